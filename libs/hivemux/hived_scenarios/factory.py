"""Wiring for `hivemux cells replay`: the factory that builds the HiveD scheduler per scenario.

Kept apart from `replay` so the engine stays independent of any one algorithm (tests pass
their own factory); this is the only place the replay meets `cells.hived`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hivemux.cells.api import CellScheduler
from .replay import ChainSearchOrder, SchedulerFactory


def hived_factory() -> SchedulerFactory:
    """`make_scheduler(config, chain_search_order)` for `cells.hived.HivedScheduler`.

    The configuration dict is parsed by `cells.config.parse_config` (the one parser; it raises
    `ConfigurationError`, which the replay reports as an init error). No order given means the
    scheduler's default, the reference's descending chain names. Raises ImportError when the
    algorithm module is not available.
    """
    from hivemux.cells.config import parse_config
    from hivemux.cells.hived import HivedScheduler

    def make(config: Mapping[str, Any], chain_search_order: ChainSearchOrder | None) -> CellScheduler:
        parsed = parse_config(config)
        if chain_search_order is None:
            return HivedScheduler(parsed)
        return HivedScheduler(parsed, chain_search_order=chain_search_order)

    return make
