"""``status.attempts``, the phase on the runner's first progress, and quiet status patches (issue 11).

Pure, like the decision table beside it: pods built as a kubelet reports them,
each Decision applied as the merge patch would and fed back.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agentrun_operator.decide import attempts
from agentrun_operator.decide.classify import classify
from agentrun_operator.decide.conditions import QUIET_SECONDS, deferrable, status_patch
from agentrun_operator.decide.decision import Decision
from agentrun_operator.decide.podspec import pod_name
from agentrun_operator.decide.run import decide as decide_run
from agentrun_operator.decide.status import AgentRunStatus, iso
from agentrun_operator.decide.thread import ThreadPeer
from tests.unit.decisions_support import (
    FAILED,
    LIMITS,
    NOW,
    PENDING,
    RUN,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    applied,
    decide,
    disruption_target,
    later,
    make_spec,
    manifest,
    progress,
    run_status,
    running,
    terminated,
    view,
)


def created(decision: Decision) -> Decision:
    """What the reconciler does with a new attempt: it writes the pod's name with it."""
    if decision.create_attempt is not None:
        decision.status["podName"] = pod_name(RUN, decision.create_attempt)
    return decision


def test_the_first_attempt_opens_an_entry_with_its_start_and_then_its_pod() -> None:
    d = created(decide(make_spec(), {}, None, None, NOW, LIMITS))
    assert d.create_attempt == 1
    assert d.status["attempts"] == [{"attempt": 1, "startTime": iso(NOW), "outcome": "Pending"}], (
        "status.attempts must record each attempt's start when its pod is created"
    )
    status = applied({}, d)
    later_on = decide(make_spec(), status, view(manifest(phase="Pending")), None, later(1), LIMITS)
    assert later_on.status["attempts"] == [
        {"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Pending"}
    ], "the pod's name joins its attempt on the next reconcile"


def test_a_crash_and_a_replay_leave_two_attempts_with_their_endings() -> None:
    spec = make_spec(restartPolicy={"maxRestarts": 3, "backoffSeconds": 0})
    status = applied({}, created(decide(spec, {}, None, None, NOW, LIMITS)))
    status = applied(status, decide(spec, status, view(running()), progress(), later(1), LIMITS))
    assert status["attempts"][0]["outcome"] == "Running"
    crash = view(terminated(137, reason="OOMKilled", message="memory limit 256Mi"))
    status = applied(status, created(decide(spec, status, crash, progress(), later(5), LIMITS)))
    first, second = status["attempts"]
    assert first["outcome"] == "Crashed" and first["exitCode"] == 137 and first["reason"] == "OOMKilled"
    assert first["endTime"] == iso(NOW), "the end of an attempt is the container's finishedAt when known"
    assert first["message"] == "killed by SIGKILL (signal 9)", "a log tail is no reason for a killed process"
    assert second == {"attempt": 2, "startTime": iso(later(5)), "outcome": "Pending"}
    done = view(terminated(0, attempt=2))
    status = applied(status, decide(spec, status, done, progress(status="completed"), later(9), LIMITS))
    assert status["phase"] == SUCCEEDED
    assert [(e["attempt"], e["outcome"], e.get("exitCode")) for e in status["attempts"]] == [
        (1, "Crashed", 137),
        (2, "Completed", 0),
    ]


def test_a_closed_entry_is_never_rewritten() -> None:
    status = run_status(
        FAILED,
        attempts=[{"attempt": 1, "podName": "p-1", "startTime": iso(NOW), "endTime": iso(NOW), "outcome": "Crashed"}],
    )
    d = Decision()
    attempts.track(d, status=AgentRunStatus.parse(status), pod=None, outcome=attempts.Outcome.GONE, now=later(60))
    assert "attempts" not in d.status, "a pod that disappears later must not change how its attempt ended"


