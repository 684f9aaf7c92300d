"""Cost of the bus's admission check per consumed record (`bus.authorization`, issue 17): the
writers table looked up per (topic, source), cached, plus the per-record node or action check,
against the event-time check every record already passed (`hivemux.event_time`); and the
writer's signature (`bus.signing`, issue 28): signing a publisher's batch, verifying records
signed 64 to a Merkle root (one Ed25519 verification per root, then cached) and signed one per
publish (a verification each), and the runtime's whole admission (`bus.admission`).

    .venv/bin/python benchmarks/bus_authorization.py [--records 200000] [--repeats 5]

Prints ns per record (median of the repeats) for each kind of verdict and for the runtime's
whole admission (`Service.admission`: writers + event time), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime

from types import SimpleNamespace

from hivemux.bus import Service, signing
from hivemux.bus.authorization import Authorization
from hivemux.bus.codec import encode_key, encode_value
from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, JobLifecycleEvent, JobState, ReportState
from hivemux.settings import ServiceSettings


def per_record(check, topic: str, events: list, repeats: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        for event in events:
            check(topic, event)
        samples.append((time.perf_counter() - began) / len(events) * 1e9)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    now = datetime.now(UTC)
    nodes = [f"node-{i:03d}" for i in range(64)]
    lifecycle = [JobLifecycleEvent(occurred_at=now, source=f"cell-allocator/{i % 2}", job_id=f"j{i}", state=JobState.RUNNING)
                 for i in range(1000)]  # fmt: skip
    reports = [ExecutorReport(occurred_at=now, source=f"executor/{n}", node_id=n, job_id="j", command_id="c", state=ReportState.RUNNING)
               for n in nodes]  # fmt: skip
    commands = [ExecutorCommand(occurred_at=now, source="matcher/0", node_id=n, action=CommandAction.EVICT, job_id="j") for n in nodes]
    repeat = lambda sample: (sample * (args.records // len(sample) + 1))[: args.records]  # noqa: E731
    check = Authorization().refusal
    admission_check = Service("bench", ServiceSettings()).admission()
    bounds = ServiceSettings().event_time_bounds
    signer, keyring = signing.process_signer(), signing.process_keyring()
    raw = [("jobs.lifecycle", encode_key(e.job_id), encode_value(e), e.source) for e in lifecycle]
    batched = [SimpleNamespace(key=k, value=v, headers=h) for (_, k, v, _), h in zip(raw, signer.sign(raw), strict=True)]
    alone = [SimpleNamespace(key=k, value=v, headers=signer.sign([(t, k, v, src)])[0]) for t, k, v, src in raw[:200]]
    by_value = {r.value: e for r, e in zip(batched, lifecycle, strict=True)}

    def verify(topic: str, record) -> None:  # type: ignore[no-untyped-def]
        keyring.prove(topic, record.key, record.value, record.headers)

    def verify_uncached(topic: str, record) -> None:  # type: ignore[no-untyped-def]
        keyring._verified.clear()  # noqa: SLF001 - every record pays its own verification
        keyring.prove(topic, record.key, record.value, record.headers)

    def admission(topic: str, record) -> None:  # type: ignore[no-untyped-def]
        signer_name, _ = admission_check.prove(topic, record)
        admission_check.refusal(topic, by_value[record.value], signer_name)

    def sign(_topic: str, chunk: list) -> None:  # type: ignore[type-arg]
        signer.sign(chunk)

    chunks = [raw[i : i + 1000] for i in range(0, len(raw), 1000)]
    sign_ns = per_record(sign, "jobs.lifecycle", chunks * max(1, args.records // 10_000), args.repeats) / 1000
    event_time = lambda _topic, e: bounds.refusal(e.occurred_at, datetime.now(UTC))  # noqa: E731
    rows = {
        "writers: lifecycle (cached verdict)": per_record(check, "jobs.lifecycle", repeat(lifecycle), args.repeats),
        "writers: report (own node)": per_record(check, "executor.reports", repeat(reports), args.repeats),
        "writers: command (action)": per_record(check, "executor.commands", repeat(commands), args.repeats),
        "event time alone (before)": per_record(event_time, "jobs.lifecycle", repeat(lifecycle), args.repeats),
        "signature: sign (batches of 1000)": sign_ns,
        "signature: verify (64 per root)": per_record(verify, "jobs.lifecycle", repeat(batched), args.repeats),
        "signature: verify (1 per root)": per_record(verify_uncached, "jobs.lifecycle", alone, args.repeats),
        "admission: signature + writers + time": per_record(admission, "jobs.lifecycle", repeat(batched), args.repeats),
    }
    print(f"records {args.records}, repeats {args.repeats} (median)")
    print(f"{'check':<40} {'ns/record':>10}")
    for name, ns in rows.items():
        print(f"{name:<40} {ns:>10.0f}")
    print(json.dumps({"records": args.records, "ns_per_record": {k: round(v) for k, v in rows.items()}}))


if __name__ == "__main__":
    main()
