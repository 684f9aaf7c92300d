"""The node agent's side of log shipping (`hivemux.executor.log_shipping`): real log files in a
temporary work root, no process: what is appended is shipped once, a restarted agent goes on
where the last one stopped, an ended workload's last bytes go out, and the pod index comes from
the job's binding."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from hivemux.events import CellBinding, Priority
from hivemux.executor.launch import workload_files
from hivemux.executor.log_shipping import LogShipper, pod_index
from hivemux.executor.workload import Reporter, Workload
from hivemux.jobs.log_bound import LogBound

NODE = "node-00"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def shipper(bound: LogBound = LogBound(head_bytes=1024, tail_bytes=1024, chunk_bytes=8)) -> LogShipper:
    return LogShipper(bound, Reporter(NODE, f"executor/{NODE}", lambda: T0.timestamp()), lambda w: 3)


def workload(tmp_path: Path, job: str = "job-1") -> Workload:
    files = workload_files(tmp_path, job).create()
    return Workload(job, "training", (f"{NODE}/gpu-0",), files, None)


def test_what_is_appended_is_shipped_once_and_an_ended_workload_gets_its_last_bytes(tmp_path: Path) -> None:
    w, logs = workload(tmp_path), shipper()
    assert logs.ship([w]) == []  # no log yet
    w.files.log.write_bytes("hello wörld\npartial €".encode()[:-1])  # the euro sign not written whole yet
    first = logs.ship([w])
    assert "".join(c.text for c in first) == "hello wörld\npartial " and all(c.length <= 8 and c.pod == 3 for c in first)
    assert logs.ship([w]) == []
    with w.files.log.open("ab") as f:
        f.write("€".encode()[-1:] + b" tail")
    last = logs.ship([])  # the workload has left the table: a last look, then the stream is forgotten
    assert "".join(c.text for c in last) == "€ tail" and last[0].offset == first[-1].offset + first[-1].length
    assert logs.streams == {} and (last[-1].job_id, last[-1].node_id, last[-1].source) == ("job-1", NODE, f"executor/{NODE}")


def test_a_restarted_agent_goes_on_where_the_last_one_stopped(tmp_path: Path) -> None:
    w = workload(tmp_path)
    w.files.log.write_bytes(b"first\n")
    before = shipper().ship([w])
    with w.files.log.open("ab") as f:
        f.write(b"second\n")
    after = shipper().ship([w])  # a new agent: its cursor file says where to go on
    assert [c.text for c in after] == ["second\n"] and after[0].offset == 6
    assert {c.event_id for c in before}.isdisjoint({c.event_id for c in after})


def test_a_burst_past_the_bound_keeps_head_and_tail(tmp_path: Path) -> None:
    w, logs = workload(tmp_path), shipper(LogBound(head_bytes=8, tail_bytes=8, chunk_bytes=8))
    w.files.log.write_bytes(b"HEADHEAD" + b"x" * 1000 + b"TAILTAIL")
    made = logs.ship([w])
    assert [(c.offset, c.text) for c in made] == [(0, "HEADHEAD"), (1008, "TAILTAIL")]


def test_the_pod_index_comes_from_the_binding_on_this_node_and_gpus() -> None:
    def bound(pod: str, node: str, gpu: str) -> CellBinding:
        return CellBinding(occurred_at=T0, source="cell-allocator/t", job_id="j", vc="vc", state="bound", pod=pod,
                           priority=Priority.GUARANTEED, node_ids=(node,), gpu_ids=(gpu,), reason="test")  # fmt: skip

    pods = {"j/0": bound("j/0", "node-01", "node-01/gpu-0"), "j/2": bound("j/2", NODE, f"{NODE}/gpu-1"),
            "j/1": bound("j/1", NODE, f"{NODE}/gpu-0")}  # fmt: skip
    assert pod_index(pods, NODE, [f"{NODE}/gpu-1"]) == 2
    assert pod_index(pods, NODE, [f"{NODE}/gpu-0", f"{NODE}/gpu-1"]) == 1
    assert pod_index(pods, NODE, [f"{NODE}/gpu-7"]) == 0 and pod_index({}, NODE, []) == 0
