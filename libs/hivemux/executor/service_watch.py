"""A user's own online service on the node: its ports, its readiness, its latency (issue 29 item 2).

An online job whose submitted ``workload.command`` is set runs that command (the built-in
`hivemux.workloads.online` stays the default without one). Per replica:

- **ports** (`allocate_ports`): ``PORT`` and every name of ``workload.ports``, each a free port
  the kernel hands out (bind to port 0) that no other replica on this node holds, kept across
  relaunches of the replica; in the environment by name (`service_env`). The kernel may give
  the port to another program between the agent's probe and the service's bind: the service
  then fails to start, as a port clash on any host does.
- **readiness** (`ServiceWatch.watch`, every tick): ``readiness.http`` answers 2xx on
  ``127.0.0.1:PORT``, or ``readiness.tcp`` accepts a connection. Until then the replica does
  not count as serving: its start reports ``launched`` only, and the job's ``running``
  lifecycle event (what "serving" has meant since issue 19) and a ``ready`` report carrying
  the endpoint (``<node address>:PORT``) follow when it passes. A replica without a probe is
  ready at its first tick. One not ready within ``readiness_timeout_s`` is evicted with the
  reason (placed again, maybe elsewhere).
- **latency** (every ``observation_window_s`` once ready): the exposition at
  ``metrics.path`` on its port is scraped and the window's p50 / p99 taken from the histogram's
  bucket deltas (`hivemux.sharing.latency_histogram`). The window becomes what the built-in
  server writes into its progress file (`Workload.percentiles`, `Workload.latencies`), so the
  monitor's ``online.latency`` reports, the sharing observations and the solo latency are the
  same code for both. A scrape that fails, or finds no such histogram, is reported once per
  distinct problem (step ``metrics``), and the window is not reported (no made-up latency).

Time: probes and scrapes are observations of a real process, on the node's clock.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from hivemux.events import Event, JobState, ReportState, WorkloadSpec, derived_id
from hivemux.executor.config import NodeConfig
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload
from hivemux.sharing.latency_histogram import Histogram, NoHistogram, parse_histogram, window_quantile

if TYPE_CHECKING:  # graceful_exit → mps_recovery → launcher → here
    from hivemux.executor.graceful_exit import GracefulExit

PROBE_HOST = "127.0.0.1"  # the replica runs here: probes and scrapes never leave the node
MAX_EXPOSITION = 4 << 20  # bytes of one scrape read at most


@dataclass
class ServiceState:
    """One replica's ports, endpoint and what was last seen of it."""

    ports: dict[str, int]  # environment name -> port, PORT first
    endpoint: str
    ready: bool = False
    started_at: float = 0.0
    scraped_at: float | None = None
    previous: Histogram | None = None
    problem: str = ""  # the last scrape's problem (each reported once)

    @property
    def port(self) -> int:
        return self.ports["PORT"]


def runs_own_command(w: Workload) -> bool:
    return w.kind == "online" and w.spec is not None and bool(w.spec.command)


def allocate_ports(names: Iterable[str], taken: set[int]) -> dict[str, int]:
    """A free TCP port per name, none of ``taken`` (ports other replicas here hold) nor twice."""
    out: dict[str, int] = {}
    for name in names:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            if port not in taken and port not in out.values():
                out[name] = port
                break
        else:
            raise OSError(f"no free port for {name} after 64 tries")
    return out


def service_env(state: ServiceState) -> dict[str, str]:
    return {name: str(port) for name, port in state.ports.items()}


