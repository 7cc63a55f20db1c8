"""Requests and tool failures, on every backend: repeating a request repeats its answer, not its side effects.

A request key (``RunConfig.request_key``: an AgentRun's ``spec.requestId`` or
derived key, the CLI's ``--request-id``) gives a turn an identity. The same
request after it completed runs nothing; after a crash mid-turn it resumes,
and recorded tool calls replay. Tool failures are counted, the last one is
kept (never its arguments), and ``fail_on_tool_error`` turns one into a
failed, resumable run. Each test counts tool executions, not results.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from typing import Any, TypedDict

import pytest

from agentrun import END, START, StateGraph, ThreadStateError, tool
from agentrun.checkpoint import Checkpointer
from agentrun.errors import ToolError
from tests.support.checkpointers import Backend

from .helpers import app_for, call, eventually, tool_messages

ORDER = "charge order 4821"


class Crash(BaseException):
    """Stands in for the process dying: nothing after it runs, nothing catches it."""


def charging_tools(ran: Counter[str]) -> list[Any]:
    @tool(side_effects=True, in_doubt="retry")
    async def charge_card(order_id: str) -> dict[str, Any]:
        ran["charge_card"] += 1
        return {"charged": order_id}

    @tool
    async def send_receipt(order_id: str) -> str:
        ran["send_receipt"] += 1
        return "sent"

    return [charge_card, send_receipt]


CALLS = [call("call_1", "charge_card", order_id="4821"), call("call_2", "send_receipt", order_id="4821")]


async def test_the_same_request_after_it_completed_runs_no_tool_again(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()
    app = app_for(charging_tools(ran), CALLS, checkpointer)
    first = await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-1"})
    assert ran == {"charge_card": 1, "send_receipt": 1}
    state = await app.aget_state(t)
    assert state is not None and state.status == "completed"

    again = app_for(charging_tools(ran), CALLS, await backend.open())  # a re-applied AgentRun, another process
    events = [e async for e in again.astream(ORDER, {"thread_id": t, "request_key": "req-1"})]
    assert ran == {"charge_card": 1, "send_receipt": 1}, "GUARANTEE BROKEN: a completed request ran its tools again"
    assert [(e.kind, e.status, e.version) for e in events] == [("end", "completed", state.version)]
    assert events[0].values is not None and events[0].values["messages"] == first["messages"]
    after = await again.aget_state(t)
    assert after is not None and after.version == state.version, "answering a completed request must write nothing"

    turn = await checkpointer.aget_turn(t, "req-1")
    assert turn is not None and (turn.status, turn.version) == ("completed", state.version)
    answer = first["messages"][-1].content
    assert turn.result == {
        "message": answer,
        "digest": "sha256:" + hashlib.sha256(answer.encode()).hexdigest(),
        "truncated": False,
        "kind": "message",
    }
    assert turn.tool_calls == {"executed": 2, "replayed": 0, "failed": 0, "in_doubt": 0}
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and (progress.request_key, progress.result) == ("req-1", turn.result)

    await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-2"})
    assert ran == {"charge_card": 2, "send_receipt": 2}, "a new request id must start a new turn"
    await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-1"})
    assert ran == {"charge_card": 2, "send_receipt": 2}, "an earlier completed request ran again from its record"
    await app.ainvoke(ORDER, {"thread_id": t})
    assert ran == {"charge_card": 3, "send_receipt": 3}, "without a request key every input is a new turn"


async def test_the_same_request_after_a_crash_mid_turn_resumes_and_replays(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    """Like an AgentRun applied again after its pod died: same key, same input; the charge is not repeated."""
    t = backend.thread()
    ran: Counter[str] = Counter()
    crash = True

    @tool(side_effects=True, in_doubt="retry")
    async def charge_card(order_id: str) -> dict[str, Any]:
        ran["charge_card"] += 1
        return {"charged": order_id}

    @tool
    async def send_receipt(order_id: str, state: dict[str, Any]) -> str:
        ran["send_receipt"] += 1
        if crash:
            key = f"{state['messages'][-1].id}:call_1"
            await eventually(lambda: checkpointer.ledger_get(t, key), "charge_card recorded")
            raise Crash
        return "sent"

    app = app_for([charge_card, send_receipt], CALLS, checkpointer)
    with pytest.raises(Crash):
        await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-1"})
    running = await checkpointer.aget_turn(t, "req-1")
    assert running is not None and running.status == "running", "a turn's first checkpoint records it"

    crash = False
    again = app_for([charge_card, send_receipt], CALLS, await backend.open())
    values = await again.ainvoke(ORDER, {"thread_id": t, "request_key": "req-1", "run_uid": "uid-2"})
    assert ran == {"charge_card": 1, "send_receipt": 2}, "GUARANTEE BROKEN: the re-sent request charged again"
    assert tool_messages(values)["call_1"].content == '{"charged": "4821"}'
    assert [m.content for m in values["messages"] if m.role == "user"] == [ORDER], "the input was applied twice"
    turn = await checkpointer.aget_turn(t, "req-1")
    assert turn is not None and turn.status == "completed" and turn.run_uid == "uid-2"
    assert turn.tool_calls["replayed"] == 1


async def test_an_earlier_request_that_failed_cannot_be_resumed_once_the_thread_moved_on(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()
    app = app_for(charging_tools(ran), CALLS, checkpointer)
    config = {"thread_id": t, "request_key": "req-1", "fail_on_tool_error": True, "recursion_limit": 1}
    with pytest.raises(Exception, match="recursion limit"):
        await app.ainvoke(ORDER, config)
    failed = await checkpointer.aget_turn(t, "req-1")
    assert failed is not None and failed.status == "failed" and failed.error is not None
    assert failed.error["code"] == "GRAPH_RECURSION_001"
    await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-2"})
    with pytest.raises(ThreadStateError, match=r"'req-1' on thread .* is an earlier turn \(failed at version"):
        await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-1"})


async def test_tool_failures_are_counted_with_the_last_error_and_never_the_arguments(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()

    @tool
    async def charge_card(order_id: str, card_secret: str) -> str:
        raise ValueError("card declined " + "x" * 1000)

    @tool(timeout=0.05)
    async def slow(order_id: str) -> str:
        await asyncio.sleep(5)
        return "late"

    calls = [
        call("call_1", "slow", order_id="4821"),
        call("call_2", "charge_card", wrong="sk_live_SECRET"),  # bad arguments
        call("call_3", "no_such_tool", order_id="4821"),
        call("call_4", "charge_card", order_id="4821", card_secret="sk_live_SECRET"),
    ]
    app = app_for([charge_card, slow], calls, checkpointer)
    values = await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-1"})
    assert all(m.is_error for m in tool_messages(values).values()), "every failure still reaches the model"
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and progress.status == "completed", "tool errors alone do not fail a run by default"
    assert progress.tool_calls == {"executed": 0, "replayed": 0, "failed": 4, "in_doubt": 0}
    last = progress.last_tool_error
    assert last is not None and set(last) == {"tool", "code", "message"}
    assert last["tool"] in ("slow", "charge_card", "no_such_tool")
    assert len(last["message"]) <= 512
    assert "sk_live_SECRET" not in str(last), "the last tool error must never carry the call's arguments"
    turn = await checkpointer.aget_turn(t, "req-1")
    assert turn is not None and turn.tool_calls["failed"] == 4


async def test_each_kind_of_tool_failure_has_its_code() -> None:
    from agentrun.checkpoint import InMemoryCheckpointer

    @tool
    async def boom(order_id: str) -> str:
        raise ValueError("declined")

    @tool(timeout=0.05)
    async def slow(order_id: str) -> str:
        await asyncio.sleep(5)
        return "late"

    cases = [
        (
            call("c", "boom", order_id="1"),
            {"tool": "boom", "code": "TOOL_ERROR_001", "message": "ValueError: declined"},
        ),
        (call("c", "boom", nope="1"), {"tool": "boom", "code": "TOOL_ERROR_002"}),
        (call("c", "missing"), {"tool": "missing", "code": "TOOL_ERROR_003"}),
        (call("c", "slow", order_id="1"), {"tool": "slow", "code": "NODE_TIMEOUT_002"}),
    ]
    for one, expected in cases:
        store = InMemoryCheckpointer()
        await app_for([boom, slow], [one], store).ainvoke(ORDER, {"thread_id": "t"})
        progress = await store.aget_progress("t")
        assert progress is not None and progress.last_tool_error is not None
        assert {k: progress.last_tool_error[k] for k in expected} == expected, one.name


async def test_fail_on_tool_error_fails_the_run_after_the_node_and_a_resume_retries_only_the_failed_call(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()
    declined = True

    @tool(side_effects=True, in_doubt="retry")
    async def charge_card(order_id: str) -> dict[str, Any]:
        ran["charge_card"] += 1
        return {"charged": order_id}

    @tool
    async def send_receipt(order_id: str) -> str:
        ran["send_receipt"] += 1
        if declined:
            raise ConnectionError("mail server refused")
        return "sent"

    app = app_for([charge_card, send_receipt], CALLS, checkpointer)
    config = {"thread_id": t, "request_key": "req-1", "fail_on_tool_error": True}
    with pytest.raises(ToolError) as raised:
        await app.ainvoke(ORDER, config)
    assert raised.value.code == "TOOL_ERROR_001" and raised.value.tool == "send_receipt"
    assert "mail server refused" in str(raised.value)
    state = await app.aget_state(t)
    assert state is not None and (state.status, state.current_node) == ("failed", "tools"), (
        "the run must fail at the tool node, so a resume runs it again"
    )
    assert state.meta["error"]["code"] == "TOOL_ERROR_001"
    assert state.meta["tool_calls"] == {"executed": 1, "replayed": 0, "failed": 1, "in_doubt": 0}
    assert state.meta["last_tool_error"]["tool"] == "send_receipt"
    turn = await checkpointer.aget_turn(t, "req-1")
    assert turn is not None and turn.status == "failed" and turn.error is not None
    assert turn.error["code"] == "TOOL_ERROR_001"

    declined = False  # a retry of the same request (spec.retry, or the request sent again)
    values = await app_for([charge_card, send_receipt], CALLS, await backend.open()).ainvoke(ORDER, config)
    assert ran == {"charge_card": 1, "send_receipt": 2}, "the retry re-ran a call that had completed"
    assert tool_messages(values)["call_2"].content == "sent"
    done = await checkpointer.aget_turn(t, "req-1")
    assert done is not None and done.status == "completed"
    assert done.tool_calls == {"executed": 2, "replayed": 1, "failed": 1, "in_doubt": 0}


async def test_a_call_found_in_doubt_is_counted(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    crash = True

    @tool(side_effects=True, in_doubt="report")
    async def charge_card(order_id: str) -> str:
        if crash:
            raise Crash  # the process dies inside the call: its intent is recorded, its outcome is not
        return "charged"

    app = app_for([charge_card], CALLS[:1], checkpointer)
    with pytest.raises(Crash):
        await app.ainvoke(ORDER, {"thread_id": t, "request_key": "req-1"})
    crash = False
    await app_for([charge_card], CALLS[:1], await backend.open()).ainvoke(
        ORDER, {"thread_id": t, "request_key": "req-1"}
    )
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and progress.status == "completed"
    assert progress.tool_calls == {"executed": 0, "replayed": 0, "failed": 0, "in_doubt": 1}


def test_a_long_answer_is_truncated_with_the_digest_of_the_whole() -> None:
    from agentrun.messages import assistant, user
    from agentrun.result import final_result

    text = "é" * 3000
    result = final_result(text, {"messages": [user("q"), assistant(text), user("thanks")]})
    assert result == {
        "message": text[:1024],
        "digest": "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
        "truncated": True,
        "kind": "message",
    }
    assert final_result(None, {"messages": [user("q")]}) is None, "an empty state has no result"


class Greeting(TypedDict):
    name: str
    greeting: str


async def test_a_graph_whose_state_is_not_messages_records_its_final_values_as_the_result(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    """Issue 32: a ``{name} -> greeting`` graph Succeeded with no result anywhere; its final values are it."""

    def greet(state: dict[str, Any]) -> dict[str, Any]:
        return {"greeting": f"Hello, {state['name']}" + "!" * 2000}

    graph = StateGraph(Greeting)
    graph.add_node("greet", greet)
    graph.add_edge(START, "greet")
    graph.add_edge("greet", END)
    t = backend.thread()
    await graph.compile(checkpointer).ainvoke({"name": "Ada"}, {"thread_id": t, "request_key": "req-1"})
    turn = await checkpointer.aget_turn(t, "req-1")
    whole = json.dumps({"greeting": "Hello, Ada" + "!" * 2000, "name": "Ada"}, ensure_ascii=False, sort_keys=True)
    assert turn is not None and turn.result == {
        "message": whole[:1024],
        "digest": "sha256:" + hashlib.sha256(whole.encode()).hexdigest(),
        "truncated": True,
        "kind": "state",
    }, "a completed turn of a state without messages records its final values, cut, with the whole's digest"


def test_a_langgraph_turn_answers_by_the_same_rule() -> None:
    """LangGraph's final values: the last AIMessage's text, else the values without messages (``agentrun.result``)."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage

    from agentrun.integrations.langgraph.run import _result

    said = _result({"messages": [HumanMessage("q"), AIMessage("the answer"), HumanMessage("thanks")]})
    assert said is not None and (said["message"], said["kind"]) == ("the answer", "message")
    state = _result({"name": "Ada", "greeting": "Hello, Ada", "messages": []})
    assert state is not None and (state["message"], state["kind"]) == (
        '{"greeting": "Hello, Ada", "name": "Ada"}',
        "state",
    )
    assert _result({}) is None
