"""``status.toolCalls`` adds up (issue 24 item 6), on the emulated cluster and the real control plane.

Real operator process, real runner pods, real PostgreSQL, as in tests/cluster/test_operator.py. The
support agent asks for three calls at once (``lookup_order``, ``charge_card``, ``send_receipt``).

- A runner SIGKILLed right after ``charge_card``'s result was recorded (fault point
  ``after_ledger_record``, before the step's checkpoint): the next attempt replays the three calls from
  the ledger. The status counts both attempts: executed 3 (attempt 1) and replayed 3 (attempt 2), and
  ``agentrun_operator_tool_calls_total`` grew by exactly that.
- A slow ``send_receipt`` (8 s): ``lookup_order`` and ``charge_card`` show as executed while the step
  still runs, long before its checkpoint (the ledger record notifies the operator).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from examples.support_agent import count_effects
from kubesim import EmulatedCluster
from tests.cluster import operator_harness as harness
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    invocations,
    progress,
    status,
    tool_calls_counted,
    wait_node,
    wait_phase,
)

store, operator = harness.store, harness.operator

pytestmark = pytest.mark.timeout(180)


def counted(calls: dict[str, Any]) -> int:
    return sum(int(v) for v in calls.values())


@pytest.mark.real_server
def test_calls_executed_before_a_sigkill_and_replayed_after_it_both_count(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    before = 0  # the operator process is this test's own: its counter starts here
    apply(
        cluster,
        agentrun(
            "counts-kill",
            thread="counts-kill",
            effects=effects,
            # charge_card last, so the other two are recorded when it is, and the kill comes before the checkpoint.
            env={"SUPPORT_TOOL_DELAY_CHARGE_CARD": "1", "AGENTRUN_FAULT_POINT": "after_ledger_record:charge_card@1"},
            restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
        ),
    )
    final = wait_phase(cluster, operator, "counts-kill", "Succeeded", timeout=90)
    assert final["attempt"] == 2 and final["restarts"] == 1, final
    assert invocations(effects, "charge_card") == 1 and count_effects(str(effects))["charges"] == 1
    assert final["toolCalls"] == {"executed": 3, "replayed": 3}, (
        f"GUARANTEE BROKEN: status.toolCalls must count every attempt (3 executed in attempt 1, 3 replayed in "
        f"attempt 2), got {final['toolCalls']}"
    )
    cluster.wait_for(
        lambda: tool_calls_counted(operator) - before == 6,
        timeout=10,
        message=f"agentrun_operator_tool_calls_total grown by 6 (grew {tool_calls_counted(operator) - before})",
    )
    time.sleep(1)  # nothing more comes: a count that went down and up again would be counted twice
    assert tool_calls_counted(operator) - before == counted(final["toolCalls"]), "the metric differs from the status"


@pytest.mark.real_server
def test_a_recorded_call_counts_before_its_step_checkpoints(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(
        cluster,
        # send_receipt holds the step open long enough for a loaded machine: the proof is the order below.
        agentrun("counts-live", thread="counts-live", effects=effects, env={"SUPPORT_TOOL_DELAY_SEND_RECEIPT": "20"}),
    )
    wait_node(store, "default/counts-live", "tools")
    seen: list[dict[str, Any]] = []

    def two_executed() -> dict[str, Any] | None:
        seen.append(status(cluster, "counts-live"))
        return seen[-1] if (seen[-1].get("toolCalls") or {}).get("executed") == 2 else None

    try:
        live = cluster.wait_for(two_executed, timeout=30, message="status.toolCalls.executed 2")
    except AssertionError:
        shown = [(s.get("phase"), s.get("stateVersion"), s.get("toolCalls")) for s in seen]
        raise AssertionError(
            f"GUARANTEE BROKEN: lookup_order and charge_card were recorded but the status never said executed 2 "
            f"while send_receipt ran; it showed (phase, version, toolCalls): {sorted(set(map(str, shown)))}\n"
            f"operator log (tail): {operator.log()[-3000:]}"
        ) from None
    # Ordered, not timed: the status said executed 2 while the step had not checkpointed yet.
    stored = progress(store, "default/counts-live")
    assert stored is not None and stored.current_node == "tools" and stored.status == "running", (
        f"the step had already checkpointed ({stored}): this test proves nothing"
    )
    assert live["phase"] == "Running"
    final = wait_phase(cluster, operator, "counts-live", "Succeeded", timeout=60)
    assert final["toolCalls"] == {"executed": 3, "replayed": 0}, final["toolCalls"]
