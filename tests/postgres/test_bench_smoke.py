"""The benchmark (``make bench``) cannot rot: a few steps of every shape, asserting only that each figure is produced.

The numbers are not checked (CI machines are noisy); ``bench/REPORT.md`` holds the real run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres

AGENTRUN_FIGURES = {
    "pg_commit_ms",
    "agentrun_step_ms",
    "agentrun_step_ms_sqlite",
    "agentrun_step_ms_memory",
    "agentrun_step_ms_msg",
    "agentrun_step_ms_msg_h0",
    "agentrun_step_ms_msg_h100",
    "agentrun_invoke_ms_msg_h0",
    "agentrun_invoke_ms_msg_h100",
    "agentrun_tool_iteration_ms",
    "runner_cold_start_ms",
}
LANGGRAPH_FIGURES = {
    "langgraph_step_ms",
    "langgraph_step_ms_msg_h0",
    "langgraph_step_ms_msg_h100",
    "langgraph_tool_iteration_ms",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.timeout(300)  # a hang guard: how long the smoke takes is not asserted
def test_make_bench_produces_every_figure_of_the_issue(pg_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    plots = _installed("matplotlib")
    cmd = [sys.executable, "-m", "bench.runtime", "--quick", "--rounds", "1", "--idle", "0", "--inprocess"]
    cmd += ["--out", str(out), *([] if plots else ["--no-plots"])]
    env = {**os.environ, "BENCH_DSN": pg_dsn}
    env.pop("AGENTRUN_FAULT_POINT", None)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, f"the benchmark smoke failed, so `make bench` is broken:\n{done.stderr[-3000:]}"
    report = json.loads(out.read_text())
    figures = report["figures"]
    expected = set(AGENTRUN_FIGURES)
    if _installed("langgraph.checkpoint.postgres"):
        expected |= LANGGRAPH_FIGURES
    missing = sorted(expected - set(figures))
    assert not missing, f"`make bench` no longer produces {missing}"
    for name in expected:
        assert figures[name]["n"] >= 1 and figures[name]["median"] > 0, f"{name} has no samples"
    for name in ("agentrun_step_ms", "agentrun_step_ms_msg", "agentrun_tool_iteration_ms"):
        counted = figures[name].get("round_trips_per_step", figures[name].get("round_trips_per_iteration"))
        assert counted is not None and counted > 0, f"round trips of {name} are no longer counted"
    assert "agentrun_step_over_pg_commit" in report["ratios"]
    imports = figures["runner_cold_start_ms"]["imports_ms"]
    assert imports["total"] > 0 and imports.get("agentrun", 0) > 0, (
        f"the cold start's import profile is gone: {imports}"
    )
    assert report["meta"]["versions"]["asyncpg"]
    assert (tmp_path / "table.md").exists()
    if plots:
        assert (tmp_path / "history.png").exists() and (tmp_path / "steps.png").exists()
