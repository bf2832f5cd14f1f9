"""The Kubernetes recipe, checked offline as a reviewer would: each overlay renders with
``kubectl kustomize`` and validates against the Kubernetes 1.34 schemas (strict: no unknown
fields); every environment name is a setting of the role that reads it, every probe a route that
role serves on a port it listens on, every image one the project builds (or the compose file's
own PostgreSQL and Redis), every Secret key one docs/kubernetes.md tells the operator to make,
and no pod is privileged, root or on the host's paths but the worker."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dilu.config import CommonSettings, ControllerSettings, GatewaySettings, WorkerSettings
from tests.conftest import ROOT

RECIPE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ["base", "overlays/gpu", "overlays/trial"]
KUBERNETES = "1.34.0"
ROLES = {"gateway": GatewaySettings, "controller": ControllerSettings, "worker": WorkerSettings,
         "migrate": CommonSettings}
KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (apt-get install kubectl)")


def _render(overlay: str) -> list[dict[str, Any]]:
    rendered = subprocess.run([KUBECTL, "kustomize", str(RECIPE / overlay)], capture_output=True, text=True,
                              timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each workload's pod template spec, by workload name."""
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs
            if d["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}}


def _role(template: dict[str, Any]) -> str:
    return template["metadata"]["labels"]["dilu.dev/role"]


def _env_names(container: dict[str, Any], docs: list[dict[str, Any]]) -> set[str]:
    names = {e["name"] for e in container.get("env", [])}
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for source in container.get("envFrom", []):
        names |= set(maps[source["configMapRef"]["name"]]["data"])
    return names


def _routes(role: str, tmp_path: Path) -> set[str]:
    if role == "gateway":
        from gateway.app import create_app

        return set(create_app(lambda: None).openapi()["paths"])
    from dilu.messages import DeviceInfo, WorkerInfo
    from dilu.state.memory import MemoryStore
    from worker.agent import WorkerAgent
    from worker.api import create_worker_api
    from worker.backends.process import ProcessBackend
    from worker.cgroups import CpuLimiter

    agent = WorkerAgent(info=WorkerInfo(id="w", host="h", url=None, device=DeviceInfo("cpu", None, "cpu", 2**30)),
                        backend=ProcessBackend(state_dir=tmp_path, cpu=CpuLimiter()), store=MemoryStore(),
                        logs_dir=tmp_path / "logs")
    return set(create_worker_api(agent).openapi()["paths"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_and_validates_against_kubernetes_1_34(overlay: str) -> None:
    docs = _render(overlay)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "dilu-gateway"), ("Deployment", "dilu-controller"), ("DaemonSet", "dilu-worker"),
            ("Job", "dilu-migrate"), ("Service", "dilu-gateway")} <= kinds
    assert all(d["metadata"].get("namespace") == "dilu" for d in docs if d["kind"] != "Namespace")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_setting_probe_image_and_secret_is_real(overlay: str, tmp_path: Path) -> None:
    docs = _render(overlay)
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    dockerfile = (ROOT / "docker" / "platform.Dockerfile").read_text()
    compose = (ROOT / "docker-compose.yml").read_text()
    for name, template in _pods(docs).items():
        role = _role(template)
        for container in template["spec"]["containers"]:
            image = container["image"].split(":")[0]
            if role in ROLES:
                assert f"-t {image} " in dockerfile or f"-t {image}\n" in dockerfile, \
                    f"{name}: {image} is built by no Dockerfile"
                known = {f"DILU_{field.upper()}" for field in ROLES[role].model_fields}
                assert _env_names(container, docs) - known == set(), f"{name} sets what {role} does not read"
                ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                if "DILU_PORT" in env:
                    assert int(env["DILU_PORT"]) in ports.values(), f"{name} listens where no port is declared"
                for kind in ("readinessProbe", "livenessProbe"):
                    probe = container.get(kind, {}).get("httpGet")
                    if probe:
                        assert probe["path"] in _routes(role, tmp_path), f"{name}'s {kind} asks no route"
                        assert probe["port"] in ports, f"{name}'s {kind} names no port"
            else:
                assert f":-{container['image']}}}" in compose, f"{name}: {container['image']} is not compose's"
            for ref in container.get("env", []):
                key = ref.get("valueFrom", {}).get("secretKeyRef")
                if key:
                    assert key["name"] == "dilu-secrets" and f"--from-literal={key['key']}=" in guide, \
                        f"{name} reads a secret key the guide does not make: {key['key']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_but_the_worker_is_privileged_root_or_on_the_host(overlay: str) -> None:
    for name, template in _pods(_render(overlay)).items():
        spec = template["spec"]
        containers = spec["containers"] + spec.get("initContainers", [])
        if _role(template) == "worker":
            assert all(c["securityContext"]["privileged"] for c in containers)
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), name
        assert not any("hostPath" in v for v in spec.get("volumes", [])), name
        assert spec.get("automountServiceAccountToken") is False, name
        for container in containers:
            context = container["securityContext"]
            assert not context.get("privileged") and context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name


def test_gpu_workers_ask_the_device_plugin_for_gpus_on_gpu_nodes() -> None:
    (worker,) = [t for t in _pods(_render("overlays/gpu")).values() if _role(t) == "worker"]
    container = worker["spec"]["containers"][0]
    assert "nvidia.com/gpu" in container["resources"]["limits"]
    assert worker["spec"]["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert container["image"].startswith("dilu/platform-cuda")


def test_instances_cannot_reach_the_gateways() -> None:
    """Instances share their worker pod's address: no policy admits worker pods to a gateway."""
    policies = [d for d in _render("base") if d["kind"] == "NetworkPolicy"]
    assert any(p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in
               p["spec"] for p in policies), "no default deny"
    to_gateway = [p for p in policies if p["spec"]["podSelector"].get("matchLabels") == {"dilu.dev/role": "gateway"}]
    for policy in to_gateway:
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                if "podSelector" in peer:
                    (allowed,) = peer["podSelector"]["matchExpressions"]
                    assert allowed["operator"] == "In" and "worker" not in allowed["values"]
                else:
                    (outside,) = peer["namespaceSelector"]["matchExpressions"]
                    assert outside == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["dilu"]}
    assert re.search(r"not yet been run\s+on a cluster", (ROOT / "docs" / "kubernetes.md").read_text())
