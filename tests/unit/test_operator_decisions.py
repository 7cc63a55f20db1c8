"""Operator decisions (DESIGN §3-4, issue 4): pod status + run status + store progress in, one Decision out.

Pure: no API server, no store, no clock. Pods are built as a kubelet reports
them (containerStatuses with terminated / waiting states, pod conditions,
``status.reason``), so ``PodView.from_manifest`` is exercised on every path.
Multi-step scenarios apply each Decision's status as the merge patch would
(``None`` removes a key) and feed it back, as the reconcile loop does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from agentrun.checkpoint.base import Progress
from agentrun_operator.decide.classify import Outcome, classify
from agentrun_operator.decide.decision import Decision, Limits, StoreProblem
from agentrun_operator.decide.reasons import TERMINAL, Phase, Reason
from agentrun_operator.decide.run import PAYLOAD_LIMIT, at_rest, backoff, rejected, truncate_payload
from agentrun_operator.decide.run import decide as decide_run
from agentrun_operator.decide.spec import AgentRunSpec, InvalidSpec
from agentrun_operator.decide.status import AgentRunStatus, iso, parse_time
from agentrun_operator.decide.thread import OrphanedTurn, ThreadPeer, orphaned_turn
from tests.unit.decisions_support import (
    FAILED,
    INTERRUPTED,
    LIMITS,
    NOW,
    PENDING,
    RUN,
    RUNNING,
    STARTED,
    STOPPED,
    STOPPING,
    SUCCEEDED,
    applied,
    container,
    decide,
    disruption_target,
    interrupted_progress,
    later,
    make_spec,
    manifest,
    no_action,
    progress,
    run_status,
    running,
    terminated,
    view,
    waiting,
)

# --- PodView.from_manifest -------------------------------------------------------------------------------------------


def test_podview_reads_the_runner_exit_code_reason_and_termination_message() -> None:
    pod = view(terminated(137, reason="OOMKilled", message="killed: memory limit 256Mi"))
    assert (pod.name, pod.phase, pod.exit_code) == (f"{RUN}-1", "Failed", 137), "the runner's exit code is lost"
    assert pod.terminated_reason == "OOMKilled"
    assert pod.termination_message == "killed: memory limit 256Mi"
    assert pod.disruption is None and not pod.deleting


def test_podview_exit_code_zero_is_an_exit_code_not_missing() -> None:
    assert view(terminated(0)).exit_code == 0, "exit 0 read as 'no exit code' would turn success into a crash"


def test_podview_prefers_the_runner_container_over_sidecars_in_any_order() -> None:
    sidecar = container({"running": {"startedAt": iso(STARTED)}}, name="istio-proxy", ready=True)
    runner = container({"terminated": {"exitCode": 5, "reason": "Error", "message": "GRAPH_001: boom"}})
    for statuses in ([sidecar, runner], [runner, sidecar]):
        pod = view(manifest(phase="Running", containers=statuses))
        assert pod.exit_code == 5, "a sidecar's state was read instead of the runner's"
        assert pod.termination_message == "GRAPH_001: boom"


def test_podview_reads_waiting_reason_and_message() -> None:
    pod = view(waiting("CreateContainerConfigError", 'secret "agentrun-store" not found'))
    assert pod.waiting_reason == "CreateContainerConfigError"
    assert pod.waiting_message == 'secret "agentrun-store" not found'
    assert pod.exit_code is None


def test_podview_reads_the_disruption_target_condition_reason() -> None:
    pod = view(running(conditions=[disruption_target("PreemptionByScheduler")]))
    assert pod.disruption == "PreemptionByScheduler", "a DisruptionTarget condition went unnoticed"


def test_podview_ignores_a_disruption_target_condition_that_is_false() -> None:
    cleared = {**disruption_target(), "status": "False"}
    assert view(running(conditions=[cleared])).disruption is None


def test_podview_reads_kubelet_eviction_from_status_reason() -> None:
    pod = view(
        manifest(
            phase="Failed",
            reason="Evicted",
            message="The node was low on resource: memory.",
            state={"terminated": {"exitCode": 137, "reason": "Error"}},
        )
    )
    assert pod.disruption == "Evicted", "a kubelet eviction (status.reason Evicted) was not seen as a disruption"


def test_podview_reads_deletion_timestamp_and_unknown_phase() -> None:
    assert view(running(deleting=True)).deleting
    lost = view(manifest(phase="Unknown", reason="NodeLost", state={"running": {"startedAt": iso(STARTED)}}))
    assert lost.phase == "Unknown" and lost.exit_code is None


def test_podview_of_a_fresh_pod_without_status_is_pending() -> None:
    pod = view({"metadata": {"name": f"{RUN}-1"}})
    assert pod.phase == "Pending" and classify(pod) is Outcome.PENDING


# --- classify --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "outcome"),
    [
        pytest.param(terminated(0), Outcome.COMPLETED, id="exit0-completed"),
        pytest.param(terminated(3), Outcome.INTERRUPTED, id="exit3-interrupted"),
        pytest.param(terminated(4), Outcome.STOPPED, id="exit4-stopped"),
        pytest.param(terminated(5), Outcome.FAILED, id="exit5-failed"),
        pytest.param(terminated(6), Outcome.DISRUPTED, id="exit6-preempted"),
        pytest.param(terminated(1), Outcome.CRASHED, id="exit1-crash"),
        pytest.param(terminated(137), Outcome.CRASHED, id="exit137-crash"),
        pytest.param(terminated(137, reason="OOMKilled"), Outcome.CRASHED, id="oomkilled-crash"),
        pytest.param(terminated(7), Outcome.SUPERSEDED, id="exit7-fenced-superseded"),
        pytest.param(terminated(9), Outcome.CRASHED, id="unknown-code-crash"),
        pytest.param(
            manifest(phase="Failed", reason="UnexpectedAdmissionError"),
            Outcome.CRASHED,
            id="failed-without-container-state-crash",
        ),
        pytest.param(running(), Outcome.RUNNING, id="running"),
        pytest.param(waiting("ContainerCreating", ""), Outcome.PENDING, id="creating-pending"),
        pytest.param(
            waiting("ImagePullBackOff", "Back-off pulling image"), Outcome.PENDING, id="image-pull-backoff-pending"
        ),
        pytest.param(
            running(conditions=[disruption_target()]),
            Outcome.TERMINATING,
            id="disruption-target-still-running-terminating",
        ),
        pytest.param(terminated(6, conditions=[disruption_target()]), Outcome.DISRUPTED, id="evicted-exit6"),
        pytest.param(terminated(137, conditions=[disruption_target()]), Outcome.DISRUPTED, id="evicted-exit137"),
        pytest.param(
            terminated(1, conditions=[disruption_target("PreemptionByScheduler")]),
            Outcome.DISRUPTED,
            id="preempted-exit1",
        ),
        pytest.param(
            manifest(phase="Failed", reason="Evicted", state={"terminated": {"exitCode": 137}}),
            Outcome.DISRUPTED,
            id="kubelet-evicted",
        ),
        pytest.param(manifest(phase="Unknown", reason="NodeLost"), Outcome.LOST, id="unknown-lost"),
        pytest.param(
            manifest(phase="Unknown", conditions=[disruption_target("DeletionByTaintManager")], deleting=True),
            Outcome.LOST,
            id="unknown-marked-by-taint-manager-lost",
        ),
        pytest.param(manifest(phase="Unknown", deleting=True), Outcome.LOST, id="unknown-being-deleted-lost"),
        pytest.param(
            waiting("CreateContainerConfigError", 'secret "s" not found'), Outcome.CONFIG_ERROR, id="config-error"
        ),
        pytest.param(waiting("InvalidImageName", "bad"), Outcome.CONFIG_ERROR, id="invalid-image-config-error"),
        pytest.param(running(deleting=True), Outcome.TERMINATING, id="deleting-terminating"),
    ],
)
def test_classify_maps_every_pod_ending_to_the_exit_code_table(pod: dict[str, Any], outcome: Outcome) -> None:
    assert classify(view(pod)) is outcome, f"DESIGN §3 exit-code table broken for {pod['status']}"


def test_fenced_current_pod_fails_the_run_as_superseded_without_spending_a_restart() -> None:
    line = "STORAGE_FENCED_001: thread 'ns/t' is owned by AgentRun uid-2; this run was superseded"
    d = decide(make_spec(), run_status(restarts=0), view(terminated(7, message=line)), None, NOW, LIMITS)
    assert d.status["phase"] == FAILED and d.status["reason"] == "Superseded", (
        "exit 7 (fenced) of the current pod must end the run as Superseded, not be retried as a crash"
    )
    assert d.create_attempt is None and "restarts" not in d.status, "a fenced attempt spent a restart"
    assert d.status["message"] == line, "the runner's reason must reach status.message"


def test_classify_no_pod_is_gone() -> None:
    assert classify(None) is Outcome.GONE


def test_classify_exit_code_wins_over_deletion_in_progress() -> None:
    # A pod deleted gracefully whose runner already exited with its outcome: the outcome counts.
    assert classify(view(terminated(0, deleting=True))) is Outcome.COMPLETED
    assert classify(view(terminated(4, deleting=True))) is Outcome.STOPPED


# --- backoff / truncate_payload ---------------------------------------------------------------------------------------


def test_backoff_doubles_from_the_base_and_is_capped() -> None:
    assert [backoff(n, 5, 300) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert backoff(0, 5, 300) == 5, "restarts counts from 1; 0 must not halve the base"
    assert backoff(40, 5, 300) == 300, "a large restart count must not overflow past the cap"
    assert backoff(3, 0, 300) == 0


def test_truncate_payload_keeps_small_payloads_as_they_are() -> None:
    payload = {"amount": 42, "items": ["a", "b"]}
    assert truncate_payload(payload) == payload
    assert truncate_payload(None) is None


def test_truncate_payload_bounds_large_payloads() -> None:
    big = {"text": "x" * 5000}
    out = truncate_payload(big)
    assert isinstance(out, str) and out.endswith("(truncated)"), "an oversize payload reached status untruncated"
    assert out.startswith(json.dumps(big)[:50])
    assert len(out) <= PAYLOAD_LIMIT + len("…(truncated)")


def test_truncate_payload_accepts_non_json_values() -> None:
    assert truncate_payload({"when": NOW}) == {"when": NOW}  # serialisable via str(), not rejected


# --- decide: start, running, outcomes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fresh", [{}, {"phase": PENDING}], ids=["no status", "the CRD's default"])
def test_new_run_creates_attempt_one_pod_and_is_pending(fresh: dict[str, Any]) -> None:
    d = decide(make_spec(), fresh, None, None, NOW, LIMITS)
    assert d.create_attempt == 1, "a new AgentRun did not get its first pod"
    assert d.resume is None
    assert d.status["phase"] == PENDING and d.status["attempt"] == 1
    assert d.status["startTime"] == iso(NOW)
    assert (d.status["restarts"], d.status["disruptions"]) == (0, 0)
    assert d.events and d.events[0][0] == "Normal"


def test_status_lost_after_pod_creation_recreates_the_same_attempt() -> None:
    # The operator died between creating the pod and writing status: the same name again (409 is success).
    d = decide(make_spec(), {}, None, None, NOW, LIMITS)
    assert d.create_attempt == 1


def test_running_pod_makes_the_phase_running_once() -> None:
    d = decide(make_spec(), run_status(PENDING), view(running()), None, NOW, LIMITS)
    assert d.status["phase"] == RUNNING and d.create_attempt is None
    again = decide(make_spec(), run_status(RUNNING), view(running()), None, NOW, LIMITS)
    assert no_action(again) and not again.events, "a steady Running run must not emit transitions"


def test_pending_pod_waiting_reason_is_shown_without_a_phase_change() -> None:
    patient = make_spec(restartPolicy={"imagePullTimeoutSeconds": 7200})  # the pod was created an hour ago
    d = decide(
        patient, run_status(PENDING), view(waiting("ImagePullBackOff", "Back-off pulling image")), None, NOW, LIMITS
    )
    assert no_action(d)
    assert d.status["message"] == "ImagePullBackOff: Back-off pulling image"


def test_status_mirrors_the_store_progress() -> None:
    p = progress(version=12, current_node="model", step=9, tool_calls={"executed": 4, "replayed": 2})
    d = decide(make_spec(), run_status(RUNNING), view(running()), p, NOW, LIMITS)
    assert d.status["stateVersion"] == 12, "status.stateVersion must equal the store's version"
    assert d.status["currentNode"] == "model"
    assert d.status["step"] == 9
    assert d.status["toolCalls"] == {"executed": 4, "replayed": 2}
    assert d.status["lastCheckpointTime"] == iso(NOW - timedelta(seconds=2))
    assert parse_time(d.status["lastCheckpointTime"]) == NOW - timedelta(seconds=2)


def test_status_mirror_defaults_missing_tool_call_counts_to_zero() -> None:
    d = decide(make_spec(), run_status(RUNNING), view(running()), progress(tool_calls={}), NOW, LIMITS)
    assert d.status["toolCalls"] == {"executed": 0, "replayed": 0}


def test_exit_0_succeeds_with_completion_time() -> None:
    d = decide(make_spec(), run_status(), view(terminated(0)), progress(status="completed"), NOW, LIMITS)
    assert d.status["phase"] == SUCCEEDED and d.status["reason"] == "Completed"
    assert d.status["completionTime"] == iso(NOW)
    assert d.create_attempt is None


def test_exit_4_is_stopped() -> None:
    d = decide(make_spec(), run_status(), view(terminated(4)), None, NOW, LIMITS)
    assert d.status["phase"] == STOPPED and d.status["completionTime"] == iso(NOW)
    assert d.create_attempt is None


def test_exit_5_fails_with_the_termination_message_and_no_retry() -> None:
    pod = view(terminated(5, message="GRAPH_LOAD_001: cannot import examples.nope:app"))
    d = decide(make_spec(), run_status(), pod, None, NOW, LIMITS)
    assert d.status["phase"] == FAILED and d.status["reason"] == "RunFailed"
    assert d.status["message"] == "GRAPH_LOAD_001: cannot import examples.nope:app", "the runner's reason was lost"
    assert d.create_attempt is None, "a permanent failure must not be retried"
    assert d.events[-1][0] == "Warning"


def test_exit_5_without_termination_message_uses_the_store_error() -> None:
    p = progress(status="failed", error={"code": "RECURSION_001", "message": "recursion limit 50 reached"})
    d = decide(make_spec(), run_status(), view(terminated(5)), p, NOW, LIMITS)
    assert d.status["message"] == "RECURSION_001: recursion limit 50 reached"


def test_config_error_fails_at_once_and_removes_the_pod() -> None:
    pod = view(waiting("CreateContainerConfigError", 'secret "agentrun-store" not found'))
    d = decide(make_spec(), run_status(PENDING), pod, None, NOW, LIMITS)
    assert d.status["phase"] == FAILED and d.status["reason"] == "CreateContainerConfigError"
    assert "agentrun-store" in d.status["message"], "a missing secret must be named in status"
    assert d.delete_pod == f"{RUN}-1"
    assert d.create_attempt is None, "a config error must not cause a retry storm"


@pytest.mark.parametrize("phase", sorted(TERMINAL))
def test_terminal_phases_take_no_action(phase: str) -> None:
    spec = make_spec(stop=True, resume={"value": "yes"})
    for pod in (None, view(terminated(1)), view(running())):
        d = decide(spec, run_status(phase, completionTime=iso(STARTED)), pod, progress(), NOW, LIMITS)
        assert d == Decision(), f"a {phase} run was acted on"


# --- decide: interrupts and resume -----------------------------------------------------------------------------------

ASK = {"id": "int-1", "message": "approve the refund?", "payload": {"amount": 42, "order": "4821"}}
ASK2 = {"id": "int-2", "message": "and the shipping?", "payload": {"carrier": "dhl"}}


def interrupted_status(*asks: dict[str, Any]) -> dict[str, Any]:
    d = decide(make_spec(), run_status(), view(terminated(3)), interrupted_progress(*asks), NOW, LIMITS)
    return applied(run_status(), d)


def test_exit_3_is_interrupted_with_the_interrupt_from_the_store() -> None:
    d = decide(make_spec(), run_status(), view(terminated(3)), interrupted_progress(ASK), NOW, LIMITS)
    assert d.status["phase"] == INTERRUPTED
    assert d.status["interrupt"]["id"] == "int-1"
    assert d.status["interrupt"]["message"] == "approve the refund?"
    assert d.status["interrupt"]["payload"] == {"amount": 42, "order": "4821"}
    assert d.status["message"] == "approve the refund?"
    assert d.create_attempt is None and "completionTime" not in d.status, "Interrupted is not an ending"


def test_interrupt_payload_over_the_limit_is_truncated_in_status() -> None:
    ask = {**ASK, "payload": {"document": "y" * 4000}}
    d = decide(make_spec(), run_status(), view(terminated(3)), interrupted_progress(ask), NOW, LIMITS)
    payload = d.status["interrupt"]["payload"]
    assert isinstance(payload, str) and payload.endswith("(truncated)"), "a huge payload went into status"
    assert len(payload) <= PAYLOAD_LIMIT + len("…(truncated)")


def test_interrupted_without_resume_waits() -> None:
    status = interrupted_status(ASK)
    d = decide(make_spec(), status, view(terminated(3)), interrupted_progress(ASK), NOW, LIMITS)
    assert no_action(d)


def test_resume_starts_the_next_attempt_once_with_the_value_keyed_by_interrupt_id() -> None:
    status = interrupted_status(ASK)
    spec = make_spec(resume={"value": {"approved": True}})
    d = decide(spec, status, view(terminated(3)), interrupted_progress(ASK), NOW, LIMITS)
    assert d.create_attempt == 2, "spec.resume did not start the next attempt"
    assert d.resume == {"values": {"int-1": {"approved": True}}}
    assert d.status["phase"] == PENDING
    assert spec.resume is not None and d.status["resumeDigest"] == spec.resume.digest()
    status = applied(status, d)
    assert "interrupt" not in status, "the answered interrupt must leave status"

    # The next attempt interrupts again while spec.resume still holds the old answer: no second attempt.
    d = decide(spec, status, view(terminated(3, attempt=2)), interrupted_progress(ASK2), later(10), LIMITS)
    status = applied(status, d)
    assert status["phase"] == INTERRUPTED and status["interrupt"]["id"] == "int-2"
    d = decide(spec, status, view(terminated(3, attempt=2)), interrupted_progress(ASK2), later(20), LIMITS)
    assert no_action(d), "the same spec.resume started a second attempt"


def test_resume_with_values_by_interrupt_id() -> None:
    status = interrupted_status(ASK, ASK2)
    assert status["interrupt"]["ids"] == ["int-1", "int-2"]
    spec = make_spec(resume={"values": {"int-1": "yes", "int-2": "no"}})
    d = decide(spec, status, view(terminated(3)), None, NOW, LIMITS)
    assert d.create_attempt == 2
    assert d.resume == {"values": {"int-1": "yes", "int-2": "no"}}


def test_single_value_for_several_pending_interrupts_starts_no_pod() -> None:
    status = interrupted_status(ASK, ASK2)
    d = decide(make_spec(resume={"value": "yes"}), status, view(terminated(3)), None, NOW, LIMITS)
    assert d.create_attempt is None, "one value cannot answer several interrupts"
    assert "int-1" in d.status["message"] and "int-2" in d.status["message"]
    assert "spec.resume.values" in d.status["message"]
    assert "resumeDigest" not in d.status, "a rejected answer must not be remembered as given"


def test_resume_naming_unknown_interrupt_ids_starts_no_pod() -> None:
    status = interrupted_status(ASK)
    d = decide(make_spec(resume={"values": {"int-9": "yes"}}), status, view(terminated(3)), None, NOW, LIMITS)
    assert d.create_attempt is None
    assert "int-9" in d.status["message"] and "int-1" in d.status["message"]
    assert "resumeDigest" not in d.status


def test_a_waiting_run_says_what_it_waits_for_in_a_few_words_until_it_is_answered_or_ends() -> None:
    # status.waitingFor is the Waiting column of kubectl get ar (issue 32 item 5): the question, short.
    status = interrupted_status(ASK)
    assert status["waitingFor"] == "approve the refund?"
    assert interrupted_status(ASK, ASK2)["waitingFor"] == "2 interrupts: approve the refund?"
    unasked = interrupted_status({"id": "int-7", "payload": {}})
    assert unasked["waitingFor"] == "interrupt int-7", "a question without words is named by its id"
    long = interrupted_status({**ASK, "message": "refund\n" + "x" * 500})
    assert len(long["waitingFor"]) == 60 and long["waitingFor"].startswith("refund x") and long["waitingFor"][-1] == "…"

    answered = decide(make_spec(resume={"value": True}), status, view(terminated(3)), None, NOW, LIMITS)
    assert "waitingFor" not in applied(status, answered), "an answered run no longer waits"
    stopped = decide(make_spec(stop=True), status, view(terminated(3)), None, NOW, LIMITS)
    after = applied(status, stopped)
    assert after["phase"] == "Stopped" and "waitingFor" not in after, "a stopped run waits for nothing"

    # A run that was waiting before the operator wrote the field gets it at its next reconcile.
    older = {k: v for k, v in status.items() if k != "waitingFor"}
    d = decide(make_spec(), older, view(terminated(3)), interrupted_progress(ASK), later(1), LIMITS)
    assert d.status.get("waitingFor") == "approve the refund?" and no_action(d)


def test_interrupt_missing_from_status_is_filled_from_the_store_later() -> None:
    # The store could not be read when the pod exited 3: status has no interrupt.
    d = decide(make_spec(), run_status(), view(terminated(3)), None, NOW, LIMITS)
    status = applied(run_status(), d)
    assert status["phase"] == INTERRUPTED and "interrupt" not in status
    d = decide(make_spec(), status, view(terminated(3)), interrupted_progress(ASK, ASK2), later(1), LIMITS)
    assert d.status["interrupt"]["ids"] == ["int-1", "int-2"], "the interrupt never reached status"
    spec = make_spec(resume={"values": {"int-1": "a", "int-2": "b"}})
    d = decide(spec, status, view(terminated(3)), interrupted_progress(ASK, ASK2), later(1), LIMITS)
    assert d.create_attempt == 2, "a resume by interrupt id was refused because status lacked the interrupt"


# --- decide: disruptions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(
            manifest(
                phase="Failed",
                reason="Evicted",
                message="The node was low on resource: memory.",
                state={"terminated": {"exitCode": 137, "reason": "Error"}},
            ),
            id="kubelet-eviction",
        ),
        pytest.param(terminated(6, conditions=[disruption_target()], deleting=True), id="eviction-api-exit6"),
        pytest.param(terminated(137, conditions=[disruption_target("PreemptionByScheduler")]), id="preempted-killed"),
        pytest.param(terminated(6), id="exit6"),
    ],
)
def test_disruption_reschedules_at_once_and_counts_as_a_disruption(pod: dict[str, Any]) -> None:
    status = run_status(restarts=1, disruptions=0)
    d = decide(make_spec(), status, view(pod), None, NOW, LIMITS)
    assert d.create_attempt == 2, "a disrupted run was not rescheduled at once"
    assert d.status["disruptions"] == 1
    assert d.status.get("restarts", 1) == 1, "a disruption must not count as a restart"
    assert "nextAttemptTime" not in d.status or d.status["nextAttemptTime"] is None, "disruptions get no backoff"
    assert d.status["phase"] == PENDING
    assert any(kind == "Warning" for kind, _, _ in d.events)


def test_disruption_target_while_running_waits_for_the_pod_to_end() -> None:
    d = decide(make_spec(), run_status(), view(running(conditions=[disruption_target()])), None, NOW, LIMITS)
    assert no_action(d), "a new attempt must not overlap a pod still shutting down"


def test_pod_deleted_by_someone_else_is_a_disruption() -> None:
    terminating = decide(make_spec(), run_status(), view(running(deleting=True)), None, NOW, LIMITS)
    assert no_action(terminating), "wait for the deleted pod to go before the next attempt"
    d = decide(make_spec(), run_status(), None, None, later(5), LIMITS)
    assert d.create_attempt == 2
    assert d.status["disruptions"] == 1 and "restarts" not in d.status
    assert ("Warning", "PodDeleted") in [(k, r) for k, r, _ in d.events], "the disruption must be an Event"


def test_lost_node_reschedules_only_after_the_timeout_with_a_forced_delete() -> None:
    pod = view(manifest(phase="Unknown", reason="NodeLost", state={"running": {"startedAt": iso(STARTED)}}))
    status = run_status()
    first = decide(make_spec(), status, pod, None, NOW, LIMITS)
    assert first.status["lostSince"] == iso(NOW), "the first sighting of a lost pod must be recorded"
    assert no_action(first)
    status = applied(status, first)

    before = decide(make_spec(), status, pod, None, later(LIMITS.lost_node_timeout - 1), LIMITS)
    assert no_action(before), "rescheduled before the lost-node timeout"

    after = decide(make_spec(), status, pod, None, later(LIMITS.lost_node_timeout), LIMITS)
    assert after.delete_pod == f"{RUN}-1" and after.delete_grace == 0, "the lost pod must be force-deleted"
    assert after.create_attempt == 2
    assert after.status["disruptions"] == 1 and "restarts" not in after.status
    assert after.status["lostSince"] is None


def test_lost_pod_also_marked_by_the_taint_manager_is_still_rescheduled() -> None:
    pod = view(manifest(phase="Unknown", conditions=[disruption_target("DeletionByTaintManager")], deleting=True))
    status = applied(run_status(), decide(make_spec(), run_status(), pod, None, NOW, LIMITS))
    assert status.get("lostSince") == iso(NOW), "a lost pod marked for disruption would wait forever"
    after = decide(make_spec(), status, pod, None, later(LIMITS.lost_node_timeout), LIMITS)
    assert after.create_attempt == 2 and after.delete_grace == 0


def test_lost_pod_that_comes_back_clears_lost_since() -> None:
    status = run_status(lostSince=iso(NOW))
    d = decide(make_spec(), status, view(running()), None, later(10), LIMITS)
    assert d.status["lostSince"] is None
    assert applied(status, d).get("lostSince") is None


def test_disruption_cap_fails_the_run() -> None:
    status = run_status(disruptions=LIMITS.max_disruptions)
    d = decide(make_spec(), status, view(terminated(6)), None, NOW, LIMITS)
    assert d.create_attempt is None, "disruptions past the cap must not reschedule forever"
    assert d.status["phase"] == FAILED and d.status["reason"] == "DisruptionLimitExceeded"
    assert d.status["completionTime"] == iso(NOW)


def test_disruptions_up_to_the_cap_reschedule() -> None:
    status = run_status(disruptions=LIMITS.max_disruptions - 1)
    d = decide(make_spec(), status, view(terminated(6)), None, NOW, LIMITS)
    assert d.create_attempt == 2 and d.status["disruptions"] == LIMITS.max_disruptions


# --- decide: crashes and backoff -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [(1, "Error"), (137, "Error"), (137, "OOMKilled"), (139, "Error")],
)
def test_crash_counts_a_restart_and_backs_off(code: int, reason: str) -> None:
    d = decide(make_spec(), run_status(disruptions=2), view(terminated(code, reason=reason)), None, NOW, LIMITS)
    assert d.create_attempt is None, "a crash must wait out its backoff"
    assert d.status["restarts"] == 1 and "disruptions" not in d.status, "a crash counts as a restart only"
    assert d.status["nextAttemptTime"] == iso(later(5))
    assert d.status["phase"] == PENDING and d.status["reason"] == "BackOff"
    assert f"exit {code}" in d.status["message"]
    if reason == "OOMKilled":
        assert "OOMKilled" in d.status["message"], "the kubelet's reason must reach the user"


def test_backoff_waits_then_starts_the_next_attempt() -> None:
    pod = view(terminated(1))
    status = applied(run_status(), decide(make_spec(), run_status(), pod, None, NOW, LIMITS))
    waiting_ = decide(make_spec(), status, pod, None, later(4), LIMITS)
    assert no_action(waiting_), "restarted before nextAttemptTime"
    gone = decide(make_spec(), status, None, None, later(4), LIMITS)
    assert no_action(gone), "a crashed pod cleaned up during backoff is not a disruption"
    d = decide(make_spec(), status, pod, None, later(5), LIMITS)
    assert d.create_attempt == 2 and d.resume is None
    assert d.status["nextAttemptTime"] is None
    status = applied(status, d)
    assert (status["restarts"], status["disruptions"], status["attempt"]) == (1, 0, 2)


# Every kind of crash (DESIGN.md section 3: anything but 3-8, and an exit 0 the store does not confirm): the
# pod as the kubelet reports it, what the store holds, and how the operator's message names it.
CrashedPod = Callable[[int], dict[str, Any]]
CRASH_KINDS = [
    pytest.param(
        lambda a: terminated(0, attempt=a),
        None,
        "exited 0 before the run completed; the store has no progress at all",
        id="exit-0-at-import",
    ),
    pytest.param(
        lambda a: terminated(0, attempt=a),
        progress(current_node="quit"),
        "exited 0 before the run completed; the store has status running at node quit",
        id="exit-0-mid-node",
    ),
    pytest.param(lambda a: terminated(1, attempt=a), None, "exit 1 (Error)", id="exit-1"),
    pytest.param(lambda a: terminated(137, attempt=a), None, "exit 137 (Error)", id="sigkill-137"),
    pytest.param(
        lambda a: terminated(137, attempt=a, reason="OOMKilled"), None, "exit 137 (OOMKilled)", id="oom-killed"
    ),
]


def crash_loop(
    spec: AgentRunSpec,
    limits: Limits,
    crashes: int,
    crash: CrashedPod = lambda a: terminated(1, attempt=a),
    seen: Progress | None = None,
) -> tuple[list[float], dict[str, Any]]:
    """Crash every attempt (``crash``; the store holding ``seen``); returns the backoff delays seen and the final
    status. Each crashed pod is reconciled again half way through its backoff, as a watch event or a resync would."""
    status, now, delays = run_status(), NOW, []
    for _ in range(crashes):
        attempt = status["attempt"]
        crashed = view(crash(attempt))
        status = applied(status, decide(spec, status, crashed, seen, now, limits))
        if status["phase"] == FAILED:
            break
        if "nextAttemptTime" in status:
            next_at = parse_time(status["nextAttemptTime"])
            assert next_at is not None
            delays.append((next_at - now).total_seconds())
            halfway = decide(spec, status, crashed, seen, now + (next_at - now) / 2, limits)
            assert no_action(halfway) and "restarts" not in halfway.status, "a reconcile in the backoff acted"
            now = next_at
            d = decide(spec, status, crashed, seen, now, limits)
            assert d.create_attempt == attempt + 1, f"GUARANTEE BROKEN: no new pod after the backoff: {d.status}"
            status = applied(status, d)
        else:
            delays.append(0.0)
        status = applied(status, decide(spec, status, view(running(status["attempt"])), None, now, limits))
        assert status["phase"] == RUNNING
    return delays, status


def test_backoff_sequence_doubles_per_restart_and_is_capped() -> None:
    spec = make_spec(restartPolicy={"maxRestarts": 8, "backoffSeconds": 5})
    delays, status = crash_loop(spec, LIMITS, 8)
    assert delays == [5, 10, 20, 40, 80, 160, 300, 300], "exponential backoff from the base, capped at max_backoff"
    assert status["restarts"] == 8 and status["attempt"] == 9


@pytest.mark.parametrize(("crash", "seen", "why"), CRASH_KINDS)
def test_crash_loop_fails_with_backoff_limit_exceeded_after_max_restarts(
    crash: CrashedPod, seen: Progress | None, why: str
) -> None:
    """Issue 31 item 9: under a backoff an exit-0 crash was counted again at each wake-up and got no new pod."""
    spec = make_spec()  # the CRD's defaults: 3 restarts, 5 s backoff
    assert (spec.restartPolicy.maxRestarts, spec.restartPolicy.backoffSeconds) == (3, 5)
    delays, status = crash_loop(spec, LIMITS, 10, crash, seen)
    assert delays == [5, 10, 20], "exactly maxRestarts restarts, each after its backoff, before failing"
    assert why in status["message"], status["message"]
    assert status["phase"] == FAILED and status["reason"] == "BackoffLimitExceeded"
    assert status["attempt"] == 4 and "completionTime" in status
    assert "nextAttemptTime" not in status
    assert status["restarts"] == 3, "restarts counts restarts made and never exceeds maxRestarts"


def test_max_restarts_zero_fails_on_the_first_crash() -> None:
    spec = make_spec(restartPolicy={"maxRestarts": 0})
    d = decide(spec, run_status(), view(terminated(137)), None, NOW, LIMITS)
    assert d.status["phase"] == FAILED and d.status["reason"] == "BackoffLimitExceeded"
    assert d.create_attempt is None


def test_backoff_seconds_zero_restarts_immediately() -> None:
    spec = make_spec(restartPolicy={"backoffSeconds": 0})
    d = decide(spec, run_status(), view(terminated(1)), None, NOW, LIMITS)
    assert d.create_attempt == 2, "backoffSeconds 0 must restart at once"
    assert d.status["restarts"] == 1
    assert not d.status.get("nextAttemptTime")
    assert ("Warning", "BackOff") in [(k, r) for k, r, _ in d.events]


def test_backoff_in_status_is_capped_by_the_operator_limit() -> None:
    spec = make_spec(restartPolicy={"backoffSeconds": 3600})
    d = decide(spec, run_status(), view(terminated(1)), None, NOW, LIMITS)
    assert d.status["nextAttemptTime"] == iso(later(LIMITS.max_backoff))


# --- decide: stop ----------------------------------------------------------------------------------------------------


def test_stop_before_any_pod_ends_the_run_without_one() -> None:
    d = decide(make_spec(stop=True), {}, None, None, NOW, LIMITS)
    assert d.create_attempt is None, "a run stopped before it started got a pod"
    assert not d.request_stop
    assert d.status["phase"] == STOPPED and d.status["reason"] == "StoppedBeforeStart"
    assert d.status["completionTime"] == iso(NOW)


def test_stop_while_running_asks_the_runner_through_the_store_once() -> None:
    spec = make_spec(stop=True)
    d = decide(spec, run_status(), view(running()), None, NOW, LIMITS)
    assert d.request_stop, "spec.stop did not reach the store"
    assert d.status["phase"] == STOPPING and d.status["stopRequestedTime"] == iso(NOW)
    assert d.delete_pod is None and d.create_attempt is None
    status = applied(run_status(), d)
    again = decide(spec, status, view(running()), None, later(10), LIMITS)
    assert no_action(again), "the stop request must be made once and then waited on"


def test_stop_while_pending_asks_the_runner_too() -> None:
    d = decide(make_spec(stop=True), run_status(PENDING), view(waiting("ContainerCreating", "")), None, NOW, LIMITS)
    assert d.request_stop and d.status["phase"] == STOPPING


def test_stop_then_runner_exits_4_is_stopped() -> None:
    spec = make_spec(stop=True)
    status = applied(run_status(), decide(spec, run_status(), view(running()), None, NOW, LIMITS))
    d = decide(spec, status, view(terminated(4)), None, later(1), LIMITS)
    assert d.status["phase"] == STOPPED and d.status["reason"] == "Stopped"
    assert d.delete_pod is None and d.create_attempt is None
    assert d.status["completionTime"] == iso(later(1))


@pytest.mark.parametrize(("code", "phase"), [(0, SUCCEEDED), (5, FAILED), (4, STOPPED)])
def test_a_finished_run_withdraws_the_stop_it_asked_for(code: int, phase: str) -> None:
    """A stop request left in the store would end the thread's next turn (the next AgentRun) at once."""
    spec = make_spec(stop=True)
    status = applied(run_status(), decide(spec, run_status(), view(running()), None, NOW, LIMITS))
    done = progress(status="completed") if code == 0 else None
    d = decide(spec, status, view(terminated(code)), done, later(1), LIMITS)
    assert d.status["phase"] == phase
    assert d.clear_stop, "the run ended without withdrawing its stop request from the store"


