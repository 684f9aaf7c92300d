"""The takeover fault loop (issue 28, Deliver 1) with real processes on a broker of this module's
own: the active cell allocator or matcher SIGKILLed at seeded random moments under a job stream
with online services (support/takeover_faults.py), judged by what the executor reports it ran:
no GPU ran two exclusive workloads at once, the bindings log never held one GPU twice, no cell
is held by a finished job, and `hivemux audit replay` finds every decision identical.

The suite runs a few kills (`HIVEMUX_TAKEOVER_KILLS`, default 2) to stay fast; the issue's 50
are `benchmarks/faults.py --takeover-kills 50`.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from support.takeover_faults import run, summary

from hivemux.bus import ensure_topics
from hivemux.infra import InfraSettings, embedded_infra
from hivemux.topics import ALL_TOPICS

pytestmark = pytest.mark.e2e
KILLS = int(os.environ.get("HIVEMUX_TAKEOVER_KILLS", "2"))
SEED = int(os.environ.get("HIVEMUX_TAKEOVER_SEED", "28"))


def test_sigkills_of_the_active_deciders_bind_no_cell_twice_and_leak_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with embedded_infra(InfraSettings()) as infra:
        bootstrap = infra.endpoints.bootstrap_servers
        asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": infra.endpoints.postgres_dsn}
        verdict = asyncio.run(run(bootstrap, env, tmp_path, kills=KILLS, seed=SEED))
    print(f"\ntakeover faults: {summary(verdict)}; kills {verdict.kills}; {verdict.audit}")
    assert len(verdict.kills) == KILLS
    assert verdict.ran_together == []
    assert verdict.double_bound == []
    assert verdict.held_by_finished == []
    assert verdict.audit_identical, verdict.audit
