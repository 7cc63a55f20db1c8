"""The operator benchmark (``bench/operator.py``) runs end to end and produces every figure (``--quick``).

A smoke, not a timed test: the figures' values are the benchmark's business (``make bench``); this only
guards that each one is still measured (on the real control plane; ``make bench`` runs kubesim's side too) and merged
into the results file without losing other keys, and that the request counter (kubesim: a proxy; real:
kube-apiserver's audit log) sees the operator at all. The scale phase runs at 50 runs waiting for approval:
its first pass, restart and failover must each end with every run reconciled (the benchmark checks that a
seeded run came out Interrupted with its interrupt read from the store).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = (
    "operator_api_requests_per_run_per_s",
    "operator_api_requests_per_run_setup",
    "operator_db_queries_per_run_per_s",
    "operator_cpu_percent",
    "operator_rss_mb_1000_runs",
    "status_lag_p95_s",
    "stop_p95_s",
    "reschedule_p95_s",
    "burst_pods_created_s",
)
SCALE_FIGURES = (
    "setup_s",
    "start_reconciled_s",
    "api_requests_per_run_per_s",
    "db_queries_per_run_per_s",
    "cpu_percent",
    "rss_mb",
    "status_lag_p95_s",
    "restart_reconciled_s",
    "failover_leading_s",
    "failover_reconciled_s",
)

pytestmark = pytest.mark.timeout(420)


@pytest.mark.real_server  # the real one only: make bench measures on both; kubesim's side cost CI 75 s more
def test_the_operator_benchmark_produces_every_figure_and_keeps_the_runtime_keys(
    api_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "latest.json"
    out.write_text(json.dumps({"figures": {"runtime": 1}, "meta": {}}))
    result = subprocess.run(
        [sys.executable, "-m", "bench.operator", "--quick", "--api-server", api_server, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads(out.read_text())
    assert written["figures"] == {"runtime": 1}, "the runtime benchmark's keys were clobbered"
    figures = written["operator"]["figures"][api_server]
    missing = [k for k in FIGURES if not isinstance(figures.get(k), float | int) or not math.isfinite(figures[k])]
    assert not missing, f"figures not produced: {missing} in {figures}"
    # Creating a run costs the operator a pod create and status patches at least: zero means the counter is blind.
    assert figures["operator_api_requests_per_run_setup"] >= 2, f"no operator request was counted: {figures}"
    scaled = written["operator"]["scale"][api_server]["50"]
    missing = [k for k in SCALE_FIGURES if not isinstance(scaled.get(k), float | int) or not math.isfinite(scaled[k])]
    assert not missing, f"scale figures not produced: {missing} in {scaled}"
    # The Lease is renewed in any window: zero means the counter missed the operator.
    assert scaled["api_requests_per_run_per_s"] > 0, f"no operator request was counted at scale: {scaled}"