def test_a_run_that_never_asked_for_a_stop_leaves_the_store_alone() -> None:
    d = decide(make_spec(), run_status(), view(terminated(0)), progress(status="completed"), NOW, LIMITS)
    assert d.status["phase"] == SUCCEEDED and not d.clear_stop


def test_stop_not_obeyed_within_the_grace_deletes_the_pod() -> None:
    spec = make_spec(stop=True)
    status = applied(run_status(), decide(spec, run_status(), view(running()), None, NOW, LIMITS))
    before = decide(spec, status, view(running()), None, later(LIMITS.stop_grace - 1), LIMITS)
    assert no_action(before), "forced before the stop grace"
    d = decide(spec, status, view(running()), None, later(LIMITS.stop_grace), LIMITS)
    assert d.delete_pod == f"{RUN}-1" and d.delete_grace == 0, "a hung runner's pod must be deleted"
    assert d.status["phase"] == STOPPED and d.status["reason"] == "ForcedStop"
    assert d.create_attempt is None


def test_stop_while_interrupted_is_stopped() -> None:
    status = interrupted_status(ASK)
    d = decide(make_spec(stop=True), status, view(terminated(3)), None, NOW, LIMITS)
    assert d.status["phase"] == STOPPED and d.create_attempt is None and not d.request_stop


