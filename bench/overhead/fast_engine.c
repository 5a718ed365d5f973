/*
 * A minimal OpenAI-style completions engine for the gateway-overhead benchmark.
 *
 * One thread, epoll, HTTP/1.1 keep-alive, TCP_NODELAY. It costs a few microseconds per request,
 * so the proxy in front of it, not the engine, is what a benchmark measures.
 *
 *   POST /v1/completions (or /v1/chat/completions), body with "stream": true
 *       -> 16 SSE token events, each in its own write(2) (a separate chunked-encoding chunk),
 *          then a usage event (only if the body has "include_usage": true) and `data: [DONE]`.
 *          When the body contains the word "burst", the whole response goes out in one write.
 *   POST without "stream": true -> one JSON completion with usage, Content-Length framed.
 *   GET /metrics -> vLLM's Prometheus gauges (vllm:num_requests_running, vllm:num_requests_waiting,
 *       vllm:kv_cache_usage_perc), so a gateway scrapes it as it scrapes `vllm serve`.
 *   GET anything else (/health, /v1/models, ...) -> 200 with a model list.
 *
 * Usage: fast_engine PORT [PORT...]   (listens on 127.0.0.1 at each PORT, one process and thread
 *        for all of them, so several "engines" cost one core; exits on SIGTERM/SIGINT)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOKENS 16
#define INBUF 65536
#define MAXFD 65536
#define MAXLISTEN 16

struct conn {
    char in[INBUF];
    size_t in_len;
    char *out;      /* bytes a full socket buffer could not take yet */
    size_t out_len;
    int close_after;
};

static struct conn *conns[MAXFD];
static char listener[MAXFD];  /* 1 for a listening socket */
static int epfd;
static volatile sig_atomic_t stop_flag;

static const char MODELS[] =
    "{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\",\"created\":0,"
    "\"owned_by\":\"bench\"}]}";
static const char TOKEN_EVENT[] =
    "data: {\"id\":\"cmpl-bench\",\"object\":\"text_completion\",\"created\":0,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" tok\",\"logprobs\":null,\"finish_reason\":null}]}\n\n";
static const char LAST_TOKEN_EVENT[] =
    "data: {\"id\":\"cmpl-bench\",\"object\":\"text_completion\",\"created\":0,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" tok\",\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n";
static const char USAGE_EVENT[] =
    "data: {\"id\":\"cmpl-bench\",\"object\":\"text_completion\",\"created\":0,\"model\":\"m\","
    "\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":16,\"total_tokens\":21}}\n\n";
/* Every request is answered within the loop pass that read it, so when a scrape is served
 * nothing is running or waiting and no KV cache is held: zeros are the true values. */
static const char METRICS[] =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.0\n";
static const char JSON_TYPE[] = "application/json";
static const char PROM_TYPE[] = "text/plain; version=0.0.4; charset=utf-8";
static const char DONE_EVENT[] = "data: [DONE]\n\n";
static const char STREAM_HEAD[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";
static const char BODY_JSON[] =
    "{\"id\":\"cmpl-bench\",\"object\":\"text_completion\",\"created\":0,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" tok tok tok tok tok tok tok tok tok tok tok tok tok tok"
    " tok tok\",\"logprobs\":null,\"finish_reason\":\"length\"}],"
    "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":16,\"total_tokens\":21}}";

static void on_stop(int sig) { (void)sig; stop_flag = 1; }

static void drop(int fd) {
    struct conn *c = conns[fd];
    if (c) {
        free(c->out);
        free(c);
        conns[fd] = NULL;
    }
    close(fd);
}

/* Write now; whatever the socket cannot take is queued and sent on EPOLLOUT. */
static int send_bytes(int fd, struct conn *c, const char *p, size_t n) {
    if (c->out_len == 0) {
        while (n > 0) {
            ssize_t w = write(fd, p, n);
            if (w > 0) {
                p += w;
                n -= (size_t)w;
            } else if (w < 0 && errno == EINTR) {
                continue;
            } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break;
            } else {
                return -1;
            }
        }
        if (n == 0) return 0;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.fd = fd};
        epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
    }
    char *grown = realloc(c->out, c->out_len + n);
    if (!grown) return -1;
    memcpy(grown + c->out_len, p, n);
    c->out = grown;
    c->out_len += n;
    return 0;
}

/* Append one chunked-encoding chunk holding `data` to buf; returns the new length. */
static size_t put_chunk(char *buf, size_t len, const char *data, size_t n) {
    len += (size_t)sprintf(buf + len, "%zx\r\n", n);
    memcpy(buf + len, data, n);
    len += n;
    memcpy(buf + len, "\r\n", 2);
    return len + 2;
}

/* True when `"key"` is followed (after spaces and a colon) by `true`. */
static int json_true(const char *body, size_t n, const char *key) {
    const char *p = memmem(body, n, key, strlen(key));
    if (!p) return 0;
    const char *end = body + n;
    p += strlen(key);
    while (p < end && (*p == ' ' || *p == ':' || *p == '\t')) p++;
    return end - p >= 4 && memcmp(p, "true", 4) == 0;
}

