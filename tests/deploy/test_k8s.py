"""Kubernetes manifests: schema-valid, kustomize-renderable, and consistent with each other."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from engines.launch import LaunchRequest, launch_spec
from tests.deploy import configs
from tests.deploy.kustomize import Obj, build, key, load_docs
from tests.support.procs import REPO

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("overlays/dev", "overlays/gpu", "overlays/prod")
ALL_DIRS = ("base", "engines", *OVERLAYS)
K8S_VERSION = "1.30"  # oldest minor the manifests promise to work on
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")

pytestmark = pytest.mark.timeout(60)


@functools.cache
def _render(name: str) -> str:
    return json.dumps(build(K8S / name))


def render(name: str) -> list[Obj]:
    """The rendered objects of a kustomization (a fresh copy; rendering is cached)."""
    objs: list[Obj] = json.loads(_render(name))
    return objs


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objs if key(o) == (kind, name)]
    assert matches, f"no {kind}/{name}"
    return matches[0]


def pod_templates(objs: list[Obj]) -> list[tuple[Obj, Obj]]:
    return [(o, o["spec"]["template"]) for o in objs if o["kind"] in WORKLOAD_KINDS]


def containers(pod: Obj) -> list[Obj]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- rendering -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_DIRS)
def test_every_kustomization_renders_without_duplicates(name: str) -> None:
    objs = render(name)
    assert objs, f"{name} renders nothing"
    assert len({key(o) for o in objs}) == len(objs)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed")
@pytest.mark.parametrize("name", OVERLAYS)
def test_renderer_matches_real_kustomize(name: str) -> None:
    """Our renderer and `kubectl kustomize` produce the same objects (so the checks see reality)."""
    out = subprocess.run(["kubectl", "kustomize", str(K8S / name)], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    real = {key(o): o for o in yaml.safe_load_all(out) if o}
    ours = {key(o): o for o in render(name)}
    assert sorted(ours) == sorted(real)
    different = [k for k in ours if ours[k] != real[k]]
    assert not different


def test_every_manifest_file_is_strict_yaml() -> None:
    """No repeated keys anywhere (YAML silently keeps the last one; kubectl may keep another)."""
    files = sorted(K8S.rglob("*.yaml"))
    assert len(files) > 15
    for path in files:
        load_docs(path.read_text())


# --- schemas ---------------------------------------------------------------------------------


def test_rendered_objects_validate_against_kubernetes_schemas() -> None:
    """Every built-in object of every overlay (each distinct object once) is schema-valid."""
    unique = {json.dumps(o, sort_keys=True): o for name in OVERLAYS for o in render(name)
              if o["kind"] not in CRD_KINDS}
    for obj in unique.values():
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{key(obj)}: {exc.message} at {list(exc.path)}") from None
    assert len(unique) >= 20


def test_schema_validation_rejects_a_broken_deployment() -> None:
    """The validator really checks: a misspelt field and a wrong type both fail."""
    gateway = find(render("base"), "Deployment", "wattgate-gateway")
    broken = yaml.safe_load(yaml.safe_dump(gateway))
    broken["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(gateway))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitors_are_well_formed_and_match_services(overlay: str) -> None:
    objs = render(overlay)
    services = by_kind(objs, "Service")
    monitors = by_kind(objs, "ServiceMonitor")
    assert monitors
    for sm in monitors:
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        spec = sm["spec"]
        assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
        matched = [s for s in services if selects(spec["selector"]["matchLabels"],
                                                  s["metadata"].get("labels", {}))]
        assert matched, f"ServiceMonitor {sm['metadata']['name']} selects no Service"
        for ep in spec["endpoints"]:
            assert ep["path"].startswith("/") and DURATION.match(ep["interval"])
            for svc in matched:
                assert ep["port"] in {p.get("name") for p in svc["spec"]["ports"]}, (
                    f"{sm['metadata']['name']}: Service {svc['metadata']['name']} has no port "
                    f"{ep['port']!r}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitoring_objects_share_the_operator_selector_label(overlay: str) -> None:
    """Prometheus selects rules and monitors by one label; none may be left without it."""
    objs = [o for o in render(overlay) if o["kind"] in CRD_KINDS]
    releases = {o["metadata"]["labels"].get("release") for o in objs}
    assert releases == {"kube-prometheus-stack"}


def test_prometheus_rule_is_well_formed_and_equals_the_compose_rules() -> None:
    rule = find(render("base"), "PrometheusRule", "wattgate")
    groups = rule["spec"]["groups"]
    plain = load_docs((REPO / "deploy/prometheus/rules/wattgate.rules.yml").read_text())[0]
    assert groups == plain["groups"]
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names))
    alerts = 0
    for group in groups:
        assert set(group) <= {"name", "interval", "rules"}
        for r in group["rules"]:
            assert ("alert" in r) != ("record" in r), r
            assert isinstance(r["expr"], str) and r["expr"].strip()
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations"}
            if "for" in r:
                assert DURATION.match(r["for"]), r["for"]
            if "alert" in r:
                alerts += 1
                assert r["labels"]["severity"] in {"info", "warning", "critical"}
                assert all(isinstance(v, str) for v in r.get("annotations", {}).values())
            else:
                assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", r["record"])
    assert alerts >= 5


# --- consistency -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workload_selectors_match_their_pod_labels(overlay: str) -> None:
    for obj, pod in pod_templates(render(overlay)):
        assert selects(obj["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]), key(obj)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_selects_pods_that_expose_its_target_ports(overlay: str) -> None:
    objs = render(overlay)
    pods = [pod for _, pod in pod_templates(objs)]
    for svc in by_kind(objs, "Service"):
        backing = [p for p in pods if selects(svc["spec"]["selector"], p["metadata"]["labels"])]
        assert backing, f"Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in backing:
                exposed = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
                assert any(target in (p.get("name"), p["containerPort"]) for p in exposed), (
                    f"Service {svc['metadata']['name']}: target port {target!r} not exposed")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_and_pdb_point_at_existing_workloads(overlay: str) -> None:
    objs = render(overlay)
    for hpa in by_kind(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        target = find(objs, ref["kind"], ref["name"])
        assert hpa["spec"]["minReplicas"] <= target["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    pods = [pod for _, pod in pod_templates(objs)]
    for pdb in by_kind(objs, "PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"]["matchLabels"], p["metadata"]["labels"])
                   for p in pods)


def _secret_keys(secret: Obj) -> set[str]:
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_referenced_configmaps_secrets_claims_and_accounts_exist(overlay: str) -> None:
    objs = render(overlay)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for obj, pod in pod_templates(objs):
        spec = pod["spec"]
        if "serviceAccountName" in spec:
            assert ("ServiceAccount", spec["serviceAccountName"]) in names
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                cm = find(objs, "ConfigMap", vol["configMap"]["name"])
                for item in vol["configMap"].get("items", []):
                    assert item["key"] in cm["data"]
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in names
        mounts = {m["name"] for c in containers(pod) for m in c.get("volumeMounts", [])}
        assert mounts <= {v["name"] for v in spec.get("volumes", [])}, key(obj)
        for c in containers(pod):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["key"] in _secret_keys(find(objs, "Secret", ref["name"])), env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_and_wattgate_runs_as_non_root(overlay: str) -> None:
    for obj, pod in pod_templates(render(overlay)):
        for c in containers(pod):
            name, _, tag = c["image"].rpartition(":")
            assert name and tag and tag != "latest" and "/" not in tag, c["image"]
            if name == "wattgate":
                ctx = pod["spec"].get("securityContext", {})
                assert ctx.get("runAsNonRoot") is True and ctx.get("runAsUser", 0) != 0, key(obj)
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert c["securityContext"].get("privileged", False) is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespaced_objects_land_in_the_wattgate_namespace(overlay: str) -> None:
    for obj in render(overlay):
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "wattgate", key(obj)


def test_gpu_engines_request_gpus_and_probe_health() -> None:
    objs = render("overlays/gpu")
    engines = [(o, p) for o, p in pod_templates(objs)
               if p["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"]
    assert {o["metadata"]["name"] for o, _ in engines} == {
        "vllm-bf16", "vllm-fp8", "vllm-int8", "vllm-int4", "trtllm-fp8"}
    for obj, pod in engines:
        server = pod["spec"]["containers"][0]
        assert server["resources"]["limits"]["nvidia.com/gpu"] >= 1
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert server[probe]["httpGet"]["path"] == "/health", (key(obj), probe)
        assert obj["spec"]["replicas"] == 1  # one gateway endpoint = one engine


@pytest.mark.parametrize("precision", ["bf16", "fp8", "int8", "int4"])
def test_vllm_deployments_use_the_projects_launch_spec(precision: str) -> None:
    """The container runs exactly `wattgate engines launch-spec` for its precision."""
    pod = find(render("engines"), "Deployment", f"vllm-{precision}")["spec"]["template"]
    server = pod["spec"]["containers"][0]
    model, *args = server["args"]
    spec = launch_spec(LaunchRequest(engine="vllm", model=model, precision=precision,
                                     host="0.0.0.0", port=8000,
                                     served_model_name="llama-3.1-8b"), vllm_runner="console")
    assert [*server["command"], model, *args] == list(spec.serve.argv)


def test_agent_binds_every_address_only_with_its_key_which_the_gateways_send() -> None:
    """The agent is told 0.0.0.0 explicitly (its default is 127.0.0.1) and then requires the
    key from the wattgate-agent-key Secret; the gateway and apportioner pods get the same key
    under the variable their agent meters name, and Prometheus scrapes with it."""
    objs = render("base")
    agent = find(objs, "DaemonSet", "wattgate-agent")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in agent["containers"][0]["env"]}
    ref = {"secretKeyRef": {"name": "wattgate-agent-key", "key": "api-key"}}
    assert env["WATTGATE_AGENT_API_KEY"]["valueFrom"] == ref
    assert "api-key" in find(objs, "Secret", "wattgate-agent-key")["stringData"]
    config = yaml.safe_load(find(objs, "ConfigMap", "wattgate-gateway")["data"]["gateway.yaml"])
    meters = config["accounting"]["meters"].values()
    assert meters and all(m.get("api_key_env") == "WATTGATE_AGENT_API_KEY" for m in meters
                          if m["kind"] == "agent")
    for name in ("wattgate-gateway", "wattgate-apportioner"):
        pod = find(objs, "Deployment", name)["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["WATTGATE_AGENT_API_KEY"]["valueFrom"] == ref, name
    monitor = find(objs, "ServiceMonitor", "wattgate-agent")["spec"]["endpoints"][0]
    assert monitor["authorization"]["credentials"] == ref["secretKeyRef"]


def test_agent_reads_all_gpus_without_taking_one() -> None:
    agent = find(render("base"), "DaemonSet", "wattgate-agent")
    pod = agent["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"][:5] == ["agent", "--host", "0.0.0.0", "--port", "9400"]
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert [p["hostPort"] for p in c["ports"]] == [9400]


# --- the gateway config inside the ConfigMap -------------------------------------------------


def _gateway_env(objs: list[Obj]) -> dict[str, str]:
    """The gateway container's environment; a secret's value where the manifests hold it
    (the ledger's DSN must read as a PostgreSQL URL), else a stand-in."""
    pod = find(objs, "Deployment", "wattgate-gateway")["spec"]["template"]
    gateway = next(c for c in pod["spec"]["containers"] if c["name"] == "gateway")
    env: dict[str, str] = {}
    for e in gateway.get("env", []):
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        secret = next((o for o in objs if o["kind"] == "Secret"
                       and ref and o["metadata"]["name"] == ref["name"]), None)
        data = {**(secret or {}).get("stringData", {})}
        env[e["name"]] = data.get(ref["key"], f"value-of-{e['name']}") if ref else \
            f"value-of-{e['name']}"
    return env


def _config_doc(objs: list[Obj]) -> Any:
    return load_docs(find(objs, "ConfigMap", "wattgate-gateway")["data"]["gateway.yaml"])[0]


def _service_ports(objs: list[Obj]) -> dict[str, set[int]]:
    return {s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]}
            for s in by_kind(objs, "Service")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_configmap_is_a_valid_config_with_only_the_pods_env(overlay: str) -> None:
    objs = render(overlay)
    doc = _config_doc(objs)
    config = configs.validate(doc, _gateway_env(objs))
    assert config.listen.host == "0.0.0.0"
    port = find(objs, "Deployment", "wattgate-gateway")["spec"]["template"]["spec"][
        "containers"][0]["ports"][0]["containerPort"]
    assert config.listen.port == port
    assert doc["accounting"]["ledger"]["kind"] == "postgres"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_endpoints_are_services_of_the_overlay(overlay: str) -> None:
    objs = render(overlay)
    config = configs.validate(_config_doc(objs), _gateway_env(objs))
    services = _service_ports(objs)
    for pool in config.models:
        for ep in pool.endpoints:
            url = urlsplit(ep.url)
            assert url.hostname in services, f"{ep.name}: no Service {url.hostname}"
            assert url.port in services[url.hostname], f"{ep.name}: port {url.port}"


