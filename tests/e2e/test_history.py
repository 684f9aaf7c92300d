"""The embedded default keeps its history (issue 16 item 4), end to end with real processes:
`hivemux up` archives every topic into its PostgreSQL (data in the work directory); its broker
is SIGKILLed while jobs are being submitted, comes back and is refilled from the archive before
the services run again; every acknowledged job (acknowledged = the archive holds it, what
`jobs submit` waits for) is in `jobs list`, the jobs listed before the kill are listed after, and
`hivemux audit replay` is identical. Then `up` is started again on the same work directory and
the jobs are still there."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hivemux.bus import Publisher
from hivemux.bus.codec import encode_value
from hivemux.cli.jobfile import parse_jobs
from hivemux.store.archive import unarchived
from hivemux.topics import topic_for

pytestmark = pytest.mark.e2e
HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]
JOBS = """
jobs:
  - {job_id: hist-offline-a, vc: vc-a, kind: offline, workload: {model: vgg16, batch_size: 16, iterations: 100000}}
  - {job_id: hist-training, vc: vc-a, kind: training, pods: 1, gpus_per_pod: 2, workload: {model: bert, batch_size: 32, iterations: 100000}}
"""
STREAM = 40  # jobs submitted one by one around the kill


class Up:
    def __init__(
        self, workdir: Path, jobs: Path, duration: int, env: dict[str, str]
    ) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [*HIVEMUX, "up", "--duration", str(duration), "--jobs", str(jobs), "--workdir", str(workdir),
             "--summary", str(workdir.parent / f"summary-{workdir.name}-{time.monotonic_ns()}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.summary_path = Path(self.process.args[-1])  # type: ignore[index]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float, after: int = 0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, line in enumerate(self.lines[after:], after):
                if text in line:
                    return i
            if self.process.poll() is not None and not any(
                text in line for line in self.lines[after:]
            ):
                break
            time.sleep(0.2)
        self.process.kill()
        pytest.fail(f"no {text!r} from hivemux up:\n" + "\n".join(self.lines[-80:]))

    def endpoint(self, name: str) -> str:
        return next(
            line.split("=", 1)[1] for line in self.lines if line.startswith(name + "=")
        )


def jobs_list(env: dict[str, str]) -> dict[str, dict[str, object]]:
    out = subprocess.run(
        [*HIVEMUX, "jobs", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    # what a job is (its state moves on while the system runs)
    return {
        r["job_id"]: {
            k: r.get(k) for k in ("vc", "kind", "pods", "gpus", "submitted_at")
        }
        for r in rows
    }


def submit_stream(
    path: Path, bootstrap: str, dsn: str, acknowledged: list[str], stop: threading.Event, lost: list[str]
) -> None:
    """Submit jobs one by one as `jobs submit` does; a job counts as acknowledged once the archive
    holds it, and is submitted again (same event, same id) when it does not: `lost` gets the
    jobs the broker acknowledged and the archive never held (the window of a dying broker)."""

    async def run() -> None:
        async with Publisher(bootstrap, source="cli") as publisher:
            for job in parse_jobs(path, source="cli"):
                while not stop.is_set():
                    try:
                        [meta] = await asyncio.wait_for(
                            publisher.publish_all([job]), timeout=20
                        )
                    except Exception:
                        continue
                    record = (
                        topic_for(job).name,
                        meta.partition,
                        meta.offset,
                        encode_value(job),
                    )
                    if await unarchived(dsn, [record], timeout_s=10) == []:
                        acknowledged.append(job.job_id)
                        break
                    lost.append(job.job_id)
                await asyncio.sleep(0.1)

    asyncio.run(run())


def test_a_killed_broker_and_a_restarted_up_keep_every_acknowledged_job(
    tmp_path: Path,
) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    stream = tmp_path / "stream.yaml"
    stream.write_text("jobs:\n" + "".join(
        f"  - {{job_id: hist-{i:03d}, vc: vc-{'ab'[i % 2]}, kind: offline, workload: {{model: resnet50, batch_size: 32, iterations: 100000}}}}\n"
        for i in range(STREAM)
    ))  # fmt: skip
    # not under pytest's tmp dir: another pytest session makes /tmp/pytest-of-<user> 0700 again,
    # which the embedded PostgreSQL (another user when we are root) then cannot traverse
    workdir = Path(tempfile.mkdtemp(prefix="hivemux-history-")) / "work"
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KAFKA_BOOTSTRAP_SERVERS", "HIVEMUX_POSTGRES_DSN")
    }
    base |= {"HIVEMUX_MATCHER_INTERVAL_S": "2", "HIVEMUX_INGESTER_INTERVAL_S": "1"}

    up = Up(workdir, jobs, 150, base)
    up.wait_for("submitted 2 jobs", 150)
    env = base | {
        "KAFKA_BOOTSTRAP_SERVERS": up.endpoint("KAFKA_BOOTSTRAP_SERVERS"),
        "HIVEMUX_POSTGRES_DSN": up.endpoint("HIVEMUX_POSTGRES_DSN"),
    }
    acknowledged: list[str] = []
    lost: list[str] = []
    stop = threading.Event()
    submitter = threading.Thread(
        target=submit_stream,
        args=(
            stream,
            env["KAFKA_BOOTSTRAP_SERVERS"],
            env["HIVEMUX_POSTGRES_DSN"],
            acknowledged,
            stop,
            lost,
        ),
    )
    submitter.start()
    try:
        deadline = time.monotonic() + 60
        while len(acknowledged) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = jobs_list(env)
        tansu = json.loads((workdir / "supervisor.json").read_text())["tansu"]["pid"]
        os.kill(tansu, signal.SIGKILL)
        killed_at = time.monotonic()
        mark = up.wait_for("history: restored", 60, after=len(up.lines))
        restored_after = time.monotonic() - killed_at
        up.wait_for("history: archiver running again", 30, mark)
        submitter.join(120)
    finally:
        stop.set()
    assert sorted(acknowledged) == [f"hist-{i:03d}" for i in range(STREAM)]

    expected = set(before) | set(acknowledged) | {"hist-offline-a", "hist-training"}
    deadline = time.monotonic() + 90
    while set(after := jobs_list(env)) != expected and time.monotonic() < deadline:
        time.sleep(1)
    assert set(after) == expected
    assert {job: after[job] for job in before} == before
    replay = subprocess.run(
        [*HIVEMUX, "audit", "replay"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "identical" in replay.stdout
    final = jobs_list(env)

    up.process.send_signal(signal.SIGTERM)
    up.process.wait(timeout=90)
    output = "\n".join(up.lines)
    assert up.process.returncode == 0, output
    summary = json.loads(up.summary_path.read_text())
    history = summary["history"]
    restore = history["restores"][-1]
    print(f"\nbroker SIGKILLed: restored {restore['records']} records of {restore['partitions']} partitions in "
          f"{restore['seconds']} s ({restored_after:.1f} s after the kill); archive: {history['archive']}; "
          f"projector ahead of the archive: {restore['projector_ahead']}; broker-acknowledged submissions "
          f"the archive never got (published again): {lost}")  # fmt: skip
    print("\n".join(line for line in up.lines if line.startswith(("history:", "supervisor:", "History:"))))
    assert restore["records"] > 0
    assert history["archiver_error"] is None

    again = Up(workdir, jobs, 40, base)
    again.wait_for("resumed the history", 150)
    env = base | {
        "KAFKA_BOOTSTRAP_SERVERS": again.endpoint("KAFKA_BOOTSTRAP_SERVERS"),
        "HIVEMUX_POSTGRES_DSN": again.endpoint("HIVEMUX_POSTGRES_DSN"),
    }
    assert jobs_list(env) == final
    again.process.send_signal(signal.SIGTERM)
    again.process.wait(timeout=90)
    line = next(line for line in again.lines if line.startswith("history: restored"))
    print(f"up started again on its work directory: {line}")
    shutil.rmtree(workdir.parent, ignore_errors=True)