static int respond_stream(int fd, struct conn *c, int usage, int burst) {
    char buf[8192];
    size_t len = 0;
    memcpy(buf, STREAM_HEAD, sizeof STREAM_HEAD - 1);
    len = sizeof STREAM_HEAD - 1;
    for (int i = 0; i < TOKENS; i++) {
        const char *ev = i == TOKENS - 1 ? LAST_TOKEN_EVENT : TOKEN_EVENT;
        size_t evn = i == TOKENS - 1 ? sizeof LAST_TOKEN_EVENT - 1 : sizeof TOKEN_EVENT - 1;
        len = put_chunk(buf, len, ev, evn);
        if (!burst) {
            if (send_bytes(fd, c, buf, len) < 0) return -1;
            len = 0;
        }
    }
    if (usage) len = put_chunk(buf, len, USAGE_EVENT, sizeof USAGE_EVENT - 1);
    len = put_chunk(buf, len, DONE_EVENT, sizeof DONE_EVENT - 1);
    memcpy(buf + len, "0\r\n\r\n", 5);
    len += 5;
    return send_bytes(fd, c, buf, len);
}

static int respond_plain(int fd, struct conn *c, const char *type, const char *body, size_t n) {
    char buf[4096];
    size_t len = (size_t)snprintf(buf, sizeof buf,
                                  "HTTP/1.1 200 OK\r\nContent-Type: %s\r\n"
                                  "Content-Length: %zu\r\n\r\n", type, n);
    memcpy(buf + len, body, n);
    return send_bytes(fd, c, buf, len + n);
}

/* Serve every complete request in the input buffer (pipelining allowed). */
static int serve(int fd, struct conn *c) {
    for (;;) {
        char *head_end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
        if (!head_end) return c->in_len >= INBUF ? -1 : 0;
        size_t head_len = (size_t)(head_end - c->in) + 4;
        size_t body_len = 0;
        const char *cl = memmem(c->in, head_len, "\r\ncontent-length:", 17);
        if (!cl) cl = memmem(c->in, head_len, "\r\nContent-Length:", 17);
        if (!cl) cl = memmem(c->in, head_len, "\r\nCONTENT-LENGTH:", 17);
        if (cl) body_len = strtoul(cl + 17, NULL, 10);
        if (head_len + body_len > INBUF) return -1;
        if (c->in_len < head_len + body_len) return 0;
        if (memmem(c->in, head_len, "\r\nConnection: close", 19) ||
            memmem(c->in, head_len, "\r\nconnection: close", 19))
            c->close_after = 1;
        const char *body = c->in + head_len;
        int rc;
        if (memcmp(c->in, "POST ", 5) == 0) {
            if (json_true(body, body_len, "\"stream\""))
                rc = respond_stream(fd, c, json_true(body, body_len, "\"include_usage\""),
                                    memmem(body, body_len, "burst", 5) != NULL);
            else
                rc = respond_plain(fd, c, JSON_TYPE, BODY_JSON, sizeof BODY_JSON - 1);
        } else if (memcmp(c->in, "GET /metrics ", 13) == 0) {
            rc = respond_plain(fd, c, PROM_TYPE, METRICS, sizeof METRICS - 1);
        } else {
            rc = respond_plain(fd, c, JSON_TYPE, MODELS, sizeof MODELS - 1);
        }
        if (rc < 0) return -1;
        size_t used = head_len + body_len;
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
        if (c->close_after) return c->out_len ? 0 : -1;
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || argc - 1 > MAXLISTEN) {
        fprintf(stderr, "usage: %s PORT [PORT...] (at most %d)\n", argv[0], MAXLISTEN);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int one = 1;
    epfd = epoll_create1(0);
    for (int i = 1; i < argc; i++) {
        int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[i]))};
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (lfd < 0 || lfd >= MAXFD || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
            listen(lfd, 4096) < 0) {
            fprintf(stderr, "fast_engine: port %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        listener[lfd] = 1;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
        epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev);
    }
    struct epoll_event events[256];
    while (!stop_flag) {
        int n = epoll_wait(epfd, events, 256, 500);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (listener[fd]) {
                int cfd;
                while ((cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (cfd >= MAXFD) {
                        close(cfd);
                        continue;
                    }
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conns[cfd] = calloc(1, sizeof(struct conn));
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            struct conn *c = conns[fd];
            if (!c) continue;
            if (events[i].events & EPOLLOUT && c->out_len) {
                ssize_t w = write(fd, c->out, c->out_len);
                if (w < 0 && errno != EAGAIN) {
                    drop(fd);
                    continue;
                }
                if (w > 0) {
                    memmove(c->out, c->out + w, c->out_len - (size_t)w);
                    c->out_len -= (size_t)w;
                }
                if (c->out_len == 0) {
                    if (c->close_after) {
                        drop(fd);
                        continue;
                    }
                    struct epoll_event mev = {.events = EPOLLIN, .data.fd = fd};
                    epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &mev);
                }
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = read(fd, c->in + c->in_len, INBUF - c->in_len);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    drop(fd);
                    continue;
                }
                if (r > 0) {
                    c->in_len += (size_t)r;
                    if (serve(fd, c) < 0) drop(fd);
                }
            }
        }
    }
    return 0;
}