@pytest.mark.parametrize(("overlay", "kind"),
                         [("overlays/dev", "sim"), ("overlays/gpu", "agent"), ("overlays/prod", "dcgm")])
def test_every_engine_has_the_overlays_meter(overlay: str, kind: str) -> None:
    objs = render(overlay)
    doc = _config_doc(objs)
    endpoints = {ep["name"] for m in doc["models"] for ep in m["endpoints"]}
    meters = doc["accounting"]["meters"]
    assert set(meters) == endpoints
    assert {m["kind"] for m in meters.values()} == {kind}
    if kind == "sim":  # in-cluster URLs: they must be the simulated engines' Service ports
        services = _service_ports(objs)
        for meter in meters.values():
            url = urlsplit(meter["url"])
            assert url.port in services[url.hostname or ""]


def test_config_validation_catches_a_bad_field() -> None:
    """The ConfigMap check is not vacuous: a bad precision or a missing env var fails."""
    objs = render("overlays/dev")
    doc = _config_doc(objs)
    doc["models"][0]["endpoints"][0]["precision"] = "fp4"
    with pytest.raises(Exception, match="precision"):
        configs.validate(doc, _gateway_env(objs))
    env = _gateway_env(objs)
    del env["WATTGATE_KEY_ACME"]
    with pytest.raises(Exception, match="WATTGATE_KEY_ACME"):
        configs.validate(_config_doc(objs), env)