def test_stop_while_backing_off_is_stopped() -> None:
    pod = view(terminated(1))
    status = applied(run_status(), decide(make_spec(), run_status(), pod, None, NOW, LIMITS))
    assert status["reason"] == "BackOff"
    for current in (pod, None):
        d = decide(make_spec(stop=True), status, current, None, later(1), LIMITS)
        assert d.status["phase"] == STOPPED, "a stop during backoff must end the run"
        assert d.create_attempt is None
        assert d.status["nextAttemptTime"] is None


def test_run_completed_before_it_saw_the_stop_is_succeeded() -> None:
    spec = make_spec(stop=True)
    status = applied(run_status(), decide(spec, run_status(), view(running()), None, NOW, LIMITS))
    d = decide(spec, status, view(terminated(0)), progress(status="completed"), later(1), LIMITS)
    assert d.status["phase"] == SUCCEEDED, "a finished run must not be reported as stopped"
    assert d.create_attempt is None


@pytest.mark.parametrize(
    "seen",
    [
        pytest.param(None, id="no-progress-at-all"),
        pytest.param(progress(status="running", current_node="tools"), id="running-at-a-node"),
        pytest.param(progress(status="completed", request_key="another-turn"), id="another-turn-completed"),
    ],
)
def test_exit_0_without_a_completed_turn_in_the_store_is_a_crash(seen: Progress | None) -> None:
    """Issue 22 item 5: a graph calling os._exit(0) at import or mid-node must not end Succeeded."""
    d = decide_run(
        spec=make_spec(),
        status=AgentRunStatus.parse(run_status()),
        pod=view(terminated(0)),
        progress=seen,
        now=NOW,
        limits=LIMITS,
        request_key="this-turn",
    )
    assert d.status["phase"] == PENDING and d.status["reason"] == "BackOff", d.status
    assert "exited 0 before the run completed" in d.status["message"] and d.status["restarts"] == 1
    if seen is not None and seen.status == "running":
        assert "running at node tools" in d.status["message"]
    once = decide_run(
        spec=make_spec(restartPolicy={"maxRestarts": 0}),
        status=AgentRunStatus.parse(run_status()),
        pod=view(terminated(0)),
        progress=seen,
        now=NOW,
        limits=LIMITS,
        request_key="this-turn",
    )
    assert once.status["phase"] == FAILED and "exited 0 before the run completed" in once.status["message"]


