"""The envelope every event carries: `event_id`, `occurred_at` (event time) and `source`.

Events are frozen pydantic models, validated once at decode. Unknown fields are refused
(`extra="forbid"`), which also makes the generated JSON Schema strict, so the broker's
schema registry rejects them too.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

# A stable namespace for ids derived from other ids (replays derive the same ids).
HIVEMUX_NAMESPACE = uuid.UUID("6b1f1d0e-8a47-4d2a-9a3c-5f0c1e2d7a90")

Name = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
Percent = Annotated[float, Field(ge=0.0, le=100.0)]
NonNegative = Annotated[float, Field(ge=0.0)]

# Why a decision was made (or what a finding saw), in words for the user. Bounded so that a
# decision explaining many inputs still fits a record; producers clip with `clip_reason`.
REASON_MAX = 2000
Reason = Annotated[str, Field(max_length=REASON_MAX)]


def clip_reason(text: str, suffix: str = "") -> str:
    """`text` cut to fit a `Reason` with `suffix` kept whole at its end."""
    return text[: REASON_MAX - len(suffix)] + suffix


_DETAIL = re.compile(r"\s*\([^()]*\)")  # an innermost parenthesised detail
_NUMBER = re.compile(r"(?<![\w.\-/])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?%?")  # a number standing alone, not part of a name


def reason_substance(text: str) -> str:
    """What a reason says without its incidental details: parenthesised details removed and
    every number standing alone replaced by ``#``; names (``node-01/gpu-2``, ``job-17``, ``K80``)
    are kept. Two reasons with one substance say the same thing about what a job waits for, so
    a decider tells a waiting job again only when the substance changes (issue 16 item 6).

    Example: "feasible on 3 GPU(s) (best node-00/gpu-1: predicted normalized throughput 0.512)
    but the maximum-weight matching (total 7.250) gave its feasible GPUs to other jobs" and the
    same text with 4 GPUs and total 7.311 both read "feasible on # GPU but the maximum-weight
    matching gave its feasible GPUs to other jobs"."""
    previous = None
    while previous != text:
        previous, text = text, _DETAIL.sub("", text)
    return _NUMBER.sub("#", text)


class Record(BaseModel):
    """A frozen, strict value nested inside events."""

    # NaN and infinities have no JSON form: refuse them at construction, not at decode.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Event(Record):
    """Base of all event models."""

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4, description="Unique id; handlers dedupe by it.")
    occurred_at: AwareDatetime = Field(description="Event time (not processing time).")
    source: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="Who produced the event: service name and instance, or 'cli'."
    )


def derived_id(*parts: object) -> uuid.UUID:
    """A deterministic event id derived from its inputs, so a re-run emits the same ids."""
    return uuid.uuid5(HIVEMUX_NAMESPACE, "/".join(str(p) for p in parts))


def iso(at: datetime) -> str:
    return at.isoformat()