def test_an_eviction_is_recorded_with_the_cluster_reason() -> None:
    status = run_status(
        RUNNING, attempts=[{"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Running"}]
    )
    evicted = view(terminated(143, phase="Failed", conditions=[disruption_target()]))
    d = created(decide(make_spec(), status, evicted, progress(), later(2), LIMITS))
    first, second = d.status["attempts"]
    assert first["outcome"] == "Disrupted" and first["reason"] == "EvictionByEvictionAPI"
    assert second["attempt"] == 2 and second["outcome"] == "Pending"


def test_an_evicted_pod_gone_before_its_exit_was_seen_is_still_a_disruption() -> None:
    """A drain on a real node (CI, stop 42): the operator saw the pod Terminating under its DisruptionTarget, then
    the pod was gone before its exit 6 reached a reconcile. It counted a disruption; the history says the same."""
    spec = make_spec(restartPolicy={"maxRestarts": 3, "backoffSeconds": 0})
    status = run_status(
        RUNNING, attempts=[{"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Running"}]
    )
    evicting = view(running(conditions=[disruption_target()]))
    status = applied(status, decide(spec, status, evicting, progress(), later(1), LIMITS))
    assert status["attempts"][0]["outcome"] == "Terminating"
    d = created(decide(spec, status, None, progress(), later(3), LIMITS))
    first, second = d.status["attempts"]
    assert (first["outcome"], first["reason"]) == ("Disrupted", "EvictionByEvictionAPI"), first
    assert d.status["disruptions"] == 1 and second["attempt"] == 2
    # Without a disruption seen, a pod that is gone was deleted: said as such.
    plain = run_status(
        RUNNING, attempts=[{"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Running"}]
    )
    gone = created(decide(spec, plain, None, progress(), later(3), LIMITS))
    assert gone.status["attempts"][0]["outcome"] == "Deleted"


def test_a_forced_stop_closes_the_attempt_whose_pod_still_runs() -> None:
    status = run_status(
        "Stopping",
        stopRequestedTime=iso(NOW),
        attempts=[{"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Running"}],
    )
    d = decide(make_spec(stop=True), status, view(running()), progress(), later(LIMITS.stop_grace + 1), LIMITS)
    assert d.status["phase"] == STOPPED and d.delete_pod == pod_name(RUN, 1)
    (entry,) = d.status["attempts"]
    assert entry["outcome"] == STOPPED and entry["reason"] == "ForcedStop" and "endTime" in entry


def test_an_interrupted_attempt_ends_and_the_resumed_one_opens() -> None:
    status = run_status(
        RUNNING, attempts=[{"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Running"}]
    )
    waiting = progress(status="interrupted", interrupts=[{"id": "abc", "message": "approve?", "payload": 1}])
    paused = view(terminated(3, message="Interrupted: abc"))
    status = applied(status, decide(make_spec(), status, paused, waiting, later(1), LIMITS))
    assert status["attempts"][0]["outcome"] == "Interrupted" and status["attempts"][0]["exitCode"] == 3
    spec = make_spec(resume={"value": True})
    d = created(decide(spec, status, paused, waiting, later(2), LIMITS))
    assert [e["attempt"] for e in d.status["attempts"]] == [1, 2]


def test_the_history_keeps_the_last_twenty_attempts() -> None:
    history: list[dict[str, Any]] = [
        {"attempt": n, "podName": pod_name(RUN, n), "startTime": iso(NOW), "endTime": iso(NOW), "outcome": "Crashed"}
        for n in range(1, 25)
    ]
    status = run_status(PENDING, attempt=24, attempts=history, nextAttemptTime=iso(NOW))
    spec = make_spec(restartPolicy={"maxRestarts": 100, "backoffSeconds": 1})
    d = created(decide(spec, status, None, None, later(1), LIMITS))
    assert d.create_attempt == 25
    kept = d.status["attempts"]
    assert len(kept) == attempts.KEPT == 20
    assert [e["attempt"] for e in kept] == list(range(6, 26)), "the newest attempts are kept, oldest first"