@pytest.mark.parametrize(("crash", "seen", "why"), CRASH_KINDS)
def test_one_crash_under_the_default_backoff_counts_once_and_the_next_pod_comes_after_it(
    crash: CrashedPod, seen: Progress | None, why: str
) -> None:
    """Issue 31 item 9: with the CRD's default backoff (5 s) an exit 0 before the turn completed was counted
    again at every wake-up (restarts 1, 2, 3, then BackoffLimitExceeded with one pod) and recorded Completed."""
    spec = make_spec()
    crashed = view(crash(1))
    status = applied(run_status(), decide(spec, run_status(), crashed, seen, NOW, LIMITS))
    assert (status["phase"], status["reason"], status["restarts"]) == (PENDING, "BackOff", 1), status
    assert why in status["message"] and status["nextAttemptTime"] == iso(later(5)), status["message"]
    first = status["attempts"][0]
    assert first["outcome"] == "Crashed", f"the crashed attempt is recorded as {first}"
    assert first["exitCode"] == crashed.exit_code
    if crashed.exit_code == 0:
        assert "reason" not in first and first["message"] == why, "the kubelet's Completed beside a crash"
    else:  # the kubelet's generic "Error" says nothing: a crash is named Crashed (issue 32 item 3)
        assert first["reason"] == ("Crashed" if crashed.terminated_reason == "Error" else crashed.terminated_reason)
    for seconds in (0.5, 1, 2.5, 4.999):  # the crashed pod's watch events, a resync, the store's notifications
        waiting = decide(spec, status, crashed, seen, later(seconds), LIMITS)
        assert no_action(waiting), f"GUARANTEE BROKEN: the same crash acted on again: {waiting.status}"
        status = applied(status, waiting)
    assert status["restarts"] == 1, "one crash must be counted once"
    d = decide(spec, status, crashed, seen, later(5), LIMITS)
    assert d.create_attempt == 2, f"GUARANTEE BROKEN: no second pod after the backoff: {d.status}"
    status = applied(status, d)
    assert (status["attempt"], status["restarts"], status.get("nextAttemptTime")) == (2, 1, None), status
    status = applied(status, decide(spec, status, view(running(2)), seen, later(6), LIMITS))
    done = decide(spec, status, view(terminated(0, attempt=2)), progress(status="completed"), later(9), LIMITS)
    status = applied(status, done)
    assert (status["phase"], status["restarts"], status["attempt"]) == (SUCCEEDED, 1, 2), status
    assert [(e["attempt"], e["outcome"]) for e in status["attempts"]] == [(1, "Crashed"), (2, "Completed")]


