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