def test_an_attempt_unknown_to_the_history_is_added_from_the_status() -> None:
    status = run_status(RUNNING, attempt=3)
    d = decide(make_spec(), status, view(terminated(0, attempt=3)), progress(status="completed"), later(1), LIMITS)
    (entry,) = d.status["attempts"]
    assert entry["attempt"] == 3 and entry["podName"] == pod_name(RUN, 3) and entry["outcome"] == "Completed"


# --- the phase on the runner's first progress --------------------------------------------------------------------


def test_a_run_is_running_once_its_attempt_reports_progress_though_its_pod_is_not_seen_running() -> None:
    status = run_status(PENDING, reason="PodCreated")
    pending = view(manifest(phase="Pending"))
    d = decide(make_spec(), status, pending, progress(attempt=1, current_node="tools"), NOW, LIMITS)
    assert d.status.get("phase") == RUNNING, "kubectl get ar must not show Pending at node tools"


def test_progress_of_an_earlier_attempt_keeps_the_new_one_pending() -> None:
    status = run_status(PENDING, attempt=2, reason="PodCreated")
    pending = view(manifest(2, phase="Pending"))
    d = decide(make_spec(), status, pending, progress(attempt=1), NOW, LIMITS)
    assert "phase" not in d.status


def test_without_owners_in_the_store_a_checkpoint_after_the_pod_was_created_counts() -> None:
    entry = {"attempt": 2, "podName": pod_name(RUN, 2), "startTime": iso(NOW), "outcome": "Pending"}
    status = run_status(PENDING, attempt=2, reason="PodCreated", attempts=[entry])
    pending = view(manifest(2, phase="Pending"))
    before = progress(updated_at=(NOW - timedelta(seconds=5)).timestamp())
    assert "phase" not in decide(make_spec(), status, pending, before, later(1), LIMITS).status
    after = progress(updated_at=later(0.5).timestamp())
    assert decide(make_spec(), status, pending, after, later(1), LIMITS).status.get("phase") == RUNNING


# --- quiet status patches ----------------------------------------------------------------------------------------


def test_a_patch_of_unshown_fields_waits_while_the_status_is_fresh() -> None:
    current = AgentRunStatus.parse(
        run_status(RUNNING, lastCheckpointTime=iso(NOW), stateVersion=7, step=3, observedGeneration=1)
    )
    quiet = status_patch(current, {"step": 4, "lastCheckpointTime": iso(later(1))}, now=later(1), generation=1)
    assert quiet == {"step": 4, "lastCheckpointTime": iso(later(1))}
    assert deferrable(current, quiet, now=later(1)), "a row identical to the last must not be written"
    assert not deferrable(current, quiet, now=later(QUIET_SECONDS + 1)), "a quiet change is written once stale"
    shown = status_patch(current, {"stateVersion": 8, "step": 4}, now=later(1), generation=1)
    assert not deferrable(current, shown, now=later(1)), "a change kubectl shows is written at once"
    assert not deferrable(current, {}, now=later(1))
    counted = status_patch(current, {"toolCalls": {"executed": 1, "replayed": 0}}, now=later(1), generation=1)
    assert not deferrable(current, counted, now=later(1)), "a recorded tool call must show at once"


def test_a_new_attempt_is_named_at_once_when_the_run_is_known() -> None:
    me = ThreadPeer(name=RUN, uid="uid-1", created=NOW, phase=None, attempt=0, deleting=False)
    d = decide_run(spec=make_spec(), status=AgentRunStatus(), pod=None, progress=None, now=NOW, limits=LIMITS, run=me)
    assert d.status["attempts"] == [
        {"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Pending"}
    ], "the pod's name must come with its attempt: a second write would print a second identical row"


def test_a_routine_wait_writes_no_message() -> None:
    status = run_status(PENDING, reason="PodCreated", message="attempt 1: runner pod created")
    creating = view(manifest(phase="Pending", state={"waiting": {"reason": "ContainerCreating"}}))
    assert "message" not in decide(make_spec(), status, creating, None, NOW, LIMITS).status
    pulling = view(manifest(phase="Pending", state={"waiting": {"reason": "ErrImagePull", "message": "not found"}}))
    assert (
        decide(make_spec(), status, pulling, None, NOW, LIMITS).status["message"].startswith("ErrImagePull: not found")
    )


