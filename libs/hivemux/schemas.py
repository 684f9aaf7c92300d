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


_VALIDATORS: dict[str, Any] = {}  # topic -> its compiled schema (jsonschema), made on first use


def refusal(topic: Topic, key: str, value: bytes) -> str | None:
    """Why the broker's schema registry refuses a record of ``topic``, naming the field and the
    rule (``value.workload.command: [...] is too long``), or None when it takes it.

    The broker answers a refused record with error -1 and nothing else (aiokafka's
    ``UnknownError``); this is the same check done here, on the same schema (`topic_schema`: what
    ``schemas/`` holds), so a producer can say what is wrong. Uses ``jsonschema`` when installed
    (None without it: nothing can be named)."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - a test dependency; the CLI then says less
        return None
    validator = _VALIDATORS.get(topic.name)
    if validator is None:
        validator = _VALIDATORS[topic.name] = jsonschema.Draft202012Validator(topic_schema(topic))
    try:
        record = {"key": json.loads(key) if key else None, "value": json.loads(value)}
    except ValueError as error:
        return f"not JSON: {error}"
    error = jsonschema.exceptions.best_match(validator.iter_errors(record))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path) or "<record>"
    if len(error.message) <= 200:
        return f"{where}: {error.message}"
    return f"{where}: breaks {error.validator} {json.dumps(error.validator_value)[:100]}"  # the value itself is too long to quote
