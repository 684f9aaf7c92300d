"""The Salus adaptor for workloads: a context manager and iterator around a training loop.

Salus (§3.1) puts an adaptor in the DL framework so an unmodified script gets lanes; hivemux's
adaptor is explicit and framework-agnostic, a few lines around a PyTorch (or any) loop::

    from hivemux import salus

    with salus.job("resnet-tune-3", persistent_mib=900, ephemeral_mib=3_000, iterations=500) as gate:
        for step in gate.iterations():   # waits for the gate's grant before each iteration
            loss = train_one_iteration()  # the iteration runs in the job's lane
        # leaving the loop reports the last iteration done; leaving the block ends the job

``job`` registers the job's persistent (``P``: model, optimizer state, framework-internal) and
ephemeral (``E``: peak per-iteration activations and scratch) memory, and blocks until the
gate admits the job into a lane (a job may be queued until memory frees up). Each step of
``iterations()`` first reports the previous iteration done and asks for the next one in a
single message, then waits for the grant. Breaking out of the loop reports the running
iteration done.

The gate's socket is ``socket=`` or else the ``HIVEMUX_SALUS_SOCKET`` environment variable,
which the executor sets for the workloads it starts on a Salus GPU (read when ``job`` is
called, never at import). With neither, the job runs un-gated: ``iterations()`` just counts,
so the same script runs on a whole GPU or under MPS sharing.

Design note, the session as the adaptor sees it::

    connecting ─► registering ─(Queued)*─► admitted ─► requesting ⇄ running ─► closed
                        └──(Refused)──► JobRefused raised          │
        ▲                                                          │ the gate went away
        └──────── (reconnect_s > 0: the iterations left) ◄─────────┘ (else GateUnavailable)

One gRPC stream per job (see ``server.py`` for why a stream), driven from the job's own
thread, so a training loop needs no event loop: ``_DirectStream`` starts gRPC batches on the
call and waits for their completion itself (grpcio's ``segregated_call``, as its blocking unary
calls do), so reporting an iteration done, asking for the next and receiving the grant are one
batch and one wake-up, with no helper thread in between. grpcio's public streaming API needs
two thread hand-offs per message (a thread consuming the request iterator, the channel's
polling thread waking the reader): 50-240 us more per round trip on the loaded development
machine (figures in ``server.py``; ``benchmarks/salus.py`` prints both). That API remains the
fallback (``_ThreadedStream``) if grpcio's internals are not as ``_DirectStream`` expects.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from hivemux.errors import HivemuxError, TransientError

from . import gate_pb2 as pb
from .grpc_setup import grpc_modules, prefer_polling_thread_io

if TYPE_CHECKING:
    import grpc
    from grpc._cython import cygrpc
else:
    # grpcio and its core (the transport the adaptor drives from the job's thread, see
    # _DirectStream) are imported when a job opens its session (`_load_grpc`), after the
    # gRPC setting: importing the adaptor loads no grpcio and changes no environment.
    grpc = cygrpc = None

SOCKET_ENV = "HIVEMUX_SALUS_SOCKET"

# Latency over throughput on a local socket (the server uses them too): no retry buffering,
# no BDP probing.
GRPC_OPTIONS = [
    ("grpc.enable_retries", 0),
    ("grpc.optimization_target", "latency"),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.minimal_stack", 1),  # no deadline or message-size filters: the stream has neither
]


_SERVICE = pb.DESCRIPTOR.services_by_name["LaneGate"]
_SESSION_METHOD = f"/{_SERVICE.full_name}/{_SERVICE.methods_by_name['Session'].name}"

# The per-iteration messages never change: built and serialized once, off the iteration path.
_REQUEST = pb.JobMessage(request=pb.Request()).SerializeToString()
_DONE_AND_NEXT = pb.JobMessage(done=pb.Done(request_next=True)).SerializeToString()
_DONE = pb.JobMessage(done=pb.Done(request_next=False)).SerializeToString()


class GateError(HivemuxError):
    """The gate ended the job's session unexpectedly or answered out of protocol."""


class JobRefused(GateError):
    """The gate will not admit the job (for example P + E exceeds the GPU's capacity)."""


class GateUnavailable(TransientError):
    """The gate's socket does not answer."""


class _Ended(Exception):
    """The session's call ended; ``code`` is its gRPC status (OK: the gate closed the stream)."""

    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code.name)
        self.code = code


_STATUS_CODES: dict[int, grpc.StatusCode] = {}


def _load_grpc() -> None:
    """Import grpcio (once), after applying the gRPC setting (see ``grpc_setup``)."""
    global grpc, cygrpc
    if grpc is None:
        grpc, cygrpc = grpc_modules()
        _STATUS_CODES.update((code.value[0], code) for code in grpc.StatusCode)


