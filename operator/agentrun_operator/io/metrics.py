"""Operator metrics (``/metrics`` on the operator's port), all prefixed ``agentrun_operator_``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from agentrun.metrics import build_info

from ..decide.growth import MODEL_STATUSES, TOOL_OUTCOMES, ModelGrowth, model_usage_growth, tool_call_growth
from ..decide.reasons import DisruptionReason, Phase, Reason, RescheduleReason

RUNS = Gauge(
    "agentrun_operator_runs", "AgentRuns known to this operator, by phase and namespace", ["phase", "namespace"]
)
RESCHEDULES = Counter(
    "agentrun_operator_reschedules_total",
    "Attempts started after a disruption, a crash (BackOff), a retry or a resume, by reason and namespace",
    ["reason", "namespace"],
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
# How far a new leader got with its first pass over every run (after a restart or a failover, it knows no run
# until its watch lists them): the runs reconciled at least once by this process. Compare with
# ``agentrun_operator_runs`` or ``kubectl get ar -A --no-headers | wc -l`` to tell when it has caught up.
RUNS_RECONCILED = Gauge(
    "agentrun_operator_runs_reconciled",
    "AgentRuns this process has reconciled at least once since it started (deleted runs leave the count)",
)

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


# --- Issue 9: per-run facts aggregated so they survive short runner pods -------------------------------------
# A runner pod often ends before Prometheus scrapes it; the operator outlives every run and already reads each
# run's progress from the store, so the facts users alert on are counted here. Labels are bounded: namespace
# (the cluster's), phase/outcome/reason (fixed sets, plus the cluster's disruption reasons), model (from graph
# code, at most MODEL_LABELS_MAX, then "other") -- never run names, thread ids or pod names. Facts only the
# runner process sees (stale-state conflicts, fenced writes, checkpoint write latency, Redis degradation) stay
# in the runner's own ``agentrun_*`` metrics, scraped by the chart's PodMonitor
# (``monitoring.podMonitor.enabled``); ledger record failures and model usage travel in the checkpoint too.

RUN_DURATION = Histogram(
    "agentrun_operator_run_duration_seconds",
    "From an AgentRun's startTime to its final phase (Succeeded, Failed, Stopped), by namespace and final phase",
    ["namespace", "phase"],
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
)
TOOL_CALLS = Counter(
    "agentrun_operator_tool_calls_total",
    "Tool calls of AgentRuns as the runners checkpointed them, by namespace and outcome "
    "(executed, replayed from the ledger, failed, in_doubt: started but unrecorded when replayed, "
    "unrecorded: completed but the ledger record failed)",
    ["namespace", "outcome"],
)
KUBE_REQUESTS = Counter(
    "agentrun_operator_kube_requests_total",
    "Kubernetes API requests the operator made (its own client; kopf's watches are not counted), by verb and code",
    ["verb", "code"],
)
KUBE_ERRORS = Counter(
    "agentrun_operator_kube_request_errors_total",
    "Kubernetes API requests that failed (HTTP >= 400, or no answer: code 'none'), by verb and code",
    ["verb", "code"],
)
MODEL_TOKENS = Counter(
    "agentrun_operator_model_tokens_total",
    "Tokens models reported (usage) in AgentRuns, as the runners checkpointed them, by namespace, model and kind "
    "(prompt, completion)",
    ["namespace", "model", "kind"],
)
MODEL_REQUESTS = Counter(
    "agentrun_operator_model_requests_total",
    "Model requests of AgentRuns (an HTTP attempt of the OpenAI-compatible adapter, a call of a LangChain model), "
    "by namespace, model and status (ok: a usable completion; error: anything else)",
    ["namespace", "model", "status"],
)
MODEL_SECONDS = Counter(
    "agentrun_operator_model_request_seconds_total",
    "Summed wall time of those model requests, by namespace, model and status; divided by "
    "agentrun_operator_model_requests_total it is the mean latency",
    ["namespace", "model", "status"],
)
MODEL_KINDS = ("prompt", "completion")
MODEL_LABELS_MAX = 50
OTHER_MODEL = "other"
_model_labels: set[str] = set()
_model_series: set[tuple[str, str]] = set()
LOOP_LAG = Gauge(
    "agentrun_operator_event_loop_lag_seconds", "How late the liveness heartbeat's last tick ran (loop responsiveness)"
)

# Reschedule reasons the operator itself coins (decide/run.py); the cluster's disruption reasons join as seen.
RESCHEDULE_REASONS = (
    Reason.BACK_OFF.value,
    *(r.value for r in RescheduleReason),
    *(r.value for r in DisruptionReason),
    "EvictionByEvictionAPI",  # the cluster's, the commonest
)
FINAL_PHASES = tuple(p.value for p in (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED))
_namespaces: set[str] = set()


def namespace_seen(namespace: str, phases: tuple[str, ...]) -> None:
    """Create every labelled series of ``namespace`` at 0 the first time a run there is reconciled."""
    if namespace in _namespaces:
        return
    _namespaces.add(namespace)
    for phase in phases:
        RUNS.labels(phase=phase, namespace=namespace)
    for reason in RESCHEDULE_REASONS:
        RESCHEDULES.labels(reason=reason, namespace=namespace)
    for outcome in TOOL_OUTCOMES:
        TOOL_CALLS.labels(namespace=namespace, outcome=outcome)
    for phase in FINAL_PHASES:
        RUN_DURATION.labels(namespace=namespace, phase=phase)


def tool_calls_seen(namespace: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Count the growth of a run's ``status.toolCalls`` (camelCase keys) once it is written (``decide.growth``)."""
    count_tool_calls(namespace, tool_call_growth(before, after))


