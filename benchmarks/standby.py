"""Standby takeover time (issue 16 item 7), printed by `make bench`.

Two cell allocators and two matchers run as their own processes on the embedded broker, as
`hivemux up` runs them (instances 0 and 1, leader session 3 s); their inputs are fed from here
(tests/support/standby_kit.py: a T4 speed model, healthy GPUs, 1 Hz telemetry, jobs with their
profiles). Each round SIGKILLs the active instance of both at once, submits a training and an
offline job, and measures, from the record timestamps, the time from the SIGKILL to the
standby's `LeaderElected` and to its first decision; then the killed instances are started
again (they stay standby) before the next round. Target: first decision under 10 s.

    .venv/bin/python benchmarks/standby.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.standby_kit import DECIDERS, PACE, TAKEOVER_BOUND_S, publish, setting, settled, take_over, telemetry_loop, until  # noqa: E402

from hivemux.bus import ensure_topics  # noqa: E402
from hivemux.cli.up import UpOptions, start_services, stop_services, wait_ready  # noqa: E402
from hivemux.infra import InfraSettings, embedded_infra  # noqa: E402
from hivemux.topics import ALL_TOPICS  # noqa: E402


async def rounds(bootstrap: str, children: list, count: int) -> list[dict]:  # type: ignore[type-arg]
    stop = asyncio.Event()
    feeding = asyncio.create_task(telemetry_loop(bootstrap, stop))
    rows = []
    try:
        await publish(bootstrap, setting())
        for n in range(count):
            takeover = await take_over(bootstrap, children, f"r{n}", jobs=1)
            for service in DECIDERS:
                rows.append({
                    "round": n + 1, "service": service, "killed": takeover.killed[service].name,
                    "took_over": takeover.took_over[service].name, "elected_s": takeover.elected_s.get(service),
                    "first_decision_s": takeover.first_decision_s[service],
                })  # fmt: skip
            for child in takeover.killed.values():
                child.restart()
            wait_ready(list(takeover.killed.values()), timeout_s=90)
            await until(lambda: settled(children), 60, "one active and one standby of each decider")
    finally:
        stop.set()
        await feeding
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir, embedded_infra(InfraSettings()) as infra:
        bootstrap = infra.endpoints.bootstrap_servers
        asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
        env = {**os.environ, **PACE, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": infra.endpoints.postgres_dsn}
        children = start_services(UpOptions(workdir=Path(workdir), services=DECIDERS, standbys=DECIDERS), env)
        try:
            wait_ready(children, timeout_s=120)
            rows = asyncio.run(rounds(bootstrap, children, args.rounds))
        finally:
            stop_services(children)
    print(f"standby takeover: {args.rounds} rounds, leader session {PACE['HIVEMUX_LEADER_SESSION_TIMEOUT_MS']} ms, "
          f"os.cpu_count()={os.cpu_count()}")  # fmt: skip
    print(f"{'round':>5} {'service':<15} {'killed':<17} {'took over':<17} {'elected s':>9} {'1st decision s':>14}")
    for r in rows:
        print(f"{r['round']:>5} {r['service']:<15} {r['killed']:<17} {r['took_over']:<17} {r['elected_s'] or float('nan'):>9.2f} "
              f"{r['first_decision_s']:>14.2f}")  # fmt: skip
    figures: dict[str, object] = {"rounds": args.rounds, "bound_s": TAKEOVER_BOUND_S}
    for service in DECIDERS:
        firsts = [r["first_decision_s"] for r in rows if r["service"] == service]
        figures[f"{service}_first_decision_median_s"] = round(statistics.median(firsts), 2)
        figures[f"{service}_first_decision_max_s"] = max(firsts)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
