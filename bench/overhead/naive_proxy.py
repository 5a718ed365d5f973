"""A naive aiohttp pass-through (no auth, parsing, timing, metrics): the floor that aiohttp +
uvloop set, so the benchmark can tell the gateway's own costs from the framework's.

    python bench/overhead/naive_proxy.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from aiohttp import web


def build(upstream: str) -> web.Application:
    app = web.Application()
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        connector = aiohttp.TCPConnector(limit=4096, limit_per_host=0, keepalive_timeout=60.0)
        app[session_key] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        yield
        await app[session_key].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with app[session_key].post(upstream + request.path, data=body,
                                         headers={"Content-Type": "application/json"}) as up:
            if up.content_type != "text/event-stream":
                return web.Response(status=up.status, body=await up.read(),
                                    content_type=up.content_type)
            resp = web.StreamResponse(status=up.status,
                                      headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
            return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/completions", relay)
    app.router.add_post("/v1/chat/completions", relay)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    port, upstream = int(sys.argv[1]), sys.argv[2]
    web.run_app(build(upstream), host="127.0.0.1", port=port, access_log=None, print=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