def test_an_exit_0_crash_is_no_ending_the_deadline_must_respect() -> None:
    """spec.activeDeadlineSeconds ends a run in backoff; an exit-0 crash is in backoff, not Completed."""
    spec = make_spec(activeDeadlineSeconds=60)
    status = run_status(startTime=iso(NOW - timedelta(seconds=58)))
    status = applied(status, decide(spec, status, view(terminated(0)), None, NOW, LIMITS))
    assert status["reason"] == "BackOff"
    d = decide(spec, status, view(terminated(0)), None, later(3), LIMITS)
    assert d.status["phase"] == FAILED and d.status["reason"] == "DeadlineExceeded", d.status


def test_exit_0_waits_for_the_store_when_the_operator_cannot_read_it() -> None:
    d = decide_run(
        spec=make_spec(),
        status=AgentRunStatus.parse(run_status()),
        pod=view(terminated(0)),
        progress=None,
        now=NOW,
        limits=LIMITS,
        store_down=True,
    )
    assert "phase" not in d.status and d.create_attempt is None, "decided without the store's word"


def test_stop_after_a_crash_does_not_restart() -> None:
    d = decide(make_spec(stop=True), run_status(), view(terminated(137)), None, NOW, LIMITS)
    assert d.status["phase"] == STOPPED and d.create_attempt is None