class _DirectStream:
    """A ``LaneGate.Session`` call driven entirely from the job's own thread.

    grpcio's public stream API costs two thread hand-offs per message on the client: a helper
    thread consumes the request iterator and the channel's polling thread wakes the reader.
    Here the call has its own completion queue (grpcio's ``segregated_call``, which its
    blocking unary path uses too) and the job's thread starts each batch and waits for its
    completion itself: sending ``Done(request_next)`` and receiving the grant is one batch and
    one wake-up. Every method blocks until its batch completes, so at most one send and one
    receive are ever outstanding, as gRPC requires. Not thread-safe; one job, one thread.
    """

    _STATUS = object()  # tag of the batch that completes when the call ends

    def __init__(self, channel: grpc.Channel, method: str = _SESSION_METHOD) -> None:
        _load_grpc()  # a no-op once a job has opened (benchmarks drive this class directly)
        core = channel._channel  # type: ignore[attr-defined]  # grpcio's cygrpc.Channel
        self._call = core.segregated_call(
            cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS, method.encode(), None, None, None, None,
            (((cygrpc.ReceiveInitialMetadataOperation(0), cygrpc.ReceiveStatusOnClientOperation(0)), self._STATUS),),
            cygrpc.build_census_context(), None,
        )  # fmt: skip
        self._metadata_sent = False
        self._closed_send = False
        self._interrupted = False  # a wait was interrupted (KeyboardInterrupt): its batch is pending
        self._code: grpc.StatusCode | None = None  # set when the status batch completes

    @staticmethod
    def usable(channel: grpc.Channel) -> bool:
        _load_grpc()
        return cygrpc is not None and isinstance(getattr(channel, "_channel", None), cygrpc.Channel)

    def send(self, data: bytes) -> None:
        self._run(self._send_ops(data))

    def exchange(self, data: bytes) -> bytes:
        """Send ``data`` and receive the next message (one batch, one wait)."""
        return self._message(self._run(self._send_ops(data) + (cygrpc.ReceiveMessageOperation(0),)))

    def receive(self) -> bytes:
        return self._message(self._run((cygrpc.ReceiveMessageOperation(0),)))

    def finish(self) -> None:
        """Close the sending side, drain the gate's messages and wait for the call's end."""
        if self._code is not None:
            return
        if self._interrupted:  # a batch may still be outstanding: end the call rather than queue more
            self._call.cancel(cygrpc.StatusCode.cancelled, "the job stopped mid-call")
            while self._code is None:
                self._record_status(self._call.next_event())
            return
        if not self._closed_send:
            self._closed_send = True
            ops: tuple = (cygrpc.SendCloseFromClientOperation(0),)
            if not self._metadata_sent:
                self._metadata_sent = True
                ops = (cygrpc.SendInitialMetadataOperation(None, 0),) + ops
            self._run(ops)
        try:
            while True:
                self.receive()
        except _Ended:
            pass

    def _send_ops(self, data: bytes) -> tuple:
        if self._metadata_sent:
            return (cygrpc.SendMessageOperation(data, 0),)
        self._metadata_sent = True
        return (cygrpc.SendInitialMetadataOperation(None, 0), cygrpc.SendMessageOperation(data, 0))

    def _run(self, operations: tuple) -> cygrpc.BaseEvent:
        if self._code is not None:  # the call is over (its completion queue is gone)
            raise _Ended(self._code)
        if self._interrupted:
            raise _Ended(grpc.StatusCode.CANCELLED)
        tag = object()
        self._interrupted = True
        self._call.operate(operations, tag)
        while (event := self._call.next_event()).tag is not tag:
            self._record_status(event)
        self._interrupted = False
        return event

    def _record_status(self, event: cygrpc.BaseEvent) -> None:
        if event.tag is self._STATUS:
            wanted = cygrpc.OperationType.receive_status_on_client
            [status] = [op for op in event.batch_operations if op.type() == wanted]
            self._code = _STATUS_CODES.get(status.code(), grpc.StatusCode.UNKNOWN)

    def _message(self, event: cygrpc.BaseEvent) -> bytes:
        message = event.batch_operations[-1].message()
        if message is None:  # the gate ended the stream or the connection broke
            while self._code is None:
                self._record_status(self._call.next_event())
            raise _Ended(self._code)
        return message


