"""Monitoring the running workloads on each tick (MuxFlow preprint §3 "Local executor": it
"monitors the running workloads" and "can evict the offline workload if the online workload is
under threat"; §6: offline work is evicted when node memory runs short).

`WorkloadMonitor.progress` turns what one job's process did since the last tick into events:
its exit (``completed`` when its progress said done and it exited 0 — or, for the user's own
command, when it exited 0, as a Kubernetes Job counts success: the progress protocol is optional
for it —, else ``failed``, with the lifecycle event; what its cgroup's limits did to it, an OOM
kill at its host memory limit or forks refused at its pids limit, is in both), a progress report every ``report_interval_s`` (iterations, throughput, host
RSS of its process group, GPU memory from its xCUDA state file) and, for offline work, one
`SharingObservation` per ``observation_window_s`` (`observations.observe`: the speed
predictor's training data, measured). `memory_watch` evicts every offline workload, through
the graceful exit, while ``MemAvailable/MemTotal`` is below ``min_available_memory_fraction``.

Time: these are observations of real processes; they carry the node's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hivemux.events import Event, JobState, OnlineLatencyReport, ReportState, derived_id
from hivemux.executor.config import NodeConfig
from hivemux.executor.cpuset import memory_pressure
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.graceful_exit import GracefulExit
from hivemux.executor.launch import MIB
from hivemux.executor.observations import Window, observe
from hivemux.executor.supervisor import group_rss_mib
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload, finished_key
from hivemux.simulated.catalog import solo_profile


class WorkloadMonitor:
    def __init__(self, config: NodeConfig, *, workloads: NodeWorkloads, readings: GpuReadings, reporter: Reporter,
                 graceful: GracefulExit) -> None:
        self.config = config
        self.workloads = workloads
        self.readings = readings
        self.reporter = reporter
        self.graceful = graceful

    def progress(self, w: Workload, now_s: float) -> list[Event]:
        assert w.command is not None and w.proc is not None
        out: list[Event] = []
        now = datetime.fromtimestamp(now_s, UTC)
        cause = w.command.event_id
        exit_ = w.proc.exit
        report, lifecycle = self.reporter.report, self.reporter.lifecycle
        if exit_ is not None:
            limited = w.cgroup.verdict() if w.cgroup is not None else ""  # its cgroup's counters, before it goes
            self.workloads.forget(w)
            # a user's own program ends by exiting 0 (as a Kubernetes Job's does); a service does not end
            own = w.spec is not None and bool(w.spec.command) and w.kind != "online"
            if exit_.ok and (w.done or own):
                self.workloads.finished |= {w.job_id, finished_key(w.job_id, w.command)}
                out.append(report(w, cause, ReportState.COMPLETED, now, step="exited", exit_=exit_, detail=limited))
                out.append(lifecycle(w, cause, JobState.COMPLETED, now, f"{w.total} iterations done" if w.done else "its command exited 0"))
            else:
                why = f"{exit_.describe()}; {limited}" if limited else exit_.describe()  # e.g. OOM-killed at its memory limit
                out.append(report(w, cause, ReportState.FAILED, now, step="exited", exit_=exit_, detail=why))
                out.append(lifecycle(w, cause, JobState.FAILED, now, f"process {why}"))
            return out
        if now_s - w.reported_at >= self.config.report_interval_s:
            w.reported_at = now_s
            gpu_bytes = w.state.used_bytes() if w.state is not None else None
            out.append(report(w, cause, ReportState.RUNNING, now).model_copy(update={
                "host_memory_mib": group_rss_mib(w.proc.pid),
                "gpu_memory_mib": gpu_bytes / MIB if gpu_bytes is not None else None,
            }))
        if w.kind == "online":
            out += self.latency(w, now_s)
        if w.kind == "offline" and now_s - w.observed_until >= self.config.observation_window_s:
            observation = self.observation(w, Window(w.observed_until, now_s))
            if observation is not None:
                w.observed_until = now_s
                out.append(observation)
        return out

    def latency(self, w: Workload, now_s: float) -> list[Event]:
        """A submitted online service's p99 (the worst of the windows its process wrote since the
        last report) with its SLO and the rate it served, every ``observation_window_s``
        (`online.latency`: what SLO-driven protection acts on)."""
        if now_s - w.latency_until < self.config.observation_window_s:
            return []
        windows = [p for p in w.percentiles if p[0] > w.latency_until]
        if not windows:
            return []
        start, w.latency_until = w.latency_until, now_s
        assert w.command is not None
        spec, neighbour = w.spec or w.command.workload, next(
            (o for o in self.workloads.jobs.values() if o.kind == "offline" and o.gpu == w.gpu), None)
        end = datetime.fromtimestamp(now_s, UTC)
        return [OnlineLatencyReport(
            event_id=derived_id("latency", w.command.event_id, w.launches, now_s), occurred_at=end, source=self.reporter.source,
            node_id=self.config.node_id, gpu_id=w.gpu, service=w.job_id, p50_ms=max(p[1] for p in windows),
            p99_ms=max(p[2] for p in windows), slo_p99_ms=spec.slo_p99_ms if spec else None,
            request_rate=sum(p[3] for p in windows) / max(now_s - start, 1e-3) if start else None,
            window_start=datetime.fromtimestamp(start or windows[0][0], UTC), window_end=end,
            offline_job_id=neighbour.job_id if neighbour else None, sm_share=neighbour.sm_share if neighbour else None,
        )]  # fmt: skip

    def observation(self, w: Workload, window: Window) -> Event | None:
        assert w.command is not None and w.command.workload is not None and w.sm_share is not None
        sample = self.readings.latest.get(w.gpu)
        gpu_type = sample.gpu_type if sample is not None else self.config.default_gpu_type
        spec = w.command.workload
        solo_ms = w.command.solo_iteration_time_ms or solo_profile(spec.model, spec.batch_size, gpu_type).iteration_time_ms
        online = self.workloads.online_on(w.gpu)
        return observe(
            event_id=derived_id("observation", w.command.event_id, w.launches, window.end),
            source=self.reporter.source, gpu_id=w.gpu, node_id=self.config.node_id, gpu_type=gpu_type,
            offline_job_id=w.job_id,
            online_workload=online.job_id if online is not None else (sample.online_workload if sample is not None else None),
            sm_share=w.sm_share, solo_iteration_time_ms=solo_ms, progress=list(w.points),
            online_latencies_ms=list(online.latencies) if online is not None else [],
            online_solo_latency_ms=online.solo_latency_ms if online is not None else None,
            gpu_samples=list(self.readings.points.get(w.gpu, ())), window=window,
        )

    async def memory_watch(self) -> list[Event]:
        if self.config.min_available_memory_fraction <= 0:
            return []
        try:
            text = self.config.meminfo_path.read_text()
        except OSError:
            return []
        pressure, fraction = memory_pressure(text, min_available_fraction=self.config.min_available_memory_fraction)
        out: list[Event] = []
        if pressure:
            for w in [w for w in self.workloads.jobs.values() if w.kind == "offline" and not w.busy]:
                cause = derived_id("memory-pressure", w.command.event_id if w.command else w.job_id, w.launches)
                reason = (f"node memory pressure: {fraction:.1%} available, below "
                          f"{self.config.min_available_memory_fraction:.0%}")
                out += await self.graceful.end(w, cause, evicted=True, reason=reason)
        return out
