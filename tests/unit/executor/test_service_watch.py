"""A user's own online service (issue 29, `executor.service_watch`): the spec's ports, readiness
and metrics fields as validated at submission, ports allocated without clashes, their environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hivemux.events import WorkloadSpec
from hivemux.executor.service_watch import ServiceState, allocate_ports, service_env

BASE = {"model": "mlp", "batch_size": 1, "iterations": 1, "command": ["serve"]}


def test_the_spec_as_the_job_file_writes_it() -> None:
    spec = WorkloadSpec.model_validate({**BASE, "ports": [{"name": "METRICS_PORT"}], "readiness": {"http": "/healthz"},
                                        "metrics": {"path": "/metrics", "histogram": "inference_request_duration_seconds",
                                                    "port": "METRICS_PORT"}})  # fmt: skip
    assert spec.readiness is not None and spec.readiness.http == "/healthz" and not spec.readiness.tcp
    assert spec.metrics is not None and (spec.metrics.path, spec.metrics.port) == ("/metrics", "METRICS_PORT")
    tcp = WorkloadSpec.model_validate({**BASE, "readiness": {"tcp": True}, "metrics": {"histogram": "h_seconds"}})
    assert tcp.readiness is not None and tcp.readiness.tcp and tcp.metrics is not None and tcp.metrics.path == "/metrics"


@pytest.mark.parametrize(("extra", "error"), [
    ({"ports": [{"name": "PORT"}]}, "not PORT"),
    ({"ports": [{"name": "A_PORT"}, {"name": "A_PORT"}]}, "each name once"),
    ({"ports": [{"name": "lower"}]}, "should match pattern"),
    ({"readiness": {"http": "/healthz", "tcp": True}}, "either an http path or tcp"),
    ({"readiness": {}}, "either an http path or tcp"),
    ({"readiness": {"http": "http://elsewhere/x"}}, "should match pattern"),
    ({"metrics": {"histogram": "h", "port": "OTHER"}}, "is not PORT nor one of the ports"),
    ({"metrics": {"histogram": "bad name{}"}}, "should match pattern"),
], ids=["port-named-PORT", "twice", "lowercase", "both-probes", "no-probe", "absolute-url", "unknown-metrics-port", "metric-name"])  # fmt: skip
def test_what_a_spec_may_not_say(extra: dict[str, object], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        WorkloadSpec.model_validate({**BASE, **extra})


def test_ports_are_free_distinct_and_never_one_another_replica_holds() -> None:
    first = allocate_ports(["PORT", "METRICS_PORT"], set())
    assert set(first) == {"PORT", "METRICS_PORT"} and len(set(first.values())) == 2
    second = allocate_ports(["PORT"], set(first.values()))
    assert second["PORT"] not in first.values()
    state = ServiceState(first, f"10.0.0.7:{first['PORT']}")
    assert service_env(state) == {"PORT": str(first["PORT"]), "METRICS_PORT": str(first["METRICS_PORT"])}
