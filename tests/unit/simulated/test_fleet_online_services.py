"""The simulated fleet serves the online services submitted as jobs where their replicas were
bound (issue 19): telemetry's ``online_workload`` follows the ``start_online`` commands the
ingester folds (`telemetry.offline.OnlineServices`), not a fixed list of serving nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.fleet import FleetSpec, OfflineLoad, SimulatedFleet
from hivemux.simulated.telemetry_source import SimulatedBackend
from hivemux.telemetry.offline import OnlineServices

AT = datetime(2026, 3, 2, 20, 0, tzinfo=UTC)
SERVICE = WorkloadSpec(model="bert", batch_size=8, iterations=1, slo_p99_ms=50, request_rate=100)


def command(action: CommandAction, job: str, node: str, gpus: tuple[str, ...] = ()) -> ExecutorCommand:
    return ExecutorCommand(occurred_at=AT, source="cell-allocator/0", node_id=node, action=action, job_id=job, gpu_ids=gpus,
                           workload=SERVICE if action is CommandAction.START_ONLINE else None)


def test_without_serving_nodes_only_bound_replicas_serve() -> None:
    fleet = SimulatedFleet(FleetSpec(serving_nodes=0, hot_gpus=0))
    gpus, nodes = fleet.sample(AT)
    assert all(g.online_workload is None and g.sm_activity == 0.0 for g in gpus)
    online = {"node-01/gpu-2": "svc-a", "node-03/gpu-0": "svc-b"}
    gpus, nodes = fleet.sample(AT, online=online)
    serving = {g.gpu_id: g.online_workload for g in gpus if g.online_workload}
    assert serving == online
    assert all(g.sm_activity > 0 and g.memory_used_mib > 0 for g in gpus if g.gpu_id in online)
    assert {n.node_id: n.online_workloads for n in nodes if n.online_workloads} == {"node-01": ("svc-a",), "node-03": ("svc-b",)}
    # a pure function of its inputs: the same instant and map give the same readings
    assert fleet.sample(AT, online=online) == SimulatedFleet(FleetSpec(serving_nodes=0, hot_gpus=0)).sample(AT, online=online)


def test_a_submitted_service_shares_its_gpu_like_a_fixed_one() -> None:
    fleet = SimulatedFleet(FleetSpec(serving_nodes=0, hot_gpus=0))
    load = OfflineLoad("off-1", solo_profile("resnet50", 32, "T4"), 60.0)
    [gpu] = [g for g in fleet.sample(AT, {"node-00/gpu-1": load}, {"node-00/gpu-1": "svc-a"})[0] if g.gpu_id == "node-00/gpu-1"]
    alone = fleet.online_sm_activity("node-00/gpu-1", AT, {"node-00/gpu-1": "svc-a"})
    assert gpu.online_workload == "svc-a" and gpu.offline_workloads == ("off-1",) and gpu.sm_activity > alone


def test_fixed_services_keep_their_gpus() -> None:
    fleet = SimulatedFleet(FleetSpec(serving_nodes=1, hot_gpus=0))
    gpus, _ = fleet.sample(AT, online={"node-00/gpu-0": "svc-a", "node-02/gpu-0": "svc-b"})
    names = {g.gpu_id: g.online_workload for g in gpus}
    assert names["node-00/gpu-0"].startswith("infer-") and names["node-02/gpu-0"] == "svc-b"


def test_the_ingester_fold_follows_start_online_stop_and_reports() -> None:
    fold = OnlineServices()
    fold.on_command(command(CommandAction.START_ONLINE, "svc-a", "node-00", ("node-00/gpu-0",)))
    fold.on_command(command(CommandAction.START_ONLINE, "svc-a", "node-01", ("node-01/gpu-0",)))
    start_b = command(CommandAction.START_ONLINE, "svc-b", "node-01", ("node-01/gpu-1",))
    fold.on_command(start_b)
    svc_b = str(start_b.event_id)
    assert fold.by_gpu == {"node-00/gpu-0": "svc-a", "node-01/gpu-0": "svc-a", "node-01/gpu-1": "svc-b"}
    fold.on_command(command(CommandAction.STOP, "svc-a", "node-00"))  # one node's replica stops
    assert fold.by_gpu == {"node-01/gpu-0": "svc-a", "node-01/gpu-1": "svc-b"}
    fold.on_report(ExecutorReport(occurred_at=AT, source="executor/node-01", node_id="node-01", job_id="svc-b", command_id=svc_b,
                                  state=ReportState.EVICTED))
    assert fold.by_gpu == {"node-01/gpu-0": "svc-a"}
    # a resize: the old replica's stop reported after the new replica's start on the same node ends only the old one
    old = fold.start_of["node-01/gpu-0"]
    fold.on_command(command(CommandAction.STOP, "svc-a", "node-01"))
    fold.on_command(command(CommandAction.START_ONLINE, "svc-a", "node-01", ("node-01/gpu-3",)))
    fold.on_report(ExecutorReport(occurred_at=AT, source="executor/node-01", node_id="node-01", job_id="svc-a", command_id=old,
                                  state=ReportState.STOPPED))
    assert fold.by_gpu == {"node-01/gpu-3": "svc-a"}
    backend = SimulatedBackend(SimulatedFleet(FleetSpec(serving_nodes=0, hot_gpus=0)), {}, fold.by_gpu)
    assert {g.gpu_id for g in backend.read(AT + timedelta(seconds=1)) if g.online_workload == "svc-a"} == {"node-01/gpu-3"}


def test_real_gpus_readings_are_stamped_with_the_service_bound_there() -> None:
    """NVML and dcgm-exporter cannot name a service: the fold stamps the one the executors serve."""
    from hivemux.telemetry.readings import GpuReading

    def reading(gpu: str, online: str | None = None) -> GpuReading:
        return GpuReading(gpu_id=gpu, node_id="node-00", gpu_type="T4", gpu_util=10.0, memory_used_mib=100.0, memory_total_mib=15360.0,
                          sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0, sm_activity=10.0, sm_occupancy=5.0, power_w=30.0,
                          temperature_c=40.0, online_workload=online)

    fold = OnlineServices()
    readings = [reading("node-00/gpu-0"), reading("node-00/gpu-1"), reading("node-00/gpu-2", "named-by-device")]
    assert fold.stamp(readings) == readings
    fold.on_command(command(CommandAction.START_ONLINE, "svc-a", "node-00", ("node-00/gpu-0", "node-00/gpu-2")))
    assert [r.online_workload for r in fold.stamp(readings)] == ["svc-a", None, "named-by-device"]


def test_a_stop_naming_a_replicas_gpu_takes_off_that_replica_only() -> None:
    """A resize's stop names the removed replica's GPUs: the service's other replica on the node serves on."""
    fold = OnlineServices()
    for gpu in ("node-00/gpu-0", "node-00/gpu-1"):
        fold.on_command(command(CommandAction.START_ONLINE, "svc-a", "node-00", (gpu,)))
    fold.on_command(command(CommandAction.STOP, "svc-a", "node-00", ("node-00/gpu-1",)))
    assert fold.by_gpu == {"node-00/gpu-0": "svc-a"} and set(fold.start_of) == {"node-00/gpu-0"}
    fold.on_command(command(CommandAction.STOP, "svc-a", "node-00"))  # a cancel's stop: the node's every replica
    assert fold.by_gpu == {}
