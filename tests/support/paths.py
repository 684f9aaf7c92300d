"""Where the project's shared material is: `shared/` beside the checkout (as CI lays it out),
else the workplace's copy."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = next((p for p in (REPO.parent / "shared", Path("/work/shared")) if p.is_dir()), REPO.parent / "shared")
HIVED_EXAMPLES = SHARED / "hived" / "example-scenarios.yaml"
