"""What each proxy under test is told: wattgate's configurations and nginx's (pure text).

`wattgate` is the gateway as users run it: engines of kind `vllm` whose /metrics are scraped
(the default health settings), the default `least_load` policy, two model aliases with two
endpoints each, accounting on with the SQLite ledger. `wattgate-noacct` is the same without
accounting, so the cost of accounting is read side by side. `wattgate-lean` is the smallest
gateway that serves the same requests: one `openai` endpoint per alias, `round_robin`, no
scraping, no accounting. `wattgate-tenants` is the user configuration with every per-request
control a platform team turns on: the tenant's rate limits, concurrency cap and a joule budget
(reserved at admission, settled from the ledger), and the write-ahead journal, all set so that
nothing is refused: it measures their cost, not their refusals.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

API_KEY = "sk-bench-overhead"
ALIASES = ("m", "m2")
# (alias, precision) of the user configuration's endpoints, one engine listener each
USER_ENDPOINTS = (("m", "bf16"), ("m", "fp8"), ("m2", "bf16"), ("m2", "int4"))


def _base(port: int) -> dict[str, Any]:
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "slo_classes": {"interactive": {"ttft_s": 0.5, "tpot_s": 0.05}},
        "default_slo_class": "interactive",
        "tenants": [{"name": "bench", "api_key_sha256": digest, "slo_class": "interactive"}],
    }


def wattgate_user(engine_urls: Sequence[str], port: int, ledger: Path | None) -> bytes:
    """The user configuration over the engine's listeners (len(USER_ENDPOINTS) of them); with a
    ledger path accounting is on as shipped (the fast engine has no energy counter, so every
    endpoint gets the default, estimated `model` meter). JSON, which the YAML loader reads."""
    if len(engine_urls) < len(USER_ENDPOINTS):
        raise ValueError(f"the user configuration needs {len(USER_ENDPOINTS)} engine listeners")
    pools: dict[str, list[dict[str, Any]]] = {alias: [] for alias in ALIASES}
    for i, ((alias, precision), url) in enumerate(zip(USER_ENDPOINTS, engine_urls, strict=False)):
        pools[alias].append({"name": f"engine-{i}-{precision}", "url": url, "kind": "vllm",
                             "precision": precision})
    cfg = _base(port)
    cfg["routing"] = {"policy": "least_load"}
    cfg["models"] = [{"name": alias, "endpoints": eps} for alias, eps in pools.items()]
    if ledger is not None:
        cfg["accounting"] = {"ledger": {"kind": "sqlite", "path": str(ledger)}}
    return orjson.dumps(cfg, option=orjson.OPT_INDENT_2)


def wattgate_tenants(engine_urls: Sequence[str], port: int, ledger: Path) -> bytes:
    """The user configuration plus tenant limits, a budget and the journal (never reached)."""
    cfg = orjson.loads(wattgate_user(engine_urls, port, ledger))
    cfg["tenants"][0].update({
        "limits": {"requests_per_second": 1e6, "requests_per_minute": 1e8,
                   "tokens_per_minute": 1e12, "max_concurrent": 100_000},
        "budgets": [{"period": "day", "j": 1e15}], "on_budget": "reject"})
    cfg["accounting"]["journal"] = {"enabled": True, "path": f"{ledger}.journal"}
    return orjson.dumps(cfg, option=orjson.OPT_INDENT_2)


def wattgate_lean(engine_url: str, port: int) -> bytes:
    """The lean configuration: both aliases on one `openai` endpoint each, same listener."""
    cfg = _base(port)
    cfg["routing"] = {"policy": "round_robin"}
    cfg["models"] = [{"name": alias, "endpoints": [
        {"name": f"lean-{alias}", "url": engine_url, "kind": "openai", "precision": "bf16"}]}
        for alias in ALIASES]
    cfg["health"] = {"scrape_metrics": False}
    return orjson.dumps(cfg, option=orjson.OPT_INDENT_2)


NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/nginx-body;
  proxy_temp_path {workdir}/nginx-proxy;
  upstream engine {{
{servers}
    keepalive 256;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      tcp_nodelay on;
    }}
  }}
}}
"""


def nginx(workdir: Path, port: int, engine_urls: Sequence[str]) -> str:
    """nginx as a reverse proxy round-robin over the same listeners as wattgate."""
    servers = "\n".join(f"    server {url.removeprefix('http://')};" for url in engine_urls)
    return NGINX_CONF.format(workdir=workdir, port=port, servers=servers)
