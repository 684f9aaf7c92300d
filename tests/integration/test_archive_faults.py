"""History that survives any restart (issue 28 item 2): a database SIGKILL, then a broker SIGKILL,
with jobs submitted between, lose no acknowledged job (tests/support/archive_faults.py runs the
sequence with real processes under `hivemux up`'s supervisor; benchmarks/faults.py counts the
same outcome).

What is checked: every submission `jobs submit` acknowledged as archived is in the log and in
`hivemux jobs list` after the refill; the job published while the archive could not take it is
not, and the refill said so with its offset (what was said is what happened); the archiver said
it stopped and ran again, and its state and lag are where `/healthz`, `hivemux status` and the
console read them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from support import archive_faults
from support.archive_faults import LOST_JOB, SUBMITTED

from hivemux.topics import JOBS_SUBMITTED


def test_a_database_then_a_broker_kill_lose_no_acknowledged_job() -> None:
    root = Path(tempfile.mkdtemp(prefix="hivemux-archive-faults-"))
    try:
        out = archive_faults.run(root, os.environ)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    said = "\n".join(out.lines)
    if out.failure is not None:
        raise AssertionError(said) from out.failure

    # every acknowledged submission is in the log...
    assert out.acknowledged == SUBMITTED
    assert set(out.acknowledged) <= out.in_log
    # ...the one the refill said it lost is not, and the refill said which offset
    assert LOST_JOB not in out.in_log
    assert out.lost_at is not None and out.refill is not None
    partition, offset = out.lost_at
    assert any(g.topic == JOBS_SUBMITTED.name and g.partition == partition and g.first <= offset < g.end for g in out.refill.lost), out.refill
    assert "LOST (the broker had acknowledged them, the archive never got them): " in out.refill_said
    assert f"{JOBS_SUBMITTED.name}[{partition}]" in out.refill_said
    # ...and in `jobs list` once the restarted projector has folded the refilled log
    assert out.projected == set(out.acknowledged), (out.projected, said)
    assert set(out.acknowledged) <= out.listed, out.listed
    assert out.lost() == []
    # the archiver said it stopped and ran again; its state and lag are where readers look
    assert any(line.startswith("history: archiver stopped: ") for line in out.lines), said
    assert out.health is not None and out.health["state"] == "archiving" and out.health["lag_records"] == 0, out.health
    assert "History archive: archiving, up to date; archiver restarted" in out.status, out.status
