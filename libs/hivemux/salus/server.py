"""The Salus iteration gate served over gRPC on a Unix socket (the shell around ``lanes.py`` and
``iteration_scheduler.py``).

The executor runs one ``LaneServer`` per GPU and hands its socket path to the workloads it
starts (``HIVEMUX_SALUS_SOCKET``); a workload's adaptor (``hivemux.salus.job``) opens one
``LaneGate.Session`` stream per job. On the stream the job registers (``P``, ``E``, its
iteration count), is queued until Algorithm 1 finds it a lane, then sends ``Request`` /
``Done(request_next)`` and receives one ``Grant`` per iteration. The end of the stream (or a
broken connection) is the job's finish: its lane reference and persistent memory are released
and waiting jobs may be admitted or granted.

Everything runs on the server's event loop, so the lane manager and the scheduler see one
call at a time. Each session has an outbox drained by its response generator; a decision made
while handling one job's message (a grant to the lane's next job, an admission after a
finish) is put in the addressee's outbox.

Transport choice, by measurement (``benchmarks/salus.py`` prints both on the machine it runs
on): a unary call per gate message costs about twice a message round trip on a long-lived
bidirectional stream (on the shared 2-core development machine: unary echo median 0.43–0.85
ms, stream echo 0.14–0.43 ms, depending on load). So each job holds one stream, and ``Done``
carries the request for the next iteration: one round trip per iteration. The gate's own work
per message (parse, lane and policy decision, serialize) is tens of microseconds; the rest of
a round trip is gRPC's Python stack on both ends (the synchronous client's request and
response threads, the aio server's completion queue). On the development machine (load
average 5–13 on 2 cores) the gate's median round trip was 0.33–0.55 ms, within a few percent
of a bare stream echo measured alongside and above the 200 us target; the benchmark prints
the figures for the machine it runs on.

Iteration durations (the service FAIR equalizes, the measurements SRTF ranks by) are the
gate's own: from the grant leaving the server to the done arriving, on the loop's monotonic
clock. The client's word is not needed, and cannot skew the accounting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import stat
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import grpc

from hivemux.errors import ConfigurationError

from . import gate_pb2 as pb
from . import gate_pb2_grpc as pb_grpc
from .client import GRPC_OPTIONS
from .iteration_scheduler import Grant, IterationScheduler, Policy
from .lanes import JobMemory, Lane, LaneAssigned, LaneEvent, LaneManager, Queued, Refused

log = logging.getLogger("hivemux.salus.server")


@dataclass(frozen=True)
class IterationRecord:
    """One iteration as the gate saw it (loop-clock seconds)."""

    job: str
    lane_id: int
    iteration: int
    granted_at: float
    done_at: float


@dataclass(frozen=True)
class LaneSnapshot:
    policy: Policy
    capacity_mib: float
    lanes: tuple[Lane, ...]
    pending: tuple[JobMemory, ...]
    persistent_total_mib: float
    lanes_total_mib: float


@dataclass(eq=False)
class _Session:
    outbox: asyncio.Queue[pb.GateMessage | None] = field(default_factory=asyncio.Queue)
    job: str | None = None
    iterations: int | None = None
    iteration_seconds: float | None = None
    lane_id: int | None = None
    granted_at: float | None = None
    granted_iteration: int = -1
    closed: bool = False


class _Gate:
    """The lane manager, the iteration scheduler and the sessions of one GPU."""

    def __init__(self, capacity_mib: float, policy: Policy, history: int) -> None:
        self.policy = policy
        self.lanes = LaneManager(capacity_mib, in_order=policy.admits_in_order)
        self.scheduler = IterationScheduler(policy)
        self.sessions: dict[str, _Session] = {}
        self.history: deque[IterationRecord] = deque(maxlen=history)
        self.clock = asyncio.get_running_loop().time

    # -- one message ------------------------------------------------------------------------

    def handle(self, session: _Session, message: pb.JobMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "register":
            self._register(session, message.register)
            return
        if session.job is None:
            self._refuse(session, f"protocol: {kind or 'an empty message'} before register")
            return
        if session.lane_id is None:
            self._refuse(session, f"protocol: {kind} before the job was admitted into a lane")
            return
        try:
            if kind == "request":
                grants = self.scheduler.request(session.job)
            elif kind == "done":
                now = self.clock()
                granted_at = now if session.granted_at is None else session.granted_at
                grants = self.scheduler.done(
                    session.job, duration_s=now - granted_at, request_next=message.done.request_next
                )
                self.history.append(IterationRecord(session.job, session.lane_id, session.granted_iteration,
                                                    granted_at, now))  # fmt: skip
                session.granted_at = None
            else:
                self._refuse(session, f"protocol: unknown message {kind!r}")
                return
        except ValueError as broken:  # the scheduler's check of the request/done protocol
            self._refuse(session, f"protocol: {broken}")
            return
        self._deliver_grants(grants)

    def _register(self, session: _Session, register: pb.Register) -> None:
        if session.job is not None:
            self._refuse(session, "protocol: register sent twice")
            return
        job = register.job
        if not job:
            self._refuse(session, "register: the job needs a name")
            return
        if job in self.sessions:
            self._refuse(session, f"register: job {job!r} already holds a session")
            return
        iterations = register.iterations if register.HasField("iterations") else None
        seconds = register.iteration_seconds if register.HasField("iteration_seconds") else None
        if iterations is not None and iterations < 0:
            self._refuse(session, f"register: iterations must be >= 0, got {iterations}")
            return
        if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
            self._refuse(session, f"register: iteration_seconds must be a finite number >= 0, got {seconds}")
            return
        session.job, session.iterations, session.iteration_seconds = job, iterations, seconds
        self.sessions[job] = session
        self._deliver_lane_events(self.lanes.job_arrive(job, register.persistent_mib, register.ephemeral_mib))

    # -- the end of a session -----------------------------------------------------------------

    def end(self, session: _Session) -> None:
        """The job finished, left or was refused: release its lane and memory."""
        session.closed = True
        job = session.job
        if job is None or self.sessions.get(job) is not session:
            return
        del self.sessions[job]
        grants = self.scheduler.remove_job(job)
        events = self.lanes.job_finish(job)
        log.debug("job %s left lane %s", job, session.lane_id)
        self._deliver_lane_events(events)
        self._deliver_grants(grants)

    # -- delivering decisions -----------------------------------------------------------------

    def _deliver_lane_events(self, events: Iterable[LaneEvent]) -> None:
        for event in events:
            if isinstance(event, LaneAssigned):
                session = self.sessions[event.job]
                session.lane_id = event.lane_id
                self.scheduler.add_job(event.job, event.lane_id, iterations=session.iterations,
                                       iteration_estimate_s=session.iteration_seconds)  # fmt: skip
                log.debug("job %s assigned lane %d (%s, %g MiB)", event.job, event.lane_id, event.step,
                          event.lane_size_mib)  # fmt: skip
                session.outbox.put_nowait(pb.GateMessage(admitted=pb.Admitted(
                    lane=event.lane_id, lane_size_mib=event.lane_size_mib, step=event.step)))  # fmt: skip
            elif isinstance(event, Queued):
                self.sessions[event.job].outbox.put_nowait(pb.GateMessage(queued=pb.Queued(reason=event.reason)))
            elif isinstance(event, Refused):
                session = self.sessions.pop(event.job)
                session.job = None  # never admitted: nothing to release
                self._refuse(session, event.reason)

    def _deliver_grants(self, grants: Iterable[Grant]) -> None:
        for grant in grants:
            session = self.sessions[grant.job]
            session.granted_at = self.clock()
            session.granted_iteration = grant.iteration
            session.outbox.put_nowait(
                pb.GateMessage(grant=pb.Grant(iteration=grant.iteration, lane=grant.lane_id, reason=grant.reason))
            )

    def _refuse(self, session: _Session, reason: str) -> None:
        """Tell the job why and end its session; nothing it sends afterwards is handled."""
        log.info("refused job %s: %s", session.job, reason)
        session.closed = True
        session.outbox.put_nowait(pb.GateMessage(refused=pb.Refused(reason=reason)))
        session.outbox.put_nowait(None)


class _LaneGateServicer(pb_grpc.LaneGateServicer):
    def __init__(self, gate: _Gate) -> None:
        self._gate = gate

    async def Session(
        self, request_iterator: AsyncIterator[pb.JobMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GateMessage]:
        session = _Session()
        reader = asyncio.ensure_future(self._read(session, request_iterator))
        try:
            while (message := await session.outbox.get()) is not None:
                yield message
            if reader.done() and not reader.cancelled() and (error := reader.exception()) is not None:
                # An InvariantViolation (or a bug) while handling the job's message: fail loudly,
                # the job sees its call fail.
                log.critical("Salus gate failed handling job %s", session.job, exc_info=error)
                raise error
        finally:
            reader.cancel()
            self._gate.end(session)

    async def _read(self, session: _Session, request_iterator: AsyncIterator[pb.JobMessage]) -> None:
        try:
            async for message in request_iterator:
                if session.closed:
                    break
                self._gate.handle(session, message)
        finally:
            # The job closed its side (its finish) or the connection broke.
            session.outbox.put_nowait(None)


class LaneServer:
    """Salus lanes and iteration scheduling for one GPU, served on ``unix:<socket_path>``.

    ``capacity_mib`` is the GPU memory the lanes may use (C); ``policy`` is one of
    ``fifo``, ``pack``, ``srtf``, ``fair``. Start and stop it on the event loop that serves it.
    """

    def __init__(self, socket_path: str, capacity_mib: float, policy: str, *, history: int = 100_000) -> None:
        try:
            self.policy = Policy(policy)
        except ValueError:
            raise ConfigurationError(f"unknown Salus policy {policy!r}; one of {[p.value for p in Policy]}") from None
        if not (math.isfinite(capacity_mib) and capacity_mib > 0):
            raise ConfigurationError(f"Salus capacity_mib must be a positive number, got {capacity_mib!r}")
        if not socket_path:
            raise ConfigurationError("Salus socket_path is empty")
        self.socket_path = socket_path
        self.capacity_mib = capacity_mib
        self._history = history
        self._server: grpc.aio.Server | None = None
        self._gate: _Gate | None = None

    @property
    def address(self) -> str:
        return f"unix:{self.socket_path}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("LaneServer already started")
        self._remove_stale_socket()
        self._gate = _Gate(self.capacity_mib, self.policy, self._history)
        server = grpc.aio.server(options=GRPC_OPTIONS)
        pb_grpc.add_LaneGateServicer_to_server(_LaneGateServicer(self._gate), server)
        if server.add_insecure_port(self.address) == 0:
            raise ConfigurationError(f"cannot bind the Salus gate to {self.address}")
        await server.start()
        self._server = server
        log.info("Salus gate on %s: C = %g MiB, policy %s", self.address, self.capacity_mib, self.policy.value)

    async def stop(self, grace: float | None = 0.5) -> None:
        """Stop serving; open sessions are cancelled (their jobs' adaptors see the stream end)."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        self._remove_stale_socket()

    def snapshot(self) -> LaneSnapshot:
        """The lanes, the queue and the memory totals now."""
        gate = self._require_gate()
        return LaneSnapshot(self.policy, self.capacity_mib, gate.lanes.lanes, gate.lanes.pending,
                            gate.lanes.persistent_total_mib, gate.lanes.lanes_total_mib)  # fmt: skip

    def completed_iterations(self) -> tuple[IterationRecord, ...]:
        """The most recent iterations (up to ``history``), in the order they were reported done."""
        return tuple(self._require_gate().history)

    def _require_gate(self) -> _Gate:
        if self._gate is None:
            raise RuntimeError("LaneServer not started")
        return self._gate

    def _remove_stale_socket(self) -> None:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise ConfigurationError(f"{self.socket_path} exists and is not a socket")
        os.unlink(self.socket_path)
