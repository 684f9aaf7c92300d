"""What a consumer checks of a record before any handler sees it, in this order:

1. `prove`: the record's signature (`bus.signing`), before it is even decoded: who wrote it;
2. `refusal`, once decoded: that the record's ``source`` may write the topic and carry what it
   carries (`bus.authorization`), that the proven signer may claim that source
   (`signing.covers`: signed by ``matcher`` but claiming ``cell-allocator/0`` is refused; so
   the writers table judges the proven principal), and that the event time is not far ahead of
   the local clock (`hivemux.event_time`).

Each refusal is dead-lettered with its reason and journaled as refused by the runtime
(`bus.runtime.handle_record`), so `hivemux audit replay` skips the same records. Records of a
topic outside the registry (a test's own) are not judged.

Worked example: a `JobCommand` cancel from a plain producer: "unsigned record (...)"; signed by
``executor`` and claiming ``api/0``: "signed by 'executor', which may not write as 'api/0'";
signed by ``api`` as ``api/0``: admitted.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .authorization import WRITERS, Authorization
from .signing import Keyring, covers


class Admission:
    def __init__(self, keyring: Keyring | None, *, event_time: Any | None = None, clock: Callable[[], datetime] | None = None) -> None:
        """`keyring` None: records are not checked for a signature (an in-process recording
        whose records never crossed a transport: `audit.recording`)."""
        self.keyring = keyring
        self.writers = Authorization().refusal
        self.event_time = event_time
        self.clock = clock or (lambda: datetime.now(UTC))
        self._claims: dict[tuple[str, str], bool] = {}

    def prove(self, topic: str, record: Any) -> tuple[str | None, str | None]:
        """(the proven signer, None), or (None, why not); (None, None) if not checked."""
        if self.keyring is None or topic not in WRITERS:
            return None, None
        return self.keyring.prove(topic, record.key, record.value, getattr(record, "headers", None))

    def refusal(self, topic: str, event: Any, signer: str | None) -> str | None:
        """Why the decoded `event`, proven written by `signer`, may not be admitted, or None."""
        refusal = self.writers(topic, event)
        if refusal is None and signer is not None:
            claim = (signer, event.source)
            allowed = self._claims.get(claim)
            if allowed is None:
                if len(self._claims) >= 4096:
                    self._claims.clear()
                allowed = self._claims[claim] = covers(signer, event.source)
            if not allowed:
                refusal = f"signed by {signer!r}, which may not write as {event.source!r}"
        if refusal is None and self.event_time is not None:
            refusal = self.event_time.refusal(event.occurred_at, self.clock())
        return refusal
