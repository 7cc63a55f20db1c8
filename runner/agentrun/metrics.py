"""Prometheus metrics of the runtime; every name starts with ``agentrun_``.

Registered on the default registry, which the runner pod serves on its
``/metrics`` port. Labels are bounded sets (node and tool names come from
the graph's code, never from user input).

``agentrun_build_info`` is shared with the operator (one name, one home):
each process sets its own ``component`` once, at start (``build_info``), so
a process that merely imports this module exports no build info of its own.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import Counter, Gauge, Histogram

from .errors import NodeTimeoutError, StaleStateError

BUILD_INFO = Gauge(
    "agentrun_build_info",
    "Always 1: the agentrun version and Python of this process, by component (operator, runner)",
    ["version", "python", "component"],
)


def build_info(component: str) -> None:
    """Export ``agentrun_build_info{component=...}`` = 1 for this process (the operator and the runner call it)."""
    try:
        ours = version("agentrun")
    except PackageNotFoundError:  # run from a source tree that was never installed
        ours = "unknown"
    BUILD_INFO.labels(version=ours, python=platform.python_version(), component=component).set(1)


NODE_TIMEOUTS = Counter(
    "agentrun_node_timeouts_total", f"Nodes that exceeded node_timeout ({NodeTimeoutError.NODE})", ["node"]
)
TOOL_TIMEOUTS = Counter(
    "agentrun_tool_timeouts_total", f"Tool calls that exceeded tool_timeout ({NodeTimeoutError.TOOL})", ["tool"]
)
TOOL_ERRORS = Counter("agentrun_tool_errors_total", "Tool calls that ended in a tool error message", ["tool", "reason"])
TOOL_CALLS = Counter(
    "agentrun_tool_calls_total", "Tool calls by outcome (executed, replayed from the ledger)", ["tool", "outcome"]
)
LEDGER_HITS = Counter("agentrun_ledger_hits_total", "Tool calls answered from the ledger", ["tool"])
LEDGER_RECORD_FAILURES = Counter(
    "agentrun_ledger_record_failures_total", "Completed tool calls whose result could not be recorded", ["tool"]
)
LEDGER_READ_FAILURES = Counter(
    "agentrun_ledger_read_failures_total", "Ledger lookups that failed or found a malformed entry", ["reason"]
)
IN_DOUBT = Counter(
    "agentrun_tool_in_doubt_total", "Side-effect calls found started but unrecorded on replay", ["tool", "policy"]
)
STALE_STATE = Counter(
    "agentrun_stale_state_conflicts_total",
    f"Checkpoint writes rejected by optimistic concurrency ({StaleStateError.code})",
)
FENCED = Counter("agentrun_fenced_writes_total", "Writes rejected because a newer attempt owns the thread")
STOPS = Counter("agentrun_stops_total", "Runs ended by a stop request")
INTERRUPTS = Counter("agentrun_interrupts_total", "Runs paused by interrupt()")
STEP_SECONDS = Histogram(
    "agentrun_step_duration_seconds",
    "Wall time of one node execution",
    ["node"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
)
CHECKPOINT_SECONDS = Histogram(
    "agentrun_checkpoint_write_seconds",
    "Wall time of one durable checkpoint write",
    ["backend"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
MODEL_REQUEST_SECONDS = Histogram(
    "agentrun_model_request_seconds",
    "Wall time of one HTTP attempt to a model endpoint (each retry is observed on its own)",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
MODEL_ERRORS = Counter(
    "agentrun_model_errors_total", "Model calls that ended in a ModelError (after retries), by code", ["code"]
)
MODEL_TOKENS = Counter(
    "agentrun_model_tokens_total",
    "Tokens a model reported using, by model (as configured in the graph's code) and kind (prompt, completion)",
    ["model", "kind"],
)
CACHE_ERRORS = Counter(
    "agentrun_cache_errors_total",
    "Redis hot cache operations that failed (Redis unreachable or erroring); the store continued on PostgreSQL",
    ["op"],
)
CACHE_AVAILABLE = Gauge(
    "agentrun_cache_available", "1 while the Redis hot cache answers, 0 after a failure until it answers again"
)
CACHE_READS = Counter(
    "agentrun_cache_reads_total",
    "Checkpoint reads through the Redis hot cache by result (hit, miss, stale: older than PostgreSQL, malformed)",
    ["result"],
)
