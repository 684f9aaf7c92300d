"""`hivemux up`: the whole system on one machine.

Starts the embedded broker and database (or uses the configured ones), runs every service as
its own process (as production runs them: one process or container per instance), waits until
each answers on /healthz, replays a job list, and at the end folds the topics into a summary.
Children die with this process even when it is killed (parent-death signal).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..bus import Publisher, ensure_topics
from ..bus.replay import read_topics
from ..infra import InfraSettings, die_with_parent, embedded_infra, free_port
from ..status import STATUS_TOPICS, fold_status, render_summary
from ..topics import ALL_TOPICS
from .jobfile import parse_jobs
from .services import SERVICES

log = logging.getLogger("hivemux.up")

# Demo pacing, used unless the environment already sets them: a matching round every 5 s of
# event time and a simulated day every 12 minutes starting at 19:00, so a short run climbs
# into the evening peak of online load (health states and evictions show up).
DEMO_ENV = {
    "HIVEMUX_MATCHER_INTERVAL_S": "5",
    "HIVEMUX_INGESTER_TIME_SCALE": "120",
    "HIVEMUX_INGESTER_START_HOUR": "19",
    "HIVEMUX_INGESTER_INTERVAL_S": "1",
}


@dataclass
class UpOptions:
    duration: float | None = None
    jobs_path: Path | None = None
    workdir: Path = Path(".hivemux")
    services: tuple[str, ...] = tuple(SERVICES)
    extra_env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def start_services(options: UpOptions, env: dict[str, str]) -> list[Child]:
    logs = options.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    children = []
    for name in options.services:
        port = free_port()
        log_path = logs / f"{name}.log"
        child_env = {**env, "HIVEMUX_METRICS_PORT": str(port), "HIVEMUX_INSTANCE": "0"}
        with log_path.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "hivemux.cli.main", "service", name],
                env=child_env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        children.append(Child(name, process, port, log_path))
    return children


def wait_ready(children: list[Child], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(children)
    while waiting:
        for child in list(waiting):
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.process.returncode}:\n{child.log_tail()}")
            if _healthy(child.port):
                waiting.remove(child)
                log.info("%s is ready (pid %s, metrics on :%s)", child.name, child.process.pid, child.port)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(c.name for c in waiting)
            raise RuntimeError(f"not ready after {timeout_s:.0f} s: {names}\n{waiting[0].log_tail()}")
        time.sleep(0.2)


def stop_services(children: list[Child], grace_s: float = 15.0) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", child.name, grace_s)
            child.process.kill()
            child.process.wait()


def demo_jobs_path() -> Path:
    return Path(str(resources.files("hivemux.cli") / "demo_jobs.yaml"))


async def submit_jobs(bootstrap: str, path: Path) -> int:
    jobs = parse_jobs(path, source="hivemux-up")
    async with Publisher(bootstrap, source="hivemux-up") as publisher:
        await publisher.publish_all(jobs)
    return len(jobs)


async def collect_summary(bootstrap: str) -> dict[str, Any]:
    events, _ = await read_topics(bootstrap, STATUS_TOPICS)
    return fold_status(events).summary()


def _wait(duration: float | None, children: list[Child]) -> None:
    """Until the duration passes, a signal arrives, or a service dies."""
    stop = {"now": False}

    def request_stop(*_: object) -> None:
        stop["now"] = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = None if duration is None else time.monotonic() + duration
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            dead = [c for c in children if c.process.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited with {dead[0].process.returncode}:\n{dead[0].log_tail()}")
            time.sleep(0.5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_up(options: UpOptions) -> dict[str, Any]:
    with embedded_infra(InfraSettings()) as infra:
        endpoints = infra.endpoints
        print(f"KAFKA_BOOTSTRAP_SERVERS={endpoints.bootstrap_servers}", flush=True)
        print(f"HIVEMUX_POSTGRES_DSN={endpoints.postgres_dsn}", flush=True)
        asyncio.run(ensure_topics(endpoints.bootstrap_servers, ALL_TOPICS))
        env = {**DEMO_ENV, **os.environ, **options.extra_env}
        env["KAFKA_BOOTSTRAP_SERVERS"] = endpoints.bootstrap_servers
        env["HIVEMUX_POSTGRES_DSN"] = endpoints.postgres_dsn
        children = start_services(options, env)
        try:
            wait_ready(children, options.ready_timeout_s)
            print(f"{len(children)} services ready; logs in {options.workdir / 'logs'}", flush=True)
            count = asyncio.run(submit_jobs(endpoints.bootstrap_servers, options.jobs_path or demo_jobs_path()))
            print(f"submitted {count} jobs; running{'' if options.duration is None else f' for {options.duration:.0f} s'}", flush=True)
            _wait(options.duration, children)
            summary = asyncio.run(collect_summary(endpoints.bootstrap_servers))
        finally:
            stop_services(children)
    print(render_summary(summary), flush=True)
    return summary
