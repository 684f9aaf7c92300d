"""gRPC's core settings for the iteration gate, applied where the gate starts, before grpcio is
imported.

grpcio 1.6x-1.8x run a channel's and a server's socket I/O on EventEngine threads
("event_engine_client", "event_engine_listener" experiments, on by default) and hand each
completion over to the thread polling the completion queue: two extra thread hops per message.
On a gate round trip (a job's "done, may I go on?" and the grant, over a Unix socket) that
machinery was most of the time: a bare stream echo took ~215 us with them and ~105 us without
(2-core VM, `python benchmarks/salus.py`). Without them grpcio does the I/O in the polling
thread, as it did before EventEngine.

gRPC reads the variable once, when its core starts. Importing `hivemux.salus` changes nothing
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


def prefer_polling_thread_io() -> bool:
    """Ask gRPC to do socket I/O in the polling thread; False if it is too late or the user
    chose experiments of their own."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
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
