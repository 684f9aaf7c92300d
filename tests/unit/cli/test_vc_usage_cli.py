"""`hivemux vcs usage`'s window (`cli.vc_views.parse_since`) and the merge of its two queries
(`store.usage.usage_rows`); the command itself runs on PostgreSQL in tests/integration/test_vc_usage.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest
from click.testing import CliRunner

from hivemux.cli.main import cli
from hivemux.cli.vc_views import parse_since
from hivemux.store.usage import usage_rows

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", NOW - timedelta(seconds=90)), ("30m", NOW - timedelta(minutes=30)), ("6h", NOW - timedelta(hours=6)),
     ("1.5d", NOW - timedelta(days=1.5)), ("2026-11-26T08:00:00", datetime(2026, 11, 26, 8, 0, tzinfo=UTC)),
     ("2026-11-26T08:00:00+01:00", datetime(2026, 11, 26, 7, 0, tzinfo=UTC))],
    ids=["seconds", "minutes", "hours", "days", "iso-utc", "iso-zone"],
)  # fmt: skip
def test_since_is_a_duration_or_a_time(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


def test_a_bad_since_is_a_usage_error() -> None:
    with pytest.raises(click.BadParameter):
        parse_since("yesterday", NOW)


def test_rows_merge_hours_and_sharing_per_vc() -> None:
    rows = usage_rows(
        [{"vc": "b", "kind": "shared", "gpu_hours": 2.0}, {"vc": "a", "kind": "guaranteed", "gpu_hours": 8.0}],
        [{"vc": "b", "observations": 3, "offline_normalized_throughput": 0.5, "offline_slowdown": 2.0, "online_slowdown_caused": 0.1,
          "online_slowdown_max": 0.2, "online_slowdown_gpu_hours": 0.05}],
    )  # fmt: skip
    assert [r["vc"] for r in rows] == ["a", "b"]
    assert rows[0]["guaranteed_gpu_hours"] == 8.0 and rows[0]["observations"] == 0 and rows[0]["offline_slowdown"] is None
    assert rows[1]["shared_gpu_hours"] == 2.0 and rows[1]["offline_normalized_throughput"] == 0.5


def test_usage_needs_the_database() -> None:
    result = CliRunner().invoke(cli, ["vcs", "usage"], env={"HIVEMUX_POSTGRES_DSN": ""})
    assert result.exit_code != 0 and "HIVEMUX_POSTGRES_DSN is not set" in result.output
