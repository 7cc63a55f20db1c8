"""AgentRun status conditions and status patches (STYLE: Kubernetes conventions), without an API server.

``with_conditions`` turns a phase change into conditions with ``type``,
``status``, ``reason``, ``message``, ``lastTransitionTime`` and
``observedGeneration``; ``changed`` keeps status patches to what differs.
"""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from agentrun_operator.decide.conditions import PHASE_CONDITIONS, changed, with_conditions
from agentrun_operator.decide.status import AgentRunStatus, StatusPatch, iso

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
# metav1.Condition validation (apimachinery): reason is CamelCase-ish, status True/False/Unknown.
REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def transition(
    current: dict[str, Any], phase: str, reason: str, now: datetime, generation: int = 1, message: str = "m"
) -> dict[str, Any]:
    """Apply one phase change as reconcile's _write does; returns the new status."""
    patch: dict[str, Any] = {"phase": phase, "reason": reason, "message": message}
    with_conditions(AgentRunStatus.parse(current), cast(StatusPatch, patch), now=now, generation=generation)
    return {**current, **patch}


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def test_phase_change_sets_its_condition_true_with_every_field() -> None:
    status = transition({"phase": "Pending"}, "Running", "Running", at(0), generation=3, message="attempt 1 runs")
    running = by_type(status)["Running"]
    assert running == {
        "type": "Running",
        "status": "True",
        "reason": "Running",
        "message": "attempt 1 runs",
        "lastTransitionTime": iso(at(0)),
        "observedGeneration": 3,
    }, "a condition is missing a Kubernetes-convention field"


def test_next_phase_flips_the_previous_condition_false_at_the_transition_time() -> None:
    status = transition({"phase": "Pending"}, "Running", "Running", at(0))
    status = transition(status, "Succeeded", "Completed", at(60))
    conditions = by_type(status)
    assert conditions["Running"]["status"] == "False"
    assert conditions["Running"]["lastTransitionTime"] == iso(at(60)), "a flip must stamp the flip time"
    assert conditions["Succeeded"]["status"] == "True"
    assert conditions["Succeeded"]["reason"] == "Completed"
    assert conditions["Succeeded"]["lastTransitionTime"] == iso(at(60))


def test_stopping_keeps_running_true_and_its_original_transition_time() -> None:
    status = transition({"phase": "Pending"}, "Running", "Running", at(0))
    status = transition(status, "Stopping", "StopRequested", at(30))
    conditions = by_type(status)
    assert conditions["Running"]["status"] == "True", "a stopping run is still running"
    assert conditions["Running"]["lastTransitionTime"] == iso(at(0)), "no flip, so no new lastTransitionTime"
    assert conditions["Stopping"]["status"] == "True"
    status = transition(status, "Stopped", "Stopped", at(35))
    conditions = by_type(status)
    assert conditions["Running"]["status"] == "False" and conditions["Stopping"]["status"] == "False"
    assert conditions["Running"]["lastTransitionTime"] == iso(at(35))
    assert conditions["Stopped"]["status"] == "True"


def test_a_false_condition_is_left_alone_by_later_transitions() -> None:
    status = transition({"phase": "Pending"}, "Running", "Running", at(0))
    status = transition(status, "Interrupted", "Interrupted", at(10))
    flipped = copy.deepcopy(by_type(status)["Running"])
    status = transition(status, "Pending", "PodCreated", at(20), generation=2)  # resumed
    status = transition(status, "Failed", "BackoffLimitExceeded", at(30), generation=2)
    conditions = by_type(status)
    assert conditions["Running"] == flipped, "an unchanged False condition was rewritten"
    assert conditions["Interrupted"]["status"] == "False"
    assert conditions["Interrupted"]["lastTransitionTime"] == iso(at(20))
    assert conditions["Failed"]["observedGeneration"] == 2


def test_crash_back_to_pending_flips_running_false_and_a_new_start_flips_it_back() -> None:
    status = transition({"phase": "Pending"}, "Running", "Running", at(0))
    status = transition(status, "Pending", "BackOff", at(10))
    assert by_type(status)["Running"]["status"] == "False"
    assert by_type(status)["Running"]["reason"] == "BackOff"
    status = transition(status, "Running", "Running", at(20))
    assert by_type(status)["Running"]["status"] == "True"
    assert by_type(status)["Running"]["lastTransitionTime"] == iso(at(20))


def test_pending_alone_makes_no_true_condition() -> None:
    status = transition({}, "Pending", "PodCreated", at(0))
    assert status["conditions"] == []


def test_no_phase_change_leaves_the_patch_alone() -> None:
    current = transition({"phase": "Pending"}, "Running", "Running", at(0))
    for patch in ({"stateVersion": 4}, {"phase": "Running", "stateVersion": 4}):
        before = dict(patch)
        with_conditions(AgentRunStatus.parse(current), cast(StatusPatch, patch), now=at(5), generation=1)
        assert patch == before, "conditions were rewritten without a phase change"


def test_current_status_is_not_mutated() -> None:
    current = AgentRunStatus.parse(transition({"phase": "Pending"}, "Running", "Running", at(0)))
    snapshot = copy.deepcopy(current)
    failed = cast(StatusPatch, {"phase": "Failed", "reason": "RunFailed", "message": "x"})
    with_conditions(current, failed, now=at(5), generation=1)
    assert current == snapshot, "with_conditions must not edit the status it read"


def test_conditions_are_ordered_valid_and_bounded() -> None:
    status: dict[str, Any] = {"phase": "Pending"}
    for i, (phase, reason) in enumerate(
        [
            ("Running", "Running"),
            ("Interrupted", "Interrupted"),
            ("Pending", "PodCreated"),
            ("Running", "Running"),
            ("Stopping", "StopRequested"),
            ("Stopped", "ForcedStop"),
        ]
    ):
        status = transition(status, phase, reason, at(i), message="z" * 5000)
    conditions = status["conditions"]
    assert [c["type"] for c in conditions] == [t for t in PHASE_CONDITIONS if t in by_type(status)]
    assert len({c["type"] for c in conditions}) == len(conditions), "duplicate condition types"
    for c in conditions:
        assert c["status"] in ("True", "False")
        assert REASON.match(c["reason"]), f"reason {c['reason']!r} is not a valid condition reason"
        assert RFC3339.match(c["lastTransitionTime"])
        assert len(c["message"]) <= 1024, "condition messages must be bounded"
    assert [c["type"] for c in conditions if c["status"] == "True"] == ["Stopped"]


def test_changed_returns_only_differing_keys() -> None:
    current = {"phase": "Running", "stateVersion": 3, "toolCalls": {"executed": 1, "replayed": 0}, "lostSince": "x"}
    desired = {
        "phase": "Running",
        "stateVersion": 4,
        "toolCalls": {"executed": 1, "replayed": 0},
        "nextAttemptTime": None,
        "lostSince": None,
    }
    assert changed(current, cast(StatusPatch, desired)) == {"stateVersion": 4, "lostSince": None}, (
        "a patch must carry only changes: None for an absent key is no change, None for a present key removes it"
    )
    assert changed(current, cast(StatusPatch, {k: current[k] for k in ("phase", "stateVersion")})) == {}
