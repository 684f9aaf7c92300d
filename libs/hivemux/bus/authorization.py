"""Who may write what on the bus: the one table of writers per topic, and the admission check
every service applies to what it consumes.

A record says who wrote it in its envelope's ``source``, ``<principal>/<instance>`` (a service's
name and its instance: `Service.source`) or a bare principal (``cli``). `WRITERS` names, for
each registry topic, the principals that produce it (from who publishes it in this code):
commands (submissions, cancel/suspend/resume, drains, cell configurations) come from the API and
the CLI only; bindings from the cell allocator only; placements from the matcher only; models
from the predictor (or its store, restoring what it kept); reports and sharing observations
from executors only, each for its own node (``executor/<node>`` writes only records whose
``node_id`` is ``<node>``: the DaemonSet's agents run with the node name as their instance,
and the simulated fleet stamps each node's records with that node's agent); and `ACTIONS`
says which executor commands each decider may give (the allocator starts training jobs, the
matcher offline ones, the health processor remedies and evicts).

`Authorization.refusal` is the check, run at admission by `bus.runtime` (`Service.admission`)
on every record a service consumes from a registry topic: a record whose source may not
produce it is dead-lettered with the reason and journaled as refused (so `hivemux audit
replay` skips the same records). Records of topics outside the registry (a test's own topic)
are not judged. The verdict is cached per (topic, source): one dict lookup per record.

What this check is and is not: ``source`` is a claim inside the record, so the check stops a
writer that names itself (a tool, a misconfigured or compromised service using its own name,
an executor reporting for another node), not one that lies about its name. What stops a liar
is the broker: on a Kafka with SASL each service connects as its own principal
(`settings.BusSettings`, the deployment files) and the ACLs generated from this same table
(`kafka_acls`, deploy/kafka-acls.sh) let each principal write only its topics; the embedded
broker listens on loopback only.

Worked example: a `JobCommand` (jobs.commands) from ``api/0`` or ``cli`` is admitted; from
``executor/node-01`` it is refused ("jobs.commands is written by api, cli; not by executor");
an `ExecutorReport` from ``executor/node-01`` about ``node-02`` is refused ("executor/node-01
reports only for node node-01, not node-02").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import topics as t

CLI = "cli"  # the command-line tool writing to the bus directly (an operator's machine)
API = "api"  # the HTTP API: the authenticated edge for tenants and operators
UP = "hivemux-up"  # `hivemux up`'s demo jobs

COMMANDERS = frozenset({API, CLI})
DECIDERS = ("cell-allocator", "health-processor", "matcher", "predictor")  # audited: they journal

# topic -> the principals that may write it. The single home of the rule: the runtime's check,
# the README's table and the Kafka ACLs are all generated from it.
WRITERS: Mapping[str, frozenset[str]] = {
    t.GPU_TELEMETRY.name: frozenset({"telemetry-ingester"}),
    t.NODE_TELEMETRY.name: frozenset({"telemetry-ingester"}),
    t.GPU_CONTROL.name: COMMANDERS,
    t.GPU_HEALTH.name: frozenset({"health-processor"}),
    t.HEALTH_STATE.name: frozenset({"health-processor"}),
    t.NODE_PRESSURE.name: frozenset({"health-processor"}),
    t.GPU_FAULTS.name: frozenset({"health-processor"}),
    t.JOBS_SUBMITTED.name: COMMANDERS | {UP},
    t.JOBS_COMMANDS.name: COMMANDERS,
    t.JOBS_REFUSALS.name: frozenset({"job-controller", "cell-allocator", "matcher"}),  # resize: the deciders refuse too
    t.JOBS_RESIZES.name: frozenset({"cell-allocator", "matcher"}),
    t.JOBS_PRIORITIES.name: frozenset({"job-controller"}),
    t.JOBS_LIFECYCLE.name: frozenset({"job-controller", "cell-allocator", "matcher", "profiler", "executor"}),
    t.JOBS_LOGS.name: frozenset({"executor"}),
    t.JOBS_PROFILED.name: frozenset({"profiler"}),
    t.SHARING_OBSERVATIONS.name: frozenset({"executor"}),
    t.ONLINE_LATENCY.name: frozenset({"executor"}),
    t.SLO_PROTECTION.name: frozenset({"health-processor"}),
    t.PREDICTOR_MODELS.name: frozenset({"predictor", "predictor-store"}),
    t.CELL_CONFIG.name: COMMANDERS,
    t.CELL_BINDINGS.name: frozenset({"cell-allocator"}),
    t.PLACEMENTS.name: frozenset({"matcher"}),
    t.EXECUTOR_COMMANDS.name: frozenset({"cell-allocator", "matcher", "health-processor"}),
    t.EXECUTOR_REPORTS.name: frozenset({"executor"}),
    t.NODE_AGENTS.name: frozenset({"executor"}),
    t.CLOCK_TICKS.name: frozenset({"cell-allocator", "health-processor", "predictor"}),
    t.AUDIT_JOURNAL.name: frozenset(DECIDERS),
    t.LEADERSHIP.name: frozenset({"cell-allocator", "matcher"}),
}
# (topic, principal) whose instance must be the record's node: a node agent speaks for its node.
PER_NODE: frozenset[tuple[str, str]] = frozenset({
    (t.EXECUTOR_REPORTS.name, "executor"),
    (t.NODE_AGENTS.name, "executor"),
    (t.SHARING_OBSERVATIONS.name, "executor"),
    (t.ONLINE_LATENCY.name, "executor"),
    (t.JOBS_LOGS.name, "executor"),
})
# (topic, principal) -> the actions its records may carry: who may start, stop or evict what
# (a matcher does not stop training jobs, the health processor starts nothing).
ACTIONS: Mapping[tuple[str, str], frozenset[str]] = {
    (t.EXECUTOR_COMMANDS.name, "cell-allocator"): frozenset({"start_training", "start_online", "stop", "evict"}),
    (t.EXECUTOR_COMMANDS.name, "matcher"): frozenset({"start_offline", "stop", "evict", "adjust"}),  # adjust: a user's resize
    (t.EXECUTOR_COMMANDS.name, "health-processor"): frozenset({"evict", "restart_mps", "reset_workload", "adjust"}),
}
# Every service writes the dead letters of what it consumes: any principal may (the dead-letter
# topics are evidence for an operator, consumed by no decision).
DEAD_LETTER_WRITERS = "any service"

_CACHE_LIMIT = 4096  # (topic, source) pairs remembered; a flood of invented sources resets it


def principal_of(source: str) -> str:
    """The principal of a ``source``: what comes before the first '/' or ':' (``api:0`` is the
    API's instance 0 as well as ``api/0``), all of a bare name."""
    cut = min((i for i in (source.find("/"), source.find(":")) if i >= 0), default=len(source))
    return source[:cut]


def principals() -> list[str]:
    """Every principal that writes some topic, sorted."""
    return sorted(set().union(*WRITERS.values()))


def topics_of(principal: str) -> list[str]:
    """The registry topics `principal` may write, in the registry's order."""
    return [topic.name for topic in t.TOPICS if principal in WRITERS[topic.name]]


class Authorization:
    """The admission check (module docstring); one per service, its cache with it."""

    def __init__(
        self,
        writers: Mapping[str, frozenset[str]] = WRITERS,
        per_node: frozenset[tuple[str, str]] = PER_NODE,
        actions: Mapping[tuple[str, str], frozenset[str]] = ACTIONS,
    ) -> None:
        self.writers = writers
        self.per_node = per_node
        self.actions = actions
        self._verdicts: dict[tuple[str, str], Any] = {}

    def refusal(self, topic: str, event: Any) -> str | None:
        """Why `event` (consumed from `topic`) may not be admitted, or None."""
        key = (topic, event.source)
        verdict = self._verdicts.get(key, self)
        if verdict is self:
            if len(self._verdicts) >= _CACHE_LIMIT:
                self._verdicts.clear()
            verdict = self._verdicts[key] = self._judge(topic, event.source)
        if type(verdict) is tuple:  # (the writer's node,): admitted for that node's records only
            node = verdict[0]
            return None if node == event.node_id else f"{event.source} reports only for node {node or '(none)'}, not {event.node_id}"
        if type(verdict) is frozenset:  # the actions this writer may command
            action = str(event.action)
            return None if action in verdict else f"{event.source} may not command {action} (only {', '.join(sorted(verdict))})"
        return verdict  # type: ignore[no-any-return]

    def _judge(self, topic: str, source: str) -> Any:
        allowed = self.writers.get(topic)
        if allowed is None:
            return None  # not a registry topic (a test's own): not judged here
        principal = principal_of(source)
        if principal not in allowed:
            return f"source {source!r}: {topic} is written by {', '.join(sorted(allowed))}; not by {principal!r}"
        if (topic, principal) in self.per_node:
            return (source.partition("/")[2],)
        return self.actions.get((topic, principal))


_CHECK = Authorization()


def as_writer(event: Any, instance: str = "test") -> Any:
    """`event` as a writer allowed to write its topic would publish it: unchanged if its source
    may already, else with the source ``<first writer>/<instance>`` (a node agent's for per-node
    records). For tests and benchmarks that play the services' part."""
    topic = t.topic_for(event).name
    if _CHECK.refusal(topic, event) is None:
        return event
    principal = sorted(WRITERS[topic])[0]
    return event.model_copy(update={"source": f"{principal}/{event.node_id if (topic, principal) in PER_NODE else instance}"})


def readme_table() -> str:
    """The README's table: each principal and the topics it may write (`tests/unit/bus`)."""
    rows = ["| principal | may write |", "|---|---|"]
    for principal in principals():
        written = ", ".join(f"`{name}`" + _only(name, principal) for name in topics_of(principal))
        rows.append(f"| `{principal}` | {written} |")
    rows.append(f"| {DEAD_LETTER_WRITERS} | the `.dlq` topic of each topic it consumes |")
    return "\n".join(rows)


# A source principal whose records a service's own Kafka user writes (the same process).
KAFKA_USER = {"predictor-store": "predictor", UP: CLI}
SERVICES = ("api", "cell-allocator", "executor", "health-processor", "job-controller", "matcher", "predictor", "profiler",
            "projector", "telemetry-ingester")  # each its own Kafka user (docker-compose.yml, deploy/)


def _only(topic: str, principal: str) -> str:
    if (topic, principal) in PER_NODE:
        return " (its own node's)"
    actions = ACTIONS.get((topic, principal))
    return f" ({', '.join(sorted(actions))})" if actions else ""


def kafka_acls(principal_prefix: str = "User:") -> list[str]:
    """The ``kafka-acls`` commands that give each Kafka user exactly its topics (write), the
    dead-letter topics (write: every service dead-letters what it cannot accept), and every
    topic and its groups (read: reading decides nothing). deploy/kafka-acls.sh is this output."""
    add = 'kafka-acls --bootstrap-server "$KAFKA" --command-config "$ADMIN_CONFIG" --add --allow-principal'
    writes: dict[str, list[str]] = {}
    for principal in principals():
        writes.setdefault(KAFKA_USER.get(principal, principal), []).extend(topics_of(principal))
    lines = []
    for user in sorted(writes):
        for name in dict.fromkeys(writes[user]):
            lines.append(f"{add} {principal_prefix}{user} --operation Write --topic {name}")
    for user in (*SERVICES, CLI):  # the CLI reads what it waits for (`jobs submit --wait`, `cells status`)
        lines.append(f"{add} {principal_prefix}{user} --operation Read --operation Describe --topic '*' --group '*'")
    for user in SERVICES:
        for topic in t.TOPICS:
            lines.append(f"{add} {principal_prefix}{user} --operation Write --topic {topic.dead_letter.name}")
    return lines


ACL_SCRIPT_HEAD = """#!/bin/sh
# Kafka ACLs for hivemux, one Kafka user per service (SASL): each may write only the topics
# `hivemux.bus.authorization.WRITERS` gives it, every dead-letter topic, and read everything.
# Generated: python -m hivemux.bus.authorization acls > deploy/kafka-acls.sh (a unit test checks it).
# KAFKA: the bootstrap servers; ADMIN_CONFIG: a client properties file with an admin's credentials.
# The broker must deny by default (allow.everyone.if.no.acl.found=false) and the services run
# with HIVEMUX_CREATE_TOPICS=false (an admin creates the topics `hivemux topics` lists), or give
# each user Create on the cluster.
set -eu
: "${KAFKA:?set KAFKA to the bootstrap servers}"
: "${ADMIN_CONFIG:?set ADMIN_CONFIG to an admin client properties file}"
"""

if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["readme"]:
        print(readme_table())
    elif sys.argv[1:] == ["acls"]:
        print(ACL_SCRIPT_HEAD + "\n".join(kafka_acls()))
    else:
        sys.exit("usage: python -m hivemux.bus.authorization readme|acls")
