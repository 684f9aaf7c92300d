"""The simulated executor's workload output (issue 29 item 6, `hivemux.executor.simulated_logs`):
its workloads print their start, progress, latency windows and end; the lines are shipped on
``jobs.logs`` through the process agent's bounded path (the same chunks as from a file of the
same bytes), one stream per pod on its node, continued when the pod runs there again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from hivemux.events import CommandAction, ExecutorCommand, JobLogChunk, WorkloadSpec, derived_id
from hivemux.executor.launch import workload_files
from hivemux.executor.log_shipping import LogShipper
from hivemux.executor.simulated_logs import SimulatedLogs
from hivemux.executor.simulated_node import SimulatedExecutor
from hivemux.executor.workload import Reporter, Workload
from hivemux.jobs.log_bound import LogBound
from test_simulated_node import NODE, T0, at, evict, start_offline, start_training


def tick(ex: SimulatedExecutor, seconds: float) -> list:  # type: ignore[type-arg]
    """What the backend's tick returns at ``at(seconds)``: the workloads advanced, then their output shipped."""
    return [*ex.advance(at(seconds)), *ex.logs.ship(at=at(seconds))]


def chunks(events: list) -> list[JobLogChunk]:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, JobLogChunk)]


def text(events: list, job_id: str, pod: int = 0) -> str:  # type: ignore[type-arg]
    return "".join(c.text for c in sorted(chunks(events), key=lambda c: c.offset) if c.job_id == job_id and c.pod == pod)


def test_a_training_job_prints_its_start_progress_and_end() -> None:
    ex = SimulatedExecutor(source="executor/0")
    command = start_training(NODE, iterations=100).model_copy(update={"pod": 1})
    out = ex.handle(command, now=at(0))
    for seconds in range(1, 60):
        out += tick(ex, seconds)
    printed = text(out, "train-1", pod=1)
    lines = printed.splitlines()
    assert lines[0].endswith("training bert (batch 32), 100 iterations on node-00 node-00/gpu-0, node-00/gpu-1 "
                             "[a simulated workload: no process runs]")  # fmt: skip
    assert lines[0].startswith(T0.strftime("%Y-%m-%dT%H:%M:%SZ"))  # stamped with the workload's clock
    assert any("iteration " in line and "it/s" in line for line in lines[1:-1])
    assert lines[-1].endswith("done: 100 iterations")
    assert {(c.node_id, c.source, c.pod) for c in chunks(out)} == {(NODE, f"executor/{NODE}", 1)}  # the node's agent speaks
    assert ex.logs.streams == {}  # ended and shipped: forgotten
    assert not chunks(tick(ex, 61))


def test_progress_is_printed_every_ten_seconds_of_the_workloads_clock() -> None:
    ex = SimulatedExecutor(source="executor/0")
    out = ex.handle(start_offline(iterations=10**6), now=at(0))
    for seconds in range(1, 31):
        out += tick(ex, seconds)
    progress = [line for line in text(out, "offline-a").splitlines() if "iteration " in line]
    assert len(progress) == 3 and "normalized throughput" in progress[0]  # at 10, 20 and 30 s


def test_a_stopped_job_says_why_and_a_new_run_goes_on_in_its_stream() -> None:
    ex = SimulatedExecutor(source="executor/0")
    out = ex.handle(start_offline(iterations=10**6), now=T0)
    out += tick(ex, 0.5)
    out += ex.handle(evict(), now=at(1)) + tick(ex, 2)
    first = text(out, "offline-a")
    assert first.splitlines()[-1].endswith("evicted at iteration 3: GPU turned Overlimit")
    placed_again = start_offline(iterations=10**6).model_copy(update={"event_id": derived_id("placed again")})
    again = ex.handle(placed_again, now=at(3)) + tick(ex, 4)
    [resumed, *_] = chunks(again)
    assert resumed.offset == len(first.encode())  # the pod's stream on this node goes on, as a relaunch's log file


def test_a_service_prints_its_latency_windows() -> None:
    ex = SimulatedExecutor(source="executor/0", latency_window_s=5.0)
    serve = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.START_ONLINE, job_id="svc",
                            gpu_ids=(f"{NODE}/gpu-1",), pod=2,
                            workload=WorkloadSpec(model="bert", batch_size=8, iterations=1, slo_p99_ms=50, request_rate=100))  # fmt: skip
    out = ex.handle(serve, now=T0)
    for seconds in range(1, 12):
        out += tick(ex, seconds)
    lines = text(out, "svc", pod=2).splitlines()
    assert "service bert (batch 8), serving at 100 req/s on node-00 node-00/gpu-1" in lines[0]
    assert [line.split(" ", 1)[1].split(" ms")[0].startswith("p99") for line in lines[1:]] == [True, True]
    assert all("(SLO 50 ms)" in line for line in lines[1:])


def test_the_bound_is_the_process_agents_same_chunks_as_from_a_file(tmp_path: Path) -> None:
    """30 bytes through `SimulatedLogs` and through `LogShipper` over a file of the same bytes,
    under one tight bound: the same chunks (offsets, texts, ids)."""
    bound = LogBound(head_bytes=10, tail_bytes=8, chunk_bytes=4)
    logs = SimulatedLogs(bound, lambda node: f"executor/{node}")
    logs.write(NODE, "job-1", 0, "x" * 7, at=T0)  # "2026-03-02T12:00:00Z xxxxxxx\n": 29 bytes
    logs.write(NODE, "job-1", 0, "yz", at=T0 + timedelta(seconds=1))
    simulated = logs.ship(at=T0)
    files = workload_files(tmp_path, "job-1").create()
    files.log.write_bytes(f"{T0:%Y-%m-%dT%H:%M:%SZ} {'x' * 7}\n{T0 + timedelta(seconds=1):%Y-%m-%dT%H:%M:%SZ} yz\n".encode())
    w = Workload("job-1", "training", (f"{NODE}/gpu-0",), files, None)
    from_file = LogShipper(bound, Reporter(NODE, f"executor/{NODE}", lambda: T0.timestamp()), lambda _: 0).ship([w])
    assert [(c.offset, c.text, c.event_id) for c in simulated] == [(c.offset, c.text, c.event_id) for c in from_file]
    assert len(logs.streams[(NODE, "job-1", 0)].data) == 0  # nothing kept once shipped (the middle was dropped)
    logs.write(NODE, "job-1", 0, "z" * 100, at=T0)  # past the head: only the tail is kept until the next look
    assert len(logs.streams[(NODE, "job-1", 0)].data) == bound.tail_bytes
