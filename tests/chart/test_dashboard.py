"""The Grafana dashboard: generated from hack/dashboard.py, shipped in the chart, templated, every panel queried.

(Its queries run against a real Prometheus in tests/cluster/test_metrics_prometheus.py.)
"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import pytest

from tests.chart.conftest import CHART, NAMESPACE, ROOT, rendering

pytestmark = pytest.mark.chart

DASHBOARD = CHART / "dashboards" / "agentrun.json"


def generator() -> ModuleType:
    path = ROOT / "hack" / "dashboard.py"
    spec = importlib.util.spec_from_file_location("agentrun_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("agentrun_dashboard", module)
    spec.loader.exec_module(module)
    return module


def test_the_committed_dashboard_is_what_the_generator_writes() -> None:
    assert DASHBOARD.read_text() == generator().build(), (
        "helm/agentrun/dashboards/agentrun.json is stale: make dashboard"
    )


def test_the_chart_ships_the_dashboard_for_the_grafana_sidecar_by_default() -> None:
    (config_map,) = [o for o in rendering("default").all("ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert json.loads(config_map["data"]["agentrun.json"]) == json.loads(DASHBOARD.read_text())


def test_every_panel_is_templated_by_datasource_and_namespace() -> None:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["namespace"]["includeAll"] and variables["namespace"]["allValue"] == ".*"
    titles = {p["title"] for p in board["panels"]}
    for wanted in (
        "Runs by phase",
        "Run duration by final phase",
        "Reschedules by reason",
        "Stop latency",
        "Pod start latency",
        "Checkpoint write p50/p99",
        "Ledger replays vs executions",
        "Ledger record failures",
        "In-doubt calls",
        "Tool errors and timeouts",
        "Stale-state conflicts and fenced writes",
        "Redis degradation",
        "Model tokens",
        "Model latency",
        "Operator leader",
        "Reconcile errors and API errors",
    ):
        assert wanted in titles, f"the dashboard lost the panel {wanted!r}"
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    namespaced = [t["expr"] for p in board["panels"] for t in p["targets"] if "$namespace" in t["expr"]]
    assert len(namespaced) >= 10, "per-run panels must follow the namespace variable"
