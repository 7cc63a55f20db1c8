"""Operator decisions of issue 14 and Job parity: a request has an identity, retries, tool errors, deadlines, ttl.

Pure, like tests/unit/test_operator_decisions.py (these rows reuse the same
kubelet-shaped pod builders, tests/unit/decisions_support.py): status, pod, store progress and the request's
recorded turn in, one Decision out.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from agentrun.checkpoint.base import Turn
from agentrun_operator.decide import jobparity, toolerrors
from agentrun_operator.decide.conditions import status_patch
from agentrun_operator.decide.decision import Decision
from agentrun_operator.decide.identity import RecordedTurn, recorded_outcome, request_key
from agentrun_operator.decide.reasons import Phase, Reason
from agentrun_operator.decide.run import at_rest
from agentrun_operator.decide.run import decide as decide_run
from agentrun_operator.decide.spec import AgentRunSpec
from agentrun_operator.decide.status import AgentRunStatus
from agentrun_operator.decide.thread import ThreadPeer
from agentrun_operator.io import metrics
from tests.unit.decisions_support import (
    LIMITS,
    NOW,
    STARTED,
    make_spec,
    progress,
    run_status,
    running,
    terminated,
    view,
)

UID = "uid-of-this-run"
EARLIER = "uid-of-the-earlier-run"
KEY = "shop/support-order-4821/0123456789abcdef"
INPUT = {"messages": [{"role": "user", "content": "charge my saved card for order 4821"}]}


def turn(status: str, **fields: Any) -> RecordedTurn:
    base: dict[str, Any] = dict(
        request_key=KEY,
        status=status,
        version=9,
        run_uid=EARLIER,
        updated_at=(NOW - timedelta(minutes=5)).timestamp(),
        tool_calls={"executed": 3, "replayed": 0},
    )
    return RecordedTurn(**{**base, **fields})


def decide(
    spec: AgentRunSpec,
    status: dict[str, Any] | None = None,
    *,
    pod: dict[str, Any] | None = None,
    store: Any = None,
    recorded: RecordedTurn | None = None,
    peers: tuple[ThreadPeer, ...] = (),
    now: datetime = NOW,
) -> Decision:
    return decide_run(
        spec=spec,
        status=AgentRunStatus.parse(status or {}),
        pod=view(pod) if pod is not None else None,
        progress=store,
        now=now,
        limits=LIMITS,
        run=ThreadPeer(name="support-order-4821", uid=UID, created=STARTED),
        peers=peers,
        request_key=KEY,
        turn=recorded,
    )


# --- the request key ------------------------------------------------------------------------------------------------


def test_the_request_key_is_spec_request_id_as_is() -> None:
    assert request_key(namespace="shop", name="a", request_id="charge-4821", input=INPUT) == "charge-4821"


def test_the_derived_request_key_is_stable_across_reapplies_and_key_order() -> None:
    first = request_key(namespace="shop", name="a", request_id=None, input={"x": 1, "y": [1, 2]})
    again = request_key(namespace="shop", name="a", request_id=None, input={"y": [1, 2], "x": 1})
    assert first == again, "the same manifest re-applied must be the same request (canonical JSON)"
    assert first.startswith("shop/a/") and len(first.rsplit("/", 1)[1]) == 16


@pytest.mark.parametrize(
    ("namespace", "name", "input"),
    [
        pytest.param("other", "a", {"x": 1}, id="namespace"),
        pytest.param("shop", "b", {"x": 1}, id="run-name"),
        pytest.param("shop", "a", {"x": 2}, id="input"),
        pytest.param("shop", "a", None, id="no-input"),
    ],
)
def test_a_different_namespace_name_or_input_is_a_different_request(
    namespace: str, name: str, input: dict[str, Any] | None
) -> None:
    base = request_key(namespace="shop", name="a", request_id=None, input={"x": 1})
    assert request_key(namespace=namespace, name=name, request_id=None, input=input) != base


def test_a_store_turn_converts_to_the_decision_input() -> None:
    stored = Turn(
        thread_id="shop/order-4821",
        request_key=KEY,
        run_uid=EARLIER,
        status="completed",
        version=9,
        started_at=1.0,
        updated_at=2.0,
        result={"message": "Done.", "digest": "sha256:ab", "truncated": False},
        tool_calls={"executed": 3},
    )
    seen = RecordedTurn.of(stored)
    assert (seen.status, seen.version, seen.run_uid, seen.result) == ("completed", 9, EARLIER, stored.result)


# --- before the first pod: the recorded outcome ----------------------------------------------------------------------


def test_a_completed_request_is_succeeded_already_completed_without_a_pod() -> None:
    result = {"message": "Done. charge_card: succeeded", "digest": "sha256:" + "ab" * 32, "truncated": False}
    d = decide(make_spec(), recorded=turn("completed", result=result))
    assert d.create_attempt is None, "GUARANTEE BROKEN: a completed request got a pod (the card would be charged)"
    assert (d.status["phase"], d.status["reason"]) == (Phase.SUCCEEDED, Reason.ALREADY_COMPLETED)
    assert d.status["stateVersion"] == 9 and d.status["result"] == {
        "message": result["message"],
        "digest": result["digest"],
    }
    assert "completionTime" in d.status
    [event] = d.events
    assert event.type == "Normal" and event.reason == Reason.ALREADY_COMPLETED
    assert EARLIER in event.message and "2025-03-01T11:55:00Z" in event.message, "the Event names the earlier run"


def test_a_completed_request_does_not_wait_for_the_thread() -> None:
    busy = ThreadPeer(name="older", uid="older-uid", created=STARTED - timedelta(hours=1), attempt=1)
    d = decide(make_spec(), recorded=turn("completed"), peers=(busy,))
    assert d.status["reason"] == Reason.ALREADY_COMPLETED, "the answer needs no thread: it must not wait ThreadBusy"


def test_a_failed_request_shows_the_recorded_failure_with_its_reason() -> None:
    error = {"code": "TOOL_ERROR_001", "message": "charge_card failed: card declined"}
    d = decide(make_spec(), recorded=turn("failed", error=error))
    assert d.create_attempt is None
    assert (d.status["phase"], d.status["reason"]) == (Phase.FAILED, Reason.TOOL_ERROR)
    assert d.status["message"].startswith("TOOL_ERROR_001: charge_card failed: card declined")
    assert "spec.retry" in d.status["message"], "the message says how to run it again"
    other = decide(make_spec(), recorded=turn("failed", error={"code": "GRAPH_001", "message": "boom"}))
    assert other.status["reason"] == Reason.RUN_FAILED


def test_a_stopped_request_stays_stopped() -> None:
    d = decide(make_spec(), recorded=turn("stopped"))
    assert d.create_attempt is None and d.status["phase"] == Phase.STOPPED


@pytest.mark.parametrize(
    ("recorded", "spec_fields"),
    [
        pytest.param(None, {}, id="new-request"),
        pytest.param(turn("running"), {}, id="in-progress-resumed-by-the-runner"),
        pytest.param(turn("interrupted"), {}, id="interrupted"),
        pytest.param(turn("completed", run_uid=UID), {}, id="own-turn-after-operator-restart"),
        pytest.param(turn("failed", error={"code": "X_001", "message": "m"}), {"retry": 1}, id="retried-failure"),
    ],
)
def test_otherwise_the_first_pod_starts(recorded: RecordedTurn | None, spec_fields: dict[str, Any]) -> None:
    d = decide(make_spec(**spec_fields), recorded=recorded)
    assert d.create_attempt == 1 and d.status["reason"] == Reason.POD_CREATED


def test_an_in_progress_request_still_follows_the_thread_rule() -> None:
    busy = ThreadPeer(name="older", uid="older-uid", created=STARTED - timedelta(hours=1), attempt=1)
    d = decide(make_spec(), recorded=turn("running"), peers=(busy,))
    assert d.create_attempt is None and d.status["reason"] == Reason.THREAD_BUSY


def test_the_recorded_outcome_is_consulted_only_before_the_first_pod() -> None:
    d = decide(make_spec(), run_status(), pod=running(), recorded=turn("completed"))
    assert d.status.get("reason") != Reason.ALREADY_COMPLETED, "a started run is decided by its own pod"


def test_recorded_outcome_of_nothing_is_none() -> None:
    assert recorded_outcome(None, run_uid=UID, retried=False, now=NOW) is None


# --- spec.retry ------------------------------------------------------------------------------------------------------

FAILED_STATUS = run_status(
    Phase.FAILED, attempt=2, restarts=3, reason="BackoffLimitExceeded", completionTime="2025-03-01T11:59:00Z"
)


def test_a_bumped_retry_reopens_a_failed_run_with_the_next_attempt() -> None:
    d = decide(make_spec(retry=1), FAILED_STATUS, pod=terminated(1, attempt=2))
    assert d.create_attempt == 3, "the retry must start the next attempt (it resumes the same turn)"
    assert d.status["observedRetry"] == 1 and d.status["restarts"] == 0, "restarts reset on retry"
    assert d.status["completionTime"] is None and d.status["phase"] == Phase.PENDING
    assert d.reschedule_reason == "Retry"


@pytest.mark.parametrize(
    ("retry", "status"),
    [
        pytest.param(0, FAILED_STATUS, id="not-bumped"),
        pytest.param(1, {**FAILED_STATUS, "observedRetry": 1}, id="already-observed"),
        pytest.param(1, run_status(Phase.SUCCEEDED, reason="Completed"), id="succeeded-stays"),
        pytest.param(1, run_status(Phase.STOPPED, reason="Stopped"), id="stopped-stays"),
    ],
)
def test_retry_reopens_only_a_failed_run_once_per_bump(retry: int, status: dict[str, Any]) -> None:
    d = decide(make_spec(retry=retry), status, pod=terminated(1, attempt=2))
    assert d.create_attempt is None and not d.status
    assert at_rest(AgentRunStatus.parse(status), deleting=False, retry=retry)


def test_a_pending_retry_is_not_at_rest() -> None:
    assert not at_rest(AgentRunStatus.parse(FAILED_STATUS), deleting=False, retry=1)
    assert at_rest(AgentRunStatus.parse(FAILED_STATUS), deleting=True, retry=1)


def test_retrying_a_run_that_never_had_a_pod_starts_its_first_attempt() -> None:
    status = {"phase": "Failed", "reason": "RunFailed", "attempt": 0}
    failed = turn("failed", error={"code": "GRAPH_001", "message": "boom"})
    d = decide(make_spec(retry=1), status, recorded=failed)
    assert d.create_attempt == 1, "a retried recorded failure resumes the turn in a pod"
    assert d.status["observedRetry"] == 1


@pytest.mark.parametrize("raw", [None, {}, {"retry": "1"}, {"retry": True}, {"retry": -1}, {"retry": 2.5}])
def test_a_hostile_raw_retry_reads_as_zero(raw: Any) -> None:
    assert jobparity.retry_of(raw) == 0
    assert jobparity.retry_of({"retry": 3}) == 3


@pytest.mark.parametrize(
    ("spec", "status", "refused"),
    [
        pytest.param({}, FAILED_STATUS, None, id="failed"),
        pytest.param({"retry": 1}, FAILED_STATUS, None, id="failed-retry-pending"),
        pytest.param({"stop": True}, FAILED_STATUS, "failed after a stop was requested", id="failed-after-stop"),
        pytest.param({}, run_status(Phase.STOPPED, reason="Stopped"), "was stopped (spec.stop is one-way)", id="stop"),
        pytest.param({}, run_status(Phase.SUCCEEDED, reason="Completed"), "nothing to retry", id="succeeded"),
        pytest.param({}, run_status(Phase.INTERRUPTED), "has not failed (phase Interrupted)", id="waiting"),
        pytest.param({"retry": 1000}, {**FAILED_STATUS, "observedRetry": 1000}, "retried 1000 times", id="max"),
    ],
)
def test_a_retry_is_offered_for_a_failed_run_only_and_refusals_say_what_to_do(
    spec: dict[str, Any], status: dict[str, Any], refused: str | None
) -> None:
    # kubectl agentrun retry and the run page's Retry (issue 32 item 5) ask this one rule.
    why = jobparity.retry_refusal("r", spec, AgentRunStatus.parse(status))
    if refused is None:
        assert why is None, why
    else:
        assert why is not None and refused in why, why
        if "stop" in refused:
            assert "new AgentRun with the same threadId" in why, "a refusal says what to do instead"


def test_the_next_retry_is_above_both_the_spec_and_the_retry_acted_on() -> None:
    failed = AgentRunStatus.parse({**FAILED_STATUS, "observedRetry": 2})
    assert jobparity.next_retry({}, failed) == 3, "a run created with retry 2 then failed retries as 3"
    assert jobparity.next_retry({"retry": 2}, failed) == 3
    assert jobparity.next_retry({"retry": 5}, failed) == 6


# --- tool errors -----------------------------------------------------------------------------------------------------

LAST_ERROR = {"tool": "charge_card", "code": "TOOL_ERROR", "message": "ValueError: no order 9999"}


def failing(**fields: Any) -> Any:
    counts = {"executed": 0, "replayed": 0, "failed": 3, "in_doubt": 1}
    return progress(**{"request_key": KEY, "tool_calls": counts, "last_tool_error": LAST_ERROR, **fields})


def test_failed_tool_calls_show_in_status_a_condition_an_event_and_the_metric_input() -> None:
    d = decide(make_spec(), run_status(), pod=running(), store=failing())
    assert d.status["toolCalls"] == {"executed": 0, "replayed": 0, "failed": 3, "inDoubt": 1}
    active, reason, message = d.conditions["ToolErrors"]
    assert active and reason == Reason.TOOL_ERROR
    assert "charge_card" in message and "TOOL_ERROR" in message and "no order 9999" in message
    warnings = [e for e in d.events if e.reason == Reason.TOOL_ERROR]
    assert len(warnings) == 1 and warnings[0].type == "Warning", "one Warning Event per reconcile, not per call"
    assert d.tool_failures == {"charge_card": 3}


@pytest.mark.parametrize(
    ("counts", "summary", "phase"),
    [
        ({"executed": 0, "replayed": 0, "failed": 3}, "3 failed", "Succeeded with 3 failed tool calls"),
        (
            {"executed": 2, "replayed": 1, "failed": 1},
            "2 run, 1 replayed, 1 failed",
            "Succeeded with 1 failed tool call",
        ),
        ({"executed": 3, "replayed": 0, "in_doubt": 1}, "3 run, 1 in doubt", "Succeeded"),
        ({"executed": 0, "replayed": 0}, "none", "Succeeded"),
    ],
)
def test_the_tools_column_and_the_phase_words_say_failed_calls(
    counts: dict[str, int], summary: str, phase: str
) -> None:
    """Issue 32: all three calls failed, and kubectl get ar showed a plain Succeeded run (the counts sat in
    describe only). status.toolSummary (the Tools column) names every non-zero outcome, failures first-class."""
    d = decide(make_spec(), run_status(), pod=running(), store=progress(request_key=KEY, tool_calls=counts))
    assert d.status["toolSummary"] == summary, (
        f"GUARANTEE BROKEN: the Tools column must name the failed calls: {d.status.get('toolSummary')!r}"
    )
    assert toolerrors.phase_words("Succeeded", d.status["toolCalls"]) == phase


def test_no_event_and_no_count_when_failed_did_not_grow() -> None:
    seen = run_status(toolCalls={"executed": 0, "replayed": 0, "failed": 3})
    d = decide(make_spec(), seen, pod=running(), store=failing())
    assert not [e for e in d.events if e.reason == Reason.TOOL_ERROR] and d.tool_failures == {}
    assert d.conditions["ToolErrors"][0], "the condition stays True"


def test_a_tool_error_message_is_bounded_and_one_line() -> None:
    huge = {"tool": "t", "code": "C", "message": "line\n" * 1000}
    d = decide(make_spec(), run_status(), pod=running(), store=failing(last_tool_error=huge))
    message = d.conditions["ToolErrors"][2]
    assert "\n" not in message and len(message) <= 600


def test_no_tool_errors_no_condition() -> None:
    d = decide(make_spec(), run_status(), pod=running(), store=progress(request_key=KEY))
    assert "ToolErrors" not in d.conditions and "failed" not in d.status["toolCalls"]


def test_the_previous_turns_failures_are_not_this_runs() -> None:
    d = decide(make_spec(), run_status(), pod=running(), store=failing(request_key="shop/earlier/xyz"))
    assert "ToolErrors" not in d.conditions and d.tool_failures == {}
    assert "failed" not in d.status.get("toolCalls", {}), "the thread's previous turn leaked into this run's counters"


def test_a_new_turn_on_the_thread_shows_none_of_the_previous_turns_tool_calls() -> None:
    # A second AgentRun on the thread whose pod has not checkpointed yet: the thread's latest turn is the earlier one.
    earlier = progress(request_key="shop/earlier/xyz", tool_calls={"executed": 3, "replayed": 2})
    d = decide(make_spec(), run_status(), pod=running(), store=earlier)
    assert "toolCalls" not in d.status, (
        f"GUARANTEE BROKEN: the previous turn's calls show (and are counted) as this run's: {d.status.get('toolCalls')}"
    )
    own = decide(make_spec(), run_status(), pod=running(), store=progress(request_key=KEY, tool_calls={"executed": 1}))
    assert own.status["toolCalls"] == {"executed": 1, "replayed": 0}, "this run's own turn is mirrored"


def test_an_already_completed_request_shows_the_recorded_counts_and_counts_nothing_again() -> None:
    usage = {"m": {"tokens": {"prompt": 100, "completion": 20}, "requests": {"ok": 1}}}
    counts = {"executed": 3, "replayed": 0, "failed": 1}
    # The re-applied request is the thread's latest turn: the store's progress is that turn's.
    latest = progress(
        request_key=KEY, status="completed", tool_calls=counts, model_usage=usage, last_tool_error=LAST_ERROR
    )
    d = decide(make_spec(), store=latest, recorded=turn("completed", tool_calls=counts))
    assert d.status["reason"] == Reason.ALREADY_COMPLETED
    assert d.status["toolCalls"] == {"executed": 3, "replayed": 0, "failed": 1}, "the recorded turn's counts, once"
    assert d.recorded_counts, "GUARANTEE BROKEN: the metrics would count the earlier run's calls a second time"
    assert "modelUsage" not in d.status, "the earlier run's model usage is not this run's (its operator counted it)"
    assert d.tool_failures == {} and not [e for e in d.events if e.reason == Reason.TOOL_ERROR]
    assert d.conditions["ToolErrors"][0], "the recorded failures still show"


def test_a_succeeded_run_gets_its_result() -> None:
    result = {"message": "Done.", "digest": "sha256:" + "cd" * 32, "truncated": False}
    done = progress(request_key=KEY, status="completed", current_node="__end__", result=result)
    d = decide(make_spec(), run_status(), pod=terminated(0), store=done)
    assert d.status["phase"] == Phase.SUCCEEDED and d.status["result"]["digest"] == result["digest"]


def test_the_tool_metric_keeps_its_labels_bounded() -> None:
    for i in range(metrics.TOOL_LABELS_MAX * 3):
        metrics.tool_failed(f"tool_{i}", 1)
    labels = {s.labels["tool"] for m in metrics.TOOL_CALLS_FAILED.collect() for s in m.samples if "tool" in s.labels}
    assert len(labels) <= metrics.TOOL_LABELS_MAX + 2, "a graph with many tools must not explode the series"
    assert {"other", "unknown"} <= labels, "the fallback labels exist from the start, so panels show 0"


def test_fail_on_tool_error_reaches_the_runner_config_and_its_exit_is_reason_tool_error() -> None:
    assert make_spec(config={"failOnToolError": True}).run_config() == {"failOnToolError": True}
    assert "failOnToolError" not in make_spec().run_config(), "unset: the runtime's default applies"
    pod = terminated(5, message="TOOL_ERROR_001: charge_card failed: ValueError: no order 9999")
    d = decide(make_spec(config={"failOnToolError": True}), run_status(), pod=pod)
    assert (d.status["phase"], d.status["reason"]) == (Phase.FAILED, Reason.TOOL_ERROR)


# --- activeDeadlineSeconds and ttlSecondsAfterFinished --------------------------------------------------------------

DEADLINE = 3600  # STARTED is NOW - 1 h


def test_past_the_deadline_a_running_pod_is_deleted_and_the_run_fails() -> None:
    d = decide(make_spec(activeDeadlineSeconds=DEADLINE), run_status(), pod=running())
    assert (d.status["phase"], d.status["reason"]) == (Phase.FAILED, Reason.DEADLINE_EXCEEDED)
    assert d.delete_pod == "support-order-4821-1" and d.delete_grace is None, "graceful: the runner checkpoints"
    assert "completionTime" in d.status


def test_before_the_deadline_nothing_happens() -> None:
    d = decide(make_spec(activeDeadlineSeconds=DEADLINE + 1), run_status(), pod=running())
    assert d.delete_pod is None and d.status.get("phase") is None


@pytest.mark.parametrize(
    ("status", "pod"),
    [
        pytest.param(run_status(Phase.INTERRUPTED), terminated(3), id="waiting-for-an-answer"),
        pytest.param(run_status(nextAttemptTime="2025-03-01T12:05:00Z", restarts=1), terminated(1), id="in-backoff"),
    ],
)
def test_the_deadline_ends_a_waiting_run_too(status: dict[str, Any], pod: dict[str, Any]) -> None:
    d = decide(make_spec(activeDeadlineSeconds=DEADLINE), status, pod=pod)
    assert d.status["reason"] == Reason.DEADLINE_EXCEEDED and d.create_attempt is None


def test_a_run_that_completed_by_itself_keeps_its_outcome_past_the_deadline() -> None:
    d = decide(
        make_spec(activeDeadlineSeconds=DEADLINE), run_status(), pod=terminated(0), store=failing(status="completed")
    )
    assert d.status["reason"] == Reason.COMPLETED


def test_a_run_that_has_not_started_has_no_deadline_yet() -> None:
    d = decide(make_spec(activeDeadlineSeconds=1), {})
    assert d.create_attempt == 1


def test_ttl_after_finished() -> None:
    finished = AgentRunStatus.parse({"phase": "Succeeded", "completionTime": "2025-03-01T12:00:00Z"})
    assert not jobparity.expired(60, finished, now=NOW + timedelta(seconds=59))
    assert jobparity.expired(60, finished, now=NOW + timedelta(seconds=60))
    assert jobparity.expired(0, finished, now=NOW)
    assert not jobparity.expired(None, finished, now=NOW + timedelta(days=365)), "unset: kept"
    running_ = AgentRunStatus.parse({"phase": "Running", "completionTime": "2025-03-01T12:00:00Z"})
    assert not jobparity.expired(0, running_, now=NOW + timedelta(days=1)), "a live run is never expired"


# --- conditions carry every metav1.Condition field -------------------------------------------------------------------


def test_every_condition_written_has_all_metav1_condition_fields() -> None:
    d = decide(make_spec(), run_status(), pod=running(), store=failing())
    patch = status_patch(AgentRunStatus.parse(run_status()), d.status, now=NOW, generation=4, conditions=d.conditions)
    d2 = decide(make_spec(), run_status(), pod=terminated(0), store=failing(status="completed"))
    patch2 = status_patch(
        AgentRunStatus.parse(run_status()), d2.status, now=NOW, generation=4, conditions=d2.conditions
    )
    fields = {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
    for condition in [*patch.get("conditions", []), *patch2.get("conditions", [])]:
        assert set(condition) == fields, f"condition {condition.get('type')} lacks {fields - set(condition)}"
    assert {c["type"] for c in patch2["conditions"]} >= {"Succeeded", "ToolErrors"}
