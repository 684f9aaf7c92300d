"""`hivemux.executor.workload` and the progress protocol (`hivemux.workloads.progress`)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from hivemux.events import CommandAction, ExecutorCommand, JobState, ReportState, WorkloadSpec, derived_id
from hivemux.executor.launch import WorkloadFiles
from hivemux.executor.mps_control import MpsCheck
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload, report
from hivemux.workloads.progress import ProgressReader, ProgressWriter

AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def test_reader_returns_complete_lines_once(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    reader = ProgressReader(path)
    assert reader.read() == []  # no file yet
    ProgressWriter(path).write("progress", iteration=5, total=10)
    with open(path, "a") as f:
        f.write('{"event": "progress", "iter')  # a line cut short (the writer died mid-line)
    [line] = reader.read()
    assert (line["event"], line["iteration"]) == ("progress", 5)
    with open(path, "a") as f:
        f.write('ation": 6, "total": 10, "t": 1.0}\nnot json\n[1]\n')
    assert [(x["event"], x["iteration"]) for x in reader.read()] == [("progress", 6)]
    assert reader.read() == []


def workload(tmp_path: Path) -> Workload:
    command = ExecutorCommand(
        occurred_at=AT, source="t", node_id="n", action=CommandAction.START_OFFLINE, job_id="j", gpu_ids=("n/gpu-0",),
        sm_share=30.0, workload=WorkloadSpec(model="m", batch_size=1, iterations=100),
    )  # fmt: skip
    return Workload("j", "offline", ("n/gpu-0",), WorkloadFiles(tmp_path), command, sm_share=30.0, total=100)


def test_absorb_follows_progress_checkpoints_and_relaunches(tmp_path: Path) -> None:
    w = workload(tmp_path)
    w.absorb([
        {"event": "start", "t": 1.0, "iteration": 0, "resumed_from": None},
        {"event": "progress", "t": 3.0, "iteration": 20},
        {"event": "checkpoint", "t": 3.0, "iteration": 20},
        {"event": "progress", "t": 5.0, "iteration": 40},
        {"event": "cuda_error", "t": 5.0, "code": 700},
    ], now=6.0, gpu_alone=False)  # fmt: skip
    assert (w.iteration, w.checkpoint, w.cuda_error, w.throughput()) == (40, 20, 700, 10.0)
    w.absorb([{"event": "start", "t": 9.0, "iteration": 20}], now=9.0, gpu_alone=False)  # relaunched from 20
    assert (w.iteration, w.throughput(), len(w.points)) == (20, 0.0, 1)
    w.absorb([{"event": "done", "t": 10.0, "iteration": 100}], now=10.0, gpu_alone=False)
    assert w.done and w.iteration == 100


def test_online_latency_baseline_is_taken_only_while_alone(tmp_path: Path) -> None:
    w = workload(tmp_path)
    w.absorb([{"event": "latency", "t": 1.0, "requests": 5, "mean_ms": 9.0}], now=1.0, gpu_alone=False)
    assert w.solo_latency_ms is None and list(w.latencies) == [(1.0, 9.0)]
    w.absorb([{"event": "latency", "t": 2.0, "requests": 5, "mean_ms": 4.0},
              {"event": "latency", "t": 3.0, "requests": 5, "mean_ms": 5.0}], now=3.0, gpu_alone=True)
    assert w.solo_latency_ms == 4.0


def test_report_ids_derive_from_cause_step_and_launch(tmp_path: Path) -> None:
    w = workload(tmp_path)
    cause = derived_id("evict")

    def make(**kw: object) -> object:
        return report(w, node_id="n", source="executor/t", cause=cause, at=AT, **kw).event_id  # type: ignore[arg-type]

    assert make(state=ReportState.RUNNING, step="sigterm") == make(state=ReportState.RUNNING, step="sigterm")
    assert make(state=ReportState.RUNNING, step="sigterm") != make(state=ReportState.RUNNING, step="killed")
    first = make(state=ReportState.EVICTED)
    w.launches += 1
    assert make(state=ReportState.EVICTED) != first
    r = report(w, node_id="n", source="s", cause=cause, at=AT, state=ReportState.RUNNING, mps_server="hung")
    assert (r.mps_server, r.sm_share, r.command_id, r.step) == ("hung", 30.0, str(w.command.event_id), None)  # type: ignore[union-attr]


def test_node_workloads_read_forget_and_mps_clients(tmp_path: Path) -> None:
    table = NodeWorkloads(clock=lambda: 7.0)
    offline = workload(tmp_path / "a")
    training = Workload("t", "training", ("n/gpu-0",), WorkloadFiles(tmp_path / "t"), None)
    online = Workload("svc", "online", ("n/gpu-0",), WorkloadFiles(tmp_path / "o"), None)
    other_gpu = Workload("b", "offline", ("n/gpu-1",), WorkloadFiles(tmp_path / "b"), None)
    table.jobs.update({"j": offline, "t": training, "b": other_gpu})
    table.online["n/gpu-0"] = online
    assert table.mps_clients(0) == []  # nothing launched yet: no process to terminate
    for w in (offline, training, online, other_gpu):
        w.proc = object()  # type: ignore[assignment]
    assert table.mps_clients(0) == [offline, online]  # training pods are not MPS clients
    offline.done = True
    assert table.mps_clients(0) == [online]

    path = tmp_path / "o" / "progress.jsonl"
    path.parent.mkdir(parents=True)
    ProgressWriter(path).write("latency", requests=3, mean_ms=8.0)
    online.reader = ProgressReader(path)
    table.read_progress(online)  # offline work runs on gpu-0: not a solo baseline
    assert online.solo_latency_ms is None and online.latencies[-1][1] == 8.0
    table.forget(offline)
    assert "j" not in table.jobs and offline.control is None


def test_reporter_binds_node_source_and_clock(tmp_path: Path) -> None:
    w = workload(tmp_path)
    reporter = Reporter("n", "executor/t", clock=lambda: AT.timestamp())
    cause = derived_id("evict")
    r = reporter.report(w, cause, ReportState.RUNNING, reporter.at(), step="mps_checked", mps=MpsCheck("crashed", (), "gone"))
    assert r == report(w, node_id="n", source="executor/t", cause=cause, state=ReportState.RUNNING, at=AT,
                       step="mps_checked", mps_server="crashed")  # fmt: skip
    life = reporter.lifecycle(w, cause, JobState.EVICTED, AT, "x" * 5000)
    assert (life.node_id, life.source, life.occurred_at, life.gpu_ids) == ("n", "executor/t", AT, ("n/gpu-0",))
    assert len(life.reason) < 5000  # clipped to the event's limit