@pytest.mark.parametrize(("code", "phase"), [(0, SUCCEEDED), (5, FAILED), (4, "Stopped"), (3, "Interrupted")])
def test_a_final_exit_code_wins_over_a_disruption_that_came_meanwhile(code: int, phase: str) -> None:
    """An eviction racing with a run that already failed permanently must not retry it."""
    pod = terminated(code)
    pod["status"]["conditions"] = [disruption_target()]
    d = decide(make_spec(), run_status(), view(pod), progress(status="completed") if code == 0 else None, NOW, LIMITS)
    assert d.status["phase"] == phase and d.create_attempt is None


def test_a_pod_stuck_terminating_on_a_dead_node_is_replaced_after_the_timeout() -> None:
    """Real clusters keep a dead node's pod in phase Running with a deletionTimestamp and no kubelet to
    confirm the deletion; waiting for it would hang the run forever."""
    pod = running()
    pod["metadata"]["deletionTimestamp"] = iso(NOW)
    pod["status"]["conditions"] = [disruption_target("DeletionByTaintManager")]
    waiting = decide(make_spec(), run_status(), view(pod), None, NOW + timedelta(seconds=5), LIMITS)
    assert waiting.create_attempt is None, "within the timeout the old pod may still finish"
    late = NOW + timedelta(seconds=LIMITS.lost_node_timeout + 1)
    d = decide(make_spec(), run_status(), view(pod), None, late, LIMITS)
    assert d.delete_pod == pod["metadata"]["name"] and d.delete_grace == 0
    assert d.create_attempt == 2 and d.status["disruptions"] == 1


