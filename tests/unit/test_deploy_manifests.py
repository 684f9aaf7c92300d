"""The deployment files agree with the CLI: docker-compose.yml and deploy/kubernetes/ run every
service the CLI knows, with the command `hivemux service <name>`, the bus configured and a
health check on /healthz."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hivemux.cli.services import SERVICES, SINGLE_ACTIVE

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "kubernetes"

EXPECTED = {
    "telemetry-ingester",
    "health-processor",
    "cell-allocator",
    "profiler",
    "predictor",
    "matcher",
    "executor",
    "job-controller",
    "projector",
    "api",
}
METRICS_PORT = 9400


def load_all(path: Path) -> list[dict[str, Any]]:
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = load_all(COMPOSE)
    return doc


@pytest.fixture(scope="module")
def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += load_all(path)
    assert docs, f"no manifests in {K8S}"
    return docs


@pytest.fixture(scope="module")
def workloads(k8s_docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for doc in k8s_docs:
        if doc.get("kind") in ("Deployment", "DaemonSet"):
            name = doc["metadata"]["name"]
            assert name not in found, f"workload {name} declared twice"
            found[name] = doc
    return found


def hivemux_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Compose services that run `hivemux service <name>`."""
    return {
        name: spec
        for name, spec in compose["services"].items()
        if list(spec.get("command") or [])[:2] == ["hivemux", "service"]
    }


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def test_expected_names_match_the_cli_registry() -> None:
    assert set(SERVICES) == EXPECTED


# -- docker compose ------------------------------------------------------------------------


def test_compose_runs_every_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in SERVICES:
        assert name in services, f"{name} is not a compose service"
        assert services[name]["command"] == ["hivemux", "service", name]
    assert set(hivemux_services(compose)) == set(SERVICES) | {f"{name}-standby" for name in SINGLE_ACTIVE}


