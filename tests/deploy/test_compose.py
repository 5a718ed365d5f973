"""docker compose files: they parse, and everything they name exists (files, services, ports)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.deploy import configs
from tests.deploy.kustomize import load_docs
from tests.support.procs import REPO

COMPOSE = REPO / "deploy" / "compose"

pytestmark = pytest.mark.timeout(30)


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = load_docs((COMPOSE / name).read_text())[0]
    return doc


def merged(*names: str) -> dict[str, dict[str, Any]]:
    """Services of several compose files as `docker compose -f a -f b` merges them (the subset
    used here: mappings merge, volumes merge by container path, other lists are replaced)."""
    services: dict[str, dict[str, Any]] = {}
    for name in names:
        for svc, spec in load(name)["services"].items():
            base = services.setdefault(svc, {})
            for k, v in spec.items():
                if k == "volumes" and "volumes" in base:
                    by_target = {vol.split(":")[1]: vol for vol in base["volumes"]}
                    by_target.update({vol.split(":")[1]: vol for vol in v})
                    base[k] = list(by_target.values())
                elif isinstance(v, dict) and isinstance(base.get(k), dict):
                    base[k] = {**base[k], **v}
                else:
                    base[k] = v
    return services


def active(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services that start without --profile."""
    return {n: s for n, s in services.items() if not s.get("profiles")}


def bind_mounts(spec: dict[str, Any]) -> list[tuple[str, str]]:
    return [(v.split(":")[0], v.split(":")[1]) for v in spec.get("volumes", [])
            if v.startswith((".", "/"))]


def mounted_file(spec: dict[str, Any], target: str) -> Path:
    for source, dest in bind_mounts(spec):
        if dest == target:
            return (COMPOSE / source).resolve()
    raise AssertionError(f"nothing mounted at {target}")


def gateway_env(spec: dict[str, Any]) -> dict[str, str]:
    """The gateway's environment as compose sets it, each `${VAR:-default}` at its default."""
    return {k: re.sub(r"\$\{[A-Za-z_]+:-([^}]*)\}", r"\1", str(v))
            for k, v in spec["environment"].items()}


VARIANTS = [("compose.yaml",), ("compose.yaml", "compose.gpu.yaml")]


@pytest.mark.parametrize("files", VARIANTS)
def test_bind_mounts_build_context_and_dependencies_exist(files: tuple[str, ...]) -> None:
    services = merged(*files)
    named_volumes = set()
    for name in files:
        named_volumes |= set(load(name).get("volumes") or {})
    for name, spec in services.items():
        for source, _ in bind_mounts(spec):
            path = (COMPOSE / source).resolve()
            if source != "./models":  # the GPU variant's optional local checkpoints
                assert path.exists(), f"{name}: {source} does not exist"
        for vol in spec.get("volumes", []):
            if not vol.startswith((".", "/")):
                assert vol.split(":")[0] in named_volumes, f"{name}: volume {vol}"
        deps = spec.get("depends_on", {})
        assert set(deps) <= set(active(services)), f"{name} depends on an inactive service"
        if "build" in spec:
            context = (COMPOSE / spec["build"]["context"]).resolve()
            assert (context / spec["build"]["dockerfile"]).is_file()


@pytest.mark.parametrize("files", VARIANTS)
def test_host_ports_are_unique(files: tuple[str, ...]) -> None:
    published = [p.split(":")[0] for s in active(merged(*files)).values() for p in s.get("ports", [])]
    assert len(published) == len(set(published))


@pytest.mark.parametrize("files", VARIANTS)
def test_gateways_share_one_valid_config_and_one_ledger(files: tuple[str, ...]) -> None:
    services = active(merged(*files))
    gateways = {n: s for n, s in services.items() if n.startswith("gateway-")}
    assert len(gateways) == 2
    paths = {mounted_file(s, "/etc/wattgate/gateway.yaml") for s in gateways.values()}
    assert len(paths) == 1
    dsns = {s["environment"]["WATTGATE_PG_DSN"] for s in gateways.values()}
    assert len(dsns) == 1 and urlsplit(dsns.pop()).hostname == "postgres"
    spec = next(iter(gateways.values()))
    assert spec["depends_on"]["postgres"]["condition"] == "service_healthy"
    doc = load_docs(paths.pop().read_text())[0]
    config = configs.validate(doc, gateway_env(spec))
    assert doc["accounting"]["ledger"] == {"kind": "postgres", "dsn_env": "WATTGATE_PG_DSN",
                                           "retention_days": 30}
    # the rate-limit store is the ledger's database; the collector is a compose service
    shared = config.tenant_controls.shared_store
    assert shared is not None and config.accounting is not None
    assert shared.dsn == config.accounting.ledger.dsn
    assert any(t.limits.any for t in config.tenants)
    assert config.telemetry.enabled and urlsplit(config.telemetry.otlp_endpoint).hostname \
        in services
    for pool in config.models:
        for ep in pool.endpoints:
            assert urlsplit(ep.url).hostname in services, f"{ep.name}: {ep.url}"
    for meter in doc["accounting"]["meters"].values():
        assert urlsplit(meter["url"]).hostname in services


