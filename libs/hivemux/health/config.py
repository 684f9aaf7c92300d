"""The health-processor's configuration: thresholds, back-off, node limits, detector rules.

Read from YAML (`default_health.yaml` is the shipped default and documents every value);
pydantic validates the file at the edge and the result is plain frozen dataclasses.
A bad file fails with a message naming the offending key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hivemux.events.telemetry import FaultKind, Remediation

from .thresholds import METRICS, HealthThresholds, LimitTable, MetricLimit, compile_levels

DEFAULT_CONFIG = "default_health.yaml"
LevelFn = Callable[[tuple[float | None, ...]], int]


class ConfigError(ValueError):
    """The health configuration is invalid; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Limit(_Strict):
    healthy: float
    unhealthy: float
    overlimit: float
    low_is_bad: bool = False


class _Backoff(_Strict):
    base_period_s: float = Field(gt=0)
    window_s: float = Field(gt=0)


class _Node(_Strict):
    cpu_util: float = Field(gt=0, le=100)
    memory_usage: float = Field(gt=0, le=100)
    kswapd_busy_s: float = Field(gt=0)
    recovery_margin: float = Field(ge=0, lt=100)


class _Detector(_Strict):
    high_util_pct: float = Field(gt=0, le=100)
    high_util_s: float = Field(gt=0)
    ecc_sbe_burst: int = Field(ge=1)


class _File(_Strict):
    thresholds: dict[str, _Limit]
    gpu_types: dict[str, dict[str, _Limit]] = Field(default_factory=dict)
    backoff: _Backoff
    stale_after_s: float = Field(gt=0)
    node: _Node
    detector: _Detector
    rules: dict[FaultKind, Literal["restart_mps", "reset_and_restart", "drain", "report"]]

    @model_validator(mode="after")
    def _complete(self) -> "_File":
        missing = [m for m in METRICS if m not in self.thresholds]
        unknown = [m for m in self.thresholds if m not in METRICS]
        unknown += [f"gpu_types.{t}.{m}" for t, limits in self.gpu_types.items() for m in limits if m not in METRICS]
        if missing or unknown:
            raise ValueError(f"thresholds: missing {missing}, unknown {unknown}; metrics are {list(METRICS)}")
        unruled = [k.value for k in FaultKind if k not in self.rules]
        if unruled:
            raise ValueError(f"rules: no remediation for {unruled}")
        return self


@dataclass(frozen=True)
class NodeLimits:
    cpu_util: float
    memory_usage: float
    kswapd_busy_s: float
    recovery_margin: float


@dataclass(frozen=True)
class DetectorSettings:
    high_util_pct: float
    high_util_s: float
    ecc_sbe_burst: int


@dataclass(frozen=True)
class HealthConfig:
    default: HealthThresholds
    by_type: dict[str, HealthThresholds]
    base_period_s: float
    backoff_window_s: float
    stale_after_s: float
    node: NodeLimits
    detector: DetectorSettings
    rules: dict[FaultKind, Remediation]
    # The document it was parsed from (JSON-able), recorded in the audit journal so a replay
    # judges with the same thresholds.
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    _tables: dict[str, LimitTable] = field(default_factory=dict, compare=False, repr=False)
    # GPU type -> its compiled level function (see `thresholds.compile_levels`), compiled on
    # first use; read by subscript, the cheapest lookup, on the per-sample path.
    levels: dict[str, LevelFn] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", _LevelFns(self.table_for))

    def thresholds_for(self, gpu_type: str) -> HealthThresholds:
        return self.by_type.get(gpu_type, self.default)

    def table_for(self, gpu_type: str) -> LimitTable:
        """The compiled thresholds of a type (cached: this is on the per-sample path)."""
        table = self._tables.get(gpu_type)
        if table is None:
            table = self._tables[gpu_type] = LimitTable.of(self.thresholds_for(gpu_type))
        return table

    def level_fn(self, gpu_type: str) -> LevelFn:
        """The compiled level function of a type (cached; see `thresholds.compile_levels`)."""
        return self.levels[gpu_type]


class _LevelFns(dict[str, "LevelFn"]):
    def __init__(self, table_for: Callable[[str], LimitTable]) -> None:
        super().__init__()
        self._table_for = table_for

    def __missing__(self, gpu_type: str) -> LevelFn:
        fn = self[gpu_type] = compile_levels(self._table_for(gpu_type))
        return fn


def _limit(raw: _Limit, where: str) -> MetricLimit:
    try:
        return MetricLimit(raw.healthy, raw.unhealthy, raw.overlimit, raw.low_is_bad)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def parse_config(document: object, *, origin: str = "<config>") -> HealthConfig:
    try:
        raw = _File.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"{origin}: {where}: {first['msg']}") from None
    base = {m: _limit(raw.thresholds[m], f"{origin}: thresholds.{m}") for m in METRICS}
    by_type = {}
    for gpu_type, overrides in raw.gpu_types.items():
        merged = dict(base)
        merged.update({m: _limit(v, f"{origin}: gpu_types.{gpu_type}.{m}") for m, v in overrides.items()})
        by_type[gpu_type] = HealthThresholds(**merged)
    return HealthConfig(
        default=HealthThresholds(**base),
        by_type=by_type,
        base_period_s=raw.backoff.base_period_s,
        backoff_window_s=raw.backoff.window_s,
        stale_after_s=raw.stale_after_s,
        node=NodeLimits(**raw.node.model_dump()),
        detector=DetectorSettings(**raw.detector.model_dump()),
        rules=dict(raw.rules),
        document=raw.model_dump(mode="json"),
    )


def load_config(path: str | Path | None = None) -> HealthConfig:
    """The configuration in `path`, or the shipped default."""
    if path is None:
        text = resources.files("hivemux.health").joinpath(DEFAULT_CONFIG).read_text()
        origin = DEFAULT_CONFIG
    else:
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise ConfigError(f"cannot read health configuration {path}: {error.strerror}") from None
        origin = str(path)
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{origin}: not YAML: {error}") from None
    return parse_config(document, origin=origin)
