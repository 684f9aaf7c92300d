"""Issue 29's "Done when", as one run on this machine: your own work through hivemux, for real.

    .venv/bin/python examples/process_mode/scenario.py [--workdir DIR] [--keep]

What it does (every step through the CLI a user has; nothing is mocked):

1. `hivemux up --executor process --devices cpu` on a cell configuration of five one-device nodes
   (`cells.yaml` below: node-00 serving, node-01..04 two pairs of vc-a's): every node gets its own
   executor agent and NVML ingester (CPU devices), the agents share one checkpoint store;
2. `hivemux jobs submit` of the user's own HTTP inference server (`examples/inference_server`,
   an online service: PORT, readiness on /healthz, p99 from its own Prometheus histogram) and of a
   2-node torch.distributed training gang (`examples/distributed_training/train.py`: gloo
   all-reduce, checkpoints in the store), opportunistic in vc-a, side by side;
3. the load generator drives the service; `jobs describe` must show its p99 from its histogram;
4. `jobs logs` of the gang must show both ranks' output;
5. a guaranteed job `hold` (``max_runtime_s: 45``) takes the other pair, a guaranteed `urgent`
   takes the gang's pair: HiveD preempts the gang (its pods evicted gracefully: they checkpoint);
   `hold` ends ``timed_out`` past its max runtime, which frees its pair, and the gang is bound
   there: it must resume from its checkpoints on those other nodes (its log says at which step);
6. everything is cancelled and `hivemux up` stopped.

Each check prints PASS or FAIL with what it saw; the exit code is the number of FAILs. The machine
is small and shared: the timeouts are generous (a run takes about 5 to 10 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
CELLS = """
physicalCluster:
  cellTypes:
    T4-NODE: {childCellType: T4, childCellNumber: 1, isNodeLevel: true}
    T4-PAIR: {childCellType: T4-NODE, childCellNumber: 2}
    T4-SERVE-NODE: {childCellType: T4, childCellNumber: 1, isNodeLevel: true}
  physicalCells:
  - {cellType: T4-SERVE-NODE, cellAddress: node-00}
  - cellType: T4-PAIR
    cellChildren: [{cellAddress: node-01}, {cellAddress: node-02}]
  - cellType: T4-PAIR
    cellChildren: [{cellAddress: node-03}, {cellAddress: node-04}]
virtualClusters:
  vc-a:
    virtualCells:
    - {cellType: T4-SERVE-NODE, cellNumber: 1}
    - {cellType: T4-PAIR, cellNumber: 2}
