"""JSON Schemas for the broker's schema registry, generated from the event models.

Tansu reads `<topic>.json`: a JSON Schema object whose `properties.key` and
`properties.value` validate a record's key and value. Measured on the embedded broker: a
schema holding `$ref` is not enforced at all, so references are inlined here (event models
are not recursive, so inlining terminates).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .topics import ALL_TOPICS, Topic

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].removeprefix("#/$defs/")
            target = _inline_refs(defs[name], defs)
            rest = {k: _inline_refs(v, defs) for k, v in node.items() if k != "$ref"}
            return {**target, **rest}
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def value_schema(topic: Topic) -> dict[str, Any]:
    raw = topic.model.model_json_schema(mode="serialization")
    return _inline_refs(raw, raw.get("$defs", {}))


def topic_schema(topic: Topic) -> dict[str, Any]:
    return {
        "$schema": SCHEMA_DIALECT,
        "title": topic.name,
        "description": topic.description,
        "type": "object",
        "properties": {
            "key": {"type": "string", "minLength": 1, "description": f"the event's {topic.key_field}"},
            "value": value_schema(topic),
        },
    }


def render(topic: Topic) -> str:
    return json.dumps(topic_schema(topic), indent=2, sort_keys=True) + "\n"


def export(directory: Path) -> list[Path]:
    """Write one schema file per topic; return the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for topic in ALL_TOPICS:
        path = directory / f"{topic.name}.json"
        path.write_text(render(topic))
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Topics whose checked-in schema differs from the models (empty when up to date)."""
    return [t.name for t in ALL_TOPICS if not (directory / f"{t.name}.json").exists()
            or (directory / f"{t.name}.json").read_text() != render(t)]
