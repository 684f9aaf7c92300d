"""Where the tests' data lives: inside the checkout (`tests/data/`), never beside it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_DATA = REPO / "tests" / "data"
# HiveD's acceptance scenarios and their format (copied from the project's shared material).
HIVED_EXAMPLES = TEST_DATA / "hived" / "example-scenarios.yaml"