# --- decide: one live run per thread (the newer waits) ---------------------------------------------------------------

ME = ThreadPeer(name=RUN, uid="uid-me", created=NOW - timedelta(minutes=1))


def peer(name: str, *, age: float, phase: Phase | None = None, attempt: int = 0, deleting: bool = False) -> ThreadPeer:
    """Another AgentRun on the thread, created ``age`` seconds before NOW."""
    return ThreadPeer(
        name=name,
        uid=f"uid-{name}",
        created=NOW - timedelta(seconds=age),
        phase=phase,
        attempt=attempt,
        deleting=deleting,
    )


@pytest.mark.parametrize(
    ("others", "waits_for"),
    [
        pytest.param([], None, id="alone-starts"),
        pytest.param([peer("older-running", age=600, phase=RUNNING, attempt=1)], "older-running", id="older-started"),
        pytest.param([peer("newer-running", age=5, phase=RUNNING, attempt=1)], "newer-running", id="newer-started"),
        pytest.param([peer("older-new", age=600)], "older-new", id="older-not-started"),
        pytest.param([peer("newer-new", age=5)], None, id="newer-not-started-waits-for-me"),
        pytest.param([peer("twin", age=60)], None, id="same-age-tie-broken-by-name-twin-after-me"),
        pytest.param([peer("a-twin", age=60)], "a-twin", id="same-age-tie-broken-by-name-a-twin-first"),
        pytest.param([peer("done", age=600, phase=SUCCEEDED, attempt=1)], None, id="older-succeeded-frees"),
        pytest.param([peer("failed", age=600, phase=FAILED, attempt=3)], None, id="older-failed-frees"),
        pytest.param([peer("stopped", age=600, phase=STOPPED)], None, id="older-stopped-frees"),
        pytest.param([peer("going", age=600, phase=RUNNING, attempt=1, deleting=True)], None, id="deleted-frees"),
        pytest.param([peer("paused", age=600, phase=INTERRUPTED, attempt=1)], "paused", id="interrupted-holds"),
        pytest.param([peer("backoff", age=600, phase=PENDING, attempt=2)], "backoff", id="backing-off-holds"),
        pytest.param(
            [peer("older-new", age=600), peer("newer-running", age=5, phase=RUNNING, attempt=1)],
            "newer-running",
            id="a-started-run-is-named-first",
        ),
        pytest.param([peer("old", age=900), peer("older", age=1200)], "older", id="waits-for-the-oldest-not-started"),
        pytest.param([dataclasses.replace(ME, phase=PENDING)], None, id="itself-in-the-index-is-ignored"),
    ],
)
def test_a_run_that_has_not_started_waits_while_another_live_run_holds_its_thread(
    others: list[ThreadPeer], waits_for: str | None
) -> None:
    d = decide_run(
        spec=make_spec(),
        status=AgentRunStatus(),
        pod=None,
        progress=None,
        now=NOW,
        limits=LIMITS,
        run=ME,
        peers=others,
    )
    if waits_for is None:
        assert d.create_attempt == 1, f"nothing holds the thread, yet the run did not start: {d.status}"
        return
    assert d.create_attempt is None, f"GUARANTEE BROKEN: two live runs on one thread ({waits_for} holds it)"
    assert d.status["phase"] == PENDING and d.status["reason"] == Reason.THREAD_BUSY
    assert waits_for in d.status["message"] and "order-4821" in d.status["message"], "say whom the run waits for"
    assert "attempt" not in d.status and "startTime" not in d.status, "a waiting run has not started"


