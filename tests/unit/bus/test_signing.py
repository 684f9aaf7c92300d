"""Signed records (`hivemux.bus.signing`, `bus.admission`): a publisher's batch signed under one
Merkle root verifies record by record, anything changed or unsigned does not, and a signer may
claim only its own principal (and instance)."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from hivemux.bus import signing
from hivemux.bus.admission import Admission
from hivemux.bus.signing import Keyring, Signer
from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
KEYS = signing.generate(["cell-allocator", "matcher", "executor/node-01", "api"])
SIGNER = Signer(KEYS)


def keyring(keys: dict = KEYS) -> Keyring:  # type: ignore[type-arg]
    return Keyring({name: [bytes.fromhex(raw) for raw in raws] for name, raws in signing.public_keyring(keys).items()})


def records(n: int, source: str = "cell-allocator/0") -> list[tuple[str, bytes | None, bytes | None, str]]:
    return [("cells.bindings", f'"job-{i}"'.encode(), b'{"n": %d}' % i, source) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 65, 200], ids=lambda n: f"{n} records")
def test_every_record_of_a_batch_verifies_alone(n: int) -> None:
    batch = records(n)
    headers = SIGNER.sign(batch)
    ring = keyring()
    for (topic, key, value, _), signed in zip(batch, headers, strict=True):
        assert ring.prove(topic, key, value, signed) == ("cell-allocator", None)
    assert max(len(dict(h)[signing.HEADER_SIGNATURE]) for h in headers) <= 72 + 33 * 6
    assert len({dict(h)[signing.HEADER_SIGNATURE][8:72] for h in headers}) == -(-n // signing.LEAVES)  # one signature per 64


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda t, k, v, h: (t, k, v + b" ", h), "bad signature"),
        (lambda t, k, v, h: (t, b'"job-9"', v, h), "bad signature"),
        (lambda t, k, v, h: ("placements", k, v, h), "bad signature"),
        (lambda t, k, v, h: (t, k, v, [(signing.HEADER_SIGNER, b"matcher"), h[1]]), "which the keyring does not hold"),
        (lambda t, k, v, h: (t, k, v, []), "unsigned record"),
        (lambda t, k, v, h: (t, k, v, None), "unsigned record"),
        (lambda t, k, v, h: (t, k, v, [h[0], (signing.HEADER_SIGNATURE, h[1][1][:50])]), "malformed signature"),
        (lambda t, k, v, h: (t, k, v, [h[0], (signing.HEADER_SIGNATURE, h[1][1] + b"R" + b"x" * 32)]), "bad signature"),
    ],
    ids=["value changed", "key changed", "other topic", "other signer named", "no headers", "headers None", "truncated", "path grown"],
)
def test_a_changed_or_unsigned_record_is_not_proven(change, reason: str) -> None:  # type: ignore[no-untyped-def]
    (topic, key, value, _), = records(1)
    headers = SIGNER.sign([(topic, key, value, "cell-allocator/0")])[0]
    signer, why = keyring().prove(*change(topic, key, value, headers))
    assert signer is None and reason in (why or "")


def test_a_key_the_keyring_does_not_hold_is_refused_and_a_rotated_one_is_kept() -> None:
    stranger = Signer(signing.generate(["cell-allocator"]))
    (topic, key, value, source), = records(1)
    headers = stranger.sign([(topic, key, value, source)])[0]
    assert "which the keyring does not hold" in (keyring().prove(topic, key, value, headers)[1] or "")
    both = {name: [*raws] for name, raws in signing.public_keyring(KEYS).items()}
    both["cell-allocator"] += signing.public_keyring({"cell-allocator": stranger.keys["cell-allocator"].private})["cell-allocator"]
    rotated = Keyring({n: [bytes.fromhex(r) for r in raws] for n, raws in both.items()})
    assert rotated.prove(topic, key, value, headers) == ("cell-allocator", None)


@pytest.mark.parametrize(
    "signer, source, allowed",
    [
        ("cell-allocator", "cell-allocator/1", True),
        ("cell-allocator", "cell-allocator", True),
        ("cell-allocator", "matcher/0", False),
        ("predictor", "predictor-store/0", True),
        ("cli", "hivemux-up", True),
        ("executor", "executor/node-07", True),
        ("executor/node-01", "executor/node-01", True),
        ("executor/node-01", "executor/node-02", False),
        ("executor/node-01", "executor/node-010", False),
        ("api", "api:0", True),
        ("api", "apix/0", False),
    ],
)
def test_what_a_signer_may_claim(signer: str, source: str, allowed: bool) -> None:
    assert signing.covers(signer, source) is allowed


def test_the_signer_picks_the_most_specific_key() -> None:
    signer = Signer(signing.generate(["executor", "executor/node-01", "api"]))
    assert signer.key_for("executor/node-01").signer == "executor/node-01"
    assert signer.key_for("executor/node-02").signer == "executor"
    assert signer.key_for("api/0").signer == "api"


def _record(topic: str, event, source_signer: Signer = SIGNER):  # type: ignore[no-untyped-def]
    from hivemux.bus.codec import encode_key, encode_value
    from hivemux.topics import topic_for

    t = topic_for(event)
    key, value = encode_key(t.key_of(event)), encode_value(event)
    return SimpleNamespace(key=key, value=value, headers=source_signer.sign([(topic, key, value, event.source)])[0])


def test_admission_judges_the_proven_writer_not_the_claimed_one() -> None:
    admission = Admission(keyring())
    # The matcher's key, claiming to be the allocator starting training (which the matcher may not).
    matcher_only = Signer({"matcher": KEYS["matcher"]})
    forged = ExecutorCommand(occurred_at=AT, source="cell-allocator/0", node_id="node-01", action=CommandAction.START_TRAINING, job_id="j",
                             gpu_ids=("node-01/gpu-0",), workload=WorkloadSpec(model="bert", batch_size=8, iterations=10))  # fmt: skip
    record = _record("executor.commands", forged, matcher_only)
    signer, why = admission.prove("executor.commands", record)
    assert (signer, why) == ("matcher", None)
    assert admission.refusal("executor.commands", forged, signer) == "signed by 'matcher', which may not write as 'cell-allocator/0'"
    real = _record("executor.commands", forged)
    assert admission.refusal("executor.commands", forged, admission.prove("executor.commands", real)[0]) is None
    # A node agent's own key speaks for its node only.
    report = ExecutorReport(occurred_at=AT, source="executor/node-02", node_id="node-02", job_id="j", command_id="c", state=ReportState.RUNNING)
    node_01 = Signer({"executor/node-01": KEYS["executor/node-01"]})
    signer, _ = admission.prove("executor.reports", _record("executor.reports", report, node_01))
    assert signer == "executor/node-01"
    assert admission.refusal("executor.reports", report, signer) == "signed by 'executor/node-01', which may not write as 'executor/node-02'"


def test_a_topic_outside_the_registry_is_not_judged() -> None:
    assert Admission(keyring()).prove("test.own-topic", SimpleNamespace(key=None, value=b"{}", headers=None)) == (None, None)


def test_written_keys_are_private_and_kept(tmp_path: Path) -> None:
    first = signing.write_keys(tmp_path / "keys", ["cell-allocator", "cli"])
    assert stat.S_IMODE(first["cli"].stat().st_mode) == 0o600 and stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    again = signing.write_keys(tmp_path / "keys", ["cell-allocator", "cli", "matcher"])
    assert first["cli"].read_text() == again["cli"].read_text()  # a key once made is kept
    ring = json.loads(again["keyring"].read_text())
    assert sorted(ring) == ["cell-allocator", "cli", "matcher"] and all(len(v) == 1 for v in ring.values())
    signer = Signer(signing.load_private(again["matcher"]))
    (topic, key, value, _), = records(1)
    headers = signer.sign([(topic, key, value, "matcher/0")])[0]
    assert signing.load_keyring(again["keyring"]).prove(topic, key, value, headers) == ("matcher", None)


def test_what_a_verified_batch_mate_proved_does_not_admit_a_changed_record() -> None:
    batch = records(5)
    headers = SIGNER.sign(batch)
    ring = keyring()
    topic, key, value, _ = batch[0]
    assert ring.prove(topic, key, value, headers[0]) == ("cell-allocator", None)  # the root is now proven and remembered
    topic, key, value, _ = batch[1]
    assert "bad signature" in (ring.prove(topic, key, value + b"!", headers[1])[1] or "")
    assert "bad signature" in (ring.prove(topic, key, value, headers[2])[1] or "")  # another record's path
    assert ring.prove(topic, key, value, headers[1]) == ("cell-allocator", None)