class _ThreadedStream:
    """The same session over grpcio's public streaming API (its helper threads): the fallback
    when grpcio's core is not reachable as ``_DirectStream`` expects."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        ident = lambda data: data  # noqa: E731
        call = channel.stream_stream(_SESSION_METHOD, request_serializer=ident, response_deserializer=ident)
        self._responses: Iterator[bytes] = call(self._requests())
        self._closed_send = False

    def _requests(self) -> Iterator[bytes]:
        while (message := self._outbox.get()) is not None:
            yield message

    def send(self, data: bytes) -> None:
        self._outbox.put(data)

    def exchange(self, data: bytes) -> bytes:
        self._outbox.put(data)
        return self.receive()

    def receive(self) -> bytes:
        try:
            return next(self._responses)
        except StopIteration:
            raise _Ended(grpc.StatusCode.OK) from None
        except grpc.RpcError as broken:
            raise _Ended(broken.code()) from None

    def finish(self) -> None:
        if not self._closed_send:
            self._closed_send = True
            self._outbox.put(None)
        try:
            while True:
                self.receive()
        except _Ended:
            pass


class GatedJob:
    """A job with a lane on a Salus gate. Use as a context manager (``job(...)`` builds it)."""

    def __init__(
        self,
        name: str,
        *,
        persistent_mib: float,
        ephemeral_mib: float,
        socket: str,
        iterations: int | None = None,
        iteration_seconds: float | None = None,
        connect_timeout_s: float = 10.0,
        reconnect_s: float = 0.0,
    ) -> None:
        self.name = name
        self.socket = socket
        self.iteration_count = iterations
        self.lane: int | None = None
        self.lane_size_mib: float | None = None
        self.queued_reason: str | None = None
        self._register = pb.Register(job=name, persistent_mib=persistent_mib, ephemeral_mib=ephemeral_mib)
        if iterations is not None:
            self._register.iterations = iterations
        if iteration_seconds is not None:
            self._register.iteration_seconds = iteration_seconds
        self._connect_timeout_s = connect_timeout_s
        self._reconnect_s = reconnect_s
        self._base = 0  # the job's iteration the current session's iteration 0 is (after a reconnect)
        self.reconnects = 0
        self._channel: grpc.Channel | None = None
        self._stream: _DirectStream | _ThreadedStream | None = None
        self._running = False
        self._iterating = False
        self._next_step = 0  # iterations() continues from here if called again

    # -- the session --------------------------------------------------------------------------

    def __enter__(self) -> GatedJob:
        self.open()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        """Connect, register and wait until the gate admits the job into a lane."""
        self._open(self._connect_timeout_s)

    def _open(self, timeout_s: float) -> None:
        _load_grpc()
        self._channel = grpc.insecure_channel(f"unix:{self.socket}", options=GRPC_OPTIONS)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            self._channel.close()
            self._channel = None
            raise GateUnavailable(f"the Salus gate at unix:{self.socket} does not answer") from None
        stream_kind = _DirectStream if _DirectStream.usable(self._channel) else _ThreadedStream
        self._stream = stream_kind(self._channel)
        try:
            message = self._exchange(pb.JobMessage(register=self._register).SerializeToString())
            while True:
                kind = message.WhichOneof("kind")
                if kind == "admitted":
                    self.lane, self.lane_size_mib = message.admitted.lane, message.admitted.lane_size_mib
                    return
                if kind != "queued":
                    raise GateError(f"the gate answered {kind!r} while the job waited for a lane")
                self.queued_reason = message.queued.reason
                message = self._receive()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Report a running iteration done and end the session (the job's finish). Idempotent."""
        if self._channel is None:
            return
        try:
            if self._running:
                self._running = False
                self._send(_DONE)
            if self._stream is not None:
                # End the request stream (the gate runs JobFinish) and drain until the gate
                # closes its side. A broken stream ends the same way: nothing left to release.
                self._stream.finish()
        except (GateError, GateUnavailable, _Ended, grpc.RpcError):
            pass  # the gate is gone: there is nothing left to release on its side
        finally:
            self._stream = None
            # The gate has ended the session (drained above). Closing a channel blocks for the
            # client's polling period (~0.2 s), which would count in every job's completion
            # time, so it happens off the job's thread.
            channel, self._channel = self._channel, None
            threading.Thread(target=channel.close, name=f"salus-close-{self.name}", daemon=True).start()

    # -- iterations ---------------------------------------------------------------------------

    def iterations(self) -> Iterator[int]:
        """Yield 0, 1, 2, ... (up to ``iterations`` if given), each once the gate grants it.

        A second call continues the count where the first stopped (the gate numbers the job's
        iterations, not the loops)."""
        if self._channel is None:
            raise GateError("iterations() outside the job's `with` block")
        if self._iterating:
            raise GateError("iterations() is already running for this job")
        self._iterating = True
        try:
            while self.iteration_count is None or self._next_step < self.iteration_count:
                step = self._next_step
                request = _DONE_AND_NEXT if self._running else _REQUEST
                self._running = False
                try:
                    grant = self._exchange(request)
                except GateUnavailable:
                    if self._reconnect_s <= 0:
                        raise
                    self._reconnect(step)
                    grant = self._exchange(_REQUEST)
                self._await_grant(step, grant)
                self._running = True
                self._next_step += 1  # before the yield: a loop that breaks has still run it
                yield step
        finally:
            self._iterating = False
            if self._running and self._channel is not None:
                self._running = False
                self._send(_DONE)

    def _reconnect(self, step: int) -> None:
        """The gate went away mid-job (its executor died; a restarted one re-grants the job's
        lane): connect again within ``reconnect_s`` and register the iterations left, the job's
        ``step`` being the new session's iteration 0. The training loop's state is in this
        process, so nothing is lost; a session that cannot be opened in time raises."""
        self._drop_session()
        deadline = time.monotonic() + self._reconnect_s
        register = pb.Register()
        register.CopyFrom(self._register)
        if self.iteration_count is not None:
            register.iterations = self.iteration_count - step
        self._register, self._base = register, step
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GateUnavailable(f"the Salus gate at unix:{self.socket} did not come back within "
                                      f"{self._reconnect_s:g} s")  # fmt: skip
            try:
                self._open(min(2.0, remaining))  # a fresh channel each try: no reconnect backoff
            except GateUnavailable:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            self.reconnects += 1
            return

    def _drop_session(self) -> None:
        """Forget a broken session (nothing to release on a gate that is gone)."""
        channel, self._channel, self._stream = self._channel, None, None
        if channel is not None:
            threading.Thread(target=channel.close, name=f"salus-close-{self.name}", daemon=True).start()

    def _await_grant(self, step: int, message: pb.GateMessage) -> None:
        if (kind := message.WhichOneof("kind")) != "grant":
            raise GateError(f"expected a grant for iteration {step}, the gate answered {kind!r}")
        if message.grant.iteration + self._base != step:
            raise GateError(f"the gate granted iteration {message.grant.iteration + self._base}, expected {step}")

    # -- transport ----------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            self._require_stream().send(data)
        except _Ended as ended:
            raise self._ended(ended) from None

    def _exchange(self, data: bytes) -> pb.GateMessage:
        """Send one (serialized) message and receive the gate's answer: one round trip."""
        try:
            return self._parse(self._require_stream().exchange(data))
        except _Ended as ended:
            raise self._ended(ended) from None

    def _receive(self) -> pb.GateMessage:
        try:
            return self._parse(self._require_stream().receive())
        except _Ended as ended:
            raise self._ended(ended) from None

    def _require_stream(self) -> _DirectStream | _ThreadedStream:
        if self._stream is None:
            raise GateError("the job's session is closed")
        return self._stream

    def _ended(self, ended: _Ended) -> GateError | GateUnavailable:
        if ended.code is grpc.StatusCode.OK:
            return GateError("the gate ended the job's session")
        return GateUnavailable(f"the Salus gate at unix:{self.socket} failed: {ended.code.name}")

    @staticmethod
    def _parse(data: bytes) -> pb.GateMessage:
        message = pb.GateMessage.FromString(data)
        if message.WhichOneof("kind") == "refused":
            raise JobRefused(message.refused.reason)
        return message


