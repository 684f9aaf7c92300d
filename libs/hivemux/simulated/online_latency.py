"""The simulated fleet's online latency: what an online service's p99 is, beside an offline job.

The fleet (`simulated.fleet`) names its services ``infer-<model>-<k>``; each model family has a
solo p99 at idle load and a p99 SLO (ours: the paper publishes latencies only normalized to
Online-only). The p99 over a window follows the cluster simulator's latency model
(`experiments.online_world`): queuing grows with the load, ``load = 1 / (1 - 0.5 rho)`` with
``rho`` the online SM activity (a proxy of the request rate the node agent can measure), and
sharing adds the online slowdown ``S`` of `interference.shared_execution`:
``p99 = base * load * (1 + S)``, p50 = half of it. The SLO is twice the idle p99: a normal
service (peak SM activity 60-75 %) stays inside alone (1.6 x base at 75 %) and approaches it
when shared at its peak; a hot one (100 %) runs at 95 % of it alone.

Worked example: bert (base 25 ms, SLO 50 ms) at 60 % SM activity alone: 25 / 0.7 = 35.7 ms;
with an offline neighbour slowing it by 15 %: 41.1 ms, 82 % of the SLO.
"""

from __future__ import annotations

SERVICE_LATENCY_MS: dict[str, float] = {"resnet50": 10.0, "bert": 25.0, "recommendation-mlp": 6.0, "inceptionv3": 12.0}
DEFAULT_LATENCY_MS = 20.0
SLO_FACTOR = 2.0


def service_model(service: str) -> str:
    """``infer-bert-03`` -> ``bert``; another name is its own model."""
    name = service.removeprefix("infer-")
    head, _, tail = name.rpartition("-")
    return head if head and tail.isdigit() else name


def base_p99_ms(service: str) -> float:
    return SERVICE_LATENCY_MS.get(service_model(service), DEFAULT_LATENCY_MS)


def slo_p99_ms(service: str) -> float:
    return SLO_FACTOR * base_p99_ms(service)


def online_p99_ms(service: str, online_sm_activity: float, slowdown: float) -> float:
    rho = min(0.95, max(0.0, online_sm_activity / 100.0))
    return base_p99_ms(service) / (1.0 - 0.5 * rho) * (1.0 + max(0.0, slowdown))
