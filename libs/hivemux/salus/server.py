"""The Salus iteration gate served over gRPC on a Unix socket (the shell around
``hivemux.lanes.lane_assignment`` and ``hivemux.lanes.iteration_scheduler``).

The executor runs one ``LaneServer`` per GPU and hands its socket path to the workloads it
starts (``HIVEMUX_SALUS_SOCKET``); a workload's adaptor (``hivemux.salus.job``) opens one
``LaneGate.Session`` stream per job. On the stream the job registers (``P``, ``E``, its
iteration count), is queued until Algorithm 1 finds it a lane, then sends ``Request`` /
``Done(request_next)`` and receives one ``Grant`` per iteration. The end of the stream (or a
broken connection) is the job's finish: its lane reference and persistent memory are released
and waiting jobs may be admitted or granted.

The gate (``_Gate``: lane manager, scheduler, sessions) sees one message at a time. Each
session has a ``send`` for the gate's messages to its job; a decision made while handling one
job's message (a grant to the lane's next job, an admission after a finish) is sent to the
addressee's session.

Two transports serve the same ``gate.proto`` service on the same socket:

- ``core`` (the default): ``_CoreGateServer``, grpcio's core server (the C core under every
  grpcio server) driven by one thread of the gate's own. The thread polls the server's
  completion queue and handles each completion where it lands: a job's message is parsed,
  decided on and the answer's send started before it polls again. The gate's state is
  guarded by a lock the thread holds per completion; ``snapshot`` and ``completed_iterations``
  take it too, so they may be called from the event loop.
- ``aio``: a grpc.aio servicer on the event loop (the fallback when grpcio's core is not
  reachable as ``_CoreGateServer`` expects). grpc.aio's completion-queue poller thread hands
  every completion to the loop through a socket, and each message then resumes several
  futures and coroutines; that machinery, not the gate's logic (about 10 us per message), was
  most of a round trip.

Transport choice, by measurement (``benchmarks/salus.py`` prints the figures for the machine
it runs on). A unary call per gate message costs about twice a message round trip on a
long-lived bidirectional stream, so each job holds one stream and ``Done`` carries the request
for the next iteration: one round trip per iteration. The gate's round trip (median, the
shared 2-core development machine at load average 5-8, runs side by side): grpc.aio server
with grpcio's synchronous streaming client 243-492 us (269 us on a quiet machine); the
adaptor's direct client (``client._DirectStream``) against the grpc.aio server 193-251 us;
against the core server thread 129-216 us. A bare stream echo with the direct client on the
core server, the floor of a Python gRPC round trip here, measured 108-171 us alongside.
The core server thread runs Python, so it needs the GIL: a busy event loop in the same process
can delay a completion by up to the interpreter's switch interval (5 ms), where the aio
transport would queue it behind the loop's ready callbacks anyway.

Granted lanes (issue 20: Salus lanes in the running cluster). The cluster's lane placer runs
Algorithm 1 for every lane GPU and puts each decision on the log (a ``start_training`` with a
``LaneGrant``); the executor hands it to the gate before it launches the job (`LaneServer.grant`).
The gate admits the job into the granted lane at once (``LaneManager.admit_into``: the safety
condition is checked again before the admission; a grant that breaks it is refused with the
figures) and keeps the reservation — lane reference, ``P``, ``E`` — until the executor releases
it (`LaneServer.release`: the job stopped, was evicted or finished), across the job's sessions
(a relaunch from a checkpoint registers again into the same lane). A job registering under a
granted name gets the grant's ``P``/``E`` whatever it declares (the executor's grant is the
account; the workload's word is not needed). Other jobs still go through Algorithm 1. The GPU's
policy is that of the first grant on an idle gate (a lane GPU is one VC's cell, so its grants
agree); a grant naming another policy while jobs hold the gate runs under the gate's and is told
so (`Granted.note`), since one scheduler cannot serve two policies and switching would reorder
the neighbours' iterations; the next grant on an empty gate sets the policy again.

Iteration durations (the service FAIR equalizes, the measurements SRTF ranks by) are the
gate's own: from the grant leaving the gate to the done arriving, on ``time.monotonic`` (the
event loop's clock). The client's word is not needed, and cannot skew the accounting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import stat
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from hivemux.errors import ConfigurationError
from hivemux.lanes.iteration_scheduler import Grant, IterationScheduler, Policy
from hivemux.lanes.lane_assignment import JobMemory, Lane, LaneAssigned, LaneEvent, LaneManager, Queued, Refused

from . import gate_pb2 as pb
from .client import GRPC_OPTIONS
from .grpc_setup import grpc_modules

if TYPE_CHECKING:
    import grpc
    from grpc._cython import cygrpc
else:
    # grpcio and its core (the gate thread drives the core server directly, see
    # _CoreGateServer) are imported where the gate starts (`_load_grpc`), after the gRPC
    # setting: importing this module loads no grpcio and changes no environment.
    grpc = cygrpc = None

log = logging.getLogger("hivemux.salus.server")


def _load_grpc() -> None:
    """Import grpcio (once), after applying the gRPC setting (see ``grpc_setup``)."""
    global grpc, cygrpc
    if grpc is None:
        grpc, cygrpc = grpc_modules()


class IterationRecord(NamedTuple):
    """One iteration as the gate saw it (``time.monotonic`` seconds, the event loop's clock).

    (A named tuple: one is made per iteration, on the gate's path.)"""

    job: str
    lane_id: int
    iteration: int
    granted_at: float
    done_at: float


@dataclass(frozen=True)
class Granted:
    """A grant the gate admitted (`LaneServer.grant`): the lane, its size, the step, the policy
    the job's iterations run under, and why that is not the grant's (empty when it is)."""

    job: str
    lane_id: int
    lane_size_mib: float
    step: str
    policy: Policy
    note: str = ""


@dataclass(frozen=True)
class LaneSnapshot:
    policy: Policy
    capacity_mib: float
    lanes: tuple[Lane, ...]
    pending: tuple[JobMemory, ...]
    persistent_total_mib: float
    lanes_total_mib: float


def _discard(message: pb.GateMessage | None) -> None:
    return None


@dataclass(eq=False)
class _Session:
    # Where the gate's messages to the job go, in order; None ends the stream (the transport
    # sets it: the aio servicer's outbox or the core server's send queue).
    send: Callable[[pb.GateMessage | None], None] = _discard
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
        self.clock = time.monotonic  # the event loop's clock too (asyncio's default loop.time)
        self.granted: dict[str, JobMemory] = {}  # jobs the executor admitted into granted lanes

    # -- granted lanes (module docstring) -------------------------------------------------------

    def grant(self, job: str, persistent_mib: float, ephemeral_mib: float, lane_id: int, lane_size_mib: float,
              policy: Policy) -> Granted | Refused:
        if job in self.granted or job in self.sessions:
            return Refused(job, f"job {job!r} already holds a lane or a session on this GPU")
        note = ""
        if not self.sessions and not self.granted and not self.lanes.lanes and not self.lanes.pending:
            if policy is not self.policy:  # an idle gate takes the grant's policy
                self.policy = policy
                self.lanes = LaneManager(self.lanes.capacity_mib, in_order=policy.admits_in_order)
                self.scheduler = IterationScheduler(policy)
        elif policy is not self.policy:
            note = (f"runs under {self.policy}, the policy of the jobs already on this GPU (the grant names "
                    f"{policy}; it applies once the GPU's lanes empty)")
        [event] = self.lanes.admit_into(job, persistent_mib, ephemeral_mib, lane_id, lane_size_mib)
        if not isinstance(event, LaneAssigned):
            assert isinstance(event, Refused)
            return event
        self.granted[job] = JobMemory(job, persistent_mib, ephemeral_mib)
        return Granted(job, event.lane_id, event.lane_size_mib, event.step, self.policy, note)

    def release(self, job: str) -> bool:
        """The executor ended the granted job: its session (if one is open) ends, its lane
        reference and memory go, and the lane's other jobs (and queued ones) move on."""
        if self.granted.pop(job, None) is None:
            return False
        session = self.sessions.pop(job, None)
        grants = self.scheduler.remove_job(job)
        if session is not None:
            session.closed = True
            session.job = None  # the transport's end of this session releases nothing more
            session.send(None)
        events = self.lanes.job_finish(job)
        self._deliver_lane_events(events)
        self._deliver_grants(grants)
        return True

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
        if job in self.granted:  # its lane was granted before it started: admitted there at once
            lane = self.lanes.lane_of(job)
            size = next(ln.size_mib for ln in self.lanes.lanes if ln.lane_id == lane)
            assert lane is not None
            self._deliver_lane_events((LaneAssigned(job, lane, size, "existing_lane", self.lanes.persistent_total_mib,
                                                    self.lanes.lanes_total_mib, self.lanes.capacity_mib),))  # fmt: skip
            return
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
        # A granted job keeps its lane until the executor releases it (a relaunch comes back to it).
        events = () if job in self.granted else self.lanes.job_finish(job)
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
                session.send(pb.GateMessage(admitted=pb.Admitted(
                    lane=event.lane_id, lane_size_mib=event.lane_size_mib, step=event.step)))  # fmt: skip
            elif isinstance(event, Queued):
                self.sessions[event.job].send(pb.GateMessage(queued=pb.Queued(reason=event.reason)))
            elif isinstance(event, Refused):
                session = self.sessions.pop(event.job)
                session.job = None  # never admitted: nothing to release
                self._refuse(session, event.reason)

    def _deliver_grants(self, grants: Iterable[Grant]) -> None:
        for grant in grants:
            session = self.sessions[grant.job]
            session.granted_at = self.clock()
            session.granted_iteration = grant.iteration
            message = pb.GateMessage()
            granted = message.grant  # filled in place: half the cost of building nested messages
            granted.iteration, granted.lane, granted.reason = grant.iteration, grant.lane_id, grant.reason
            session.send(message)

    def _refuse(self, session: _Session, reason: str) -> None:
        """Tell the job why and end its session; nothing it sends afterwards is handled."""
        log.info("refused job %s: %s", session.job, reason)
        session.closed = True
        session.send(pb.GateMessage(refused=pb.Refused(reason=reason)))
        session.send(None)


class _LaneGateServicer:
    """``LaneGate`` on grpc.aio (``gate_pb2_grpc.add_LaneGateServicer_to_server`` takes any
    object with a ``Session``; the generated base class would need grpcio at import)."""

    def __init__(self, gate: _Gate) -> None:
        self._gate = gate

    async def Session(
        self, request_iterator: AsyncIterator[pb.JobMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GateMessage]:
        outbox: asyncio.Queue[pb.GateMessage | None] = asyncio.Queue()
        session = _Session(send=outbox.put_nowait)
        reader = asyncio.ensure_future(self._read(session, request_iterator))
        try:
            while (message := await outbox.get()) is not None:
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
            session.send(None)


_SESSION_METHOD = "/{}/Session".format(pb.DESCRIPTOR.services_by_name["LaneGate"].full_name).encode()
_REQUEST_CALL = object()  # tag: a new call arrived
_SHUTDOWN = object()  # tag: the server's shutdown completed
_RECEIVED, _SENT, _CLOSED = 0, 1, 2  # per-call event kinds


def core_server_usable() -> bool:
    """Whether grpcio's core server is reachable as ``_CoreGateServer`` drives it."""
    _load_grpc()
    return cygrpc is not None and all(
        hasattr(cygrpc, name)
        for name in ("Server", "CompletionQueue", "ReceiveMessageOperation", "SendMessageOperation",
                     "SendInitialMetadataOperation", "SendStatusFromServerOperation", "ReceiveCloseOnServerOperation")
    )  # fmt: skip


class _CoreCall:
    """One ``Session`` call on the core server: the job's session and the call's send queue.

    At most one receive and one send batch are outstanding (gRPC's rule); messages the gate
    sends while a send is in flight wait in ``outbox``. ``None`` in the queue ends the stream
    with status OK once the messages before it are out."""

    __slots__ = ("call", "session", "outbox", "sending", "metadata_sent", "status_sent", "ended", "pending")

    def __init__(self, call: cygrpc.Call) -> None:
        self.call: cygrpc.Call | None = call
        self.session = _Session(send=self.send)
        self.outbox: deque[pb.GateMessage | None] = deque()
        self.sending = False
        self.metadata_sent = False
        self.status_sent = False
        self.ended = False  # the gate has released the job (``_Gate.end``)
        self.pending = 0  # batches started and not completed

    def send(self, message: pb.GateMessage | None) -> None:
        if self.status_sent:
            return
        self.outbox.append(message)
        if not self.sending:
            self.flush()

    def flush(self) -> None:
        if self.sending or self.status_sent or not self.outbox:
            return
        message = self.outbox.popleft()
        if message is None:
            self.finish(cygrpc.StatusCode.ok, b"")
            return
        operation = cygrpc.SendMessageOperation(message.SerializeToString(), 0)
        self._start((self._metadata(), operation) if not self.metadata_sent else (operation,), _SENT)
        self.sending = True

    def finish(self, code: int, details: bytes) -> None:
        """Send the call's status (ending it); queued messages are dropped."""
        if self.status_sent:
            return
        self.status_sent = True
        self.outbox.clear()
        status = cygrpc.SendStatusFromServerOperation(None, code, details, 0)
        self._start((self._metadata(), status) if not self.metadata_sent else (status,), _SENT)
        self.sending = True

    def receive(self) -> None:
        self._start((cygrpc.ReceiveMessageOperation(0),), _RECEIVED)

    def _metadata(self) -> cygrpc.Operation:
        self.metadata_sent = True
        return cygrpc.SendInitialMetadataOperation(None, 0)

    def _start(self, operations: tuple, kind: int) -> None:
        assert self.call is not None
        self.call.start_server_batch(operations, (self, kind))
        self.pending += 1

    def completed(self) -> bool:
        """One batch completed; True once none is left: the call is over and let go of (the
        core server's shutdown waits for every call to be released)."""
        self.pending -= 1
        if self.pending or not self.ended:
            return False
        self.call = None
        self.session.send = _discard  # the session and this object no longer refer to each other
        return True


class _CoreGateServer:
    """The ``LaneGate`` service on grpcio's core server, driven by one thread of its own.

    grpc.aio hands every completion from its poller thread to the event loop through a socket
    and resumes coroutines and futures per message; the gate's per-message work is a few
    microseconds, so that machinery was most of a round trip. Here one thread polls the
    server's completion queue and handles each completion as it arrives: a job's message is
    parsed, decided on and the answer's send started before the thread polls again. The gate
    (lanes, scheduler, sessions) is touched only under ``lock``: by this thread for each
    completion, by ``LaneServer``'s readers (``snapshot``) from elsewhere.
    """

    def __init__(self, gate: _Gate, address: str, options: Iterable[tuple[str, object]], lock: threading.Lock) -> None:
        self._gate = gate
        self._lock = lock
        self._queue = cygrpc.CompletionQueue()
        self._server = cygrpc.Server(tuple(options), False)
        self._server.register_completion_queue(self._queue)
        if self._server.add_http2_port(address.encode()) == 0:
            raise ConfigurationError(f"cannot bind the Salus gate to {address}")
        self._calls: set[_CoreCall] = set()  # calls with batches in flight
        self._stopping = False
        self._shut_down = False
        self._awaiting_call = False  # a request_call is outstanding (it completes, failed, at shutdown)
        self._thread = threading.Thread(target=self._serve, name=f"salus-gate {address}", daemon=True)

    def start(self) -> None:
        self._server.start()
        self._request_call()
        self._thread.start()

    def _request_call(self) -> None:
        self._server.request_call(self._queue, self._queue, _REQUEST_CALL)
        self._awaiting_call = True

    async def stop(self, grace: float | None) -> None:
        """Stop accepting calls; after ``grace`` seconds cancel the sessions still open."""
        with self._lock:
            self._stopping = True
            self._server.shutdown(self._queue, _SHUTDOWN)
        if grace:
            await asyncio.to_thread(self._thread.join, grace)
        if self._thread.is_alive():
            with self._lock:
                self._server.cancel_all_calls()
            await asyncio.to_thread(self._thread.join)

    def _serve(self) -> None:
        while True:
            event = self._queue.poll(time.time() + 1.0)
            if event.completion_type == cygrpc.CompletionType.queue_timeout:
                continue
            with self._lock:
                try:
                    if event.tag is _SHUTDOWN:
                        self._shut_down = True
                    elif event.tag is _REQUEST_CALL:
                        self._arrived(event)
                    else:
                        core_call, kind = event.tag
                        self._completed(core_call, kind, event)
                        if core_call.completed():
                            self._calls.discard(core_call)
                except Exception:  # a bug in the gate: keep serving the other jobs
                    log.critical("Salus gate thread failed handling a completion", exc_info=True)
                if self._shut_down and not self._calls and not self._awaiting_call:
                    self._server.destroy()
                    return
            event = None  # drop the call's reference before polling again

    def _arrived(self, event: cygrpc.RequestCallEvent) -> None:
        self._awaiting_call = False
        if not self._stopping:
            self._request_call()
        if not event.success:
            return
        core_call = _CoreCall(event.call)
        self._calls.add(core_call)
        core_call._start((cygrpc.ReceiveCloseOnServerOperation(0),), _CLOSED)
        if event.call_details.method != _SESSION_METHOD:
            core_call.ended = True  # no job behind it
            core_call.finish(cygrpc.StatusCode.unimplemented, b"Method not found!")
            return
        core_call.receive()

    def _completed(self, core_call: _CoreCall, kind: int, event: cygrpc.BaseEvent) -> None:
        if kind == _RECEIVED:
            data = event.batch_operations[0].message() if event.success else None
            if data is None:  # the job closed its side (its finish) or the connection broke
                core_call.send(None)
                self._end(core_call)
                return
            session = core_call.session
            if session.closed or core_call.status_sent:
                return  # nothing the job sends after a refusal is handled (and no more reads)
            try:
                message = pb.JobMessage.FromString(data)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError
                core_call.finish(cygrpc.StatusCode.internal, b"Exception deserializing request!")
                self._end(core_call)
                return
            try:
                self._gate.handle(session, message)
            except Exception as error:
                # An InvariantViolation (or a bug) while handling the job's message: fail
                # loudly, the job sees its call fail.
                log.critical("Salus gate failed handling job %s", session.job, exc_info=error)
                core_call.finish(cygrpc.StatusCode.unknown, f"{type(error).__name__}: {error}".encode())
                self._end(core_call)
                return
            if not session.closed:
                core_call.receive()
        elif kind == _SENT:
            core_call.sending = False
            if not event.success:  # the call is broken: its receive fails too and ends it
                core_call.outbox.clear()
                core_call.status_sent = True
            core_call.flush()
        else:  # _CLOSED: the call is over on the job's side (cancelled: the job is gone)
            if event.batch_operations[0].cancelled():
                core_call.status_sent = True
                core_call.outbox.clear()
            self._end(core_call)

    def _end(self, core_call: _CoreCall) -> None:
        if not core_call.ended:
            core_call.ended = True
            self._gate.end(core_call.session)


class LaneServer:
    """Salus lanes and iteration scheduling for one GPU, served on ``unix:<socket_path>``.

    ``capacity_mib`` is the GPU memory the lanes may use (C); ``policy`` is one of
    ``fifo``, ``pack``, ``srtf``, ``fair``. Start and stop it on an event loop.

    ``transport``: ``"core"`` (the default) serves the gate from a thread of its own on
    grpcio's core server (``_CoreGateServer``); ``"aio"`` serves it on the event loop with
    grpc.aio (about 1.5-2x the round trip; the fallback when grpcio's core is not reachable).

    grpcio is imported by ``start``, after the gRPC setting (``grpc_setup``), not on import.
    """

    def __init__(self, socket_path: str, capacity_mib: float, policy: str, *, history: int = 100_000,
                 transport: str = "core") -> None:  # fmt: skip
        try:
            self.policy = Policy(policy)
        except ValueError:
            raise ConfigurationError(f"unknown Salus policy {policy!r}; one of {[p.value for p in Policy]}") from None
        if not (math.isfinite(capacity_mib) and capacity_mib > 0):
            raise ConfigurationError(f"Salus capacity_mib must be a positive number, got {capacity_mib!r}")
        if not socket_path:
            raise ConfigurationError("Salus socket_path is empty")
        if transport not in ("core", "aio"):
            raise ConfigurationError(f"unknown Salus transport {transport!r}; one of ['core', 'aio']")
        self.socket_path = socket_path
        self.capacity_mib = capacity_mib
        self.transport = transport
        self._history = history
        self._server: grpc.aio.Server | _CoreGateServer | None = None
        self._gate: _Gate | None = None
        self._lock = threading.Lock()  # the gate's state: the core server's thread vs readers

    @property
    def address(self) -> str:
        return f"unix:{self.socket_path}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("LaneServer already started")
        _load_grpc()  # the gate starts here: the gRPC setting first, then grpcio
        if self.transport == "core" and not core_server_usable():
            log.warning("grpcio's core server is not reachable: the Salus gate falls back to grpc.aio")
            self.transport = "aio"
        self._remove_stale_socket()
        self._gate = _Gate(self.capacity_mib, self.policy, self._history)
        if self.transport == "core":
            core = _CoreGateServer(self._gate, self.address, GRPC_OPTIONS, self._lock)
            core.start()
            self._server = core
        else:
            from . import gate_pb2_grpc as pb_grpc  # imports grpcio: only now, after the setting

            server = grpc.aio.server(options=GRPC_OPTIONS)
            pb_grpc.add_LaneGateServicer_to_server(_LaneGateServicer(self._gate), server)
            if server.add_insecure_port(self.address) == 0:
                raise ConfigurationError(f"cannot bind the Salus gate to {self.address}")
            await server.start()
            self._server = server
        log.info("Salus gate on %s (%s): C = %g MiB, policy %s", self.address, self.transport, self.capacity_mib,
                 self.policy.value)  # fmt: skip

    async def stop(self, grace: float | None = 0.5) -> None:
        """Stop serving; open sessions are cancelled (their jobs' adaptors see the stream end)."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        self._remove_stale_socket()

    def grant(self, job: str, *, persistent_mib: float, ephemeral_mib: float, lane_id: int, lane_size_mib: float,
              policy: str) -> Granted | Refused:
        """Admit ``job`` into the lane its grant names, before its process starts (module
        docstring); `Refused` with the reason when the GPU cannot honour the grant."""
        gate = self._require_gate()
        with self._lock:
            return gate.grant(job, persistent_mib, ephemeral_mib, lane_id, lane_size_mib, Policy(policy))

    def release(self, job: str) -> bool:
        """Release a granted job's lane, ``P`` and ``E`` (and end its session if one is open);
        False if the job holds no grant here."""
        gate = self._require_gate()
        with self._lock:
            return gate.release(job)

    def holds(self) -> tuple[str, ...]:
        """The jobs holding granted lanes, sorted."""
        gate = self._require_gate()
        with self._lock:
            return tuple(sorted(gate.granted))

    def snapshot(self) -> LaneSnapshot:
        """The lanes, the queue and the memory totals now."""
        gate = self._require_gate()
        with self._lock:
            return LaneSnapshot(gate.policy, self.capacity_mib, gate.lanes.lanes, gate.lanes.pending,
                                gate.lanes.persistent_total_mib, gate.lanes.lanes_total_mib)  # fmt: skip

    def completed_iterations(self) -> tuple[IterationRecord, ...]:
        """The most recent iterations (up to ``history``), in the order they were reported done."""
        gate = self._require_gate()
        with self._lock:
            return tuple(gate.history)

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
