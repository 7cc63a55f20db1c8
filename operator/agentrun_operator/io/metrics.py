"""Operator metrics (``/metrics`` on the operator's port), all prefixed ``agentrun_operator_``."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RUNS = Gauge("agentrun_operator_runs", "AgentRuns known to this operator, by phase", ["phase"])
RESCHEDULES = Counter(
    "agentrun_operator_reschedules_total", "Attempts started after a disruption or a crash", ["reason"]
)
TRANSITIONS = Counter("agentrun_operator_phase_transitions_total", "Phase changes written to status", ["phase"])
RECONCILE_SECONDS = Histogram(
    "agentrun_operator_reconcile_duration_seconds",
    "One reconcile of one AgentRun",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RECONCILE_ERRORS = Counter("agentrun_operator_reconcile_errors_total", "Reconciles that raised", ["kind"])
STOP_LATENCY = Histogram(
    "agentrun_operator_stop_latency_seconds",
    "From spec.stop seen to phase Stopped",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120),
)
POD_START_LATENCY = Histogram(
    "agentrun_operator_pod_start_latency_seconds",
    "From pod creation to the run reported Running",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
LEADER = Gauge("agentrun_operator_leader", "1 while this replica holds the leader Lease")

# Failed tool calls by tool (issue 14). Tool names come from user graphs, so the label is bounded: the first
# TOOL_LABELS_MAX distinct names get their own series, later ones count as "other" (see ``tool_failed``).
TOOL_CALLS_FAILED = Counter(
    "agentrun_operator_tool_calls_failed_total",
    "Tool calls that failed (raised or timed out) in AgentRuns, by tool; at most 50 tool labels, then other",
    ["tool"],
)
TOOL_LABELS_MAX = 50
OTHER_TOOL, UNKNOWN_TOOL = "other", "unknown"
_tool_labels: set[str] = {OTHER_TOOL, UNKNOWN_TOOL}
for _label in _tool_labels:
    TOOL_CALLS_FAILED.labels(_label)  # series exist from the start, so panels and rate() show 0, not "no data"


def tool_failed(tool: str, count: int) -> None:
    """Count ``count`` failed calls of ``tool`` under a bounded set of label values."""
    tool = tool[:64] or UNKNOWN_TOOL
    if tool not in _tool_labels:
        if len(_tool_labels) >= TOOL_LABELS_MAX + 2:
            tool = OTHER_TOOL
        else:
            _tool_labels.add(tool)
    TOOL_CALLS_FAILED.labels(tool).inc(count)
