"""The tool node (DESIGN §2): parallel calls, state merging, tool errors, idempotency keys, intents."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest

from agentrun import Command, Message, NodeTimeoutError, ToolCall, interrupt, tool, tool_message
from agentrun.checkpoint import Checkpointer
from agentrun.ledger import idempotency_key
from agentrun.messages import add_messages
from tests.support.checkpointers import Backend

from .helpers import app_for, call, eventually, log_lines, seed_tool_step, tool_messages


class Crash(BaseException):
    """Stands in for the process dying."""


class OrderState(TypedDict, total=False):
    messages: Annotated[list[Message], add_messages]
    charged: bool
    emailed: bool
    notes: list[str]
    count: int


# -- parallel calls and state ---------------------------------------------------------------------


async def test_parallel_tools_changing_different_fields_both_survive(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    both_started = asyncio.Barrier(2)

    @tool
    async def charge(state: dict[str, Any]) -> str:
        await both_started.wait()  # really concurrent: each sees the other's change only after the merge
        state["charged"] = True
        return "charged"

    @tool
    async def email(state: dict[str, Any]) -> str:
        await both_started.wait()
        state["emailed"] = True
        return "emailed"

    app = app_for([charge, email], [call("call_1", "charge"), call("call_2", "email")], checkpointer, schema=OrderState)
    values = await app.ainvoke({"messages": [Message(role="user", content="go")], "charged": False}, {"thread_id": t})
    assert values["charged"] is True and values["emailed"] is True, "a parallel branch's state change was lost"
    stored = await (app_for([], [], await backend.open(), schema=OrderState)).aget_state(t)
    assert stored is not None
    assert stored.values["charged"] is True and stored.values["emailed"] is True, "the merged state was not persisted"


async def test_single_tool_mutates_the_shared_state(checkpointer: Checkpointer, backend: Backend) -> None:
    t = backend.thread()

    @tool
    async def note(text: str, state: dict[str, Any]) -> str:
        state["notes"].append(text)  # in place
        state["count"] = state.get("count", 0) + 1
        return "noted"

    app = app_for([note], [call("call_1", "note", text="hello")], checkpointer, schema=OrderState)
    values = await app.ainvoke({"messages": [Message(role="user", content="go")], "notes": ["first"]}, {"thread_id": t})
    assert values["notes"] == ["first", "hello"] and values["count"] == 1
    stored = await app.aget_state(t)
    assert stored is not None and stored.values["notes"] == ["first", "hello"] and stored.values["count"] == 1


async def test_parallel_branches_work_on_copies(checkpointer: Checkpointer, backend: Backend) -> None:
    t = backend.thread()
    seen: dict[str, list[str]] = {}
    both_changed = asyncio.Barrier(2)

    @tool
    async def first(state: dict[str, Any]) -> str:
        state["notes"].append("first")
        await both_changed.wait()
        seen["first"] = list(state["notes"])
        return "ok"

    @tool
    async def second(state: dict[str, Any]) -> str:
        state["count"] = 7
        await both_changed.wait()
        seen["second"] = list(state["notes"])
        return "ok"

    app = app_for([first, second], [call("c1", "first"), call("c2", "second")], checkpointer, schema=OrderState)
    values = await app.ainvoke({"messages": [Message(role="user", content="go")], "notes": []}, {"thread_id": t})
    assert seen == {"first": ["first"], "second": []}, "a branch saw a sibling's in-flight change"
    assert values["notes"] == ["first"] and values["count"] == 7


async def test_one_of_three_raising_is_a_tool_error_and_siblings_are_recorded(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()

    @tool
    async def lookup() -> str:
        return "order 4821"

    @tool
    async def charge() -> str:
        raise RuntimeError("card declined")

    @tool
    async def email() -> str:
        return "sent"

    calls = [call("call_1", "lookup"), call("call_2", "charge"), call("call_3", "email")]
    values = await app_for([lookup, charge, email], calls, checkpointer).ainvoke("go", {"thread_id": t})
    results = tool_messages(values)
    assert results["call_2"].is_error is True
    assert "RuntimeError: card declined" in results["call_2"].content
    assert results["call_1"].is_error is False and results["call_1"].content == "order 4821"
    assert results["call_3"].is_error is False and results["call_3"].content == "sent"
    recorded = {e.key.rsplit(":", 1)[1]: e.tool_name for e in await checkpointer.ledger_list(t)}
    assert recorded == {"call_1": "lookup", "call_3": "email"}, "siblings must be recorded, the failure must not"
    assert "call_2=Error: RuntimeError: card declined" in values["messages"][-1].content, "the model must see the error"
    state = await checkpointer.aget(t)
    assert state is not None and state.status == "completed"


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ('{"order_id": "48', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"4821"', "must be a JSON object"),
    ],
)
async def test_invalid_json_arguments_are_a_tool_error_not_a_node_failure(
    checkpointer: Checkpointer, backend: Backend, arguments: str, reason: str
) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()

    @tool
    async def lookup(order_id: str) -> str:
        ran["lookup"] += 1
        return order_id

    bad = ToolCall(id="call_1", name="lookup", arguments=arguments)
    values = await app_for([lookup], [bad], checkpointer).ainvoke("go", {"thread_id": t})
    result = tool_messages(values)["call_1"]
    assert result.is_error and reason in result.content and "lookup" in result.content
    assert ran["lookup"] == 0
    state = await checkpointer.aget(t)
    assert state is not None and state.status == "completed"
    assert await checkpointer.ledger_list(t) == [], "a call that never ran was recorded"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "order_id: Field required"),
        ({"order_id": "4821", "amount": "lots"}, "amount: Input should be a valid integer"),
        ({"order_id": "4821", "unexpected": 1}, "unexpected: Extra inputs are not permitted"),
        ({"order_id": "4821", "idempotency_key": "forged"}, "idempotency_key: Extra inputs are not permitted"),
    ],
)
async def test_argument_validation_errors_are_tool_errors(
    checkpointer: Checkpointer, backend: Backend, arguments: dict[str, Any], problem: str
) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()

    @tool
    async def refund(order_id: str, amount: int = 0, idempotency_key: str | None = None) -> str:
        ran["refund"] += 1
        return "refunded"

    values = await app_for([refund], [call("call_1", "refund", **arguments)], checkpointer).ainvoke(
        "go", {"thread_id": t}
    )
    result = tool_messages(values)["call_1"]
    assert result.is_error and "invalid arguments for refund" in result.content and problem in result.content
    assert ran["refund"] == 0


async def test_unknown_tool_is_a_tool_error(checkpointer: Checkpointer, backend: Backend) -> None:
    t = backend.thread()

    @tool
    async def lookup() -> str:
        return "ok"

    values = await app_for(
        [lookup], [call("call_1", "launch_missiles"), call("call_2", "lookup")], checkpointer
    ).ainvoke("go", {"thread_id": t})
    results = tool_messages(values)
    assert results["call_1"].is_error
    assert "unknown tool 'launch_missiles'" in results["call_1"].content and "lookup" in results["call_1"].content
    assert results["call_2"].content == "ok"


async def test_tool_returning_a_message_replays_the_same_message(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()

    @tool
    async def rich() -> Message:
        ran["rich"] += 1
        return tool_message("rich content", tool_call_id=None, name="whatever")

    request = await seed_tool_step(checkpointer, t, [call("call_1", "rich")])
    first = tool_messages(await app_for([rich], [], checkpointer).ainvoke(None, {"thread_id": t}))["call_1"]
    # The same step again (as after a crash right before its checkpoint): answered from the ledger.
    again = backend.thread("again")
    await seed_tool_step(checkpointer, again, [call("call_1", "rich")])
    [entry] = await checkpointer.ledger_list(t)
    await checkpointer.ledger_put(again, f"{request.id}:call_1", "rich", entry.result)
    second = tool_messages(await app_for([rich], [], checkpointer).ainvoke(None, {"thread_id": again}))["call_1"]
    assert ran["rich"] == 1
    assert entry.result["__kind__"] == "message"
    assert second == first and (second.name, second.tool_call_id) == ("rich", "call_1")


# -- idempotency keys ----------------------------------------------------------------------------


async def test_idempotency_key_is_stable_across_replays_and_distinct_across_threads(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    keys: list[tuple[str, str | None]] = []
    crash = True

    @tool(side_effects=True, in_doubt="retry")
    async def charge(state: dict[str, Any], idempotency_key: str | None) -> str:
        keys.append((state["messages"][0].content, idempotency_key))
        if crash:
            raise Crash  # the process dies while the provider call is in flight
        return "charged"

    a, b = backend.thread("a"), backend.thread("b")
    for thread in (a, b):
        await seed_tool_step(checkpointer, thread, [call("call_1", "charge")], message_id="msg_same")
    app = app_for([charge], [], checkpointer)
    with pytest.raises(Crash):
        await app.ainvoke(None, {"thread_id": a})
    crash = False
    await app_for([charge], [], await backend.open()).ainvoke(None, {"thread_id": a})
    await app.ainvoke(None, {"thread_id": b})
    (_, first), (_, replayed), (_, other_thread) = keys
    assert first is not None and first.startswith("ar-")
    assert replayed == first, "a replay must hand the tool the same idempotency key"
    assert other_thread != first, "two threads must never share an idempotency key"
    assert first == idempotency_key(a, "msg_same:call_1")


async def test_tool_without_a_ledger_key_gets_no_idempotency_key(checkpointer: Checkpointer, backend: Backend) -> None:
    seen: list[str | None] = []

    @tool
    async def charge(idempotency_key: str | None = "unset") -> str:
        seen.append(idempotency_key)
        return "ok"

    await app_for([charge], [call(None, "charge")], checkpointer).ainvoke("go", {"thread_id": backend.thread()})
    assert seen == [None]


# -- intents and the in-doubt policy ------------------------------------------------------------------


async def test_intent_is_recorded_before_a_side_effect_tool_starts(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    seen: list[Any] = []

    @tool(side_effects=True)
    async def charge(state: dict[str, Any], idempotency_key: str | None) -> str:
        intent = await checkpointer.intent_get(t, f"{state['messages'][-1].id}:call_1")
        seen.append((intent.tool_name, intent.idempotency_key == idempotency_key) if intent else None)
        return "charged"

    @tool
    async def lookup(state: dict[str, Any]) -> str:
        seen.append(await checkpointer.intent_get(t, f"{state['messages'][-1].id}:call_2"))
        return "found"

    await app_for([charge, lookup], [call("call_1", "charge"), call("call_2", "lookup")], checkpointer).ainvoke(
        "go", {"thread_id": t}
    )
    assert ("charge", True) in seen, "no intent was recorded before the side-effect tool started"
    assert None in seen, "a tool without side effects must not record intents"


async def in_doubt_thread(backend: Backend, checkpointer: Checkpointer) -> tuple[str, str]:
    """A thread whose side-effect call started (intent recorded) but whose outcome was never recorded."""
    t = backend.thread()
    request = await seed_tool_step(checkpointer, t, [call("call_1", "charge", order_id="4821")])
    key = f"{request.id}:call_1"
    await checkpointer.intent_put(t, key, "charge", idempotency_key(t, key))
    return t, key


def charge_tool(policy: Any, ran: list[str | None]) -> Any:
    @tool(side_effects=True, in_doubt=policy)
    async def charge(order_id: str, idempotency_key: str | None) -> str:
        ran.append(idempotency_key)
        return f"charged {order_id}"

    return charge


async def test_in_doubt_retry_runs_again_with_the_same_idempotency_key(
    backend: Backend, checkpointer: Checkpointer, caplog: pytest.LogCaptureFixture
) -> None:
    t, key = await in_doubt_thread(backend, checkpointer)
    ran: list[str | None] = []
    values = await app_for([charge_tool("retry", ran)], [], checkpointer).ainvoke(None, {"thread_id": t})
    assert ran == [idempotency_key(t, key)], "retry must run the call again under the same idempotency key"
    assert tool_messages(values)["call_1"].content == "charged 4821"
    assert (await checkpointer.ledger_get(t, key)) is not None
    assert any("retrying with the same idempotency key" in line for line in log_lines(caplog, logging.WARNING))


async def test_in_doubt_report_is_a_tool_error_without_running(backend: Backend, checkpointer: Checkpointer) -> None:
    t, key = await in_doubt_thread(backend, checkpointer)
    ran: list[str | None] = []
    values = await app_for([charge_tool("report", ran)], [], checkpointer).ainvoke(None, {"thread_id": t})
    assert ran == [], "report must not run an in-doubt call"
    result = tool_messages(values)["call_1"]
    assert result.is_error and "outcome is unknown" in result.content
    assert f"Idempotency key: {idempotency_key(t, key)}" in result.content, "the human needs the key to reconcile"
    assert await checkpointer.ledger_get(t, key) is None
    state = await checkpointer.aget(t)
    assert state is not None and state.status == "completed"


async def test_in_doubt_interrupt_pauses_and_retry_runs_it(backend: Backend, checkpointer: Checkpointer) -> None:
    t, key = await in_doubt_thread(backend, checkpointer)
    ran: list[str | None] = []
    app = app_for([charge_tool("interrupt", ran)], [], checkpointer)
    paused = await app.ainvoke(None, {"thread_id": t})
    [pending] = paused["__interrupt__"]
    assert ran == [], "the in-doubt call ran before a human decided"
    assert pending.payload == {
        "reason": "in_doubt",
        "tool": "charge",
        "arguments": {"order_id": "4821"},
        "idempotency_key": idempotency_key(t, key),
    }
    assert pending.tool_call_id == "call_1"
    values = await app.ainvoke(Command(resume="retry"), {"thread_id": t})
    assert ran == [idempotency_key(t, key)]
    assert tool_messages(values)["call_1"].content == "charged 4821"


async def test_in_doubt_interrupt_resumed_with_a_result_records_it_without_running(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t, key = await in_doubt_thread(backend, checkpointer)
    ran: list[str | None] = []
    app = app_for([charge_tool("interrupt", ran)], [], checkpointer)
    await app.ainvoke(None, {"thread_id": t})
    values = await app.ainvoke(Command(resume={"result": {"charge": "ch_42"}}), {"thread_id": t})
    assert ran == [], "a call resolved by a human must not run"
    assert tool_messages(values)["call_1"].content == '{"charge": "ch_42"}'
    entry = await checkpointer.ledger_get(t, key)
    assert entry is not None and (entry.result["__kind__"], entry.result["value"]) == ("raw", {"charge": "ch_42"})


async def test_in_doubt_interrupt_with_an_unknown_answer_is_a_tool_error(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t, _ = await in_doubt_thread(backend, checkpointer)
    ran: list[str | None] = []
    app = app_for([charge_tool("interrupt", ran)], [], checkpointer)
    await app.ainvoke(None, {"thread_id": t})
    values = await app.ainvoke(Command(resume="maybe?"), {"thread_id": t})
    assert ran == []
    result = tool_messages(values)["call_1"]
    assert result.is_error and "not understood" in result.content


@pytest.mark.parametrize("policy", ["retry", "report", "interrupt"])
async def test_side_effect_tool_asking_for_approval_runs_once_approved(
    backend: Backend, checkpointer: Checkpointer, policy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A pause at the tool's own interrupt() is a known point, not an unknown outcome."""
    t = backend.thread()
    refunded: list[Any] = []

    @tool(side_effects=True, in_doubt=policy)
    async def refund(order_id: str) -> str:
        answer = interrupt({"order_id": order_id}, message="refund this order?")
        refunded.append(answer)
        return f"refund {answer}"

    app = app_for([refund], [call("call_1", "refund", order_id="4821")], checkpointer)
    paused = await app.ainvoke("refund please", {"thread_id": t})
    [approval] = paused["__interrupt__"]
    assert approval.payload == {"order_id": "4821"}
    values = await app.ainvoke(Command(resume="approved"), {"thread_id": t})
    assert "__interrupt__" not in values, "the approved call was treated as in doubt and paused again"
    assert refunded == ["approved"]
    assert tool_messages(values)["call_1"].content == "refund approved"
    assert not [line for line in log_lines(caplog) if "in doubt" in line or "outcome was not recorded" in line]


