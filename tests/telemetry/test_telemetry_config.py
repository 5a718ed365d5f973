"""The `telemetry:` section: off by default (no sink, no trace context, no traceparent to the
engine, nothing imported), on when an OTLP endpoint is set, refused with the field named
when wrong, and a clear one-line error when export is on without the `otel` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from core.errors import ConfigError
from gateway.app import build_app
from gateway.appkeys import PROXY
from gateway.config import parse_config
from gateway.telemetry.config import INSTALL_HINT, TelemetryConfig
from tests.faults.helpers import body, ep, post
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway import make_config, raw_config, running_gateway
from tests.support.procs import wattgate_cmd

pytestmark = pytest.mark.timeout(60)


def telemetry_of(**section: Any) -> TelemetryConfig:
    return parse_config(raw_config([ep("http://127.0.0.1:9")], telemetry=section),
                        env={}).telemetry


def test_telemetry_is_off_by_default_and_read_when_given() -> None:
    off = make_config([ep("http://127.0.0.1:9")]).telemetry
    assert off == TelemetryConfig() and not off.enabled
    on = telemetry_of(otlp_endpoint="http://collector:4318/", export_interval_s=2,
                      sample_ratio=0.25, metrics=False)
    assert on.enabled and on.otlp_endpoint == "http://collector:4318"
    assert (on.export_interval_s, on.sample_ratio, on.traces, on.metrics) == (2.0, 0.25, True,
                                                                               False)
    assert not telemetry_of(otlp_endpoint="http://c:4318", traces=False, metrics=False).enabled


@pytest.mark.parametrize(("section", "field"), [
    ({"otlp_endpoint": "collector:4318"}, "telemetry.otlp_endpoint"),
    ({"otlp_endpoint": "http://c:4318", "sample_ratio": 1.5}, "telemetry.sample_ratio"),
    ({"otlp_endpoint": "http://c:4318", "export_interval_s": 0}, "telemetry.export_interval_s"),
    ({"otlp_endpoint": "http://c:4318", "trace": True}, "telemetry.trace"),
])
def test_a_wrong_telemetry_section_names_its_field(section: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        telemetry_of(**section)
    assert err.value.message.startswith(field)


async def proxy_parts(config_raw: dict[str, Any]) -> tuple[object, tuple[object, ...]]:
    """(the proxy's trace starter, its record sinks) of an app built from `config_raw`."""
    app = build_app(parse_config(config_raw, env={}))
    runner = web.AppRunner(app)
    await runner.setup()  # runs the lifecycle that builds the proxy
    try:
        proxy = app[PROXY]
        return proxy.tracing, proxy.publisher.sinks
    finally:
        await runner.cleanup()


async def test_telemetry_off_adds_no_sink_and_on_adds_one() -> None:
    engine = "http://127.0.0.1:9"  # never asked: the app is built, not served
    tracing, sinks = await proxy_parts(raw_config([ep(engine)]))
    assert tracing is None
    assert not any(type(s).__module__.startswith("gateway.telemetry") for s in sinks)
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    tracing, sinks = await proxy_parts(raw_config([ep(engine)], telemetry={
        "otlp_endpoint": "http://127.0.0.1:9"}))
    assert tracing is not None
    assert [type(s).__name__ for s in sinks if type(s).__module__.startswith(
        "gateway.telemetry")] == ["OtelExport"]


async def test_telemetry_off_sends_no_traceparent_to_the_engine() -> None:
    async with fault_engine(FaultEngine()) as engine, \
            running_gateway(make_config([ep(engine)])) as gw, aiohttp.ClientSession() as s:
        status, _, _ = await post(s, gw, body(), {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
        assert status == 200
    assert engine.traceparents == [""]


def test_export_on_without_the_packages_fails_at_start_with_one_line(tmp_path: Path) -> None:
    """`wattgate serve` with the OpenTelemetry packages hidden: exit 2 before binding, one
    line naming the extra to install."""
    config = tmp_path / "gateway.yaml"
    config.write_bytes(orjson.dumps(raw_config([ep("http://127.0.0.1:9")], telemetry={
        "otlp_endpoint": "http://127.0.0.1:4318"})))
    hide = ("import sys; sys.modules['opentelemetry'] = None; import wattgate_cli; "
            f"sys.argv = ['wattgate', 'serve', '--config', {str(config)!r}]; wattgate_cli.main()")
    proc = subprocess.run([sys.executable, "-c", hide], capture_output=True, timeout=50,
                          check=False)
    err = proc.stderr.decode().strip()
    assert proc.returncode == 2, err
    assert len(err.splitlines()) == 1 and INSTALL_HINT in err and "telemetry" in err


def test_config_check_shows_the_telemetry_section(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_bytes(orjson.dumps(raw_config([ep("http://127.0.0.1:9")], telemetry={
        "otlp_endpoint": "http://collector:4318", "sample_ratio": 0.1})))
    proc = subprocess.run([*wattgate_cmd("config", "check", str(config))], capture_output=True,
                          timeout=50, check=False)
    assert proc.returncode == 0, proc.stderr
    shown = orjson.loads(proc.stdout)["telemetry"]
    assert shown == {"otlp_endpoint": "http://collector:4318", "service_name": "wattgate",
                     "traces": True, "metrics": True, "export_interval_s": 10.0,
                     "sample_ratio": 0.1}


def test_the_gateway_builds_without_the_packages_when_telemetry_is_off() -> None:
    """With OpenTelemetry hidden, a config without `telemetry:` loads and its app builds."""
    code = ("import sys; sys.modules['opentelemetry'] = None\n"
            "from gateway.app import build_app\n"
            "from tests.support.gateway import make_config\n"
            "build_app(make_config([{'name': 'e1', 'url': 'http://127.0.0.1:9', "
            "'precision': 'bf16'}]))\n"
            "assert not [m for m in sys.modules if m.startswith('opentelemetry.')]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=50,
                          check=False, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr.decode()