def test_an_attempt_given_up_on_a_lost_node_is_closed_when_the_next_one_opens() -> None:
    """A real lost node: the taint manager marks the pod, the operator gives it up after its timeout and
    starts the next attempt; the given-up attempt must end then (it used to stay "Terminating" forever,
    found on the real node, tests/node/test_faults.py)."""
    spec = make_spec()
    status = applied({}, created(decide(spec, {}, None, None, NOW, LIMITS)))
    status = applied(status, decide(spec, status, view(running()), progress(), later(1), LIMITS))
    pod = running()
    pod["metadata"]["deletionTimestamp"] = iso(NOW)
    pod["status"]["conditions"] = [disruption_target("DeletionByTaintManager")]
    status = applied(status, decide(spec, status, view(pod), None, later(5), LIMITS))
    assert status["attempts"][0]["outcome"] == "Terminating"
    late = later(LIMITS.lost_node_timeout + 5)
    d = created(decide(spec, status, view(pod), None, late, LIMITS))
    assert d.create_attempt == 2
    first, second = applied(status, d)["attempts"]
    assert first["outcome"] == "Disrupted" and first["endTime"] == iso(late), (
        f"GUARANTEE BROKEN: the attempt given up for a new one is left open: {first}"
    )
    assert first["reason"] == d.reschedule_reason and "attempt 2 replaces it" in first["message"]
    assert second == {"attempt": 2, "startTime": iso(late), "outcome": "Pending"}


# --- an attempt's reason names what happened (issue 32 item 3) ---------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "outcome", "reason"),
    [
        pytest.param(terminated(0), "Completed", "Completed", id="exit-0"),
        pytest.param(terminated(3), "Interrupted", "WaitingForResume", id="exit-3-waiting"),
        pytest.param(terminated(4), "Stopped", "Stopped", id="exit-4-stopped"),
        pytest.param(terminated(5), "Failed", "RunFailed", id="exit-5-failed"),
        pytest.param(terminated(6), "Disrupted", "Preempted", id="exit-6-sigterm"),
        pytest.param(terminated(7), "Superseded", "Superseded", id="exit-7-fenced"),
        pytest.param(terminated(8), "StoreUnavailable", "StoreUnavailable", id="exit-8-store"),
        pytest.param(terminated(1), "Crashed", "Crashed", id="exit-1-crash"),
        pytest.param(terminated(137), "Crashed", "Crashed", id="exit-137-sigkill"),
        pytest.param(terminated(137, reason="OOMKilled"), "Crashed", "OOMKilled", id="oom-kept"),
        pytest.param(
            terminated(143, phase="Failed", conditions=[disruption_target()]),
            "Disrupted",
            "EvictionByEvictionAPI",
            id="evicted-api",
        ),
        pytest.param(
            terminated(137, phase="Failed", reason="Error") | {"status": {"phase": "Failed", "reason": "Evicted"}},
            "Disrupted",
            "Evicted",
            id="evicted-kubelet",
        ),
    ],
)
def test_an_ended_attempt_is_named_by_what_happened_not_the_kubelets_error(
    pod: dict[str, Any], outcome: str, reason: str
) -> None:
    """The kubelet says "Error" for every non-zero exit: a run waiting for spec.resume (3) and a stop on
    request (4) read as failures in describe and the history. The attempt names what happened instead."""
    status = run_status(
        RUNNING, attempts=[{"attempt": 1, "podName": pod_name(RUN, 1), "startTime": iso(NOW), "outcome": "Running"}]
    )
    d = Decision()
    seen = view(pod)
    attempts.track(d, status=AgentRunStatus.parse(status), pod=seen, outcome=classify(seen), now=later(1))
    (entry,) = d.status["attempts"]
    assert (entry["outcome"], entry.get("reason")) == (outcome, reason), (
        f"GUARANTEE BROKEN: an attempt must be named by what happened, not the kubelet's generic word: {entry}"
    )
