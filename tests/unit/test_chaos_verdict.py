"""The fault campaign's judge (``bench.chaos.verdict``) and plans, on made-up evidence: each loss it must see.

A detector that cannot fire proves nothing, so each figure is shown a trial that breaks it: a tool run
after its ledger record, a step done twice, an older attempt writing after a newer one, two live pods,
a restart charged for an eviction, a final message that differs. The figures the campaign reports come
from these functions (``bench/RELIABILITY.md``).
"""

from __future__ import annotations

import copy
from typing import Any

from agentrun.ledger import idempotency_key
from bench.chaos.evidence import Evidence, ThreadRows
from bench.chaos.plan import DEADLINE_TOOL, FAULT_POINTS, KILL_IN_TOOL, KINDS, MCP_SIBLING_TIMEOUT, SCENARIOS, plan
from bench.chaos.verdict import LOSSES, failed, judge

THREAD = "default/t1"


def _rows(thread: str) -> ThreadRows:
    steps = [("model", 0), ("tools", 1), ("model", 2), ("__end__", 3)]
    return ThreadRows(
        thread_id=thread,
        states=[
            {"version": v + 1, "current_node": n, "step": s, "status": "running", "attempt": 1, "at": 100.0 + v}
            for v, (n, s) in enumerate(steps)
        ],
        messages=[
            {"id": "m0", "role": "user", "content": "charge"},
            {"id": "m1", "role": "assistant", "content": "", "tool_calls": [{"id": "call_2", "name": "charge_card"}]},
            {"id": "m2", "role": "tool", "content": "ok", "name": "charge_card", "tool_call_id": "call_2"},
            {"id": "m3", "role": "assistant", "content": "Done."},
        ],
        ledger=[
            {"tool_call_id": "m1:call_2", "tool_name": "charge_card", "result_text": "ok", "attempt": 1, "at": 101.5}
        ],
        intents=[],
    )


def _evidence(**changes: Any) -> Evidence:
    idem = idempotency_key(THREAD, "m1:call_2")
    evidence = Evidence(
        seed=1,
        plan={},
        injected=[{"kind": KILL_IN_TOOL, "hit": True, "attempt": 1}],
        trial=_rows(THREAD),
        baseline=_rows("default/b-plain"),
        trial_status={"phase": "Succeeded", "restarts": 1},
        baseline_status={"phase": "Succeeded"},
        effects=[{"kind": "effect", "tool": "charge_card", "idem": idem, "attempt": 1, "begin": 101.0}],
        overlaps=[],
        zombies=[],
        fault_point_fired=False,
        seconds=1.0,
        errors=[],
    )
    evidence.update(changes)  # type: ignore[typeddict-item]
    return evidence


def test_a_clean_trial_has_no_loss() -> None:
    verdict = judge(_evidence())
    assert not failed(verdict) and not any(verdict["figures"].values()), verdict


def test_a_tool_run_after_its_record_is_a_recorded_reexecution_and_one_before_is_the_window() -> None:
    idem = idempotency_key(THREAD, "m1:call_2")
    before = {"kind": "effect", "tool": "charge_card", "idem": idem, "attempt": 2, "begin": 101.2}
    after = {**before, "begin": 102.0}
    early = _evidence(effects=[*_evidence()["effects"], before])
    assert judge(early)["figures"]["window_reexecutions"] == 1 and not failed(judge(early))
    late = judge(_evidence(effects=[*_evidence()["effects"], after]))
    assert late["figures"]["recorded_tools_reexecuted"] == 1 and failed(late), late


def test_a_step_done_again_after_its_checkpoint_is_lost() -> None:
    trial = copy.deepcopy(_rows(THREAD))
    trial["states"].insert(2, {**trial["states"][1], "version": 3, "step": 1, "current_node": "model"})
    verdict = judge(_evidence(trial=trial))
    assert verdict["figures"]["steps_lost"] == 1, verdict


def test_an_older_attempt_writing_after_a_newer_one_is_a_stale_write() -> None:
    trial = copy.deepcopy(_rows(THREAD))
    trial["states"][2]["attempt"] = 2
    trial["states"][3]["attempt"] = 1  # written after attempt 2 had written: fencing should have refused it
    verdict = judge(_evidence(trial=trial))
    assert verdict["figures"]["stale_writes_accepted"] == 1, verdict


def test_restarts_beyond_the_runner_crashes_are_charged_for_infrastructure() -> None:
    verdict = judge(_evidence(trial_status={"phase": "Succeeded", "restarts": 2}))
    assert verdict["figures"]["restarts_charged_for_infrastructure"] == 1, verdict


def test_duplicate_pods_unfinished_runs_and_a_different_final_state_are_losses() -> None:
    assert judge(_evidence(overlaps=[["t1-1", "t1-2"]]))["figures"]["duplicate_pods"] == 1
    assert judge(_evidence(trial_status={"phase": "Interrupted", "restarts": 1}))["figures"]["runs_not_finished"] == 1
    trial = copy.deepcopy(_rows(THREAD))
    trial["messages"][-1]["content"] = "Done twice."
    assert judge(_evidence(trial=trial))["figures"]["final_state_mismatches"] == 1


def test_a_result_the_ledger_never_got_is_reported_not_a_loss() -> None:
    trial = copy.deepcopy(_rows(THREAD))
    trial["ledger"] = []
    verdict = judge(_evidence(trial=trial))
    assert verdict["figures"]["unrecorded_tool_calls"] == 1 and not failed(verdict), verdict


def test_plans_are_seeded_and_spread_over_every_kind() -> None:
    assert plan(5) == plan(5)
    assert {plan(s).faults[0].kind for s in range(1, len(KINDS) + 1)} == set(KINDS)
    for seed in range(1, 300):
        faults = plan(seed).faults
        assert sum(f.kind in FAULT_POINTS for f in faults) <= 1, f"seed {seed}: one fault point per trial"
    assert set(LOSSES) < set(judge(_evidence())["figures"])


def test_a_tool_error_is_a_loss_but_the_mcp_scenarios_planned_deadline() -> None:
    trial = copy.deepcopy(_rows(THREAD))
    planned = {"id": "m5", "role": "tool", "name": DEADLINE_TOOL, "tool_call_id": "call_5", "is_error": True}
    planned["content"] = f"Error: [NODE_TIMEOUT_002] tool {DEADLINE_TOOL} did not finish within 4s"
    trial["messages"].insert(3, planned)
    assert judge(_evidence(trial=trial))["figures"]["tool_errors"] == 0
    sibling = {**trial["messages"][2], "is_error": True, "content": "Error: MCPConnectionError: the session ended"}
    trial["messages"][2] = sibling
    verdict = judge(_evidence(trial=trial))
    assert verdict["figures"]["tool_errors"] == 1 and failed(verdict), verdict


def test_the_mcp_scenario_is_a_first_fault_only_with_its_own_message() -> None:
    seeds = [s for s in range(1, 300) if plan(s).faults[0].kind == MCP_SIBLING_TIMEOUT]
    assert seeds and all(plan(s).mcp and "fraud check" in plan(s).text() for s in seeds)
    for seed in range(1, 300):
        extra = [f.kind for f in plan(seed).faults[1:]]
        assert not set(extra) & SCENARIOS, f"seed {seed}: a scenario drawn as an extra fault"
        assert plan(seed).mcp == (plan(seed).faults[0].kind == MCP_SIBLING_TIMEOUT)
