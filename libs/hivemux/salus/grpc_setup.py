"""gRPC's core settings for the iteration gate, applied before grpcio is imported.

grpcio 1.6x-1.8x run a channel's and a server's socket I/O on EventEngine threads
("event_engine_client", "event_engine_listener" experiments, on by default) and hand each
completion over to the thread polling the completion queue: two extra thread hops per message.
On a gate round trip (a job's "done, may I go on?" and the grant, over a Unix socket) that
machinery was most of the time: a bare stream echo took ~215 us with them and ~105 us without
(2-core VM, `python benchmarks/salus.py`). Without them grpcio does the I/O in the polling
thread, as it did before EventEngine.

gRPC reads the variable once, when its core starts: `hivemux.salus` applies this before it
imports grpcio, and an explicit ``GRPC_EXPERIMENTS`` of the user's is kept as it is.
"""

from __future__ import annotations

import os
import sys

EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def prefer_polling_thread_io() -> bool:
    """Ask gRPC to do socket I/O in the polling thread; False if it is too late or the user
    chose experiments of their own."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True