class ServiceWatch:
    """Ports at launch, readiness and scrapes on ticks, for the node's own-command services."""

    def __init__(self, config: NodeConfig, *, workloads: NodeWorkloads, reporter: Reporter, graceful: GracefulExit) -> None:
        self.config = config
        self.workloads = workloads
        self.reporter = reporter
        self.graceful = graceful

    def prepare(self, w: Workload, now_s: float) -> dict[str, str]:
        """Before (re)launching ``w``: its ports (kept across relaunches), not ready; its env."""
        assert w.spec is not None
        if w.service is None:
            taken = {p for o in self.workloads.jobs.values() if o is not w and o.service is not None for p in o.service.ports.values()}
            ports = allocate_ports(["PORT", *(p.name for p in w.spec.ports)], taken)
            w.service = ServiceState(ports, f"{self.config.address}:{ports['PORT']}")
        w.service.ready, w.service.started_at = False, now_s
        w.service.scraped_at, w.service.previous = None, None
        return service_env(w.service)

    def awaits_readiness(self, w: Workload) -> bool:
        return w.service is not None and w.spec is not None and w.spec.readiness is not None

    async def watch(self, now_s: float) -> list[Event]:
        ws = [w for w in self.workloads.jobs.values()
              if w.service is not None and not w.busy and w.proc is not None and w.proc.exit is None]
        found = await asyncio.gather(*(self._one(w, now_s) for w in ws))
        return [e for events in found for e in events]

    async def _one(self, w: Workload, now_s: float) -> list[Event]:
        assert w.service is not None and w.spec is not None and w.command is not None
        s, spec = w.service, w.spec
        if not s.ready:
            if spec.readiness is not None and not await probe(spec, s.port, self.config.probe_timeout_s):
                if now_s - s.started_at < self.config.readiness_timeout_s:
                    return []
                why = (f"not ready within {self.config.readiness_timeout_s:g} s "
                       f"({'GET ' + spec.readiness.http if spec.readiness.http else 'TCP connect'} on port {s.port})")
                return await self.graceful.end(w, derived_id("not-ready", w.command.event_id, w.launches), evicted=True, reason=why)
            s.ready = True
            w.latency_until = now_s  # its first latency window starts when it serves (the monitor's)
            return self._ready(w)
        if spec.metrics is None or (s.scraped_at is not None and now_s - s.scraped_at < self.config.observation_window_s):
            return []
        return await self._scrape(w, s, spec, now_s)

    def _ready(self, w: Workload) -> list[Event]:
        assert w.service is not None and w.command is not None
        at, cause = self.reporter.at(), w.command.event_id
        what = f"serving on {w.service.endpoint}"
        out: list[Event] = [self.reporter.report(w, cause, ReportState.RUNNING, at, step="ready", detail=what)
                            .model_copy(update={"endpoint": w.service.endpoint})]
        if w.launches == 1 and self.awaits_readiness(w):  # the start held back "serving" until now
            out.append(self.reporter.lifecycle(w, cause, JobState.RUNNING, at, f"{what} ({self.config.node_id} {','.join(w.gpu_ids)})"))
        return out

    async def _scrape(self, w: Workload, s: ServiceState, spec: WorkloadSpec, now_s: float) -> list[Event]:
        assert spec.metrics is not None
        url = f"http://{PROBE_HOST}:{s.ports[spec.metrics.port]}{spec.metrics.path}"
        s.scraped_at = now_s
        try:
            text = await fetch(url, self.config.probe_timeout_s)
            current = parse_histogram(text, spec.metrics.histogram)
        except (OSError, aiohttp.ClientError, asyncio.TimeoutError, NoHistogram, ValueError) as error:
            return self._problem(w, f"scrape of {url}: {error or type(error).__name__}")
        window = window_quantile(0.99, s.previous, current)
        median = window_quantile(0.5, s.previous, current)
        s.previous, s.problem = current, ""
        if window is None or median is None:
            return []  # no request in the window: nothing measured, nothing reported
        p50_ms, p99_ms = max(median.seconds * 1000, 1e-3), max(window.seconds * 1000, 1e-3)
        # the same record of a window as the built-in server's progress lines (`Workload.absorb`)
        w.percentiles.append((now_s, p50_ms, p99_ms, int(window.requests)))
        w.latencies.append((now_s, window.mean * 1000 or p50_ms))
        alone = not any(o.kind == "offline" and o.gpu == w.gpu for o in self.workloads.jobs.values())
        if w.solo_latency_ms is None and alone:
            w.solo_latency_ms = window.mean * 1000 or p50_ms
        return []

    def _problem(self, w: Workload, problem: str) -> list[Event]:
        assert w.service is not None and w.command is not None
        s = w.service
        s.previous = None  # the next scrape that works starts a fresh window
        if problem == s.problem:
            return []
        s.problem = problem
        return [self.reporter.report(w, w.command.event_id, ReportState.RUNNING, self.reporter.at(), step="metrics", detail=problem)
                .model_copy(update={"event_id": derived_id("metrics", w.command.event_id, w.launches, problem)})]


async def probe(spec: WorkloadSpec, port: int, timeout_s: float) -> bool:
    """Whether the replica on ``port`` passes its readiness probe now."""
    assert spec.readiness is not None
    try:
        if spec.readiness.http is not None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
                async with session.get(f"http://{PROBE_HOST}:{port}{spec.readiness.http}", allow_redirects=False) as r:
                    return 200 <= r.status < 300
        _, writer = await asyncio.wait_for(asyncio.open_connection(PROBE_HOST, port), timeout_s)
        writer.close()
        return True
    except (OSError, aiohttp.ClientError, asyncio.TimeoutError):
        return False


async def fetch(url: str, timeout_s: float) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url, allow_redirects=False) as r:
            if r.status != 200:
                raise ValueError(f"HTTP {r.status}")
            body = await r.content.read(MAX_EXPOSITION + 1)
            if len(body) > MAX_EXPOSITION:
                raise ValueError(f"exposition over {MAX_EXPOSITION} bytes")
            return body.decode("utf-8", errors="replace")
