"""Scheduler construction, in one place: a parsed HiveD configuration in, a `CellScheduler` out.

Every caller builds its scheduler here: the cell-allocator service (at start and on a new
cell configuration, `cells.allocator`), the trace-driven experiments (HiveD §5.2-§5.3,
`experiments.hived_experiments`) and the scenario replay (`hivemux cells replay`).

- ``hived``: `cells.hived.HivedScheduler`, HiveD's multi-level cells with buddy cell allocation
  (§3, Algorithm 1). ``chain_search_order`` (leaf type -> chain names) overrides the order in
  which chains are tried for a leaf type (the reference's default: descending chain name); the
  replay passes the one a scenario file names.
- ``quota``: `cells.quota_baseline.QuotaScheduler`, the per-VC GPU quota baseline HiveD is
  compared with (§5). It has no chain search order.

The configuration is either a raw HiveD YAML mapping (``physicalCluster``, ``virtualClusters``),
parsed by `cells.config.parse_config`, the one parser, or an already parsed `HivedConfig`
(callers that read the configuration themselves parse it once). Bad configuration raises
`ConfigurationError`, as does an unknown kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from hivemux.errors import ConfigurationError

from .api import CellScheduler
from .config import HivedConfig, parse_config
from .hived import HivedScheduler
from .quota_baseline import QuotaScheduler

SchedulerKind = Literal["hived", "quota"]
SCHEDULERS: tuple[SchedulerKind, ...] = ("hived", "quota")


def build_scheduler(
    kind: str,
    config: HivedConfig | Mapping[str, Any],
    *,
    chain_search_order: Mapping[str, Sequence[str]] | None = None,
    quota_placement: str = "best",
    quota_preempt: bool = True,
) -> CellScheduler:
    """A fresh scheduler of `kind` over `config` (raw HiveD YAML mapping or parsed).
    ``quota_placement`` / ``quota_preempt``: the quota baseline's variants (`QuotaScheduler`)."""
    if kind not in SCHEDULERS:
        raise ConfigurationError(f"unknown scheduler {kind!r} (one of {', '.join(SCHEDULERS)})")
    parsed = config if isinstance(config, HivedConfig) else parse_config(config)
    if kind == "quota":
        if chain_search_order:
            raise ConfigurationError("the quota baseline has no chain search order")
        return QuotaScheduler(parsed, placement=quota_placement, preempt=quota_preempt)
    return HivedScheduler(parsed, chain_search_order=chain_search_order)
