"""The bus's writer table (`bus.authorization`): who may write which topic, as the runtime's
admission applies it, and the README's table and the Kafka ACLs generated from it."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.bus.authorization import WRITERS, Authorization, kafka_acls, principal_of, readme_table, topics_of
from hivemux.events import (
    CellBinding,
    CellConfig,
    CommandAction,
    DeviceControl,
    Event,
    ExecutorCommand,
    ExecutorReport,
    JobAction,
    JobCommand,
    JobLifecycleEvent,
    JobState,
    Placement,
    Priority,
    ReportState,
)
from hivemux.topics import TOPICS

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
README = Path(__file__).resolve().parents[3] / "README.md"


def cancel(source: str) -> JobCommand:
    return JobCommand(occurred_at=T0, source=source, command_id="c1", principal="tenant-a", job_id="j1", action=JobAction.CANCEL)


def report(source: str, node: str = "node-01") -> ExecutorReport:
    return ExecutorReport(occurred_at=T0, source=source, node_id=node, job_id="j1", command_id="c", state=ReportState.COMPLETED)


def command(source: str, action: CommandAction) -> ExecutorCommand:
    return ExecutorCommand.model_construct(occurred_at=T0, source=source, node_id="node-01", action=action, job_id="j1")


CASES: list[tuple[str, str, Event, str | None]] = [
    ("api cancels", "jobs.commands", cancel("api/0"), None),
    ("cli cancels", "jobs.commands", cancel("cli"), None),
    ("api:0 cancels", "jobs.commands", cancel("api:0"), None),
    ("nobody cancels", "jobs.commands", cancel("attacker"), "jobs.commands is written by api, cli; not by 'attacker'"),
    ("executor cancels", "jobs.commands", cancel("executor/node-01"), "not by 'executor'"),
    ("own node's report", "executor.reports", report("executor/node-01"), None),
    ("another node's report", "executor.reports", report("executor/node-01", "node-02"), "executor/node-01 reports only for node node-01, not node-02"),
    ("report by no executor", "executor.reports", report("cli"), "executor.reports is written by executor; not by 'cli'"),
    ("allocator binds", "cells.bindings", CellBinding(occurred_at=T0, source="cell-allocator/0", job_id="j", vc="a", state="refused",
                                                      priority=Priority.GUARANTEED, reason="r"), None),
    ("matcher binds", "cells.bindings", CellBinding(occurred_at=T0, source="matcher/0", job_id="j", vc="a", state="refused",
                                                    priority=Priority.GUARANTEED, reason="r"), "not by 'matcher'"),
    ("forged placement", "placements", Placement(occurred_at=T0, source="cell-allocator/0", job_id="j", action="evict", gpu_id="n/gpu-0",
                                                  node_id="n", sm_share=0.0, policy="matching", reason="r"), "not by 'cell-allocator'"),
    ("drain by the api", "gpu.control", DeviceControl(occurred_at=T0, source="api/1", gpu_id="n/gpu-0", node_id="n", action="drain"), None),
    ("drain by a tool", "gpu.control", DeviceControl(occurred_at=T0, source="kcat", gpu_id="n/gpu-0", node_id="n", action="drain"), "not by 'kcat'"),
    ("config by the matcher", "cells.config", CellConfig.model_construct(occurred_at=T0, source="matcher/0", version=2, config={}), "not by 'matcher'"),
    ("executor's lifecycle", "jobs.lifecycle", JobLifecycleEvent(occurred_at=T0, source="executor/0", job_id="j", state=JobState.RUNNING), None),
    ("a test's own topic", "test.0123456789ab", cancel("anyone"), None),
    ("allocator starts training", "executor.commands", command("cell-allocator/0", CommandAction.START_TRAINING), None),
    ("matcher stops", "executor.commands", command("matcher/1", CommandAction.STOP), None),
    ("matcher starts training", "executor.commands", command("matcher/1", CommandAction.START_TRAINING),
     "matcher/1 may not command start_training (only adjust, evict, start_offline, stop)"),
    ("health processor stops", "executor.commands", command("health-processor/0", CommandAction.STOP), "may not command stop"),
    ("health processor remedies", "executor.commands", command("health-processor/0", CommandAction.RESTART_MPS), None),
]  # fmt: skip


@pytest.mark.parametrize(("topic", "event", "refused"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_who_may_write_what(topic: str, event: Event, refused: str | None) -> None:
    refusal = Authorization().refusal(topic, event)
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refused in refusal


def test_the_verdict_is_cached_per_topic_and_source_but_the_node_is_checked_per_record() -> None:
    check = Authorization()
    assert check.refusal("executor.reports", report("executor/node-01")) is None
    assert check.refusal("executor.reports", report("executor/node-01", "node-09")) is not None
    assert check.refusal("jobs.commands", cancel("attacker")) == check.refusal("jobs.commands", cancel("attacker"))
    assert len(check._verdicts) == 2


def test_every_registry_topic_has_writers_and_only_registry_topics_are_listed() -> None:
    assert set(WRITERS) == {t.name for t in TOPICS}
    assert all(WRITERS.values())


def test_commands_come_only_from_the_api_and_the_cli() -> None:
    for topic in ("jobs.commands", "gpu.control", "cells.config"):
        assert WRITERS[topic] == {"api", "cli"}
    assert topics_of("executor") == ["jobs.lifecycle", "jobs.logs", "sharing.observations", "online.latency", "executor.reports", "nodes.agents"]
    assert "jobs.lifecycle" in topics_of("cell-allocator") and "cells.bindings" in topics_of("cell-allocator")
    assert principal_of("executor/node-01") == "executor" and principal_of("cli") == "cli" and principal_of("api:2") == "api"


def test_the_readme_table_is_the_code() -> None:
    text = README.read_text()
    match = re.search(r"<!-- writers:begin -->\n(.*?)\n<!-- writers:end -->", text, re.S)
    assert match is not None, "README.md has no writers table (between <!-- writers:begin --> and <!-- writers:end -->)"
    assert match.group(1).strip() == readme_table(), "regenerate it: python -m hivemux.bus.authorization readme"


def test_the_acl_script_is_the_code() -> None:
    script = (README.parent / "deploy" / "kafka-acls.sh").read_text()
    assert all(line in script for line in kafka_acls()), "regenerate it: python -m hivemux.bus.authorization acls > deploy/kafka-acls.sh"
    assert "--allow-principal User:cli --operation Write --topic jobs.commands" in script
    assert "--allow-principal User:executor --operation Write --topic cells.bindings\n" not in script


def test_each_deployed_service_connects_as_its_own_kafka_user() -> None:
    import yaml

    compose = yaml.safe_load((README.parent / "docker-compose.yml").read_text())
    for name, spec in compose["services"].items():
        command = spec.get("command", [])
        if command[:2] == ["hivemux", "service"]:
            assert spec["environment"]["KAFKA_SASL_USERNAME"] == command[2], name
    for path in sorted((README.parent / "deploy" / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            containers = (doc or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            for container in containers:
                if container.get("command", [])[:2] == ["hivemux", "service"]:
                    env = {e["name"]: e for e in container["env"]}
                    assert env["KAFKA_SASL_USERNAME"]["value"] == container["command"][2], path.name
                    assert env["KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == container["command"][2], path.name


def test_as_writer_signs_what_a_test_plays_as_its_service_would() -> None:
    from hivemux.bus.authorization import as_writer

    assert as_writer(cancel("attacker"), "burst").source == "api/burst"
    assert as_writer(report("cli", "node-07")).source == "executor/node-07"
    legit = cancel("cli")
    assert as_writer(legit) is legit
