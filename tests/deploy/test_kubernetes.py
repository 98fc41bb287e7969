"""deploy/kubernetes: the manifests validate against the Kubernetes OpenAPI
schemas (kubernetes-validate) and the KEDA CRD models (cloudcoil), and every
probe path, port, environment variable and command in them exists in the code."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda import v1alpha1 as keda

from streamkit import StreamKit
from streamkit.observability import probes
from streamkit.settings import StreamKitSettings, default_member_id_base
from streamkit_server.api import create_app
from streamkit_server.settings import ServerSettings

ROOT = Path(__file__).parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
#: The Kubernetes version whose schemas the manifests are checked against.
K8S_VERSION = "1.30"
_KEDA_KINDS = {
    "ScaledObject": keda.ScaledObject,
    "TriggerAuthentication": keda.TriggerAuthentication,
}


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in manifest_files():
        for doc in documents(path):
            yield path, doc


def containers(kind: str, name: str) -> list[dict[str, Any]]:
    for _, doc in all_documents():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return list(doc["spec"]["template"]["spec"]["containers"])
    raise AssertionError(f"no {kind} {name}")


def pod_spec(name: str) -> dict[str, Any]:
    for _, doc in all_documents():
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == name:
            return dict(doc["spec"]["template"]["spec"])
    raise AssertionError(f"no Deployment {name}")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def test_every_manifest_is_listed_in_a_kustomization() -> None:
    listed: set[Path] = set()
    for kustomization in KUBE.rglob("kustomization.yaml"):
        doc = yaml.safe_load(kustomization.read_text())
        assert doc["kind"] == "Kustomization"
        for resource in doc["resources"]:
            path = (kustomization.parent / resource).resolve()
            assert path.is_file(), f"{kustomization}: {resource} does not exist"
            listed.add(path)
    assert {p.resolve() for p in manifest_files()} == listed


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBE)))
def test_manifest_validates_against_the_schemas(path: Path) -> None:
    docs = documents(path)
    assert docs
    for doc in docs:
        model = _KEDA_KINDS.get(doc["kind"])
        if model is None:
            # Strict schemas: an unknown or misspelt field is an error too.
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            continue
        parsed = model.model_validate(doc)
        # The models ignore unknown fields; a round trip that loses one finds it.
        assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == doc


def test_a_misspelt_field_is_refused() -> None:
    # The validator really checks: the check above cannot pass vacuously.
    doc = documents(KUBE / "coordinator-service.yaml")[0]
    doc["spec"]["prots"] = doc["spec"].pop("ports")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _paths(app: Any) -> set[str]:
    return {getattr(route, "path", "") for route in app.routes}


def test_coordinator_probes_env_and_grace_match_the_server() -> None:
    (container,) = containers("Deployment", "streamkit-coordinator")
    assert container["command"] == ["streamkit-server"]
    assert 'streamkit-server = "streamkit_server.cli:main"' in (ROOT / "pyproject.toml").read_text()
    env = env_of(container)
    fields = set(ServerSettings.model_fields)
    for name in env:
        assert name.startswith("STREAMKIT_SERVER_"), name
        assert name.removeprefix("STREAMKIT_SERVER_").lower() in fields, f"{name} is not a setting"
    for secret in ("ADMIN_PASSWORD", "TOKEN_SECRET"):
        assert "secretKeyRef" in env[f"STREAMKIT_SERVER_{secret}"]["valueFrom"]
    app = create_app(ServerSettings(), admin_password="x", token_secret=b"k" * 32)
    served = _paths(app)
    port = int(env["STREAMKIT_SERVER_PORT"]["value"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in served, f"{probe} {get['path']} is not a route"
        assert ports[get["port"]] == port
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # docs/operations.md#shutdown: above SHUTDOWN_GRACE_MS + 2 x MUTEX_TTL_MS + 5 s.
    values = {n.removeprefix("STREAMKIT_SERVER_").lower(): e.get("value") for n, e in env.items()}
    settings = ServerSettings(**{k: v for k, v in values.items() if v is not None and k in (
        "shutdown_grace_ms", "mutex_ttl_ms")})  # fmt: skip
    needed = (settings.shutdown_grace_ms + 2 * settings.mutex_ttl_ms) / 1000 + 5
    assert pod_spec("streamkit-coordinator")["terminationGracePeriodSeconds"] > needed


def test_coordinator_deployment_has_two_replicas_a_budget_and_a_service() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in all_documents()}
    deployment = kinds["Deployment", "streamkit-coordinator"]
    assert deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    budget = kinds["PodDisruptionBudget", "streamkit-coordinator"]
    assert budget["spec"]["selector"]["matchLabels"] == selector
    assert budget["spec"]["minAvailable"] == 1
    service = kinds["Service", "streamkit-coordinator"]
    assert service["spec"]["selector"] == selector
    (consumer,) = containers("Deployment", "orders-consumer")
    url = env_of(consumer)["STREAMKIT_COORDINATOR_URL"]["value"]
    assert url == f"http://streamkit-coordinator:{service['spec']['ports'][0]['port']}"


def test_consumer_probes_env_and_grace_match_the_client() -> None:
    (container,) = containers("Deployment", "orders-consumer")
    command = container["command"]
    assert command[:2] == ["streamkit", "run"]
    module, _, attribute = command[2].partition(":")
    app = getattr(__import__(module, fromlist=[attribute]), attribute)
    assert isinstance(app, StreamKit)
    env = env_of(container)
    fields = set(StreamKitSettings.model_fields)
    for name in env:
        if name == "POD_IP":
            continue
        assert name.removeprefix("STREAMKIT_").lower() in fields, f"{name} is not a setting"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    host, port = probes.parse_address(env["STREAMKIT_HTTP"]["value"])
    assert host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert ports[get["port"]] == port
        status, _, _ = probes._route(app, None, f"GET {get['path']} HTTP/1.1\r\n\r\n".encode())
        assert status != 404, f"{probe} {get['path']} is not served by streamkit run"
    # The drain may take shutdown_timeout; the leave request comes after it.
    default = inspect.signature(StreamKit).parameters["shutdown_timeout"].default
    grace = pod_spec("orders-consumer")["terminationGracePeriodSeconds"]
    assert grace >= math.ceil(default) + 10


def test_pod_ip_is_the_member_id_base(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    assert default_member_id_base() == "10.1.2.3"
