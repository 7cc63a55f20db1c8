"""The run history model (agentrun.history) from hand-made store rows, and the web view's escaping (pure).

The rows are shaped as ``pg_history`` reads them: digests and previews computed by the store (``shown``
and ``record`` below do here what its SQL does), JSON values as text.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from agentrun.checkpoint.pg_history import ThreadRows
from agentrun.history import DEPTH_MARKER, MAX_DEPTH, PREVIEW_CHARS, build, digest
from agentrun.ledger import idempotency_key
from agentrun_history import listing, pages

pytestmark = pytest.mark.unit

THREAD = "default/order-1"


def shown(value: Any) -> str | None:
    """The digest the store reads of ``value`` (a string's own text, else its JSON), as JSON text."""
    if value is None:
        return None
    return digest(value if isinstance(value, str) else json.dumps(value)).model_dump_json()


def state(version: int, node: str, status: str, attempt: int, at: float, **meta: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"version": version, "current_node": node, "step": version - 1, "status": status}
    row.update(attempt=attempt, run_uid="uid-1", at=at)
    for key in ("error", "result", "stop_reason"):
        row[key] = json.dumps(meta[key]) if key in meta else None
    interrupts = meta.get("interrupts")
    row["interrupts"] = (
        json.dumps(
            [
                {"id": i["id"], "message": i.get("message"), "payload": json.loads(shown(i.get("payload")) or "null")}
                for i in interrupts
            ]
        )
        if interrupts
        else None
    )
    resume = meta.get("resume")
    row["resume"] = json.dumps({k: json.loads(shown(v) or "null") for k, v in resume.items()}) if resume else None
    row["resume_all"] = shown(resume)
    return row


def message(idx: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
    calls = [
        {"id": c["id"], "name": c["name"], "arguments": json.loads(shown(c["arguments"]) or "null")}
        for c in body.get("tool_calls", [])
    ]
    return {
        "idx": idx,
        "message_id": body.get("id"),
        "version": version,
        "id": body.get("id"),
        "role": body["role"],
        "tool_call_id": body.get("tool_call_id"),
        "is_error": bool(body.get("is_error")),
        "content": shown(body.get("content")),
        "tool_calls": json.dumps(calls) if calls else None,
    }


def request(*calls: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "id": "m-ai",
        "role": "assistant",
        "tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in calls],
    }


def answer(call_id: str, name: str, content: str, *, error: bool = False) -> dict[str, Any]:
    return {
        "id": f"m-{call_id}",
        "role": "tool",
        "tool_call_id": call_id,
        "name": name,
        "content": content,
        "is_error": error,
    }


def record(content: str, name: str, call_id: str, *, attempt: int, at: float, error: bool = False) -> dict[str, Any]:
    """A ledger row: the digest of the stored envelope, the preview of the content the model read."""
    whole = digest(json.dumps({"__kind__": "message", "value": answer(call_id, name, content, error=error)}))
    return {
        "tool_call_id": f"m-ai:{call_id}",
        "tool_name": name,
        "attempt": attempt,
        "run_uid": "uid-1",
        "at": at,
        "result_sha256": whole.sha256,
        "result_bytes": whole.bytes,
        "result_preview": content[:PREVIEW_CHARS],
        "result_truncated": len(content) > PREVIEW_CHARS,
        "result_is_error": error,
    }


def crashed_run() -> ThreadRows:
    """charge_card recorded by attempt 1, which died; attempt 2 checkpointed its answer from the ledger."""
    return ThreadRows(
        states=[
            state(1, "model", "running", 1, 100.0),
            state(2, "tools", "running", 1, 100.5),
            state(3, "model", "running", 2, 110.0),
            state(4, "__end__", "completed", 2, 110.2, result={"message": "Done", "digest": "sha256:ab"}),
        ],
        messages=[
            message(1, 2, request(("call_1", "charge_card", '{"order_id": "1"}'), ("call_2", "send_receipt", "{}"))),
            message(2, 3, answer("call_1", "charge_card", "charged")),
            message(3, 3, answer("call_2", "send_receipt", "sent")),
        ],
        ledger=[
            record("charged", "charge_card", "call_1", attempt=1, at=101.0),
            record("sent", "send_receipt", "call_2", attempt=2, at=109.5),
        ],
        intents=[
            {
                "tool_call_id": "m-ai:call_1",
                "tool_name": "charge_card",
                "idempotency_key": "ar-x",
                "attempt": 1,
                "run_uid": "uid-1",
                "at": 100.75,
            },
            {
                "tool_call_id": "m-ai:call_2",
                "tool_name": "send_receipt",
                "idempotency_key": "ar-y",
                "attempt": 1,
                "run_uid": "uid-1",
                "at": 100.8,
            },
        ],
        inputs=[{"attempt": 2, "resume": None, "at": 108.0}],
        # Attempt 2's runner registered at 109.0 (its pod created at 108.0): its pod start is 1 s.
        owner={"attempt": 2, "run_uid": "uid-1", "at": 109.0},
    )


def test_a_call_recorded_by_a_dead_attempt_and_answered_by_the_next_is_replayed() -> None:
    history = build(
        crashed_run(),
        namespace="default",
        name="order-1",
        thread_id=THREAD,
        status={
            "phase": "Succeeded",
            "attempts": [
                {
                    "attempt": 1,
                    "podName": "order-1-1",
                    "outcome": "Crashed",
                    "exitCode": 137,
                    "startTime": "2026-01-01T00:00:00Z",
                },
                {"attempt": 2, "podName": "order-1-2", "outcome": "Completed", "exitCode": 0},
            ],
        },
    )
    charge, receipt = history.tool_calls
    assert (charge.name, charge.outcome, charge.attempt, charge.replayed_in) == ("charge_card", "replayed", 1, [2])
    assert (charge.duration_seconds, charge.duration_from) == (0.25, "intent") and charge.idempotency_key == "ar-x"
    assert charge.arguments is not None and charge.arguments.preview == '{"order_id": "1"}'
    assert charge.result is not None and charge.result.preview == "charged" and charge.result.bytes > 7
    # In doubt in attempt 1 (an intent, no record), run again and recorded by attempt 2: its duration runs
    # from attempt 2's runner being ready (its registration, 109.0), an upper bound; never from its pod's
    # creation (108.0: the pod's start is no part of a call).
    assert (receipt.outcome, receipt.attempt, receipt.in_doubt_in) == ("executed", 2, [1])
    assert (receipt.duration_seconds, receipt.duration_from) == (0.5, "node")
    first, second = history.attempts
    assert (first.pod, first.exit_code, first.steps, first.tool_calls_executed) == ("order-1-1", 137, 2, 1)
    assert (first.last_node, second.last_node) == ("tools", "__end__")
    assert (second.pod, second.started_at, second.tool_calls_replayed, second.tool_calls_executed) == (
        "order-1-2",
        108.0,
        1,
        1,
    )
    # Attempt 2's first step runs from its registration, not from its pod's creation (2.0 s with the pod start).
    assert [s.duration_seconds for s in history.steps] == [None, 0.5, 1.0, 0.2]
    assert [s.pod_start_seconds for s in history.steps] == [None, None, 1.0, None]
    assert second.pod_start_seconds == 1.0
    assert history.result is not None and history.result.sha256 == "ab" and history.status == "completed"


def test_an_intent_without_a_record_is_in_doubt_and_an_error_answer_is_failed() -> None:
    rows = ThreadRows(
        states=[state(1, "tools", "running", 1, 1.0), state(2, "model", "running", 1, 2.0)],
        messages=[
            message(1, 1, request(("c1", "refund", "{}"), ("c2", "lookup", "{bad"))),
            message(2, 2, answer("c1", "refund", "in doubt: a human must check", error=False)),
            message(3, 2, answer("c2", "lookup", "Error: invalid JSON arguments", error=True)),
        ],
        intents=[
            {
                "tool_call_id": "m-ai:c1",
                "tool_name": "refund",
                "idempotency_key": None,
                "attempt": 1,
                "run_uid": None,
                "at": 1.5,
            }
        ],
    )
    refund, lookup = build(rows, namespace="default", name="r", thread_id=THREAD).tool_calls
    assert refund.outcome == "in_doubt" and refund.idempotency_key == idempotency_key(THREAD, "m-ai:c1")
    assert lookup.outcome == "failed" and lookup.result is not None and lookup.result.preview.startswith("Error")


def test_an_interrupt_shows_its_question_and_the_answer_the_resumed_attempt_used() -> None:
    question = [{"id": "i-1", "payload": {"amount": 120}, "message": "approve?", "node": "tools"}]
    rows = ThreadRows(
        states=[
            state(1, "tools", "interrupted", 1, 5.0, interrupts=question),
            state(2, "model", "running", 2, 9.0, resume={"i-1": True}),
        ],
    )
    (interrupt,) = build(rows, namespace="default", name="r", thread_id=THREAD).interrupts
    assert (interrupt.ids, interrupt.message, interrupt.answered_in_attempt) == (["i-1"], "approve?", 2)
    assert interrupt.answer is not None and interrupt.answer.preview == "true" and interrupt.answered_at == 9.0
    assert interrupt.payload is not None and json.loads(interrupt.payload.preview) == {"amount": 120}


def test_an_answer_not_resumed_yet_shows_the_value_sent_not_the_operators_wrapping() -> None:
    # The Answer column showed {"values": {"d545774b37977364": true}} until the next attempt checkpointed.
    question = [{"id": "i-1", "payload": {"amount": 120}, "message": "approve?", "node": "tools"}]
    sent = {"values": {"i-1": {"ok": True, "note": "checked"}}}
    rows = ThreadRows(
        states=[state(1, "tools", "interrupted", 1, 5.0, interrupts=question)],
        inputs=[{"attempt": 2, "resume": shown(sent), "at": 7.0}],
    )
    (interrupt,) = build(rows, namespace="default", name="r", thread_id=THREAD).interrupts
    assert interrupt.answer is not None and json.loads(interrupt.answer.preview) == {"ok": True, "note": "checked"}
    assert (interrupt.answered_at, interrupt.answered_in_attempt) == (7.0, 2)
    for resume, preview in (({"values": {"i-1": "yes"}}, "yes"), ({"value": False}, "false")):
        rows = ThreadRows(states=rows.states, inputs=[{"attempt": 2, "resume": shown(resume), "at": 7.0}])
        (interrupt,) = build(rows, namespace="default", name="r", thread_id=THREAD).interrupts
        assert interrupt.answer is not None and interrupt.answer.preview == preview, resume


def test_a_huge_result_keeps_its_size_and_digest_and_a_cut_preview() -> None:
    huge = "x" * (PREVIEW_CHARS * 50)
    rows = ThreadRows(
        states=[state(1, "tools", "running", 1, 1.0), state(2, "model", "running", 1, 2.0)],
        messages=[message(1, 1, request(("c1", "fetch", "{}"))), message(2, 2, answer("c1", "fetch", huge))],
        ledger=[record(huge, "fetch", "c1", attempt=1, at=1.5)],
    )
    (call,) = build(rows, namespace="default", name="r", thread_id=THREAD).tool_calls
    assert call.result is not None and call.result.truncated and len(call.result.preview) == PREVIEW_CHARS
    assert call.result.bytes > len(huge)  # the whole recorded envelope


def test_nothing_recorded_is_said_so() -> None:
    history = build(ThreadRows(), namespace="default", name="r", thread_id=THREAD)
    assert not history.recorded and history.tool_calls == [] and history.attempts == []


def test_the_web_view_renders_hostile_tool_output_as_text() -> None:
    hostile = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    rows = ThreadRows(
        states=[state(1, "tools", "running", 1, 1.0), state(2, "model", "running", 1, 2.0)],
        messages=[
            message(1, 1, request(("c1", hostile, json.dumps({"q": hostile})))),
            message(2, 2, answer("c1", hostile, hostile)),
        ],
    )
    history = build(rows, namespace="default", name="r", thread_id=THREAD, status={"phase": "Running"})
    html = pages.timeline(history, {"status": {"phase": "Running"}, "spec": {}})
    assert "<script>" not in html and "<img" not in html and 'onerror="' not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def page_of(spec: dict[str, Any], status: dict[str, Any]) -> str:
    """The run page's live part for a run with ``spec`` and ``status`` (nothing recorded in the store)."""
    history = build(ThreadRows(), namespace="default", name="r", thread_id=THREAD, status=status)
    return pages.timeline(history, {"metadata": {"namespace": "default", "name": "r"}, "spec": spec, "status": status})


def test_a_waiting_run_is_answered_with_a_json_value_after_a_confirmation_of_what_is_sent() -> None:
    # Issue 32 item 5: the page's buttons carry what the confirmation shows (ids, question) and app.js sends
    # the value field's JSON, or the button's default when it is empty.
    interrupt = {"id": "i-1", "ids": ["i-1", "i-2"], "message": "refund <b>120</b>?", "payload": {"amount": 120}}
    html = page_of({}, {"phase": "Interrupted", "interrupt": interrupt})
    assert re.search(r"<textarea id=answer-value [^>]*>", html), html
    approve = re.search(r'<button class="act approve" ([^>]*)>Approve</button>', html)
    reject = re.search(r'<button class="act reject" ([^>]*)>Reject</button>', html)
    assert approve and reject, html
    for button, default in ((approve.group(1), "true"), (reject.group(1), "false")):
        assert f'data-default="{default}"' in button and 'data-ids="i-1, i-2"' in button
        assert 'data-question="refund &lt;b&gt;120&lt;/b&gt;?"' in button, "the question, escaped, for the confirmation"
        assert f'data-digest="{pages.interrupt_digest(interrupt)}"' in button
    assert "<div id=act-confirm class=confirm hidden" in html, "the confirmation starts hidden"
    assert 'class="act retry"' not in html


def test_a_retry_is_offered_for_a_failed_run_with_the_retry_it_saw_and_never_twice() -> None:
    failed = {"phase": "Failed", "reason": "BackoffLimitExceeded"}
    html = page_of({}, failed)
    retry = re.search(r'<button class="act retry" ([^>]*)>Retry</button>', html)
    assert retry and 'data-retry="0"' in retry.group(1) and "spec.retry 0 -&gt; 1" in retry.group(1), html
    assert pages.ended({"spec": {}, "status": failed})

    pending = page_of({"retry": 1}, failed)
    assert 'class="act retry"' not in pending and "Retry 1 requested" in pending
    assert not pages.ended({"spec": {"retry": 1}, "status": failed}), "a requested retry keeps the live view open"
    again = page_of({"retry": 1}, {**failed, "observedRetry": 1})
    assert 'data-retry="1"' in again and "spec.retry 1 -&gt; 2" in again, "a run that failed again is retried again"

    after_stop = page_of({"stop": True}, failed)
    assert 'class="act retry"' not in after_stop and "spec.stop is one-way" in after_stop
    for phase in ("Stopped", "Succeeded", "Running"):
        assert 'class="act retry"' not in page_of({}, {"phase": phase}), phase


def test_a_stop_shows_while_requested_and_after_it_was_acknowledged() -> None:
    requested = ThreadRows(states=[state(1, "tools", "running", 1, 1.0)], stop={"reason": "user", "at": 2.0})
    stop = build(requested, namespace="default", name="r", thread_id=THREAD).stop
    assert stop is not None and (stop.reason, stop.requested_at) == ("user", 2.0)
    done = ThreadRows(
        states=[state(1, "tools", "running", 1, 1.0), state(2, "tools", "stopped", 1, 3.0, stop_reason="spec.stop")]
    )
    stop = build(done, namespace="default", name="r", thread_id=THREAD).stop
    assert stop is not None and (stop.reason, stop.requested_at) == ("spec.stop", 3.0)


def test_the_live_views_never_listen_through_a_transaction_pooler() -> None:
    from agentrun_history.store import ProgressHub

    pooled = "postgresql://u@pgbouncer:6432/agentrun?agentrun_pooler=transaction"
    assert ProgressHub(pooled).dsn is None
    direct = "postgresql://u@db:5432/agentrun"
    assert ProgressHub(pooled, listen=direct).dsn == direct
    assert ProgressHub(direct + "?agentrun_listen=off").dsn == direct


def test_a_stored_value_nested_past_the_cap_is_shown_to_the_cap_with_a_marker_never_an_error() -> None:
    levels = 5000  # far deeper than json.loads goes on any stack
    text = json.dumps({"code": "X", "message": 'brackets in text: [[{ \\" ]'})[:-1]
    row = state(1, "tools", "failed", 1, 1.0)
    row["error"] = text + ', "detail": ' + "[" * levels + '"leaf"' + "]" * levels + "}"
    history = build(ThreadRows(states=[row]), namespace="default", name="r", thread_id=THREAD)
    assert history.error is not None and history.error["message"] == 'brackets in text: [[{ \\" ]'
    value, depth = history.error["detail"], 1
    while isinstance(value, list):
        (value,), depth = value, depth + 1
    assert (value, depth) == (DEPTH_MARKER, MAX_DEPTH), "GUARANTEE BROKEN: a deep value is not cut at the cap"
    json.loads(history.model_dump_json())  # the server's answer, and what kubectl agentrun history reads


def test_a_request_whose_key_holds_other_arguments_is_not_shown_with_that_record() -> None:
    """The key's record was made with other arguments (the request was edited since) and the edited call has no
    record yet: the request shows no result, and the record shows apart, not as this request's answer."""
    from agentrun.ledger import args_digest

    rows = ThreadRows(
        states=[state(1, "tools", "running", 1, 1.0)],
        messages=[message(1, 1, request(("call_1", "charge_card", '{"order_id": "9999"}')))],
        ledger=[{**record("charged 4821", "charge_card", "call_1", attempt=1, at=0.5), "args_digest": "0" * 64}],
    )
    asked, recorded = build(rows, namespace="default", name="r", thread_id=THREAD).tool_calls
    edited = f"m-ai:call_1#args-{args_digest({'order_id': '9999'})[:16]}"
    assert (asked.ledger_key, asked.edit_of, asked.outcome, asked.result) == (edited, "m-ai:call_1", "requested", None)
    assert (recorded.ledger_key, recorded.requested_version, recorded.result and recorded.result.preview) == (
        "m-ai:call_1",
        None,
        "charged 4821",
    )
    # Arguments the history cannot see whole (a preview cut) cannot be told apart: the key's record, as ever.
    long = json.dumps({"order_id": "9999", "note": "x" * PREVIEW_CHARS})
    rows.messages[0] = message(1, 1, request(("call_1", "charge_card", long)))
    (asked,) = build(rows, namespace="default", name="r", thread_id=THREAD).tool_calls
    assert (asked.ledger_key, asked.edit_of) == ("m-ai:call_1", None)


# --- honest outcomes (issue 32 item 3) -------------------------------------------------------------------------------


def in_flight_run(*last: dict[str, Any]) -> ThreadRows:
    """Attempt 1 asked for charge_card (a side effect: its intent recorded) and lookup_order (no intent); neither
    answered nor recorded. ``last``: the checkpoints after the request (a stop's, or none)."""
    return ThreadRows(
        states=[state(1, "model", "running", 1, 10.0), state(2, "tools", "running", 1, 11.0), *last],
        messages=[message(1, 2, request(("c1", "charge_card", "{}"), ("c2", "lookup_order", "{}")))],
        intents=[
            {
                "tool_call_id": "m-ai:c1",
                "tool_name": "charge_card",
                "idempotency_key": "ar-c1",
                "attempt": 1,
                "run_uid": "uid-1",
                "at": 11.1,
            }
        ],
        inputs=[{"attempt": 1, "resume": None, "at": 6.0}],
    )


def outcomes(rows: ThreadRows, status: dict[str, Any] | None = None) -> list[str]:
    return [c.outcome for c in build(rows, namespace="default", name="r", thread_id=THREAD, status=status).tool_calls]


def test_a_stopped_runs_calls_in_flight_are_cancelled_never_running_forever() -> None:
    """The runner cancelled charge_card ("tool cancelled … after 23.989s") and the page said "running" forever."""
    stopped = in_flight_run(state(3, "tools", "stopped", 1, 35.0, stop_reason="spec.stop"))
    assert outcomes(stopped) == ["cancelled", "cancelled"], (
        "GUARANTEE BROKEN: a stopped run's calls in flight (started or only asked for) must show cancelled"
    )
    # A forced stop (the runner did not exit in its grace: the pod deleted, no stopped checkpoint): the attempt
    # the operator closed as Stopped.
    forced = {"phase": "Stopped", "attempts": [{"attempt": 1, "outcome": "Stopped", "reason": "ForcedStop"}]}
    assert outcomes(in_flight_run(), forced)[0] == "cancelled"


def test_a_call_in_flight_is_running_while_its_attempt_runs_and_in_doubt_once_it_crashed() -> None:
    running = {"phase": "Running", "attempts": [{"attempt": 1, "outcome": "Running"}]}
    assert outcomes(in_flight_run(), running) == ["running", "requested"]
    crashed = {
        "phase": "Failed",
        "attempts": [{"attempt": 1, "outcome": "Crashed", "exitCode": 137, "endTime": "2026-01-01T00:00:00Z"}],
    }
    assert outcomes(in_flight_run(), crashed) == ["in_doubt", "requested"], (
        "GUARANTEE BROKEN: a call whose attempt was killed mid-call may or may not have taken effect: in doubt"
    )
    # No status (a deleted run): a later attempt's checkpoint says attempt 1 is over.
    resumed = in_flight_run(state(3, "tools", "running", 2, 40.0))
    assert outcomes(resumed)[0] == "in_doubt"


def test_a_call_waiting_at_its_own_interrupt_is_interrupted_then_running_again_once_answered() -> None:
    """A tool with side effects that asks a human (its intent recorded, then interrupt()) stopped at a known
    point: not in doubt. Answered, the next attempt runs it again: running while that attempt runs."""
    waiting = in_flight_run(state(3, "tools", "interrupted", 1, 12.0))
    assert outcomes(waiting, {"phase": "Interrupted"})[0] == "interrupted"
    resumed = in_flight_run(state(3, "tools", "interrupted", 1, 12.0), state(4, "tools", "running", 2, 20.0))
    assert outcomes(resumed, {"phase": "Running"})[0] == "running"
    assert outcomes(waiting, {"phase": "Stopped"}) == ["cancelled", "cancelled"], "a stop while it waited"


def test_pod_start_is_shown_apart_and_never_counted_in_a_step() -> None:
    """Step 0's "Duration" was the pod's start (3.8 s) and a 5 ms lookup showed "≤ 22.3 s"."""
    rows = ThreadRows(
        # Attempt 1's pod created at 6.0, its opening checkpoint (no node ran) at 9.8, then the model node.
        states=[state(1, "model", "running", 1, 9.8), state(2, "tools", "running", 1, 10.3)],
        messages=[message(1, 2, request(("c1", "lookup_order", "{}")))],
        inputs=[{"attempt": 1, "resume": None, "at": 6.0}],
    )
    history = build(rows, namespace="default", name="r", thread_id=THREAD)
    (attempt,) = history.attempts
    assert attempt.pod_start_seconds == 3.8, "the pod's start: created -> its runner's opening checkpoint"
    assert [(s.pod_start_seconds, s.duration_seconds) for s in history.steps] == [(3.8, None), (None, 0.5)], (
        "GUARANTEE BROKEN: step 0's duration counted the pod's start"
    )
    # Its runner registered at 9.7 (the store keeps the newest attempt's registration): the opening write's own time.
    registered = build(
        ThreadRows(states=rows.states, inputs=rows.inputs, owner={"attempt": 1, "run_uid": None, "at": 9.7}),
        namespace="default",
        name="r",
        thread_id=THREAD,
    )
    assert [(s.pod_start_seconds, s.duration_seconds) for s in registered.steps] == [(3.7, 0.1), (None, 0.5)]
    # Another AgentRun's registration on the thread says nothing of this run's pod.
    other = ThreadRows(states=rows.states, inputs=rows.inputs, owner={"attempt": 1, "run_uid": "uid-2", "at": 9.7})
    built = build(other, namespace="default", name="r", thread_id=THREAD, uid="uid-1")
    assert built.attempts[0].pod_start_seconds == 3.8


STEPS_TO_END = ((1, "model", "running"), (2, "tools", "running"), (3, "__end__", "completed"))


def test_the_page_and_the_list_say_a_succeeded_run_with_failed_calls_and_a_cancelled_call() -> None:
    calls = {"executed": 0, "replayed": 0, "failed": 3}
    condition = {"type": "ToolErrors", "status": "True", "message": "3 tool calls failed; last: lookup_order: no 9999"}
    run = {
        "metadata": {"namespace": "default", "name": "r", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"graph": "g:app"},
        "status": {"phase": "Succeeded", "toolCalls": calls, "toolSummary": "3 failed", "conditions": [condition]},
    }
    listed = pages.run_list(listing.entries([run]), namespace=None, phase=None, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert "Succeeded</span>" in listed and "with 3 failed tool calls" in listed and "3 failed" in listed, (
        "GUARANTEE BROKEN: the list must show a Succeeded run whose tool calls failed as a warning"
    )
    # The page counts what the history's records show (the calls' table below it), as status.toolCalls does.
    failing = ThreadRows(
        states=[state(v, node, status, 1, 9.0 + v) for v, node, status in STEPS_TO_END],
        messages=[message(1, 2, request(*((f"c{i}", "lookup_order", "{}") for i in (1, 2, 3))))]
        + [message(1 + i, 3, answer(f"c{i}", "lookup_order", "Error: no 9999", error=True)) for i in (1, 2, 3)],
    )
    failed = build(
        failing, namespace="default", name="r", thread_id=THREAD, status={"phase": "Succeeded", "toolCalls": calls}
    )
    assert failed.tool_counts == calls, failed.tool_counts
    page = pages.timeline(failed, run)
    assert "Succeeded with 3 failed tool calls." in page and "lookup_order: no 9999" in page
    history = build(
        in_flight_run(state(3, "tools", "stopped", 1, 35.0)), namespace="default", name="r", thread_id=THREAD
    )
    history.phase = "Succeeded"
    page = pages.timeline(history, run)
    assert page.count('class="badge out-cancelled"') == 2 and "out-running" not in page
    assert "Pod start" in page
    plain = pages.timeline(history, {**run, "status": {"phase": "Succeeded", "toolCalls": {"executed": 2}}})
    assert "failed tool call" not in plain, "no warning without failures"


def a_run(name: str, created: str, *, phase: str = "Succeeded", ns: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
        "spec": {"graph": "examples.support_agent:app", "threadId": f"t-{name}", **spec},
        "status": {"phase": phase, "reason": "Completed"},
    }


def test_the_list_is_newest_first_searchable_paged_and_shows_deleted_runs_marked() -> None:
    # Issue 32 item 4: it was sorted by name, had no search or paging, and deleted runs dropped out of it.
    runs = [a_run(f"r-{i:03d}", f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z") for i in range(120)]
    runs.append(a_run("lg-order", "2026-01-02T00:00:00Z", phase="Failed", graph="examples.langgraph_agent:graph"))
    recorded = [
        {"namespace": "default", "name": "gone", "thread_id": "default/order-4821", "run_uid": "u-9",
         "status": "completed", "started_at": datetime(2026, 1, 1, 12, tzinfo=UTC).timestamp(), "updated_at": 0.0},
        # A name that exists again: the living run only.
        {"namespace": "default", "name": "r-001", "thread_id": "default/t-r-001", "run_uid": "u-old",
         "status": "failed", "started_at": 0.0, "updated_at": 0.0},
    ]  # fmt: skip
    items = listing.entries(runs, recorded)
    assert len(items) == 122, "a deleted run whose name exists again is listed once, alive"
    newest = listing.chosen(items, phase=None, search=None)
    assert [x["name"] for x in newest[:3]] == ["lg-order", "gone", "r-119"], "newest first, deleted ones among them"
    (gone,) = [x for x in newest if x["deleted"]]
    assert (gone["phase"], gone["threadId"], gone["storeStatus"]) == ("Deleted", "order-4821", "completed")
    assert gone["created"] == "2026-01-01T12:00:00Z"

    assert [x["name"] for x in listing.chosen(items, phase=None, search="LANGGRAPH")] == ["lg-order"], "by graph"
    assert [x["name"] for x in listing.chosen(items, phase=None, search="4821")] == ["gone"], "by thread id"
    assert [x["name"] for x in listing.chosen(items, phase="Deleted", search=None)] == ["gone"]
    assert [x["name"] for x in listing.chosen(items, phase="Failed", search="order")] == ["lg-order"]

    # Created within a time range: the last day of 2026-01-02T06:00 keeps what was created since 01-01T06:00.
    after = listing.since("24h", datetime(2026, 1, 2, 6, tzinfo=UTC))
    assert after == "2026-01-01T06:00:00Z" and listing.since("forever", datetime.now(UTC)) is None
    assert [x["name"] for x in listing.chosen(items, phase=None, search=None, after=after)] == ["lg-order", "gone"]

    first, at, pages_count = listing.paged(newest, 1)
    assert (len(first), at, pages_count) == (listing.PAGE_SIZE, 1, 3)
    last, at, _ = listing.paged(newest, 99)
    assert at == 3 and len(last) == 122 - 2 * listing.PAGE_SIZE and last[-1]["name"] == "r-000", "clamped"
    assert [listing.page_number(t) for t in (None, "", "2", "0", "-1", "x", "9" * 40)] == [1, 1, 2, 1, 1, 1, 1]

    html = pages.run_list(
        first, namespace="default", phase=None, search="r-", page_at=(1, 3, 122), now=datetime(2026, 1, 3, tzinfo=UTC)
    )
    assert re.search(r'<tr class="deleted">.*?>gone</a>.*?Deleted</span> completed', html), "marked, with its end"
    assert "Runs 1-50 of 122, newest first" in html and "page 1 of 3" in html
    older = re.search(r'<a class=page href="([^"]*)">older', html)
    assert older and older.group(1) == "/runs?namespace=default&amp;q=r-&amp;page=2", "the pager keeps the filters"
    assert '<option value="Deleted">' in html and 'name=q value="r-"' in html and '<option value="7d">' in html
    assert '<div id=runs-table data-events="/runs/events?namespace=default">' in html, "the list follows changes"


def test_the_result_of_a_graph_without_messages_is_its_final_state_in_the_page_and_the_cli(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 32: a ``{name} -> greeting`` graph's output appeared nowhere; ``agentrun.result`` records its values."""
    from agentrun.result import final_result
    from agentrun_operator.kubectl_plugin import print_history

    result = final_result(None, {"name": "Ada", "greeting": "Hello, <Ada>"})
    rows = ThreadRows(states=[state(1, "__end__", "completed", 1, 1.0, result=result)])
    history = build(rows, namespace="default", name="greet", thread_id="default/greet")
    assert history.result is not None and history.result_kind == "state"
    assert history.result.preview == '{"greeting": "Hello, <Ada>", "name": "Ada"}'
    html = pages.timeline(history, {"status": {"phase": "Succeeded"}, "spec": {}})
    assert "Result <span class=note>(the final state&#x27;s values" in html
    assert "&quot;greeting&quot;: &quot;Hello, &lt;Ada&gt;&quot;" in html, "shown, escaped"
    print_history(json.loads(history.model_dump_json()))
    out = capsys.readouterr().out
    assert "Result (the final state's values, sha256 " in out and '"greeting": "Hello, <Ada>"' in out
    # A messages graph's answer says so; an older runner's result (no kind) is a message too.
    older = ThreadRows(states=[state(1, "__end__", "completed", 1, 1.0, result={"message": "Done", "digest": "x"})])
    assert build(older, namespace="d", name="r", thread_id="d/r").result_kind == "message"
