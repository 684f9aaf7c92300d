"""Wiring for `hivemux cells replay`: the replay's scheduler factory, over the one place
schedulers are built (`cells.schedulers.build_scheduler`).

Kept apart from `replay` so the engine stays independent of any one algorithm (tests pass
their own factory, and replace this one to drive the CLI with a toy scheduler).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hivemux.cells.api import CellScheduler
from .replay import ChainSearchOrder, SchedulerFactory


def hived_factory() -> SchedulerFactory:
    """`make_scheduler(config, chain_search_order)` building `cells.hived.HivedScheduler`.

    The configuration is parsed by `cells.config.parse_config` (the one parser; it raises
    `ConfigurationError`, which the replay reports as an init error). No order given means the
    scheduler's default, the reference's descending chain names. Raises ImportError when the
    algorithm module is not available.
    """
    from hivemux.cells.schedulers import build_scheduler

    def make(config: Mapping[str, Any], chain_search_order: ChainSearchOrder | None) -> CellScheduler:
        return build_scheduler("hived", config, chain_search_order=chain_search_order)

    return make