async def test_crash_after_an_approved_resume_is_still_in_doubt(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    refunded: list[Any] = []
    crash = True

    @tool(side_effects=True, in_doubt="report")
    async def refund(order_id: str) -> str:
        answer = interrupt({"order_id": order_id}, message="refund this order?")
        refunded.append(answer)
        if crash:
            raise Crash  # the refund went out, the process died before it was recorded
        return "refunded"

    app = app_for([refund], [call("call_1", "refund", order_id="4821")], checkpointer)
    await app.ainvoke("refund please", {"thread_id": t})
    with pytest.raises(Crash):
        await app.ainvoke(Command(resume="approved"), {"thread_id": t})
    crash = False
    values = await app_for([refund], [], await backend.open()).ainvoke(None, {"thread_id": t})
    assert refunded == ["approved"], "a call that started after its approval ran again although it was in doubt"
    result = tool_messages(values)["call_1"]
    assert result.is_error and "outcome is unknown" in result.content


# -- what replays and failures do to state ----------------------------------------------------------


async def test_duplicate_call_ids_in_one_message_never_share_a_ledger_entry(
    backend: Backend, checkpointer: Checkpointer, caplog: pytest.LogCaptureFixture
) -> None:
    """Some OpenAI-compatible servers repeat call ids; the ledger must not hand one call's result to the other."""
    t = backend.thread()
    ran: list[str] = []
    crash = True

    @tool
    async def lookup(order_id: str) -> str:
        ran.append(order_id)
        return f"order {order_id}"

    @tool
    async def crasher() -> str:
        if crash:
            await asyncio.sleep(0.01)
            raise Crash
        return "ok"

    calls = [
        call("call_1", "lookup", order_id="1"),
        call("call_1", "lookup", order_id="2"),
        call("call_2", "crasher"),
    ]
    with pytest.raises(Crash):
        await app_for([lookup, crasher], calls, checkpointer).ainvoke("go", {"thread_id": t})
    crash = False
    values = await app_for([lookup, crasher], calls, checkpointer).ainvoke(None, {"thread_id": t})
    contents = [m.content for m in values["messages"] if m.role == "tool"]
    assert contents == ["order 1", "order 2", "ok"], "a call got the result of another call with the same id"
    assert sorted(ran) == ["1", "1", "2", "2"], "calls the ledger cannot tell apart must run again"
    assert any("appears more than once" in line for line in log_lines(caplog, logging.WARNING))


@pytest.mark.looptime
async def test_node_that_fails_leaves_no_partial_state_change(backend: Backend, checkpointer: Checkpointer) -> None:
    """In-place changes of a node that did not complete must not be persisted (or applied twice on resume)."""
    t = backend.thread()
    slow = True

    @tool
    async def note(state: dict[str, Any]) -> str:
        state["notes"].append("noted")  # in place, then the node misses its deadline
        if slow:
            await asyncio.sleep(3600)
        return "ok"

    app = app_for([note], [call("call_1", "note")], checkpointer, schema=OrderState)
    config = {"thread_id": t, "node_timeout": 10, "tool_timeout": None}
    with pytest.raises(NodeTimeoutError):
        await app.ainvoke({"messages": [Message(role="user", content="go")], "notes": []}, config)
    state = await app.aget_state(t)
    assert state is not None and state.status == "failed"
    assert state.values["notes"] == [], "a node that timed out leaked its in-place change into the stored state"
    slow = False
    values = await app.ainvoke(None, config)
    assert values["notes"] == ["noted"], "the change of a re-run node was applied twice"


async def test_sync_tool_can_interrupt(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()

    @tool
    def approve(amount: int) -> str:
        return f"{amount}: {interrupt({'amount': amount})}"

    app = app_for([approve], [call("call_1", "approve", amount=3)], checkpointer)
    paused = await app.ainvoke("go", {"thread_id": t})
    [pending] = paused["__interrupt__"]
    assert pending.payload == {"amount": 3} and pending.tool_call_id == "call_1"
    values = await app.ainvoke(Command(resume="ok"), {"thread_id": t})
    assert tool_messages(values)["call_1"].content == "3: ok"


async def test_state_change_of_a_replayed_tool_survives_a_crash(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    crash = True

    @tool
    async def charge(state: dict[str, Any]) -> str:
        state["charged"] = True
        return "charged"

    @tool
    async def crasher(state: dict[str, Any]) -> str:
        if crash:
            await eventually(lambda: checkpointer.ledger_list(t), "charge recorded")
            raise Crash
        return "ok"

    calls = [call("call_1", "charge"), call("call_2", "crasher")]
    with pytest.raises(Crash):
        await app_for([charge, crasher], calls, checkpointer, schema=OrderState).ainvoke("go", {"thread_id": t})
    crash = False
    values = await app_for([charge, crasher], calls, checkpointer, schema=OrderState).ainvoke(None, {"thread_id": t})
    assert values.get("charged") is True
