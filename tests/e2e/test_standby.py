"""Standbys for the deciders (issue 16 item 7), with real processes on a broker of this module's own.

Two cell allocators and two matchers run as `hivemux up` runs them (`start_services` with
`standbys`: instances 0 and 1 of each); the test feeds their inputs itself (support/standby_kit.py).
Exactly one instance of each says it is active on /healthz; the active ones decide; then both
are SIGKILLed at once, new jobs are submitted, and the standbys decide within 10 s of the kill
(the record timestamp of each one's first decision minus the kill time). The killed instances
are started again and stay standby (the lead stays where it is). No decision id is on the log
with two bodies, no pod is bound twice, no job is placed twice without an eviction between, and
`hivemux audit replay` finds every decision identical.

The takeover times are printed: `.venv/bin/python -m pytest tests/e2e/test_standby.py -s`
(a line "standby takeover: ..."); `benchmarks/standby.py` repeats the takeover.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from support.standby_kit import (
    DECIDERS,
    PACE,
    TAKEOVER_BOUND_S,
    decided_by,
    offline,
    one_active,
    placed,
    placement_actions,
    publish,
    records,
    setting,
    settled,
    source_of,
    take_over,
    telemetry_loop,
    training,
    until,
)

from hivemux.bus import ensure_topics
from hivemux.cli.up import UpOptions, start_services, stop_services, wait_ready
from hivemux.infra import InfraSettings, embedded_infra
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS, JOBS_LIFECYCLE, PLACEMENTS

pytestmark = pytest.mark.e2e
HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("standby")
    with embedded_infra(InfraSettings()) as infra:
        bootstrap = infra.endpoints.bootstrap_servers
        asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
        env = {**os.environ, **PACE, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": infra.endpoints.postgres_dsn}
        children = start_services(UpOptions(workdir=workdir, services=DECIDERS, standbys=DECIDERS), env)
        try:
            wait_ready(children, timeout_s=90)
            yield {"bootstrap": bootstrap, "env": env, "children": children}
        finally:
            stop_services(children)


async def test_the_standby_decides_within_10_s_of_a_sigkill_and_nothing_is_decided_twice(system: dict[str, Any]) -> None:
    bootstrap, env, children = system["bootstrap"], system["env"], system["children"]
    assert sorted(c.name for c in children) == ["cell-allocator", "cell-allocator.1", "matcher", "matcher.1"]
    stop = asyncio.Event()
    feeding = asyncio.create_task(telemetry_loop(bootstrap, stop))
    try:
        await publish(bootstrap, setting())
        roles = await until(lambda: settled(children), 60, "one active and one standby of each decider")
        active = {service: next(c for c in children if c.name == one_active(roles, service)) for service in DECIDERS}

        # The active ones decide.
        await publish(bootstrap, [training(f"a-t{i}") for i in range(3)] + [e for i in range(3) for e in offline(f"a-o{i}")])
        await until(lambda: decided_by(bootstrap, source_of(active["cell-allocator"]), CELL_BINDINGS, 3), 60, "active allocator binds")
        await until(lambda: decided_by(bootstrap, source_of(active["matcher"]), PLACEMENTS, 3), 60, "active matcher places")

        # SIGKILL both active ones at once; new work arrives; the standbys decide it.
        takeover = await take_over(bootstrap, children, "b")
        print(f"\nstandby takeover: SIGKILL to the standby's first decision {takeover.first_decision_s} s, "
              f"to its LeaderElected {takeover.elected_s} s (bound {TAKEOVER_BOUND_S} s)")  # fmt: skip
        assert takeover.killed == active
        assert all(seconds < TAKEOVER_BOUND_S for seconds in takeover.first_decision_s.values()), takeover
        new = takeover.took_over
        await until(lambda: decided_by(bootstrap, source_of(new["cell-allocator"]), CELL_BINDINGS, 3), 30, "new allocator binds")
        await until(lambda: placed(bootstrap, {f"{tag}-o{i}" for tag in "ab" for i in range(3)}), 30, "every offline job placed")

        # The killed instances come back as standbys: the lead stays where it is.
        for service in DECIDERS:
            active[service].restart()
        wait_ready(list(active.values()), timeout_s=90)
        roles = await until(lambda: settled(children), 60, "one active and one standby of each decider after the restarts")
        assert {service: one_active(roles, service) for service in DECIDERS} == {s: c.name for s, c in new.items()}
        await publish(bootstrap, [training("c-t0")])
        await until(lambda: decided_by(bootstrap, source_of(new["cell-allocator"]), CELL_BINDINGS, 4), 30, "the active allocator binds c-t0")
    finally:
        stop.set()
        await feeding
    stop_services(children)  # a quiet log to audit

    # No decision twice: one body per id, one binding per pod, no placement over a placement.
    found = await records(bootstrap, (CELL_BINDINGS, PLACEMENTS, JOBS_LIFECYCLE, EXECUTOR_COMMANDS))
    bodies: dict[tuple[str, object], set[bytes]] = defaultdict(set)
    for record, event in found:
        bodies[record.topic, event.event_id].add(record.value)
    assert not [key for key, values in bodies.items() if len(values) > 1]
    bound: dict[str, set[object]] = defaultdict(set)
    for record, event in found:
        if record.topic == CELL_BINDINGS.name and event.state == "bound":  # type: ignore[attr-defined]
            bound[event.pod].add(event.event_id)  # type: ignore[attr-defined]
    assert len(bound) == 7 and all(len(ids) == 1 for ids in bound.values()), bound
    for job_id, actions in placement_actions(found).items():
        assert all(not (a == b == "place") for a, b in zip(actions, actions[1:], strict=False)), (job_id, actions)

    done = subprocess.run([*HIVEMUX, "audit", "replay"], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical" in done.stdout
    print(done.stdout.strip().splitlines()[-1])
