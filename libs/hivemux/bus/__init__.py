"""The event bus: typed publishing and the consumer runtime, on aiokafka."""

from .admin import ensure_topics
from .codec import decode_key, decode_value, encode_key, encode_value, partition_for_key
from .publisher import Publisher
from .runtime import RecordContext, SeenEvents, Service

__all__ = [
    "Publisher",
    "RecordContext",
    "SeenEvents",
    "Service",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
    "ensure_topics",
    "partition_for_key",
]
