"""``bench/results/reliability.json`` and ``bench/RELIABILITY.md`` from a campaign's summary.

The Markdown is generated whole from the figures and the texts below (``FAULTS``,
``FIGURE_TEXT``, ``FINDINGS``), so a rerun of ``make chaos`` rewrites it consistently;
edit the texts here, not the file.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from typing import Any

from agentrun.errors import NodeTimeoutError, RunnerInputError

from . import plan as p
from .verdict import LOSSES
from .world import ROOT

__all__ = ["JSON", "LOSS_FIGURES", "MARKDOWN", "ROOT", "write"]

JSON = ROOT / "bench" / "results" / "reliability.json"
MARKDOWN = ROOT / "bench" / "RELIABILITY.md"
LOSS_FIGURES = LOSSES

# kind -> (how the campaign does it, what agentrun must do)
FAULTS: dict[str, tuple[str, str]] = {
    p.KILL_IN_TOOL: (
        "SIGKILL to the runner's process group (kubelet) at a random moment inside a tool body: before or "
        "after the tool's side effect",
        "a crash: rescheduled with backoff, charged to `maxRestarts`; the new attempt resumes from the last "
        "checkpoint, recorded calls replay from the ledger, the cut call runs again (in-doubt policy `retry`, "
        "same idempotency key)",
    ),
    p.KILL_IN_CHECKPOINT_TXN: (
        "`AGENTRUN_FAULT_POINT=in_checkpoint_txn:<version>@1`: the runner SIGKILLs itself with the state row "
        "and messages of a seeded version inserted and the transaction not committed",
        "nothing of that version lands (rolled back); the next attempt writes the same version again",
    ),
    p.KILL_BEFORE_LEDGER_RECORD: (
        "`AGENTRUN_FAULT_POINT=after_tool:<tool>@1`: SIGKILL after a seeded tool returned, before its ledger record",
        "the documented window: the call runs again on resume (counted in `window_reexecutions`), the others replay",
    ),
    p.KILL_DURING_RESUME: (
        "the run pauses at `approve_refund`'s `interrupt()`, the campaign answers with `spec.resume`, then "
        "SIGKILLs the resuming attempt at a random moment (0 to 2 s after its runner started)",
        "the answer is not lost: the next attempt resumes the same interrupt with it",
    ),
    p.KILL_DURING_DRAIN: (
        "SIGTERM to the runner inside a tool, then SIGKILL a random 0 to 0.6 s into its drain (before it "
        "reaches its safe point, unless the drain is quicker: then no SIGKILL and the fault counts as missed)",
        "a crash, as above; a drain that finished exits 6 (a disruption). A bare SIGTERM that reaches a "
        "runner in its last moments, after its handler is gone, kills it (exit 143): without a pod "
        "deletion the operator rightly sees a crash, so the campaign counts it as one of its crashes",
    ),
    p.EVICTION: (
        "the Eviction API on the runner pod at a random moment (grace period: the pod's, 1 s or 2 s): "
        "DisruptionTarget condition, SIGTERM, SIGKILL after the grace period",
        "a disruption, never charged to `maxRestarts`; the next attempt starts once the pod is gone",
    ),
    p.NODE_LOSS: (
        "kubesim's `lose_node`: the runner SIGKILLed, the pod's phase Unknown (NodeLost), the kubelet silent",
        "after the lost-node timeout (2 s here) the pod is force-deleted and the run rescheduled, a disruption",
    ),
    p.OPERATOR_LEADER_KILL: (
        "SIGKILL to the operator replica holding the Lease (two replicas run; a third starts in its place, "
        "as a Deployment would)",
        "the other replica takes the Lease and carries on; runner pods never depend on the operator",
    ),
    p.POSTGRES_RESTART: (
        "the campaign's PostgreSQL stopped with `pg_ctl -m fast` (every session cut, open transactions "
        "rolled back) and started again 0.5 to 4 s later; every run in flight feels it",
        "runners ride it out (bounded retries, 60 s) or exit 8, a disruption; nothing charged, nothing lost",
    ),
    p.REDIS_RESTART: (
        "the campaign's redis-server shut down and started again on its port 0.5 to 4 s later",
        "the cache degrades to PostgreSQL; never a failed run",
    ),
    p.FROZEN_RUNNER: (
        "SIGSTOP to the runner and its node made unreachable (pod phase Unknown, the kubelet forgets the "
        "process: a partition); once a newer attempt committed a checkpoint (or the run ended) the frozen "
        "runner gets SIGCONT",
        "the successor owns the thread; every write of the thawed runner is refused (fencing) and it exits 7",
    ),
    p.MCP_SIBLING_TIMEOUT: (
        "a scenario: the first round's tools run on an MCP server (stdio, one session for all calls) with a "
        f"fourth call, `fraud_check`, that never answers; at its own {p.DEADLINE_SECONDS:g} s deadline "
        "`charge_card` is in flight on the same session (it waits for the cancellation before it answers). "
        "Counted as landed when a charge answered after the cancellation; other kinds may come on top",
        "only the call past its deadline is cancelled (`notifications/cancelled`): the charge answers, is "
        f"recorded and is charged once; `fraud_check` is the only tool error (`{NodeTimeoutError.TOOL}`)",
    ),
}

FIGURE_TEXT: dict[str, tuple[str, str]] = {
    "recorded_tools_reexecuted": (
        "0",
        "raw executions of a tool call that began after the call's result was in the ledger (ledger row "
        "`created_at` before the execution's start): the guarantee agentrun exists for",
    ),
    "window_reexecutions": (
        "reported",
        "extra executions of a call whose earlier execution was cut before its result was recorded: the "
        "documented window between a side effect and its record (DESIGN.md 2; a frozen runner that thaws "
        "mid-call is in it too). Every such re-run carried the same idempotency key",
    ),
    "steps_lost": (
        "0",
        "steps done again although their checkpoint had committed (the step of a later state version goes "
        "back), plus, for a trial that finished, steps it has fewer than its baseline",
    ),
    "stale_writes_accepted": (
        "0",
        "state, ledger or intent rows written by an attempt after a newer attempt of the run had written: "
        "what fencing must refuse",
    ),
    "runs_not_finished": (
        "0",
        "trials that did not end Succeeded (within 240 s, or stuck Interrupted after their answer)",
    ),
    "duplicate_pods": (
        "0",
        "two runner processes of one run alive at the same moment (sampled every 0.1 s), the frozen runner "
        "of a partition excepted: the operator replaces it on purpose and fencing covers it",
    ),
    "restarts_charged_for_infrastructure": (
        "0",
        "`status.restarts` beyond the runner crashes the campaign caused: a restart charged for an eviction, "
        "a lost node, a store or operator restart",
    ),
    "final_state_mismatches": (
        "0",
        "trials whose final messages, tool results (as the model saw them) or state version progression "
        "(node, step and status of every version) differ from their uninterrupted baseline's",
    ),
    "tool_errors": (
        "0",
        "tool calls of the trial that ended as an error for the model, except the MCP scenario's planned "
        "deadline (`fraud_check`): a sibling failed with a call that timed out, or a call whose outcome was "
        "unknown was reported as a failure, which a model would retry under a new idempotency key",
    ),
    "unrecorded_tool_calls": (
        "reported",
        "calls (of the trial or its baseline) whose result reached the model but whose ledger record failed "
        '("COMPLETED but could not be recorded", the write-failure policy): a replay of that step would run '
        "them again",
    ),
}

# Known causes of a figure that is not 0: a reason's marker -> what it is (written by a person, kept here).
FINDINGS: dict[str, str] = {
    "is Interrupted again after its answer": (
        "**An answer to an interrupt lost with the attempt it started** (the bug below, fixed in "
        "`decide/answers.py`): if this shows again, the fix does not cover the case."
    ),
}

# Bugs this campaign found, and their fixes (kept in RELIABILITY.md whatever the figures).
FIXED: tuple[str, ...] = (
    "**An answer to an interrupt was lost when the attempt it started died before its first checkpoint** "
    "(operator). `spec.resume` starts one attempt with the answer, kept in the store for that attempt "
    "only. When that runner was SIGKILLed, evicted or lost with its node before it checkpointed (the "
    "answer was then in no checkpoint), the next attempt (`decide/run.py`: the backoff and disruption "
    "paths) started without it and pruned the record; that runner found the thread still interrupted and "
    "exited 3, and the same `spec.resume` started nothing (its digest was already "
    "`status.resumeDigest`): the run waited for an answer it had been given. Nearly every "
    "`runner_sigkill_during_interrupt_resume` trial hit it (19 of 220 trials in the campaigns before the "
    "fix), because a runner takes longer to start than most of the 0 to 2 s delays. Fixed: the next "
    "attempt carries its predecessor's answer on while the thread waits on exactly the interrupts it "
    "answers, never on another one (`operator/agentrun_operator/decide/answers.py`, read in "
    "`io/reconcile.py` before the next attempt's inputs are written; `tests/unit/test_operator_answers.py`). "
    "Replay: `python -m bench.chaos replay 4`.",
    "**A ledger record sent while PostgreSQL shut down was dropped, not retried** (runner store). An idle "
    "pooled connection that had received the server's goodbye failed the next statement with asyncpg's "
    '`InternalClientError` ("cannot switch to state 12; another operation (2) is in progress"), which the '
    'store did not count as a lost connection: the record failed at once and the runner logged "COMPLETED '
    'but could not be recorded" (a replay of that step would have run the tool again). Seen in '
    "`unrecorded_tool_calls` of a baseline during another trial's PostgreSQL restart. Fixed: it is retried "
    "like any lost connection (`runner/agentrun/checkpoint/postgres.py`; "
    "`tests/postgres/test_postgres_outage.py`).",
    "**A runner hung at its exit, its run completed** (runner store, Redis). In the campaign at commit "
    "0c8ef1f, seed 4's third attempt wrote its final checkpoint and never exited: its Redis stop "
    "subscription kept reconnecting for minutes while Redis and PostgreSQL restarted around it, so "
    "`CachedStore.aclose` never returned and the run stayed Running. Likely cause, forced in a test: a "
    "cancellation landing as `get_message`'s own 1 s timeout expires can come out of Python 3.11's "
    "`asyncio.timeout` as a `TimeoutError`, which the loop took for a Redis failure and retried, and the "
    "close waited for the loop without a bound. Fixed: the loop ends at its next turn once its store "
    "closes, and the close waits 2 s at most (`runner/agentrun/checkpoint/redis_stops.py`; "
    "`tests/postgres/test_stop_notify.py`). Not reproduced by a replay (it needs the shared world's "
    "restarts at that moment).",
)


def _git() -> dict[str, Any]:
    def out(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": out("rev-parse", "HEAD"), "dirty_paths": len(out("status", "--porcelain").splitlines())}


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.platform(terse=True)}


def write(figures: dict[str, Any]) -> None:
    figures = dict(figures)
    figures["campaign"] = {
        **figures["campaign"],
        "finished_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": _git(),
        "machine": _machine(),
    }
    JSON.parent.mkdir(parents=True, exist_ok=True)
    JSON.write_text(json.dumps(figures, indent=1) + "\n")
    MARKDOWN.write_text(markdown(figures))


def _cause(detail: dict[str, Any]) -> str | None:
    """The known finding a trial's reasons point at, if any."""
    for marker in FINDINGS:
        if any(marker in why for why in detail["why"]):
            return marker
    return None