def test_a_deleted_runs_unfinished_turn_is_waited_for_then_taken_over() -> None:
    """Issue 22 item 4: the deleted run's pods first; then the next run starts and closes that turn."""
    left = progress(status="running", run_uid="deleted-uid", request_key="its-request")
    assert orphaned_turn(left, me=ME.uid, request_key="mine", peers=[]) == "deleted-uid"
    assert orphaned_turn(left, me=ME.uid, request_key="its-request", peers=[]) is None, "a re-applied request"
    assert orphaned_turn(left, me="deleted-uid", request_key="mine", peers=[]) is None, "its own turn"
    still_there = peer("still-there", age=60, phase=RUNNING, attempt=1)
    holder = progress(status="running", run_uid=still_there.uid)
    assert orphaned_turn(holder, me=ME.uid, request_key="mine", peers=[still_there]) is None, "not deleted"
    assert orphaned_turn(progress(status="completed", run_uid="x"), me=ME.uid, request_key="", peers=[]) is None
    kwargs: dict[str, Any] = dict(spec=make_spec(), pod=None, progress=None, limits=LIMITS, run=ME, now=NOW)
    waiting = decide_run(status=AgentRunStatus(), orphan=OrphanedTurn("deleted-uid", ("gone-1",)), **kwargs)
    assert waiting.create_attempt is None, "GUARANTEE BROKEN: a pod while the deleted run's runner may still write"
    assert waiting.status["reason"] == Reason.THREAD_BUSY and "gone-1" in waiting.status["message"]
    assert waiting.waits_for_pods == ("gone-1",)
    d = decide_run(status=AgentRunStatus(), orphan=OrphanedTurn("deleted-uid"), **kwargs)
    assert d.create_attempt == 1 and d.take_over_from == "deleted-uid"
    plain = decide_run(status=AgentRunStatus(), **kwargs)
    assert plain.create_attempt == 1 and plain.take_over_from is None


def test_a_waiting_run_starts_once_the_holder_ends() -> None:
    holder = peer("first-turn", age=600, phase=RUNNING, attempt=1)
    kwargs: dict[str, Any] = dict(spec=make_spec(), pod=None, progress=None, limits=LIMITS, run=ME)
    waiting = decide_run(status=AgentRunStatus(), now=NOW, peers=[holder], **kwargs)
    status = applied({}, waiting)
    assert status["reason"] == Reason.THREAD_BUSY
    again = decide_run(status=AgentRunStatus.parse(status), now=later(1), peers=[holder], **kwargs)
    assert again.create_attempt is None and applied(status, again) == status, (
        "a run still waiting must not start nor rewrite its status"
    )
    ended = dataclasses.replace(holder, phase=SUCCEEDED)
    d = decide_run(status=AgentRunStatus.parse(status), now=later(2), peers=[ended], **kwargs)
    assert d.create_attempt == 1 and d.status["reason"] == Reason.POD_CREATED
    assert d.status["startTime"] == iso(later(2)), "startTime is when the run started, not when it was applied"


def test_a_started_run_is_never_held_back_by_the_thread_rule() -> None:
    """Its own next attempts (crash restarts, resumes) must not wait for a newer run: that would deadlock."""
    newer = peer("newer", age=5, phase=RUNNING, attempt=1)
    status = applied(run_status(), decide(make_spec(), run_status(), view(terminated(1)), None, NOW, LIMITS))
    d = decide_run(
        spec=make_spec(),
        status=AgentRunStatus.parse(status),
        pod=view(terminated(1)),
        progress=None,
        now=later(5),
        limits=LIMITS,
        run=dataclasses.replace(ME, attempt=1),
        peers=[newer],
    )
    assert d.create_attempt == 2


def test_stop_of_a_waiting_run_ends_it_without_a_pod() -> None:
    holder = peer("holder", age=600, phase=RUNNING, attempt=1)
    d = decide_run(
        spec=make_spec(stop=True),
        status=AgentRunStatus(phase=PENDING, reason=Reason.THREAD_BUSY),
        pod=None,
        progress=None,
        now=NOW,
        limits=LIMITS,
        run=ME,
        peers=[holder],
    )
    assert d.status["phase"] == STOPPED and d.status["reason"] == Reason.STOPPED_BEFORE_START
    assert d.create_attempt is None


def test_store_secret_problem_fails_the_run_unless_it_is_stopping() -> None:
    problem = StoreProblem(reason=Reason.STORE_SECRET_NOT_FOUND, message="store secret ns/s does not exist")
    kwargs: dict[str, Any] = dict(pod=None, progress=None, now=NOW, limits=LIMITS, store_problem=problem)
    d = decide_run(spec=make_spec(), status=AgentRunStatus(), **kwargs)
    assert d.status["phase"] == FAILED and d.status["reason"] == Reason.STORE_SECRET_NOT_FOUND
    assert d.create_attempt is None
    stopping = decide_run(spec=make_spec(stop=True), status=AgentRunStatus(), **kwargs)
    assert stopping.status["phase"] == STOPPED, "a stop needs no store: the run ends Stopped, not Failed"


def test_invalid_spec_is_rejected_with_its_reason() -> None:
    d = rejected(InvalidSpec("spec.graph: bad"))
    assert d.status["phase"] == FAILED and d.status["reason"] == Reason.INVALID_SPEC
    assert d.events == [("Warning", "InvalidSpec", "spec.graph: bad")]


def test_at_rest_covers_ended_and_deleted_runs() -> None:
    assert at_rest(AgentRunStatus(phase=SUCCEEDED), deleting=False)
    assert at_rest(AgentRunStatus(phase=RUNNING), deleting=True)
    assert not at_rest(AgentRunStatus(phase=PENDING, reason=Reason.THREAD_BUSY), deleting=False)


@pytest.mark.parametrize(
    ("pod", "status", "reason"),
    [
        pytest.param(terminated(6), {}, "Preempted", id="disruption-labels-its-cause"),
        pytest.param(None, {}, "PodDeleted", id="pod-deleted"),
        pytest.param(terminated(1), {"nextAttemptTime": iso(NOW)}, "BackOff", id="restart-after-backoff"),
    ],
)
def test_a_reschedule_says_why(pod: dict[str, Any] | None, status: dict[str, Any], reason: str) -> None:
    d = decide(make_spec(), run_status(**status), view(pod) if pod else None, None, NOW, LIMITS)
    assert d.create_attempt == 2 and d.reschedule_reason == reason
