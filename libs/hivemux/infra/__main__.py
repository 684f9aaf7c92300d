"""`python -m hivemux.infra`: start both servers, print their endpoints, wait for SIGTERM/SIGINT.

The endpoints are printed as `KAFKA_BOOTSTRAP_SERVERS=...` and `HIVEMUX_POSTGRES_DSN=...` lines
on stdout, ready to export for another shell; the servers run until this process gets SIGTERM
or SIGINT (a clean stop), or dies (their death signal). `hivemux.infra.main` calls this `main`.
"""

from __future__ import annotations

import logging
import signal
import sys

from . import InfraSettings, embedded_infra
from .processes import log_event


def main() -> int:
    """`python -m hivemux.infra`: start both servers, print their endpoints, wait for SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with embedded_infra(InfraSettings()) as infra:
        print(f"KAFKA_BOOTSTRAP_SERVERS={infra.endpoints.bootstrap_servers}")
        print(f"HIVEMUX_POSTGRES_DSN={infra.endpoints.postgres_dsn}", flush=True)
        # Blocked only now: a signal mask survives fork and exec, and a child spawned with
        # SIGTERM blocked would ignore its death signal.
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        received = signal.sigwait(stop_signals)
        log_event(logging.INFO, "stopping", signal=signal.Signals(received).name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