def _findings(figures: dict[str, Any]) -> list[str]:
    """Trials with a loss (or an unrecorded call), grouped by known cause, then the unexplained ones."""
    lines: list[str] = []
    watched = (*LOSS_FIGURES, "unrecorded_tool_calls")
    details = [d for d in figures["trials_with_nonzero_figures"] if any(d["figures"].get(f) for f in watched)]
    by_cause: dict[str | None, list[dict[str, Any]]] = {}
    for detail in details:
        by_cause.setdefault(_cause(detail), []).append(detail)
    for cause, group in sorted(by_cause.items(), key=lambda kv: kv[0] is None):
        counted = {f: sum(d["figures"].get(f, 0) for d in group) for f in watched}
        named = ", ".join(f"`{f}` {n}" for f, n in counted.items() if n)
        if cause is not None:
            seeds = ", ".join(str(d["seed"]) for d in group)
            lines += [f"### {len(group)} trials: {named}", "", FINDINGS[cause], "", f"Seeds: {seeds}.", ""]
            continue
        lines += [f"### {len(group)} trials without a known cause: {named}", ""]
        for d in group:
            kinds = ", ".join(f["kind"] for f in d["faults"] if f.get("hit")) or "no fault landed"
            reasons = [w for w in d["why"] if not w.startswith("window:")][:4]
            kept = f" Evidence: `{d['kept']}`." if d.get("kept") else ""
            lines.append(f"- seed {d['seed']} ({kinds}): {'; '.join(reasons)}.{kept}")
        lines.append("")
    if figures.get("harness_errors"):
        lines.append("### Trials the harness could not judge (counted in `runs_not_finished`)")
        lines.append("")
        lines += [f"- seed {e['seed']}: {e['error']}" for e in figures["harness_errors"]]
        lines.append("")
    return lines