"""
HOLD = "import time; print('holding two nodes', flush=True); time.sleep(3600)"


def jobs() -> dict[str, dict[str, Any]]:
    serve = [PYTHON, str(ROOT / "examples" / "inference_server" / "server.py")]
    train = [PYTHON, str(ROOT / "examples" / "distributed_training" / "train.py"), "--step-s", "0.2"]
    hold = {"model": "custom", "batch_size": 1, "iterations": 1, "command": [PYTHON, "-c", HOLD]}
    return {
        "svc": {"job_id": "svc", "vc": "vc-a", "kind": "online", "replicas": 1, "gpu_type": "T4",
                "workload": {"model": "mlp", "batch_size": 32, "slo_p99_ms": 250, "request_rate": 20, "command": serve,
                             "ports": [{"name": "METRICS_PORT"}], "readiness": {"http": "/healthz"},
                             "metrics": {"path": "/metrics", "histogram": "inference_request_duration_seconds"}}},
        "train": {"job_id": "train", "vc": "vc-a", "kind": "training", "pods": 2, "gpus_per_pod": 1, "priority": "opportunistic",
                  "workload": {"model": "custom", "batch_size": 1, "iterations": 1, "command": train}},
        "hold": {"job_id": "hold", "vc": "vc-a", "kind": "training", "pods": 2, "priority": "guaranteed", "priority_value": 100,
                 "max_runtime_s": 45, "workload": hold},
        "urgent": {"job_id": "urgent", "vc": "vc-a", "kind": "training", "pods": 2, "priority": "guaranteed", "priority_value": 100,
                   "workload": hold},
    }  # fmt: skip


class Scenario:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.results: list[tuple[str, bool, str]] = []
        self.up: subprocess.Popen[str] | None = None
        self.out = workdir / "up.out"
        self.env: dict[str, str] = {}

    # -- plumbing -------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def check(self, name: str, ok: bool, seen: str) -> bool:
        self.results.append((name, ok, seen))
        print(f"{'PASS' if ok else 'FAIL'}: {name}: {seen}", flush=True)
        return ok

    def until(self, what: str, probe: Callable[[], Any], timeout_s: float, every_s: float = 2.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.up is not None and self.up.poll() is not None:
                raise RuntimeError(f"hivemux up exited ({self.up.returncode}) while waiting for {what}:\n{self.out.read_text()[-3000:]}")
            found = probe()
            if found:
                return found
            time.sleep(every_s)
        return None

    def cli(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([PYTHON, "-m", "hivemux.cli.main", *args], env=self.env, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"hivemux {' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}")
        return done.stdout

    def describe(self, job: str) -> dict[str, Any]:
        return json.loads(self.cli("jobs", "describe", job, "--json"))

    def state(self, job: str) -> str:
        return str(self.describe(job)["state"])

    def nodes(self, job: str) -> list[str]:
        return sorted(n for pod in self.describe(job)["binding"].values() for n in pod.get("node_ids", []))

    def submit(self, name: str) -> None:
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps(jobs()[name]))
        self.say(self.cli("jobs", "submit", str(path)).strip())

    # -- the run --------------------------------------------------------------------------------
    def start(self) -> None:
        (self.workdir / "cells.yaml").write_text(CELLS)
        drop = ("KAFKA_BOOTSTRAP_SERVERS", "HIVEMUX_POSTGRES_DSN", "HIVEMUX_API_URL", "HIVEMUX_TOKEN", "HIVEMUX_SIGNING_KEY", "HIVEMUX_KEYRING")
        env = {k: v for k, v in os.environ.items() if k not in drop} | {"HIVEMUX_ALLOCATOR_CONFIG": str(self.workdir / "cells.yaml")}
        command = [PYTHON, "-m", "hivemux.cli.main", "up", "--executor", "process", "--devices", "cpu", "--workdir", str(self.workdir / "up")]
        self.say("$ " + " ".join(["hivemux", *command[3:]]))
        with self.out.open("w") as sink:
            self.up = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
        ready = self.until("services ready", lambda: "no job list given" in self.out.read_text(), 600, 1.0)
        text = self.out.read_text()
        if not ready:
            raise RuntimeError(f"hivemux up not ready in 600 s:\n{text[-3000:]}")
        printed = dict(line.split("=", 1) for line in text.splitlines() if line.startswith(("HIVEMUX_", "KAFKA_")) and "=" in line)
        self.env = env | printed
        self.say(next(line for line in text.splitlines() if "process executor on" in line))

    def run(self) -> None:
        self.start()
        self.submit("svc")
        self.submit("train")
        both = self.until("the service and the gang running", lambda: self.state("svc") == "running" and self.state("train") == "running", 300)
        first = self.nodes("train")
        self.check("a user's own inference server and a 2-node torch.distributed gang run side by side", bool(both) and len(set(first)) == 2,
                   f"svc {self.state('svc')}, train {self.state('train')} on {', '.join(first) or '-'}")

        endpoint = self.until("the service's endpoint", lambda: next(
            (r["endpoint"] for r in (self.describe("svc").get("service") or {}).get("replica_latency", []) if r.get("endpoint")), None), 120)
        if endpoint:
            self.say(f"load generator: 20 req/s for 20 s on http://{endpoint}/predict")
            subprocess.run([PYTHON, str(ROOT / "examples" / "inference_server" / "loadgen.py"), "--url", f"http://{endpoint}/predict",
                            "--rate", "20", "--duration", "20", "--connections", "2"], capture_output=True, text=True, timeout=120)  # fmt: skip
        p99 = self.until("its p99", lambda: (self.describe("svc").get("service") or {}).get("worst_p99_ms"), 120)
        latency = [line for line in self.cli("jobs", "describe", "svc").splitlines() if "p99" in line or "serving on" in line]
        self.check("the service's p99 from its own histogram shows in `jobs describe`", p99 is not None,
                   f"endpoint {endpoint}; " + " | ".join(line.strip() for line in latency))

        def trained(step: int) -> str | None:
            text = self.cli("jobs", "logs", "train")
            ranks = {r for r in ("rank 0/2", "rank 1/2") if re.search(rf"{r} .*: step {step} loss", text)}
            return text if len(ranks) == 2 else None

        logs = self.until("both ranks' output", lambda: trained(20), 240)
        shown = [line for line in (logs or self.cli("jobs", "logs", "train")).splitlines() if "step" in line][:4]
        self.check("`hivemux jobs logs train` shows the training job's output", bool(logs), " | ".join(shown) or "no step lines")

        self.submit("hold")
        held = self.until("hold running", lambda: self.state("hold") == "running", 180)
        hold_nodes = self.nodes("hold")
        self.say(f"hold {'running' if held else self.state('hold')} on {', '.join(hold_nodes)}; submitting urgent, for the gang's pair")
        self.submit("urgent")
        preempted = self.until("the gang preempted", lambda: next(
            (line.strip() for line in self.cli("jobs", "history", "train").splitlines() if "preempted by" in line), None), 180)
        self.say(f"gang {preempted or 'not preempted'}")

        timed_out = self.until("hold timed out", lambda: self.state("hold") == "timed_out", 240)
        hold = self.describe("hold")
        self.check("a job over its max_runtime_s ends timed_out", bool(timed_out), f"hold {hold['state']}: {hold['last_reason']}")

        def resumed() -> str | None:
            if self.state("train") != "running" or not set(self.nodes("train")).isdisjoint(first):
                return None
            text = self.cli("jobs", "logs", "train")
            lines = [line for line in text.splitlines() if "resumed from its checkpoint at step" in line]
            return " | ".join(lines) if len(lines) >= 2 else None

        seen = self.until("the gang resumed elsewhere", resumed, 300)
        steps = [int(m) for m in re.findall(r"at step (\d+)", seen or "")]
        self.check("the preempted gang resumes from its checkpoint elsewhere", bool(preempted) and bool(seen) and min(steps or [0]) > 0,
                   f"first on {', '.join(first)}, now on {', '.join(self.nodes('train'))}: {seen or self.describe('train')['last_reason']}")

    def stop(self) -> None:
        for job in ("train", "urgent", "svc"):
            try:
                self.cli("jobs", "cancel", job, "--reason", "scenario over", check=False)
            except (subprocess.TimeoutExpired, OSError):
                pass
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self.up.kill()
                self.up.wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", type=Path, default=None, help="default: a new temporary directory")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs of every service and workload)")
    args = p.parse_args()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="hivemux-scenario-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)  # workloads run as unprivileged uids: they traverse it to their directories
    scenario = Scenario(workdir)
    try:
        scenario.run()
    except Exception as error:  # the run could not go on: what it saw so far is reported
        scenario.check("the scenario ran to its end", False, f"{type(error).__name__}: {error}")
    finally:
        scenario.stop()
    failed = [name for name, ok, _ in scenario.results if not ok]
    print(f"\n{len(scenario.results) - len(failed)} PASS, {len(failed)} FAIL; hivemux up's output and logs in {workdir}", flush=True)
    if not args.keep and not failed and args.workdir is None:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return len(failed)


if __name__ == "__main__":
    sys.exit(main())
