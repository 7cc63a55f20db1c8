"""The operator's metrics: bounded labels, series at 0 before anything happens, counts from status deltas."""

from __future__ import annotations

from prometheus_client import REGISTRY

from agentrun_operator.decide.toolerrors import tool_call_counts
from agentrun_operator.io import metrics


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_a_namespace_s_series_exist_at_zero_once_a_run_there_is_seen() -> None:
    metrics.namespace_seen("metrics-ns-a", ("Pending", "Running"))
    assert sample("agentrun_operator_runs", phase="Running", namespace="metrics-ns-a") == 0
    assert sample("agentrun_operator_reschedules_total", reason="BackOff", namespace="metrics-ns-a") == 0
    for outcome in metrics.TOOL_OUTCOMES:
        assert sample("agentrun_operator_tool_calls_total", namespace="metrics-ns-a", outcome=outcome) == 0
    assert sample("agentrun_operator_run_duration_seconds_count", namespace="metrics-ns-a", phase="Stopped") == 0


def test_tool_calls_count_only_the_growth_of_a_run_s_status_counters() -> None:
    metrics.namespace_seen("metrics-ns-b", ())
    before = tool_call_counts({"executed": 2, "replayed": 0})
    after = tool_call_counts({"executed": 3, "replayed": 2, "in_doubt": 1, "unrecorded": 1})
    assert after.get("unrecorded") == 1, "status.toolCalls must carry ledger record failures"
    metrics.tool_calls_seen("metrics-ns-b", before, after)
    metrics.tool_calls_seen("metrics-ns-b", after, after)  # a re-written status counts nothing twice
    got = {
        o: sample("agentrun_operator_tool_calls_total", namespace="metrics-ns-b", outcome=o)
        for o in metrics.TOOL_OUTCOMES
    }
    assert got == {"executed": 1, "replayed": 2, "failed": 0, "in_doubt": 1, "unrecorded": 1}


def test_kubernetes_api_errors_are_counted_by_verb_and_code_and_build_info_is_one() -> None:
    before = sample("agentrun_operator_kube_request_errors_total", verb="PATCH", code="409") or 0
    metrics.kube_request("PATCH", 409)
    metrics.kube_request("PATCH", 200)
    metrics.kube_request("GET", None)
    assert sample("agentrun_operator_kube_request_errors_total", verb="PATCH", code="409") == before + 1
    assert (sample("agentrun_operator_kube_request_errors_total", verb="GET", code="none") or 0) >= 1
    (info,) = [
        s
        for m in REGISTRY.collect()
        if m.name == "agentrun_build_info"
        for s in m.samples
        if s.labels["component"] == "operator"
    ]
    assert info.value == 1 and info.labels["version"] and info.labels["python"]