def markdown(figures: dict[str, Any]) -> str:
    c = figures["campaign"]
    seeds = c["seeds"]
    out = [
        "# Reliability: what survives which fault",
        "",
        "Figures from `make chaos` (`python -m bench.chaos`): a seeded campaign of "
        f"**{figures['trials']} trials** (seeds {seeds[0]} to {seeds[1]}), each a support-agent run under one "
        "or more faults injected at a random moment, compared with an uninterrupted run of the same "
        "scenario (the seed's message; what a run ends with depends on nothing else, so the campaign runs "
        "each scenario's baseline once, beside the trials). "
        "Everything is real except the Kubernetes control plane and node: the operator (two replicas), the "
        "runner pods (`python -m agentrun.runner` processes, started by kubesim's kubelet stand-in), "
        "PostgreSQL and Redis (private servers of the campaign), the signals. "
        f"This run: {c['seconds']:.0f} s on {c['machine']['cpus']} CPUs, {c['concurrency']} trials in flight, "
        f"commit `{c['git']['commit'][:12]}`, finished {c['finished_at']}. "
        "The machine-readable figures: [`results/reliability.json`](results/reliability.json).",
        "",
        "## Figures",
        "",
        "| figure | value | must be | what it counts |",
        "|---|---:|---|---|",
    ]
    for figure, (must, text) in FIGURE_TEXT.items():
        out.append(f"| `{figure}` | {figures[figure]} | {must} | {text} |")
    out += [
        "",
        "## Faults",
        "",
        "Counted when the fault landed (a live process got the signal, a server was restarted); a fault whose "
        "moment never came (the run was already past it) is listed as missed and changes nothing. A "
        "world-wide fault (PostgreSQL, Redis, the operator leader) hits every run in flight, so runs feel "
        "more faults than their seeds name.",
        "",
        "| fault | injected | missed | how | what agentrun must do |",
        "|---|---:|---:|---|---|",
    ]
    for kind in p.KINDS:
        how, must = FAULTS[kind]
        out.append(
            f"| `{kind}` | {figures['faults_injected'][kind]} | {figures['faults_missed'][kind]} | {how} | {must} |"
        )
    out += [
        "",
        "A trial's tools (`bench/chaos/graph.py`) append one line per raw execution to a file, whatever the "
        "idempotency key: the provider tables of `examples/support_agent.py` deduplicate on the key and "
        "would hide a re-execution. Three tools run in parallel, then one more (`add_note`, or "
        "`approve_refund`, which interrupts for a human in about a third of the trials), then the answer.",
        "",
        "## What was not 0, and why",
        "",
    ]
    findings = _findings(figures)
    out += findings or ["Nothing: every loss figure is 0.", ""]
    out += ["## Found by this campaign, and fixed", ""]
    out += [f"- {text}" for text in FIXED]
    out.append("")
    window = figures.get("window_reexecutions_by_fault_in_trial") or {}
    if window:
        listed = ", ".join(f"{k} {v}" for k, v in window.items())
        out += [
            f"`window_reexecutions` by the faults of the trials they happened in (a trial with two faults "
            f"counts under both): {listed}. Each is a call cut "
            "between its side effect and its ledger record, run again with the same idempotency key "
            "(a provider that deduplicates on it, as `examples/support_agent.py` does, charges once).",
            "",
        ]
    exits = figures.get("frozen_runner_exit_codes") or {}
    if exits:
        listed = ", ".join(f"exit {code}: {n}" for code, n in exits.items())
        out += [
            f"Frozen runners, once thawed after their successor took over: {listed}. 7 is FENCED: the thawed "
            "runner's next write was refused and it stopped. 5 is a runner frozen before it had read its "
            "inputs: writing the successor's inputs pruned the older attempts' (`put_run_inputs`), so it "
            f"stops with `{RunnerInputError.code}` having written nothing (harmless, but its message blames a deleted "
            "thread or a bug, and FENCED would say what happened). 0 and 3 are runners frozen after they "
            "registered that, thawed, read the thread completed or waiting for an answer and had nothing to "
            "write. None is a runner still running 30 s after its thaw, then SIGKILLed by the campaign. "
            "`stale_writes_accepted` above is what matters: no thawed runner wrote anything.",
            "",
        ]
    replaced = c.get("operator_replicas_replaced") or []
    killed = sum(1 for r in replaced if r.endswith("exited -9"))
    out += [
        f"Operator replicas replaced during the campaign: {len(replaced)}: {killed} SIGKILLed leaders and "
        f"{len(replaced) - killed} replicas that ended by themselves (a replica that cannot renew the Lease "
        "within its 5 s, on a loaded machine, steps down and exits by design; its Deployment starts another).",
        "",
        "## Replaying a trial",
        "",
        "A seed fixes the trial's scenario and faults (kinds, anchors, delays, outage lengths); what a delay "
        "lands on depends on the machine's timing. `python -m bench.chaos replay SEED [SEED ...]` runs the "
        "trials alone in a fresh world and prints their figures and reasons. A trial with a loss keeps its "
        "evidence (store rows, raw executions, status, pod and operator logs) under "
        "`bench/results/chaos/<seed>/`.",
        "",
        "## Limits",
        "",
        "- One emulated node and API server (kubesim), not a real cluster; pods are processes on one machine.",
        "- Server restarts are clean (`pg_ctl -m fast`, Redis shutdown), not power cuts; `fsync` is off.",
        "- The model is scripted (deterministic), so final states can be compared exactly.",
        "- Lease 5 s, lost-node timeout 2 s, backoff 1 s, `maxRestarts` 10: shorter than production defaults, "
        "so a campaign fits in minutes; the rules exercised are the same.",
        "",
    ]
    return "\n".join(out)
