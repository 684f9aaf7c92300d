"""The deployment files agree with the CLI: docker-compose.yml and deploy/kubernetes/ run every
service the CLI knows, with the command `hivemux service <name>`, the bus configured and a
health check on /healthz. Every HIVEMUX_* variable they set is a setting some service reads
(derived from the services' pydantic settings classes), the executor DaemonSet runs the process
backend unprivileged (only its MPS init step is privileged), the Dockerfile builds and ships
the xCUDA shim (issue 18), and every service mounts its own signing key, no other, and the public
keyring where its variables say, made by what makes them (issue 28: compose's one-shot
`signing-keys`, deploy/kubernetes/signing-keys.sh), and the executor requests its GPUs from the
NVIDIA device plugin (or, in the host-GPU overlay, takes all of them) with no pod-wide memory
limit over its workloads' own (issue 30)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from hivemux.cli.services import SERVICES, SINGLE_ACTIVE

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"

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
        # the node agent uses no database, and its workloads must not find a password near it
        assert ({"secretRef": {"name": secret["metadata"]["name"]}} in sources) is (name != "executor"), name


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
        if name == "executor":  # root to switch workloads to their uids; see test_executor_privileges
            assert not pod["securityContext"].get("runAsNonRoot", False)
        else:
            assert pod["securityContext"]["runAsNonRoot"] is True, name


def test_executor_is_a_node_agent(workloads: dict[str, dict[str, Any]]) -> None:
    pod = workloads["executor"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"hivemux.io/gpu-node": "true"}
    assert pod["hostPID"] is True  # NVML's per-process usage names host pids (the memory guard)
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HIVEMUX_EXECUTOR_BACKEND"]["value"] == "process"  # the real node agent, not the simulation
    for name in ("HIVEMUX_EXECUTOR_NODE_ID", "HIVEMUX_INSTANCE"):  # reports as executor/<node>
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", name
    assert "HIVEMUX_NODE_ID" not in env  # no setting reads it
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "compute,utility"  # MPS binaries, NVML, nvidia-smi
    assert container["resources"]["requests"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    work = env["HIVEMUX_EXECUTOR_WORK_DIR"]["value"]  # workloads, xCUDA files, per-GPU MPS pipe and log dirs
    assert mounts[work]["hostPath"]["path"] == work
    for directory in ("/tmp/nvidia-mps", "/var/log/nvidia-mps"):  # the host's MPS pipe and log directories
        assert mounts[directory]["hostPath"]["path"] == directory
    assert env["CUDA_MPS_PIPE_DIRECTORY"]["value"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_LOG_DIRECTORY"]["value"] == "/var/log/nvidia-mps"


def test_executor_privileges(workloads: dict[str, dict[str, Any]]) -> None:
    """Privileged only where MPS needs it (the compute mode, set once by an init container);
    the agent is root without privilege, and its workloads get nothing it could pass on."""
    pod = workloads["executor"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["securityContext"]["privileged"] is True and "EXCLUSIVE_PROCESS" in " ".join(init["command"])
    (agent,) = pod["containers"]
    security = agent["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False  # no_new_privs, inherited
    assert security["capabilities"]["drop"] == ["ALL"]
    # SYS_ADMIN: the workloads' sandboxes (mount, PID and IPC namespaces; executor/sandbox.py)
    assert set(security["capabilities"]["add"]) == {"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID", "SYS_ADMIN"}
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert int(env["HIVEMUX_EXECUTOR_WORKLOAD_UID_FIRST"]) >= 1000  # workloads: unprivileged uids
    for name, workload in workloads.items():
        spec = workload["spec"]["template"]["spec"]
        for c in spec["containers"]:
            assert not c.get("securityContext", {}).get("privileged", False), name


def apply_json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """The RFC 6902 ``add``/``remove`` operations a kustomize patch uses (``~1`` is ``/``)."""
    import copy

    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif op["op"] == "add" and isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        elif op["op"] == "add":
            target[last] = op["value"]
        else:
            raise AssertionError(f"unexpected patch operation {op}")
    return doc


def test_executor_requests_its_gpus_from_the_device_plugin(workloads: dict[str, dict[str, Any]]) -> None:
    """Issue 30 item 5: the agent asks the NVIDIA device plugin for its node's GPUs (so the kubelet
    gives them to no other pod), under the NVIDIA runtime, and never names "all" devices itself,
    which would bypass the plugin's allocation."""
    pod = workloads["executor"]["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    (agent,) = pod["containers"]
    limits = agent["resources"]["limits"]
    assert isinstance(limits["nvidia.com/gpu"], int) and limits["nvidia.com/gpu"] >= 1  # one node's GPUs
    assert "nvidia.com/gpu" not in agent["resources"]["requests"] or agent["resources"]["requests"]["nvidia.com/gpu"] == limits["nvidia.com/gpu"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in agent["env"]}
    for other, workload in workloads.items():  # no other service holds a GPU
        if other != "executor":
            (c,) = containers(workload)
            assert "nvidia.com/gpu" not in (c.get("resources", {}).get("limits") or {}), other


def test_host_gpu_mode_is_the_documented_overlay(workloads: dict[str, dict[str, Any]]) -> None:
    """deploy/kubernetes/host-gpus: the same agent without the request, every GPU of its node
    through the NVIDIA runtime."""
    (overlay,) = load_all(K8S / "host-gpus" / "kustomization.yaml")
    assert overlay["resources"] == [".."]
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": "executor"}
    patched = apply_json_patch(workloads["executor"], yaml.safe_load(patch["patch"]))
    pod = patched["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    assert "nvidia.com/gpu" not in agent["resources"].get("limits", {})
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in agent["env"] and pod["runtimeClassName"] == "nvidia"


def test_executor_limits_each_workload_not_the_pod(workloads: dict[str, dict[str, Any]]) -> None:
    """Issue 30 items 3 and 5: each workload's cgroup nests under the agent's, in the host's
    hierarchy mounted writable; the pod sets no memory limit that would cap all of them together."""
    pod = workloads["executor"]["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    assert "memory" not in agent["resources"].get("limits", {})
    env = {e["name"]: e.get("value") for e in agent["env"]}
    root = env["HIVEMUX_EXECUTOR_CGROUP_ROOT"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in agent["volumeMounts"] if m["mountPath"] == root]
    assert volumes[mount["name"]]["hostPath"]["path"] == "/sys/fs/cgroup" and not mount.get("readOnly", False)


# -- HIVEMUX_* variables are settings --------------------------------------------------------


def settings_classes() -> list[type[BaseSettings]]:
    """The settings classes the services read: those their modules use, and the bus and infra
    settings every entry point reads."""
    from hivemux.infra import InfraSettings
    from hivemux.settings import ServiceSettings

    found: dict[str, type[BaseSettings]] = {"infra": InfraSettings, "service": ServiceSettings}
    for module_name in SERVICES.values():
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseSettings) and value is not BaseSettings:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def setting_names(cls: type[BaseSettings]) -> set[str]:
    """The environment variables one settings class reads (aliases, else prefix + field name)."""
    prefix = cls.model_config.get("env_prefix", "")
    names: set[str] = set()
    for field_name, field in cls.model_fields.items():
        alias = field.validation_alias or field.alias
        if isinstance(alias, str):
            names.add(alias.upper())
        elif isinstance(alias, AliasChoices):
            names |= {choice.upper() for choice in alias.choices if isinstance(choice, str)}
        else:
            names.add(f"{prefix}{field_name}".upper())
    return names


def known_settings() -> set[str]:
    names: set[str] = set()
    for cls in settings_classes():
        names |= setting_names(cls)
    return names


def compose_variables(compose: dict[str, Any]) -> dict[str, set[str]]:
    """HIVEMUX_* names set in each compose service's environment (a map or a KEY=VALUE list)."""
    out: dict[str, set[str]] = {}
    for name, spec in compose["services"].items():
        env = spec.get("environment") or {}
        keys = env.keys() if isinstance(env, dict) else [item.split("=", 1)[0] for item in env]
        out[name] = {k for k in keys if k.startswith("HIVEMUX_")}
    return out


def manifest_variables(k8s_docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """HIVEMUX_* names set by the manifests: containers' env, ConfigMap data, Secret stringData."""
    out: dict[str, set[str]] = {}
    for doc in k8s_docs:
        where = f"{doc['kind']}/{doc.get('metadata', {}).get('name', '')}"
        keys: list[str] = []
        if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            spec = doc["spec"]["template"]["spec"]
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                keys += [e["name"] for e in c.get("env", [])]
        keys += list((doc.get("data") or {}).keys()) + list((doc.get("stringData") or {}).keys())
        out[where] = {k for k in keys if k.startswith("HIVEMUX_")}
    return out


def test_the_settings_are_derived_from_the_classes() -> None:
    names = known_settings()
    assert {"HIVEMUX_EXECUTOR_BACKEND", "HIVEMUX_EXECUTOR_NODE_ID", "HIVEMUX_INSTANCE", "HIVEMUX_POSTGRES_DSN",
            "HIVEMUX_INGESTER_NODE_ID", "HIVEMUX_SCHEMAS_DIR"} <= names  # fmt: skip
    assert "HIVEMUX_NODE_ID" not in names


def test_every_hivemux_variable_in_compose_and_manifests_is_a_setting(compose: dict[str, Any],
                                                                         k8s_docs: list[dict[str, Any]]) -> None:
    names = known_settings()
    unknown = {
        (where, variable)
        for found in (compose_variables(compose), manifest_variables(k8s_docs))
        for where, variables in found.items()
        for variable in variables
        if variable not in names
    }
    assert not unknown, f"HIVEMUX_* variables no service reads: {sorted(unknown)}"


# -- the image ships libxcuda.so ------------------------------------------------------------


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str, str]]:
    """(stage, instruction, arguments) in order; continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    out: list[tuple[str, str, str]] = []
    stage = ""
    for index, line in enumerate(lines):
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            words = args.split()
            stage = words[2] if len(words) >= 3 and words[1].upper() == "AS" else f"stage-{index}"
        out.append((stage, instruction.upper(), args.strip()))
    return out


def test_the_image_builds_and_ships_the_xcuda_shim() -> None:
    from hivemux.xcuda.library import NATIVE_DIR

    steps = dockerfile_instructions()
    # a build stage copies the shim's sources (and the layout header its Makefile includes) and makes it
    make = [(stage, args) for stage, ins, args in steps if ins == "RUN" and re.search(r"make -C native/xcuda\b[^&]*libxcuda\.so", args)]
    assert make, "no RUN step makes native/xcuda's libxcuda.so"
    builder = make[0][0]
    target = re.search(r"make -C native/xcuda\b[^&]*?(\S*libxcuda\.so)", make[0][1]).group(1)  # type: ignore[union-attr]
    assert re.search(r"^\$\(OUT\)/libxcuda\.so:", (ROOT / "native/xcuda/Makefile").read_text(), re.M) and target == "build/libxcuda.so"
    copied = " ".join(args for stage, ins, args in steps if stage == builder and ins == "COPY")
    assert "native/xcuda" in copied and "libs/hivemux/xcuda/xcuda_layout.h" in copied
    # the final stage copies the built library from that stage and installs it where library_path() looks
    final = steps[-1][0]
    shipped = [args for stage, ins, args in steps if stage == final and ins == "COPY" and f"--from={builder}" in args]
    assert shipped and any("native/xcuda/build/libxcuda.so" in shlex.split(a)[1] for a in shipped), shipped
    installs = " ".join(args for stage, ins, args in steps if stage == final and ins == "RUN")
    assert "from hivemux.xcuda.library import NATIVE_DIR" in installs and "/build/libxcuda.so" in installs
    assert "library_path()" in installs  # checked at build time: the executor refuses to start without it
    assert NATIVE_DIR.name == "xcuda" and NATIVE_DIR.parent.name == "native"


def test_the_cell_allocator_mounts_a_valid_hived_configuration(k8s_docs: list[dict[str, Any]], workloads: dict[str, dict[str, Any]]) -> None:
    from hivemux.cells.config import parse_config

    (cells,) = [d for d in k8s_docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hivemux-cells"]
    parse_config(yaml.safe_load(cells["data"]["cells.yaml"]))
    (container,) = containers(workloads["cell-allocator"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "cells")
    assert env["HIVEMUX_ALLOCATOR_CONFIG"] == mount["mountPath"] + "/cells.yaml"


# -- signing keys (bus.signing): each service mounts its own private key and the keyring ------------

KEY_SCRIPT = K8S / "signing-keys.sh"


def compose_mounts(spec: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """A compose service's volumes (short syntax) by target: (source, read-only)."""
    out: dict[str, tuple[str, bool]] = {}
    for entry in spec.get("volumes", []):
        source, target, *mode = entry.split(":")
        out[target] = (source, mode == ["ro"])
    return out


def keygen_files(compose: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """What the one-shot `signing-keys` leaves in each volume: (volume, file in it) by what it
    copied there (a signer's name, or ``keyring``), read from its script and its mounts."""
    keygen = compose["services"]["signing-keys"]
    script = keygen["command"][-1].replace("$$", "$")
    volumes = {target: source for target, (source, _) in compose_mounts(keygen).items()}
    (loop,) = re.findall(r"for s in ([a-z -]+); do", script)
    copies = re.findall(r'install -m 0400 -o 10001 -g 10001 "/keys/all/\$s\.key" "(/keys/\$s/[a-z.]+)"', script)
    (keyring,) = re.findall(r"install -m 0444 /keys/all/keyring\.json (\S+)", script)
    assert len(copies) == 1, script
    out = {s: copies[0].replace("$s", s) for s in loop.split()} | {"keyring": keyring}
    return {signer: (volumes[str(Path(path).parent)], Path(path).name) for signer, path in out.items()}


def test_compose_makes_the_signing_keys_once_before_any_service_starts(compose: dict[str, Any], tmp_path: Path) -> None:
    from hivemux.bus.signing import signers, write_keys

    keygen = compose["services"]["signing-keys"]
    assert keygen["command"][:2] == ["sh", "-ec"] and keygen["restart"] == "no"
    script = keygen["command"][-1]
    assert script.startswith("python -m hivemux.bus.signing /keys/all\n"), script
    assert compose_mounts(keygen)["/keys/all"] == ("signing-keys", False)  # kept: a rerun reuses the keys
    # the files the script copies are those the signing CLI writes (run it)
    written = {name: path.name for name, path in write_keys(tmp_path).items()}
    assert set(written) == set(signers()) | {"keyring"}
    for signer in set(keygen_files(compose)) - {"keyring"}:
        assert written[signer] == f"{signer}.key", signer
    assert written["keyring"] == "keyring.json"
    for name, spec in hivemux_services(compose).items():
        assert spec["depends_on"]["signing-keys"]["condition"] == "service_completed_successfully", name
        assert "signing-keys" not in {source for source, _ in compose_mounts(spec).values()}, name  # nobody mounts them all


def test_compose_services_mount_their_own_key_and_the_keyring(compose: dict[str, Any]) -> None:
    made = keygen_files(compose)
    assert set(made) == set(SERVICES) | {"keyring"}  # a key for every service (cli's stays in signing-keys)
    assert len({volume for volume, _ in made.values()}) == len(made)  # a volume each
    for name, spec in hivemux_services(compose).items():
        principal = spec["command"][2]
        env, mounts = spec["environment"], compose_mounts(spec)
        for variable, signer in (("HIVEMUX_SIGNING_KEY", principal), ("HIVEMUX_KEYRING", "keyring")):
            path = Path(env[variable])
            assert mounts[str(path.parent)] == (made[signer][0], True), (name, variable)  # read-only
            assert path.name == made[signer][1], (name, variable)
        others = {volume for signer, (volume, _) in made.items() if signer not in (principal, "keyring")}
        assert not others & {source for source, _ in mounts.values()}, name  # no other service's key


def test_workloads_mount_their_own_key_and_the_keyring(workloads: dict[str, dict[str, Any]]) -> None:
    secrets_mounted: dict[str, str] = {}
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        key, keyring = Path(env["HIVEMUX_SIGNING_KEY"]["value"]), Path(env["HIVEMUX_KEYRING"]["value"])
        (key_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] in (str(key), str(key.parent))]
        (ring_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(keyring.parent)]
        assert key_mount["readOnly"] is True and ring_mount["readOnly"] is True, name
        secret = volumes[key_mount["name"]]["secret"]
        assert secret["defaultMode"] == 0o400, name
        assert volumes[ring_mount["name"]]["configMap"]["name"] == "hivemux-keyring", name
        assert keyring.name == "keyring.json", name
        if name == "executor":  # a key per node, its own picked by name: executor/<node> (signing-keys.md)
            assert secret["secretName"] == "hivemux-key-executor-nodes"
            assert key_mount["mountPath"] == str(key) and key_mount["subPathExpr"] == "$(HIVEMUX_EXECUTOR_NODE_ID).key"
            assert env["HIVEMUX_EXECUTOR_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        else:
            assert secret["secretName"] == f"hivemux-key-{name}", name
            assert key_mount["mountPath"] == str(key.parent) and key.name == "signing.key", name
            assert not {"subPath", "subPathExpr"} & set(key_mount), name
            # a Secret's files are root's: the pod's group (fsGroup) lets the service's uid read 0400 as 0440
            assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"], name
        keys = [v["secret"]["secretName"] for v in pod["volumes"] if v.get("secret", {}).get("secretName", "").startswith("hivemux-key-")]
        assert keys == [secret["secretName"]], name  # its own key only
        secrets_mounted[name] = secret["secretName"]
    assert len(set(secrets_mounted.values())) == len(secrets_mounted)


def test_signing_keys_script_creates_what_the_workloads_mount(workloads: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """deploy/kubernetes/signing-keys.sh, run with a kubectl that records what it would create."""
    import json
    import subprocess
    import sys

    from hivemux.bus.signing import Signer, load_keyring, load_private

    bin_dir, log = tmp_path / "bin", tmp_path / "created.jsonl"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" apply "*) cat >> "{log}" ;; *" get nodes "*) exit 3 ;;\n'
        f"  *) '{sys.executable}' -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" ;; esac\n"
    )
    kubectl.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": sys.executable, "EXECUTOR_NODES": "gpu-a gpu-b.example"}
    run = subprocess.run(["sh", str(KEY_SCRIPT), str(tmp_path / "keys")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    created: dict[tuple[str, str], dict[str, Path]] = {}
    for line in log.read_text().splitlines():
        args = json.loads(line)
        assert args[:3] == ["-n", "hivemux", "create"] and args[-3:] == ["--dry-run=client", "-o", "yaml"], args
        kind, name = (args[3], args[5]) if args[3] == "secret" else (args[3], args[4])
        files = [a.removeprefix("--from-file=").split("=", 1) for a in args if a.startswith("--from-file=")]
        created[(kind, name)] = {key: Path(path) for key, path in files}
    assert set(created) == {("secret", s) for s in (*(f"hivemux-key-{n}" for n in SERVICES if n != "executor"),
                                                    "hivemux-key-executor-nodes")} | {("configmap", "hivemux-keyring")}  # fmt: skip
    keyring = load_keyring(created[("configmap", "hivemux-keyring")]["keyring.json"])
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        secret = next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "signing-key")
        files = created[("secret", secret)]
        expected = {"signing.key": name} if name != "executor" else {f"{n}.key": f"executor/{n}" for n in ("gpu-a", "gpu-b.example")}
        assert set(files) == set(expected), name
        for file, signer in expected.items():
            keys = load_private(files[file])
            assert set(keys) == {signer}, (name, file)  # that principal's key alone
            source = f"{signer}/0" if "/" not in signer else signer
            (headers,) = Signer(keys).sign([("t", b"k", b"v", source)])
            assert keyring.prove("t", b"k", b"v", headers) == (signer, None), (name, file)