def test_sim_fleet_serves_every_endpoint_of_the_compose_config() -> None:
    from engines.sim.fleet import load_fleet

    services = merged("compose.yaml")
    fleet = load_fleet(mounted_file(services["engines"], "/etc/wattgate/fleet.yaml"))
    assert all(c.host == "0.0.0.0" for c in fleet)
    doc = load_docs((COMPOSE / "gateway.yaml").read_text())[0]
    endpoint_ports = {urlsplit(ep["url"]).port for m in doc["models"] for ep in m["endpoints"]}
    assert endpoint_ports == {c.port for c in fleet}
    kinds = {ep["name"]: ep["kind"] for m in doc["models"] for ep in m["endpoints"]}
    dialects = {c.name: c.dialect for c in fleet}
    assert kinds == dialects


def test_gpu_variant_gives_each_engine_its_own_gpu_and_meters_that_gpu() -> None:
    services = active(merged("compose.yaml", "compose.gpu.yaml"))
    assert "engines" not in services
    devices = {}
    for name, spec in services.items():
        if name.startswith("vllm-"):
            reservation = spec["deploy"]["resources"]["reservations"]["devices"]
            devices[name] = [int(i) for i in reservation[0]["device_ids"]]
            assert spec["image"].startswith("vllm/vllm-openai:")
    assert sorted(i for ids in devices.values() for i in ids) == [0, 1, 2, 3]
    doc = load_docs((COMPOSE / "gateway.gpu.yaml").read_text())[0]
    urls = {ep["name"]: urlsplit(ep["url"]).hostname for m in doc["models"] for ep in m["endpoints"]}
    for endpoint, meter in doc["accounting"]["meters"].items():
        assert meter["kind"] == "agent" and urlsplit(meter["url"]).hostname == "agent"
        assert meter["gpus"] == devices[urls[endpoint]], endpoint
        assert meter["api_key_env"] == "WATTGATE_AGENT_API_KEY", endpoint
    assert "--quantization" in services["vllm-fp8"]["command"]
    agent = services["agent"]
    assert agent["command"][:1] == ["agent"] and "build" in agent
    # bound beyond loopback only with the key the gateways send
    assert agent["command"][1:3] == ["--host", "0.0.0.0"]
    key = agent["environment"]["WATTGATE_AGENT_API_KEY"]
    assert key and all(services[g]["environment"]["WATTGATE_AGENT_API_KEY"] == key
                       for g in ("gateway-1", "gateway-2"))
    assert agent["deploy"]["resources"]["reservations"]["devices"][0]["count"] == "all"


@pytest.mark.parametrize("files", VARIANTS)
def test_prometheus_scrapes_compose_services(files: tuple[str, ...]) -> None:
    services = active(merged(*files))
    prom = services["prometheus"]
    config = load_docs(mounted_file(prom, "/etc/prometheus/prometheus.yml").read_text())[0]
    rules_dir = mounted_file(prom, "/etc/prometheus/rules")
    assert list(rules_dir.glob("*.yml"))
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "wattgate-gateway" in jobs  # the alert rules' `up{job=...}`
    for job in jobs.values():
        for target in (t for sc in job["static_configs"] for t in sc["targets"]):
            host = target.split(":")[0]
            assert host in services, f"{job['job_name']}: {target}"


def test_grafana_is_provisioned_with_the_dashboard_and_datasource() -> None:
    grafana = merged("compose.yaml")["grafana"]
    provisioning = mounted_file(grafana, "/etc/grafana/provisioning")
    datasources = load_docs((provisioning / "datasources/prometheus.yaml").read_text())[0]
    providers = load_docs((provisioning / "dashboards/wattgate.yaml").read_text())[0]
    folder = providers["providers"][0]["options"]["path"]
    dashboard = mounted_file(grafana, f"{folder}/wattgate-dashboard.json")
    assert dashboard == (REPO / "deploy/grafana/wattgate-dashboard.json")
    import orjson

    uids = {p["datasource"]["uid"] for p in orjson.loads(dashboard.read_bytes())["panels"]
            if "datasource" in p}
    assert uids == {ds["uid"] for ds in datasources["datasources"]}
    assert urlsplit(datasources["datasources"][0]["url"]).hostname == "prometheus"


def test_gateway_command_parses_with_the_real_cli_and_names_its_workers() -> None:
    """Each gateway replica runs `serve --workers 2` (a container sees the host's cores)."""
    from gateway.cli import serve

    services = active(merged("compose.yaml"))
    for name in ("gateway-1", "gateway-2"):
        command, *args = services[name]["command"]
        assert command == "serve"
        assert serve.make_context("serve", list(args)).params["workers"] == 2, name
