"""Record encoding: keys and values are JSON (the broker's schema registry requires JSON
keys, so a key `gpu-1` travels as `"gpu-1"`). Decoding validates once, against the topic's
model, and turns every failure into `InvalidEvent` with a readable reason."""

from __future__ import annotations

import json
from collections.abc import Iterable

from aiokafka.partitioner import DefaultPartitioner
from pydantic import ValidationError

from ..errors import InvalidEvent
from ..events import Event
from ..topics import Topic


def encode_key(key: str) -> bytes:
    return json.dumps(key).encode()


def partition_for_key(key: str, partitions: Iterable[int]) -> int:
    """The partition a producer with aiokafka's default partitioner sends `key` to."""
    ordered = sorted(partitions)
    return DefaultPartitioner()(encode_key(key), ordered, ordered)


def decode_key(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: a key nested too deep
        return raw.decode(errors="replace")
    return value if isinstance(value, str) else json.dumps(value)


def encode_value(event: Event) -> bytes:
    # Fields at their defaults are left out (the consumer's model fills them in): telemetry
    # is mostly zero counters and empty lists, and the broker's ingest is bound by bytes.
    return event.model_dump_json(exclude_defaults=True).encode()


def _summarize(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "<record>"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def decode_value(topic: Topic, raw: bytes | None) -> Event:
    if raw is None:
        raise InvalidEvent(f"{topic.name}: record has no value (tombstone)")
    if len(raw) > topic.max_record_bytes:
        raise InvalidEvent(f"{topic.name}: record of {len(raw)} bytes, more than the {topic.max_record_bytes} a {topic.model.__name__} may take")
    try:
        return topic.model.model_validate_json(raw)
    except ValidationError as error:
        raise InvalidEvent(f"{topic.name}: invalid {topic.model.__name__}: {_summarize(error)}") from error
