"""The agentrun Grafana dashboard as code: ``make dashboard`` writes helm/agentrun/dashboards/agentrun.json.

Built with grafana-foundation-sdk (Grafana's own builder library). The chart
ships the JSON in a ConfigMap labelled ``grafana_dashboard: "1"``
(templates/dashboard.yaml, value ``metrics.dashboard.enabled``); tests/chart
fails when the committed JSON is not what this script writes, and
tests/cluster/test_metrics_prometheus.py runs every panel's query against a
real Prometheus that scraped a real operator.

Where each number comes from:

- ``agentrun_operator_*``: the operator, which outlives every run and counts
  each run's facts from the store's progress (aggregated by namespace; no run
  names or thread ids as labels). These survive runner pods that end before
  a scrape.
- ``agentrun_*`` without ``operator``: runner pods' own ``/metrics`` (the
  chart's PodMonitor, which adds the ``namespace`` label): facts only the
  runner process sees -- checkpoint write latency, stale-state conflicts,
  fenced writes, Redis degradation, and the live pods' side of ledger record
  failures and model tokens and latency (the operator counts those from the
  checkpoint as well). A short run may end before its scrape; their
  counters are lower bounds. Queries of counters that are created on first use end in
  ``or vector(0)``, so a quiet cluster shows 0, not "No data".

Templated by ``datasource`` (any Prometheus) and ``namespace`` (multi, All).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

from agentrun.errors import NodeTimeoutError, StaleStateError

OUT = Path(__file__).resolve().parents[1] / "helm" / "agentrun" / "dashboards" / "agentrun.json"
UID = "agentrun-overview"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
NS = 'namespace=~"$namespace"'
WINDOW = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"


def quantiles(metric: str, by: str, selector: str = NS) -> tuple[Query, ...]:
    inner = f"sum by (le{', ' + by if by else ''}) (rate({metric}_bucket{{{selector}}}[{WINDOW}]))"
    suffix = f" {{{{{by}}}}}" if by else ""
    return (
        Query(f"histogram_quantile(0.5, {inner})", "p50" + suffix),
        Query(f"histogram_quantile(0.99, {inner})", "p99" + suffix),
    )


def increase(metric: str, by: str, selector: str = NS, *, zero: bool = False) -> str:
    expr = (
        f"sum by ({by}) (increase({metric}{{{selector}}}[{WINDOW}]))"
        if by
        else (f"sum(increase({metric}{{{selector}}}[{WINDOW}]))")
    )
    return f"{expr} or vector(0)" if zero else expr


PANELS: tuple[Panel, ...] = (
    Panel(
        "Runs by phase",
        "AgentRuns the leader knows, by phase (agentrun_operator_runs)",
        "short",
        (Query(f"sum by (phase) (agentrun_operator_runs{{{NS}}})", "{{phase}}"),),
    ),
    Panel(
        "Run duration by final phase",
        "startTime to Succeeded/Failed/Stopped (operator histogram)",
        "s",
        quantiles("agentrun_operator_run_duration_seconds", "phase"),
    ),
    Panel(
        "Reschedules by reason",
        "Attempts started after a crash (BackOff), a disruption (eviction, preemption, lost node), a retry or resume",
        "short",
        (Query(increase("agentrun_operator_reschedules_total", "reason"), "{{reason}}"),),
    ),
    Panel(
        "Stop latency",
        "spec.stop seen to phase Stopped (all namespaces)",
        "s",
        quantiles("agentrun_operator_stop_latency_seconds", "", selector=""),
    ),
    Panel(
        "Pod start latency",
        "Pod created to the run reported Running (all namespaces)",
        "s",
        quantiles("agentrun_operator_pod_start_latency_seconds", "", selector=""),
    ),
    Panel(
        "Checkpoint write p50/p99",
        "One durable checkpoint write, by backend (runner pods, PodMonitor)",
        "s",
        quantiles("agentrun_checkpoint_write_seconds", "backend"),
    ),
    Panel(
        "Ledger replays vs executions",
        "Tool calls run vs answered from the ledger after a crash or resume (operator, from the store)",
        "short",
        (
            Query(
                increase("agentrun_operator_tool_calls_total", "outcome", f'{NS}, outcome=~"executed|replayed"'),
                "{{outcome}}",
            ),
        ),
    ),
    Panel(
        "Ledger record failures",
        "Tool calls that COMPLETED but could not be recorded: a replay would run them again "
        "(operator, from the checkpointed counts; and the live runner pods' own counter)",
        "short",
        (
            Query(increase("agentrun_operator_tool_calls_total", "", f'{NS}, outcome="unrecorded"'), "unrecorded"),
            Query(increase("agentrun_ledger_record_failures_total", "", zero=True), "runner pods"),
        ),
    ),
    Panel(
        "In-doubt calls",
        "Side-effect calls found started but unrecorded on replay (operator, from the store)",
        "short",
        (Query(increase("agentrun_operator_tool_calls_total", "", f'{NS}, outcome="in_doubt"'), "in doubt"),),
    ),
    Panel(
        "Tool errors and timeouts",
        f"Failed tool calls by tool (operator) and tool timeouts {NodeTimeoutError.TOOL} (runner pods)",
        "short",
        (
            Query(increase("agentrun_operator_tool_calls_failed_total", "tool", ""), "failed {{tool}}"),
            Query(increase("agentrun_tool_timeouts_total", "tool", zero=True), "timeout {{tool}}"),
        ),
    ),
    Panel(
        "Stale-state conflicts and fenced writes",
        f"{StaleStateError.code} and writes of an older attempt rejected by fencing (runner pods)",
        "short",
        (
            Query(increase("agentrun_stale_state_conflicts_total", "", zero=True), "stale-state conflicts"),
            Query(increase("agentrun_fenced_writes_total", "", zero=True), "fenced writes"),
        ),
    ),
    Panel(
        "Redis degradation",
        "Hot cache failures (the store continued on PostgreSQL) and cache availability (runner pods)",
        "short",
        (
            Query(increase("agentrun_cache_errors_total", "op", zero=True), "errors {{op}}"),
            Query(f"min(agentrun_cache_available{{{NS}}}) or vector(1)", "available"),
        ),
    ),
    Panel(
        "Model tokens",
        "Tokens models reported (usage), by model and kind: the operator's count from the checkpointed usage "
        "(survives short pods), and the live runner pods' own counter",
        "short",
        (
            Query(increase("agentrun_operator_model_tokens_total", "model, kind", zero=True), "{{model}} {{kind}}"),
            Query(increase("agentrun_model_tokens_total", "model, kind", zero=True), "{{model}} {{kind}} (live pods)"),
        ),
    ),
    Panel(
        "Model latency",
        "Mean wall time of a model request by model and status (operator, from the checkpointed usage); "
        "p50/p99 of one HTTP attempt in the live runner pods",
        "s",
        (
            Query(
                f"sum by (model, status) (rate(agentrun_operator_model_request_seconds_total{{{NS}}}[{WINDOW}])) / "
                f"sum by (model, status) (rate(agentrun_operator_model_requests_total{{{NS}}}[{WINDOW}]))",
                "mean {{model}} {{status}}",
            ),
            *(Query(q.expr, q.legend + " (live pods)") for q in quantiles("agentrun_model_request_seconds", "")),
        ),
    ),
    Panel(
        "Model requests by status",
        "Model requests by model and status, ok or error (operator, from the checkpointed usage); "
        "model calls that failed after retries, by code (live runner pods)",
        "short",
        (
            Query(
                increase("agentrun_operator_model_requests_total", "model, status", zero=True), "{{model}} {{status}}"
            ),
            Query(increase("agentrun_model_errors_total", "code", zero=True), "errors {{code}} (live pods)"),
        ),
    ),
    Panel(
        "Operator leader",
        "1 on the replica holding the Lease; exactly one should",
        "short",
        (Query("sum(agentrun_operator_leader)", "leaders"),),
        kind="stat",
    ),
    Panel(
        "Reconcile errors and API errors",
        "Reconciles that raised, by exception; Kubernetes API requests that failed, by verb and code",
        "short",
        (
            Query(increase("agentrun_operator_reconcile_errors_total", "kind", "", zero=True), "reconcile {{kind}}"),
            Query(increase("agentrun_operator_kube_request_errors_total", "verb, code", ""), "api {{verb}} {{code}}"),
        ),
    ),
    Panel(
        "Kubernetes API requests",
        "Requests of the operator's own client, by verb and code",
        "reqps",
        (Query(f"sum by (verb, code) (rate(agentrun_operator_kube_requests_total[{WINDOW}]))", "{{verb}} {{code}}"),),
    ),
)


def _panel(spec: Panel) -> timeseries.Panel | stat.Panel:
    built: timeseries.Panel | stat.Panel = timeseries.Panel() if spec.kind == "timeseries" else stat.Panel()
    built.title(spec.title).description(spec.description).unit(spec.unit).datasource(DATASOURCE).height(8).span(8)
    for i, query in enumerate(spec.queries):
        built.with_target(prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(chr(ord("A") + i)))
    return built


def build() -> str:
    """The dashboard JSON, deterministic (sorted keys), ending in a newline."""
    board = (
        db.Dashboard("agentrun")
        .uid(UID)
        .description("Durable agent runs: phases, reschedules, ledger replays, latencies, store and model health")
        .tags(["agentrun", "kubernetes"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            db.QueryVariable("namespace")
            .label("Namespace")
            .datasource(DATASOURCE)
            .query("label_values(agentrun_operator_runs, namespace)")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    for spec in PANELS:
        board.with_panel(_panel(spec))
    return json.dumps(json.loads(JSONEncoder().encode(board.build())), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = build()
    if argv[1:] == ["--check"]:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is stale: run make dashboard", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
