"""Which version numbers may follow the latest one: the rule for every versioned record
(cell configurations on ``cells.config``, speed models on ``predictor.models``).

Consumers take the newest version and ignore older or equal ones (at-least-once delivery makes
that the idempotent fold), so a version far ahead would win for ever: a configuration at
2^63-1 could never be replaced by a legitimate update. A new version must therefore lie within
`MAX_VERSION_STEP` of the latest one consumed for its key; a cell configuration may also be
numbered by its own event time in seconds (what ``hivemux cells configure`` does by default;
within the same step of it),
which cannot run ahead of the consumer's clock by more than the event-time bound
(`hivemux.event_time`). Anything further is refused with the reason (the record goes to the
dead-letter topic) and the latest version stays as it was.

A record with an event time may moreover not be numbered ahead of its writer's clock: a version
past its own event time in seconds by more than `AHEAD_OF_CLOCK_S` is refused (issue 28: three
configurations numbered "now + 1000", each within the step, made the operator's next
``hivemux cells configure``, numbered now, older than the one in force for ever after).
Versions numbered 1, 2, 3 are far below any writer's clock and are not concerned.

The rule depends only on the records consumed (the latest version folded, the record's own
event time), so a replay decides the same.

Worked example: latest 3: versions 4 and 3 + 1000 are plausible, 1004 is refused; latest 0 and a
configuration dated 2026-11-26 12:00 UTC: version 1795694400 (its time in seconds) is
plausible, and so is 1795694401 (`int(time.time())` read a moment after the event time);
10^10, the largest version the schema admits, is refused.
"""

from __future__ import annotations

from datetime import datetime

from ..errors import InvalidEvent

MAX_VERSION_STEP = 1000  # versions a producer may skip (refused trainings, retries) before it is a jump
AHEAD_OF_CLOCK_S = 60  # how far a version may be numbered past its own event time in seconds


def version_jump(latest: int, version: int, *, at: datetime | None = None, step: int = MAX_VERSION_STEP) -> str | None:
    """Why `version` may not follow `latest`, or None. With `at`, a version within `step` of the
    event time in whole seconds is also plausible (time-numbered versions)."""
    dated = int(at.timestamp()) if at is not None else 0
    if version > max(latest, dated) + step:
        also = f" or its event time in seconds ({dated})" if at is not None else ""
        return (f"version {version} jumps past the latest {latest} by more than {step}{also}: it would win over every "
                "later legitimate version")
    if at is not None and version > dated + AHEAD_OF_CLOCK_S:
        return (f"version {version} is numbered {version - dated} s ahead of its own event time ({dated}): a version may "
                f"not run ahead of its writer's clock (by more than {AHEAD_OF_CLOCK_S} s), or the next one numbered by the "
                "clock would be ignored")
    return None


class LatestVersions:
    """The latest version consumed per key, checked against `version_jump` (for a consumer whose
    core keeps no such count: the matcher's view of ``predictor.models``)."""

    def __init__(self) -> None:
        self.latest: dict[str, int] = {}

    def admit(self, key: str, version: int) -> None:
        """Record `version` of `key`, or raise `InvalidEvent` with the reason if it jumps."""
        latest = self.latest.get(key, 0)
        jump = version_jump(latest, version)
        if jump is not None:
            raise InvalidEvent(f"{key}: {jump}")
        self.latest[key] = max(latest, version)
