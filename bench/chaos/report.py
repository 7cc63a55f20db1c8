"""bench/results/reliability.json and bench/RELIABILITY.md from a campaign's summary (placeholder)."""

from __future__ import annotations

import json
from typing import Any

from .verdict import LOSSES
from .world import ROOT

__all__ = ["JSON", "LOSS_FIGURES", "MARKDOWN", "ROOT", "write"]

JSON = ROOT / "bench" / "results" / "reliability.json"
MARKDOWN = ROOT / "bench" / "RELIABILITY.md"
LOSS_FIGURES = LOSSES


def write(figures: dict[str, Any]) -> None:
    JSON.write_text(json.dumps(figures, indent=1) + "\n")