def test_gateway_config_accepts_the_accounting_section() -> None:
    """Once the gateway config knows `accounting:`, the whole ConfigMap parses in one call."""
    if not configs.gateway_knows_accounting():
        pytest.skip("gateway.config has no accounting: section yet (validated on its own)")
    from gateway.config import parse_config

    objs = render("overlays/dev")
    assert parse_config(_config_doc(objs), _gateway_env(objs)).models


def test_dev_fleet_matches_its_service(tmp_path: Path) -> None:
    from engines.sim.fleet import load_fleet

    objs = render("overlays/dev")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(find(objs, "ConfigMap", "wattgate-sim-fleet")["data"]["fleet.yaml"])
    ports = {c.port for c in load_fleet(fleet)}
    assert ports == _service_ports(objs)["wattgate-sim"]
    assert all(c.host == "0.0.0.0" for c in load_fleet(fleet))


def test_agent_serves_the_path_its_service_monitor_scrapes() -> None:
    """Reports (as a skip) while the energy agent has no Prometheus endpoint for its monitor."""
    from engines.meters.agent import build_agent_app

    monitor = find(render("base"), "ServiceMonitor", "wattgate-agent")
    paths = {ep["path"] for ep in monitor["spec"]["endpoints"]}
    app = build_agent_app(lambda: (0.0, []))
    served = {r.canonical for r in app.router.resources()}
    assert {"/v1/energy", "/health"} <= served
    if not paths <= served:
        pytest.skip(f"wattgate agent does not serve {sorted(paths - served)} yet")
    assert paths <= served


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_args_parse_with_the_real_cli_and_name_their_workers(overlay: str) -> None:
    """A pod without a CPU limit sees every core of its node: `serve`'s default (a worker per
    core) would start dozens, so the manifest names its workers, no more than the CPU it asks."""
    from gateway.cli import serve

    pod = find(render(overlay), "Deployment", "wattgate-gateway")["spec"]["template"]
    (gateway,) = [c for c in containers(pod) if c["name"] == "gateway"]
    command, *args = gateway["args"]
    assert command == "serve"
    params = serve.make_context("serve", list(args)).params
    assert params["workers"] is not None and params["workers"] >= 2
    if overlay != "overlays/dev":  # the dev overlay shrinks requests to fit a laptop cluster
        cpu = gateway["resources"]["requests"]["cpu"]
        cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        assert params["workers"] <= cores, (params["workers"], cpu)
