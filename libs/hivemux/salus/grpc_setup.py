"""gRPC's core settings for the iteration gate, applied where the gate starts, before grpcio is
imported.

grpcio 1.6x-1.8x run a channel's and a server's socket I/O on EventEngine threads
("event_engine_client", "event_engine_listener" experiments, on by default) and hand each
completion over to the thread polling the completion queue: two extra thread hops per message.
On a gate round trip (a job's "done, may I go on?" and the grant, over a Unix socket) that
machinery was most of the time: a bare stream echo took ~215 us with them and ~105 us without
(2-core VM, `python benchmarks/salus.py`). Without them grpcio does the I/O in the polling
thread, as it did before EventEngine.

Fork support off (``GRPC_ENABLE_FORK_SUPPORT=0``). grpcio is built with gRPC's fork support on:
its ``pthread_atfork`` handlers pause gRPC before every ``fork()`` of the process and, in the
child, restart EventEngine's poller thread on the inherited epoll fd. The executor agent runs
the GPUs' lane servers in its own process and starts every workload with ``fork()`` + ``exec``
(a uid switch rules out ``vfork``); between the two, ``subprocess`` closes the child's file
descriptors (``close_fds``), the epoll fd among them, so the restarted poller thread meets
``epoll_wait: EBADF`` and aborts the child before it execs: the workload "dies" at start with
"(event_engine) Epoll1Poller ... epoll_wait error: Bad file descriptor" in its log (its stderr is
already the log), or its start never happens (grpc/grpc#43055: a regression since grpcio 1.81,
open). A child that only execs never uses the parent's gRPC, so nothing needs the handlers; with
them off, ``fork`` is a plain ``fork``. Seen under ``strace -f`` (which widens the window
between the child's fork and its exec): 40 forks of ``/bin/true`` as a uid beside a lane server
with one gated job iterating; children aborted with that message, and poller threads of children
met EBADF; with ``GRPC_ENABLE_FORK_SUPPORT=0``, none. A workload that forks without exec (a data
loader) after its session opened gets a plain fork too: the child must not use the parent's
channel, which it never does.

gRPC reads the variables once, when its core starts. Importing `hivemux.salus` changes nothing
(no environment write, no grpcio): the gate's modules reach grpcio only through
`grpc_modules`, which applies the setting first, and they call it where the gate starts
(`LaneServer.start`, the adaptor's `job()` and `GatedJob.open`). An explicit
``GRPC_EXPERIMENTS`` of the user's is kept as it is; once grpcio is loaded it is too late.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

EXPERIMENTS = "-event_engine_client,-event_engine_listener"
FORK_SUPPORT = "0"


def prefer_polling_thread_io() -> bool:
    """Ask gRPC to do socket I/O in the polling thread, and to leave ``fork`` alone (see the
    module's docstring); False if it is too late or the user chose experiments of their own
    (an explicit ``GRPC_ENABLE_FORK_SUPPORT`` is kept as well)."""
    if "grpc" in sys.modules:
        return False
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", FORK_SUPPORT)
    if "GRPC_EXPERIMENTS" in os.environ:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True


def grpc_modules() -> tuple[ModuleType, ModuleType | None]:
    """grpcio and its Cython core (None if it is not reachable), imported after the setting."""
    prefer_polling_thread_io()
    import grpc

    try:  # the gate drives grpcio's core directly (server._CoreGateServer, client._DirectStream)
        from grpc._cython import cygrpc
    except ImportError:  # pragma: no cover - grpcio without its Cython core
        return grpc, None
    return grpc, cygrpc