def count_tool_calls(namespace: str, grown: Mapping[str, int]) -> None:
    """Add ``grown`` (outcome -> calls, ``decide.growth.tool_call_growth``) to the namespace's tool call series."""
    for outcome, count in grown.items():
        TOOL_CALLS.labels(namespace=namespace, outcome=outcome).inc(count)


def _model_label(model: str) -> str:
    """``model`` itself for the first MODEL_LABELS_MAX names seen, then ``other`` (bounded cardinality)."""
    if model not in _model_labels:
        if len(_model_labels) >= MODEL_LABELS_MAX:
            return OTHER_MODEL
        _model_labels.add(model)
    return model


def model_usage_seen(namespace: str, before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> None:
    """Count the growth of a run's ``status.modelUsage`` once it is written (``decide.growth``: the baseline rule)."""
    count_model_usage(namespace, model_usage_growth(before, after))


def count_model_usage(namespace: str, grown: Sequence[ModelGrowth]) -> None:
    """Add ``grown`` (``decide.growth.model_usage_growth``) to the model series, under a bounded model label.

    A model's series are created at 0 the first time it is seen in a namespace, so panels show 0, not "no data".
    """
    for growth in grown:
        model = _model_label(growth.model)
        if (namespace, model) not in _model_series:
            _model_series.add((namespace, model))
            for kind in MODEL_KINDS:
                MODEL_TOKENS.labels(namespace=namespace, model=model, kind=kind)
            for status in MODEL_STATUSES:
                MODEL_REQUESTS.labels(namespace=namespace, model=model, status=status)
                MODEL_SECONDS.labels(namespace=namespace, model=model, status=status)
        for kind, tokens in growth.tokens.items():
            if tokens > 0:
                MODEL_TOKENS.labels(namespace=namespace, model=model, kind=kind).inc(tokens)
        for status, requests in growth.requests.items():
            if requests > 0:
                MODEL_REQUESTS.labels(namespace=namespace, model=model, status=status).inc(requests)
        for status, seconds in growth.seconds.items():
            if seconds > 0:
                MODEL_SECONDS.labels(namespace=namespace, model=model, status=status).inc(seconds)


def kube_request(verb: str, code: int | None) -> None:
    """Count one API request by verb and status code (``none``: no answer), and an error when it failed."""
    label = str(code) if code is not None else "none"
    KUBE_REQUESTS.labels(verb=verb, code=label).inc()
    if code is None or code >= 400:
        KUBE_ERRORS.labels(verb=verb, code=label).inc()


build_info("operator")  # agentrun_build_info{component="operator"}: the runner sets component="runner"
for _verb in ("GET", "POST", "PATCH", "PUT", "DELETE"):
    KUBE_REQUESTS.labels(verb=_verb, code="200")
    KUBE_ERRORS.labels(verb=_verb, code="none")