class UngatedJob:
    """A job with no gate configured: it runs as if it had the GPU (or its MPS share) alone."""

    lane: int | None = None
    lane_size_mib: float | None = None
    queued_reason: str | None = None

    def __init__(self, name: str, *, iterations: int | None = None) -> None:
        self.name = name
        self.iteration_count = iterations
        self._next_step = 0

    def __enter__(self) -> UngatedJob:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def iterations(self) -> Iterator[int]:
        """Yield 0, 1, 2, ... (up to ``iterations`` if given) at once, continuing across calls."""
        while self.iteration_count is None or self._next_step < self.iteration_count:
            self._next_step += 1
            yield self._next_step - 1


def job(
    name: str,
    *,
    persistent_mib: float,
    ephemeral_mib: float,
    iterations: int | None = None,
    iteration_seconds: float | None = None,
    socket: str | None = None,
    connect_timeout_s: float = 10.0,
    reconnect_s: float = 0.0,
) -> GatedJob | UngatedJob:
    """The adaptor for one job: gated if a socket is given or ``HIVEMUX_SALUS_SOCKET`` is set.

    ``iterations`` lets SRTF rank the job (and ends the loop after that many);
    ``iteration_seconds`` is an estimate SRTF uses until the gate has measured an iteration;
    ``reconnect_s`` > 0: when the gate goes away mid-job (its executor restarted), connect again
    for up to that long and go on with the iterations left (`GatedJob._reconnect`).
    """
    path = socket if socket is not None else os.environ.get(SOCKET_ENV, "")
    if not path:
        return UngatedJob(name, iterations=iterations)
    prefer_polling_thread_io()  # where the gate starts for this job, before grpcio is imported
    return GatedJob(name, persistent_mib=persistent_mib, ephemeral_mib=ephemeral_mib, socket=path,
                    iterations=iterations, iteration_seconds=iteration_seconds,
                    connect_timeout_s=connect_timeout_s, reconnect_s=reconnect_s)  # fmt: skip
