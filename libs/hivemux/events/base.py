"""The envelope every event carries: `event_id`, `occurred_at` (event time) and `source`.

Events are frozen pydantic models, validated once at decode. Unknown fields are refused
(`extra="forbid"`), which also makes the generated JSON Schema strict, so the broker's
schema registry rejects them too.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Annotated, NamedTuple

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

# A stable namespace for ids derived from other ids (replays derive the same ids).
HIVEMUX_NAMESPACE = uuid.UUID("6b1f1d0e-8a47-4d2a-9a3c-5f0c1e2d7a90")

Name = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
# A submitted job's id: also a directory name on the nodes that run it and the prefix of its pods'
# names (`<job>/<index>`), so one path segment — no '/', no leading '.' (issue 18).
JobId = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
Percent = Annotated[float, Field(ge=0.0, le=100.0)]
NonNegative = Annotated[float, Field(ge=0.0)]

# Bounds of what makes sense (issue 16: records are validated against sizes and magnitudes a
# real cluster can produce, not only their types). Generous on purpose: a bound refuses the
# absurd (a record that would poison a decider's state), never a value a producer can send.
MAX_GPUS = 65_536  # GPU ids listed in one record: a job's gang, a node's, a batch's
MAX_NAMES = 4096  # other names listed in one record: nodes, workloads, evictions
MAX_ENTRIES = 256  # entries of a map of inputs or metrics a decision records
MAX_PER_GPU = 64  # workloads sharing one GPU (MPS serves at most 48 clients)
MAX_MIB = 16 * 1024 * 1024  # 16 TiB in MiB: more memory than any host or GPU has
MAX_ITERATIONS = 10_000_000  # a workload's iterations (as WorkloadSpec bounds them)
MAX_RATIO = 100.0  # a normalized throughput: shared or measured over solo, ~1 in practice
MAX_ITERATION_MS = 3_600_000.0  # one iteration taking more than an hour is no measurement
MAX_PID = 4_194_304  # Linux's largest pid_max
MAX_VERSION = 10_000_000_000  # versions count up (cells.config may use epoch seconds, < 2^34)
Label = Annotated[str, StringConstraints(max_length=200)]  # a key of a map of inputs or metrics
Text = Annotated[str, StringConstraints(max_length=2000)]  # a value of such a map
Mebibytes = Annotated[float, Field(ge=0.0, le=MAX_MIB)]
Ratio = Annotated[float, Field(ge=0.0, le=MAX_RATIO)]
Count = Annotated[int, Field(ge=0, le=2**40)]  # a cumulative counter (errors, observations)

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


# What a waiting job waits for, in substance (issue 28 item 6): a job that is feasible but not
# chosen this round waits for its turn, whichever wording the round gave it. Under churn a VC's
# jobs were told each round, alternately, "VC vc-b at its fair share (4 of 8 offline slots)"
# (the matcher's `fairness.at_share_reason`) and "feasible on 3 GPU(s) (...) but the
# maximum-weight matching (...) gave its feasible GPUs to other jobs" (`explanations`): one
# substance, so neither is news after the other. The cell allocator's "would exceed its fair
# share" is the same kind of wait. The words that mark a turn-wait, one home for both deciders:
_TURN_MARKS = ("at its fair share", "gave its feasible GPUs to other jobs", "would exceed its fair share")
WAITING_TURN = "feasible, waiting for its turn"
# A job feasible on no GPU (the matcher's `explanations.why_not_placed`) waits for a feasible GPU,
# whichever constraints the round listed: online memory moving made 487 of 5,000 jobs flap
# between "over memory quota on 4" and "over memory quota on 4; too little free memory on 4".
_INFEASIBLE_MARK = "no feasible GPU among"
WAITING_FEASIBLE = "no feasible GPU"
# A job told why it waits is told again, when the substance changed, no sooner than this much
# event time after it was last told (a substance that flaps cannot flood the log).
RETELL_AFTER = timedelta(minutes=2)


def waiting_substance(reason: str) -> str:
    """What a waiting job is told, in substance: `WAITING_FEASIBLE` for a job feasible on no
    GPU; `WAITING_TURN` for a job feasible but not chosen (its first clause carries a turn mark), followed by the substance of any further
    clauses (a note on GPUs cooling down); otherwise `reason_substance`.

    Example: "VC vc-b at its fair share (4 of 8 offline slots)" and "feasible on 3 GPU(s) (best
    node-00/gpu-1: ...) but the maximum-weight matching (total 7.250) gave its feasible GPUs to
    other jobs" both read "feasible, waiting for its turn"; "no feasible GPU among 4: over memory
    quota on 4" and "no feasible GPU among 4: too little free memory on 4" read "no feasible GPU";
    "preempted by job-17" reads itself."""
    text = clip_reason(reason)
    if text.startswith(_INFEASIBLE_MARK):
        return WAITING_FEASIBLE
    head, _, rest = text.partition("; ")
    if any(mark in head for mark in _TURN_MARKS):
        return f"{WAITING_TURN}; {reason_substance(rest)}" if rest else WAITING_TURN
    return reason_substance(text)


class Retelling(NamedTuple):
    """`retell`'s verdict: whether to tell the job now, and what it counts as told afterwards."""

    tell: bool
    told: str


def retell(last: str, reason: str, *, last_at: datetime | None, at: datetime) -> Retelling:
    """Whether a waiting job last told `last` (at event time `last_at`; ``""``: nothing since it
    last waited anew, so anything is news) is told `reason` at event time `at`: only if its
    `waiting_substance` changed, and then no sooner than `RETELL_AFTER` after it was last told.
    The one rule of both deciders (the matcher's rounds, the cell allocator's passes). A change
    held back is not forgotten: the job counts as told `last` still, so a later pass tells it if
    it still stands once the interval has passed; an unchanged substance keeps the newest wording.

    Example (`RETELL_AFTER` 2 min): told "no feasible GPU among 4: ..." at 12:00; at 12:01 "...
    gave its feasible GPUs to other jobs" is held back (told stays the first); at 12:02 it is told.
    >>> from datetime import UTC
    >>> t = datetime(2026, 1, 1, 12, tzinfo=UTC)
    >>> retell("no feasible GPU among 4: x", "no feasible GPU among 4: y", last_at=t, at=t).tell
    False
    >>> retell("no feasible GPU among 4: x", "preempted by j", last_at=t, at=t + timedelta(minutes=1))
    Retelling(tell=False, told='no feasible GPU among 4: x')
    >>> retell("no feasible GPU among 4: x", "preempted by j", last_at=t, at=t + RETELL_AFTER).tell
    True
    """
    if waiting_substance(last) == waiting_substance(reason):
        return Retelling(False, reason)
    if last and last_at is not None and at - last_at < RETELL_AFTER:
        return Retelling(False, last)
    return Retelling(True, reason)


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
