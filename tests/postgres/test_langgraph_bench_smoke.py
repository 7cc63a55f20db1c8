"""``bench.langgraph_saver`` cannot rot: a quick run produces every figure, our round trips counted.

The numbers are not checked (CI machines are noisy); ``bench/REPORT.md`` holds the real run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)  # a hang guard: how long the smoke takes is not asserted
def test_the_langgraph_bench_produces_its_figures_per_step_and_per_tool_iteration(pg_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    out.write_text(json.dumps({"figures": {"kept": 1}}))
    env = {**os.environ, "BENCH_DSN": pg_dsn}
    env.pop("AGENTRUN_FAULT_POINT", None)
    cmd = [sys.executable, "-m", "bench.langgraph_saver", "--quick", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, f"the LangGraph bench failed, so `make bench` is broken:\n{done.stderr[-3000:]}"
    merged = json.loads(out.read_text())
    assert merged["figures"] == {"kept": 1}, "the merge dropped the other benches' figures"
    section = merged["langgraph_saver"]
    assert section == json.loads((tmp_path / "langgraph_saver.json").read_text())
    for workload in ("step", "tools"):
        row = section["workloads"][workload]
        for key in ("agentrun_ms", "langgraph_ms", "memory_ms", "agentrun_cpu_ms", "langgraph_over_agentrun"):
            assert row[key] > 0, f"{workload}: {key} is not measured"
        assert row["agentrun_round_trips"] > 0 and row["agentrun_commits"] > 0, f"{workload}: our work is not counted"
    assert len(section["load_average"]["before"]) == 3
