"""`wattgate agent`'s exposure: it binds 127.0.0.1 unless told otherwise, and with a key its
counters (/v1/energy, /metrics) answer only the bearer of that key (401 JSON otherwise) while
the probes stay open; the gateway's `agent` meter carries the key from the variable its config
names, and neither a meter error nor `wattgate config check` shows it."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from accounting.config import parse_accounting
from core.errors import ConfigError
from engines.meters.agent import build_agent_app
from engines.meters.base import MeterError
from engines.meters.registry import MeterSpec, make_meter
from tests.support.gateway import raw_config
from tests.support.procs import free_port, running, wattgate_cmd

pytestmark = pytest.mark.timeout(60)
KEY = "agent-key-0123456789"


def _source() -> tuple[float, list[tuple[int, float]]]:
    return 1.0, [(0, 12.5)]


async def test_with_a_key_the_counters_need_it_and_the_probes_do_not() -> None:
    async with TestServer(build_agent_app(_source, KEY), host="127.0.0.1") as server, \
            aiohttp.ClientSession() as s:
        for path in ("/v1/energy", "/metrics"):
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": KEY}):
                async with s.get(server.make_url(path), headers=headers) as r:
                    assert r.status == 401, (path, headers)
                    err = (await r.json())["error"]
                    assert err["code"] == "invalid_api_key" and err["type"] and err["message"]
                    assert KEY not in err["message"]
            async with s.get(server.make_url(path),
                             headers={"Authorization": f"Bearer {KEY}"}) as r:
                assert r.status == 200 and b"12.5" in await r.read()
        for path in ("/health", "/ready"):
            async with s.get(server.make_url(path)) as r:
                assert r.status == 200 and b"12.5" not in await r.read()

        url = str(server.make_url("/"))
        meter = make_meter(MeterSpec(kind="agent", url=url, api_key=KEY))
        assert (await meter.read()).energy_j == (12.5,)
        await meter.close()
        keyless = make_meter(MeterSpec(kind="agent", url=url))
        with pytest.raises(MeterError, match="401") as info:
            await keyless.read()
        assert KEY not in str(info.value)
        await keyless.close()
    assert KEY not in repr(MeterSpec(kind="agent", url=url, api_key=KEY))


def test_the_meter_config_reads_the_key_from_the_named_variable() -> None:
    raw = {"meters": {"e0": {"kind": "agent", "url": "http://node:9400",
                             "api_key_env": "AGENT_KEY"}}}
    cfg = parse_accounting(raw, env={"AGENT_KEY": KEY})
    assert cfg.meter_for("e0").meter.api_key == KEY
    with pytest.raises(ConfigError, match=r"meters\.e0\.api_key_env.*AGENT_KEY is unset"):
        parse_accounting(raw, env={})


def test_config_check_does_not_print_the_agent_key(tmp_path: Path) -> None:
    raw = raw_config([{"name": "e0", "url": "http://127.0.0.1:1", "precision": "bf16"}])
    raw["accounting"] = {"meters": {"e0": {"kind": "agent", "url": "http://node:9400",
                                           "api_key_env": "AGENT_KEY"}},
                         "ledger": {"kind": "sqlite", "path": str(tmp_path / "l.db")}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = subprocess.run(wattgate_cmd("config", "check", str(path)), capture_output=True,
                         text=True, env={**os.environ, "AGENT_KEY": KEY}, timeout=30)
    assert out.returncode == 0, out.stderr
    assert KEY not in out.stdout + out.stderr and '"api_key": "<set>"' in out.stdout


def _listening(port: int) -> set[str]:
    """The local addresses listening on `port` (IPv4, /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:
            found.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_the_agent_process_binds_loopback_by_default_and_keeps_its_key_out_of_its_log(
        tmp_path: Path) -> None:
    replay = tmp_path / "replay.jsonl"
    replay.write_text('{"t_s": 0, "gpus": [{"index": 0, "energy_j": 5.0}]}\n')
    port = free_port()
    log = tmp_path / "agent.log"
    cmd = wattgate_cmd("agent", "--port", str(port), "--fake-replay", str(replay))
    with running(cmd, f"http://127.0.0.1:{port}/health", env={"WATTGATE_AGENT_API_KEY": KEY},
                 log=log):
        assert _listening(port) == {"127.0.0.1"}
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/energy", timeout=5)
        assert info.value.code == 401
        info.value.close()
    assert KEY not in log.read_text()
