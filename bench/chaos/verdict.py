"""A trial's figures from its evidence (pure: no I/O, no clock).

Definitions, one per figure (``bench/RELIABILITY.md`` says them for users):

- ``recorded_tools_reexecuted``: raw executions of a tool call that began after the
  call's result was in the ledger (the ledger row's ``created_at`` is before the
  execution's ``begin``). The guarantee says 0.
- ``window_reexecutions``: the other extra executions of a call: it ran again because
  its earlier execution was cut before its result was recorded (the documented window
  between a side effect and its record; a frozen runner that thaws mid-call is in it
  too). Reported, not a failure.
- ``steps_lost``: steps a resumed run did again although their checkpoint had
  committed (the step counter of a later state row goes back), plus, for a finished
  trial, steps it has fewer than its baseline.
- ``stale_writes_accepted``: rows (state, ledger, intent) written by an attempt after a
  newer attempt of the run had already written: fencing should have refused them.
- ``run_not_finished``: the trial did not end Succeeded.
- ``duplicate_pods``: two runner processes of the run alive at once (a partitioned,
  frozen runner excluded: the operator replaces it on purpose, fencing covers it).
- ``restarts_charged_for_infrastructure``: ``status.restarts`` beyond the runner crashes
  the campaign caused (a SIGKILL of a runner is a crash and is charged, and so is a runner
  killed by the campaign's bare SIGTERM as it was exiting; an eviction, a lost node, a
  store or operator restart never are).
- ``final_state_mismatch``: the trial's final messages, tool results or state version
  progression (node, step, status of each version) differ from its uninterrupted
  baseline's.
- ``tool_errors``: tool calls of the trial that ended as an error for the model, except
  the one its scenario sends past its deadline (the MCP scenario's ``fraud_check``,
  ``NODE_TIMEOUT_002``). No tool of the campaign fails by itself, so any other error is a
  fault turned into a failure: a sibling call failed with the call that timed out, or a
  call whose outcome was unknown was reported as failed (the model would call it again
  under a new idempotency key).
- ``unrecorded_tool_calls`` (reported, not a loss): calls of the trial or its baseline
  whose result reached the model but not the ledger (the runner's write-failure policy:
  "COMPLETED but could not be recorded"); a replay of that step would run them again.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, TypedDict

from agentrun.errors import NodeTimeoutError
from agentrun.ledger import idempotency_key

from .evidence import Evidence, ThreadRows
from .plan import DEADLINE_TOOL, RUNNER_CRASHES

FIGURES = (
    "recorded_tools_reexecuted",
    "window_reexecutions",
    "steps_lost",
    "stale_writes_accepted",
    "runs_not_finished",
    "duplicate_pods",
    "restarts_charged_for_infrastructure",
    "final_state_mismatches",
    "tool_errors",
    "unrecorded_tool_calls",
)
# The figures that must be 0. Reported, not losses: window_reexecutions (the documented window), and
# unrecorded_tool_calls (a result the ledger could not record: the documented write-failure policy,
# a re-execution only if a replay of that step follows; counted over the trial AND its baseline).
LOSSES = tuple(f for f in FIGURES if f not in ("window_reexecutions", "unrecorded_tool_calls"))


class Verdict(TypedDict):
    figures: dict[str, int]
    why: list[str]


def _message(body: dict[str, Any]) -> tuple[Any, ...]:
    calls = tuple((c.get("id"), c.get("name"), c.get("arguments")) for c in body.get("tool_calls") or [])
    fields = ("role", "content", "name", "tool_call_id", "is_error")
    return (*(body.get(f) for f in fields), calls)


def progression(rows: ThreadRows) -> list[tuple[str, int, str]]:
    return [(s["current_node"], s["step"], s["status"]) for s in rows["states"]]


def _results(rows: ThreadRows) -> list[tuple[Any, ...]]:
    """The tool results the model saw, in order: (tool, call id, content, is_error)."""
    return [
        (m.get("name"), m.get("tool_call_id"), m.get("content"), m.get("is_error"))
        for m in rows["messages"]
        if m.get("role") == "tool"
    ]


def unrecorded(rows: ThreadRows) -> list[str]:
    """Tool calls the model got a result for that have no ledger row (the record failed: a replay would rerun them)."""
    recorded = {r["tool_call_id"] for r in rows["ledger"]}
    answered = {m.get("tool_call_id") for m in rows["messages"] if m.get("role") == "tool" and not m.get("is_error")}
    missing = []
    for message in rows["messages"]:
        for call in message.get("tool_calls") or []:
            key = f"{message.get('id')}:{call.get('id')}"
            if call.get("id") in answered and key not in recorded:
                missing.append(f"{call.get('name')} ({key})")
    return missing


def tool_errors(rows: ThreadRows) -> list[str]:
    """The tool calls that ended as errors, but for the planned deadline of the MCP scenario."""
    errors = []
    for m in rows["messages"]:
        if m.get("role") != "tool" or not m.get("is_error"):
            continue
        if m.get("name") == DEADLINE_TOOL and NodeTimeoutError.TOOL in str(m.get("content")):
            continue
        errors.append(f"{m.get('name')} ({m.get('tool_call_id')}): {str(m.get('content'))[:160]}")
    return errors


def reexecutions(evidence: Evidence) -> tuple[int, int, list[str]]:
    """(recorded re-executions, window re-executions, why) from the raw executions and the ledger."""
    thread = evidence["trial"]["thread_id"]
    recorded_at = {idempotency_key(thread, r["tool_call_id"]): r for r in evidence["trial"]["ledger"]}
    by_call: dict[str, list[dict[str, Any]]] = {}
    for line in evidence["effects"]:
        if line.get("kind") == "effect":
            by_call.setdefault(str(line["idem"]), []).append(line)
    recorded = window = 0
    why = []
    for idem, runs in by_call.items():
        record = recorded_at.get(idem)
        late = [r for r in runs if record is not None and r["begin"] > record["at"]]
        for run in late:
            why.append(
                f"{run['tool']} ({idem}) began at {run['begin']:.3f} in attempt {run['attempt']}, after its ledger "
                f"record at {record['at']:.3f} (attempt {record['attempt']})"  # type: ignore[index]
            )
        recorded += len(late)
        extra = max(0, len(runs) - 1 - len(late))
        if extra:
            attempts = ", ".join(str(r["attempt"]) for r in runs)
            why.append(f"window: {runs[0]['tool']} ran {len(runs)} times (attempts {attempts}) before its record")
        window += extra
    return recorded, window, why


def steps_lost(trial: ThreadRows, baseline: ThreadRows, *, finished: bool) -> tuple[int, list[str]]:
    lost, why = 0, []
    highest = -1
    previous: tuple[str, int] | None = None
    for row in trial["states"]:
        here = (row["current_node"], row["step"])
        if here == previous:  # a status change at the same step (interrupted, resumed)
            continue
        if row["step"] <= highest:
            lost += highest - row["step"] + 1
            why.append(f"version {row['version']} went back to step {row['step']} after step {highest} had committed")
        highest = max(highest, row["step"])
        previous = here
    final_trial = max((s["step"] for s in trial["states"]), default=0)
    final_base = max((s["step"] for s in baseline["states"]), default=0)
    if finished and final_trial < final_base:  # an unfinished run is counted in runs_not_finished
        lost += final_base - final_trial
        why.append(f"the trial's last step is {final_trial}, its baseline's {final_base}")
    return lost, why


def stale_writes(trial: ThreadRows) -> tuple[int, list[str]]:
    rows: list[tuple[str, int, float]] = [("state", s["attempt"], s["at"]) for s in trial["states"] if s["attempt"]]
    rows += [("ledger", r["attempt"], r["at"]) for r in trial["ledger"] if r["attempt"]]
    rows += [("intent", r["attempt"], r["at"]) for r in trial["intents"] if r["attempt"]]
    first_by_attempt: dict[int, float] = {}
    for _, attempt, at in rows:
        first_by_attempt[attempt] = min(at, first_by_attempt.get(attempt, at))
    stale, why = 0, []
    for table, attempt, at in rows:
        newer = [a for a, first in first_by_attempt.items() if a > attempt and first < at]
        if newer:
            stale += 1
            why.append(f"a {table} row of attempt {attempt} at {at:.3f}, after attempt {min(newer)} had written")
    return stale, why


def judge(evidence: Evidence) -> Verdict:
    why: list[str] = []
    trial, baseline = evidence["trial"], evidence["baseline"]
    recorded, window, reasons = reexecutions(evidence)
    why += reasons
    phase = evidence["trial_status"].get("phase")
    not_finished = int(phase != "Succeeded")
    lost, reasons = steps_lost(trial, baseline, finished=not not_finished)
    why += reasons
    stale, reasons = stale_writes(trial)
    why += reasons
    why += evidence["errors"]
    if not_finished:
        why.append(
            f"the trial ended {phase} ({evidence['trial_status'].get('reason')}: "
            f"{evidence['trial_status'].get('message')})"
        )
    crashes = sum(1 for f in evidence["injected"] if (f["kind"] in RUNNER_CRASHES and f["hit"]) or f.get("crashed"))
    restarts = int(evidence["trial_status"].get("restarts") or 0)
    charged = max(0, restarts - crashes)
    if charged:
        why.append(f"status.restarts is {restarts}, the campaign crashed the runner {crashes} times")
    mismatch = 0
    if evidence["baseline_status"].get("phase") != "Succeeded":
        why.append(f"the baseline ended {evidence['baseline_status'].get('phase')}: nothing to compare with")
        mismatch = 1
    elif not not_finished:
        if [_message(m) for m in trial["messages"]] != [_message(m) for m in baseline["messages"]]:
            mismatch = 1
            why.append("final messages differ from the baseline's")
        if _results(trial) != _results(baseline):
            mismatch = 1
            why.append("tool results differ from the baseline's")
        if progression(trial) != progression(baseline):
            mismatch = 1
            why.append(f"state versions differ: trial {progression(trial)} baseline {progression(baseline)}")
    errors = tool_errors(trial)
    for error in errors:
        why.append(f"tool error: {error}")
    missing = unrecorded(trial) + unrecorded(baseline)
    for call in missing:
        why.append(f"unrecorded: {call} got a result but has no ledger row")
    duplicates = len(evidence["overlaps"])
    for pair in evidence["overlaps"]:
        why.append(f"pods {pair[0]} and {pair[1]} ran at the same time")
    figures = {
        "recorded_tools_reexecuted": recorded,
        "window_reexecutions": window,
        "steps_lost": lost,
        "stale_writes_accepted": stale,
        "runs_not_finished": not_finished,
        "duplicate_pods": duplicates,
        "restarts_charged_for_infrastructure": charged,
        "final_state_mismatches": mismatch,
        "tool_errors": len(errors),
        "unrecorded_tool_calls": len(missing),
    }
    return Verdict(figures=figures, why=why)


def failed(verdict: Verdict) -> bool:
    """A trial fails when any loss figure is not 0 (window re-executions alone do not fail it)."""
    return any(verdict["figures"][f] for f in LOSSES)


def totals(verdicts: list[Verdict]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for verdict in verdicts:
        total.update(verdict["figures"])
    return {f: total[f] for f in FIGURES}