def test_compose_runs_two_of_each_single_active_decider(compose: dict[str, Any]) -> None:
    """Instances 0 and 1 (distinct sources), one deciding at a time (bus.leadership)."""
    services = compose["services"]
    for name in SINGLE_ACTIVE:
        active, standby = services[name], services[f"{name}-standby"]
        assert standby["command"] == active["command"] == ["hivemux", "service", name]
        assert (str(active["environment"]["HIVEMUX_INSTANCE"]), str(standby["environment"]["HIVEMUX_INSTANCE"])) == ("0", "1")
        for spec in (active, standby):
            assert spec["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092", name
            # Kafka refuses sessions under group.min.session.timeout.ms (6000 by default)
            assert int(spec["environment"]["HIVEMUX_LEADER_SESSION_TIMEOUT_MS"]) >= 6000, name


def test_compose_services_are_configured_and_health_checked(compose: dict[str, Any]) -> None:
    for name, spec in hivemux_services(compose).items():
        env = spec["environment"]
        assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092", name
        assert env["HIVEMUX_POSTGRES_DSN"] == "postgresql://hivemux:hivemux@postgres:5432/hivemux", name
        assert str(env["HIVEMUX_METRICS_PORT"]) == str(METRICS_PORT), name
        assert env["HIVEMUX_METRICS_HOST"] == "0.0.0.0", name
        assert str(env["HIVEMUX_SESSION_TIMEOUT_MS"]) == "10000", name
        test = spec["healthcheck"]["test"]
        joined = " ".join(test) if isinstance(test, list) else test
        assert f"127.0.0.1:{METRICS_PORT}/healthz" in joined and "urllib" in joined, name
        assert spec["depends_on"]["kafka"]["condition"] == "service_healthy", name
        assert spec["depends_on"]["postgres"]["condition"] == "service_healthy", name


def test_compose_infrastructure(compose: dict[str, Any]) -> None:
    services = compose["services"]
    kafka = services["kafka"]
    assert kafka["image"] == "apache/kafka:3.9.0"
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "PLAINTEXT://kafka:9092" in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert "healthcheck" in kafka
    postgres = services["postgres"]
    assert postgres["image"] == "postgres:16"
    assert postgres["environment"] == {"POSTGRES_DB": "hivemux", "POSTGRES_USER": "hivemux", "POSTGRES_PASSWORD": "hivemux"}
    assert "healthcheck" in postgres
    topics = services["topics"]
    assert topics["command"] == ["hivemux", "topics"]
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_compose_scales_consumer_group_members(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("executor", "health-processor"):
        assert services[name]["deploy"]["replicas"] == 2, name
        assert "container_name" not in services[name], name


def test_compose_builds_the_image_from_the_dockerfile(compose: dict[str, Any]) -> None:
    for name, spec in hivemux_services(compose).items():
        assert spec["image"] == "hivemux:0.1.0", name
        assert (ROOT / spec["build"]["context"] / spec["build"]["dockerfile"]).is_file(), name


# -- kubernetes ----------------------------------------------------------------------------


def test_kustomization_lists_existing_files() -> None:
    (kustomization,) = load_all(K8S / "kustomization.yaml")
    resources = kustomization["resources"]
    assert resources, "kustomization.yaml lists no resources"
    for resource in resources:
        assert (K8S / resource).is_file(), f"{resource} is listed in kustomization.yaml but missing"
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert manifests == set(resources), "every manifest is listed in kustomization.yaml"


def test_every_service_is_a_workload(workloads: dict[str, dict[str, Any]]) -> None:
    assert set(workloads) == set(SERVICES)
    for name, workload in workloads.items():
        (container,) = containers(workload)
        assert container["command"] == ["hivemux", "service", name], name
        assert container["image"] == "hivemux:0.1.0", name
        assert workload["metadata"]["namespace"] == "hivemux", name
    per_node = {"executor", "telemetry-ingester"}
    assert all(workloads[n]["kind"] == "DaemonSet" for n in per_node)
    assert all(w["kind"] == "Deployment" for n, w in workloads.items() if n not in per_node)
    env = {e["name"]: e for e in containers(workloads["telemetry-ingester"])[0]["env"]}
    assert env["HIVEMUX_INGESTER_BACKEND"]["value"] == "dcgm"
    assert env["HIVEMUX_INGESTER_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_probes_hit_healthz(workloads: dict[str, dict[str, Any]]) -> None:
    for name, workload in workloads.items():
        (container,) = containers(workload)
        for probe in ("livenessProbe", "readinessProbe"):
            http = container[probe]["httpGet"]
            assert http["path"] == "/healthz", (name, probe)
            assert http["port"] == METRICS_PORT, (name, probe)
        if "startupProbe" in container:
            assert container["startupProbe"]["httpGet"]["path"] == "/healthz", name
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/port"] == str(METRICS_PORT), name


def test_shared_configuration(k8s_docs: list[dict[str, Any]], workloads: dict[str, dict[str, Any]]) -> None:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in k8s_docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    assert [d["metadata"]["name"] for d in by_kind["Namespace"]] == ["hivemux"]
    configs = {d["metadata"]["name"]: d for d in by_kind["ConfigMap"]}
    config = configs["hivemux-env"]
    assert config["data"]["KAFKA_BOOTSTRAP_SERVERS"]
    assert config["data"]["HIVEMUX_METRICS_PORT"] == str(METRICS_PORT)
    assert config["data"]["HIVEMUX_METRICS_HOST"] == "0.0.0.0"
    secrets = {d["metadata"]["name"]: d for d in by_kind["Secret"]}
    secret = secrets["hivemux-postgres"]
    assert set(secrets["hivemux-kafka-users"]["stringData"]) == set(workloads)  # a Kafka user per service
    assert "HIVEMUX_POSTGRES_DSN" in secret["stringData"]
    for name, workload in workloads.items():
        (container,) = containers(workload)
        sources = container["envFrom"]
        assert {"configMapRef": {"name": config["metadata"]["name"]}} in sources, name
        assert {"secretRef": {"name": secret["metadata"]["name"]}} in sources, name


def test_single_active_instances(k8s_docs: list[dict[str, Any]], workloads: dict[str, dict[str, Any]]) -> None:
    """Two pods of each single-active decider: one decides, the other stands by (bus.leadership),
    so a rolling update replaces one at a time and never runs a third."""
    assert workloads["health-processor"]["spec"]["replicas"] == 2
    for name in SINGLE_ACTIVE:
        spec = workloads[name]["spec"]
        assert spec["replicas"] == 2, name
        assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}, name
        (container,) = containers(workloads[name])
        instance = next(e for e in container["env"] if e["name"] == "HIVEMUX_INSTANCE")
        assert instance["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", name  # distinct sources
    config = next(d for d in k8s_docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hivemux-env")
    assert int(config["data"]["HIVEMUX_LEADER_SESSION_TIMEOUT_MS"]) >= 6000


def test_security_contexts(workloads: dict[str, dict[str, Any]]) -> None:
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        if name == "executor":
            assert not pod["securityContext"].get("runAsNonRoot", False)
        else:
            assert pod["securityContext"]["runAsNonRoot"] is True, name


def test_executor_is_a_node_agent(workloads: dict[str, dict[str, Any]]) -> None:
    pod = workloads["executor"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"hivemux.io/gpu-node": "true"}
    assert pod["hostPID"] is False
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HIVEMUX_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["resources"]["requests"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    mps = [name for name, v in volumes.items() if v.get("hostPath", {}).get("path") == "/tmp/nvidia-mps"]
    assert mps and mounts[mps[0]]["mountPath"] == "/tmp/nvidia-mps"


def test_the_cell_allocator_mounts_a_valid_hived_configuration(k8s_docs: list[dict[str, Any]], workloads: dict[str, dict[str, Any]]) -> None:
    from hivemux.cells.config import parse_config

    (cells,) = [d for d in k8s_docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hivemux-cells"]
    parse_config(yaml.safe_load(cells["data"]["cells.yaml"]))
    (container,) = containers(workloads["cell-allocator"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "cells")
    assert env["HIVEMUX_ALLOCATOR_CONFIG"] == mount["mountPath"] + "/cells.yaml"
