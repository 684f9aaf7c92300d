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
                        └──(Refused)──► JobRefused raised

One gRPC stream per job (see ``server.py`` for why a stream); the synchronous gRPC client, so
a training loop needs no event loop.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from types import TracebackType

import grpc

from hivemux.errors import HivemuxError, TransientError

from . import gate_pb2 as pb
from . import gate_pb2_grpc as pb_grpc

SOCKET_ENV = "HIVEMUX_SALUS_SOCKET"

# Latency over throughput on a local socket (the server uses them too): no retry buffering,
# no BDP probing.
GRPC_OPTIONS = [
    ("grpc.enable_retries", 0),
    ("grpc.optimization_target", "latency"),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.minimal_stack", 1),  # no deadline or message-size filters: the stream has neither
]


# The per-iteration messages never change: built once, off the iteration path.
_REQUEST = pb.JobMessage(request=pb.Request())
_DONE_AND_NEXT = pb.JobMessage(done=pb.Done(request_next=True))
_DONE = pb.JobMessage(done=pb.Done(request_next=False))


class GateError(HivemuxError):
    """The gate ended the job's session unexpectedly or answered out of protocol."""


class JobRefused(GateError):
    """The gate will not admit the job (for example P + E exceeds the GPU's capacity)."""


class GateUnavailable(TransientError):
    """The gate's socket does not answer."""


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
        self._channel: grpc.Channel | None = None
        self._outbox: queue.SimpleQueue[pb.JobMessage | None] = queue.SimpleQueue()
        self._responses: Iterator[pb.GateMessage] | None = None
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
        self._channel = grpc.insecure_channel(f"unix:{self.socket}", options=GRPC_OPTIONS)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self._connect_timeout_s)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise GateUnavailable(f"the Salus gate at unix:{self.socket} does not answer") from None
        self._responses = pb_grpc.LaneGateStub(self._channel).Session(self._requests())
        self._send(pb.JobMessage(register=self._register))
        try:
            while True:
                message = self._receive()
                kind = message.WhichOneof("kind")
                if kind == "admitted":
                    self.lane, self.lane_size_mib = message.admitted.lane, message.admitted.lane_size_mib
                    return
                if kind != "queued":
                    raise GateError(f"the gate answered {kind!r} while the job waited for a lane")
                self.queued_reason = message.queued.reason
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
            self._outbox.put(None)  # ends the request stream: the gate runs JobFinish
            if self._responses is not None:
                for _ in self._responses:  # drain until the gate closes its side
                    pass
        except grpc.RpcError:
            pass  # the gate is gone: there is nothing left to release on its side
        finally:
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
                self._send(_DONE_AND_NEXT if self._running else _REQUEST)
                self._running = False
                self._await_grant(step)
                self._running = True
                self._next_step += 1  # before the yield: a loop that breaks has still run it
                yield step
        finally:
            self._iterating = False
            if self._running and self._channel is not None:
                self._running = False
                self._send(_DONE)

    def _await_grant(self, step: int) -> None:
        message = self._receive()  # a refusal raises JobRefused
        if (kind := message.WhichOneof("kind")) != "grant":
            raise GateError(f"expected a grant for iteration {step}, the gate answered {kind!r}")
        if message.grant.iteration != step:
            raise GateError(f"the gate granted iteration {message.grant.iteration}, expected {step}")

    # -- transport ----------------------------------------------------------------------------

    def _requests(self) -> Iterator[pb.JobMessage]:
        while (message := self._outbox.get()) is not None:
            yield message

    def _send(self, message: pb.JobMessage) -> None:
        self._outbox.put(message)

    def _receive(self) -> pb.GateMessage:
        assert self._responses is not None
        try:
            message = next(self._responses)
        except StopIteration:
            raise GateError("the gate ended the job's session") from None
        except grpc.RpcError as broken:
            raise GateUnavailable(f"the Salus gate at unix:{self.socket} failed: {broken.code().name}") from None
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
) -> GatedJob | UngatedJob:
    """The adaptor for one job: gated if a socket is given or ``HIVEMUX_SALUS_SOCKET`` is set.

    ``iterations`` lets SRTF rank the job (and ends the loop after that many);
    ``iteration_seconds`` is an estimate SRTF uses until the gate has measured an iteration.
    """
    path = socket if socket is not None else os.environ.get(SOCKET_ENV, "")
    if not path:
        return UngatedJob(name, iterations=iterations)
    return GatedJob(name, persistent_mib=persistent_mib, ephemeral_mib=ephemeral_mib, socket=path,
                    iterations=iterations, iteration_seconds=iteration_seconds,
                    connect_timeout_s=connect_timeout_s)  # fmt: skip
