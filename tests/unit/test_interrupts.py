"""interrupt() and resume (DESIGN §2): only the paused call continues; each interrupt has its own id and value."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from agentrun import END, START, Command, StateGraph, ThreadStateError, assistant, interrupt, tool
from agentrun.checkpoint import Checkpointer
from tests.support.checkpointers import Backend

from .helpers import app_for, call, tool_messages


async def test_interrupt_in_one_of_three_parallel_calls_resumes_only_that_call(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    started: Counter[str] = Counter()
    finished: Counter[str] = Counter()

    @tool
    async def lookup() -> str:
        started["lookup"] += 1
        finished["lookup"] += 1
        return "order 4821"

    @tool
    async def approve(amount: int) -> str:
        started["approve"] += 1
        answer = interrupt({"amount": amount}, message="approve the charge?")
        finished["approve"] += 1
        return f"approval: {answer}"

    @tool
    async def email() -> str:
        started["email"] += 1
        finished["email"] += 1
        return "sent"

    calls = [call("call_1", "lookup"), call("call_2", "approve", amount=4999), call("call_3", "email")]
    app = app_for([lookup, approve, email], calls, checkpointer)
    paused = await app.ainvoke("go", {"thread_id": t})
    [pending] = paused["__interrupt__"]
    assert (pending.payload, pending.message, pending.tool_call_id) == (
        {"amount": 4999},
        "approve the charge?",
        "call_2",
    )
    assert pending.node == "tools"
    recorded = sorted(e.key.rsplit(":", 1)[1] for e in await checkpointer.ledger_list(t))
    assert recorded == ["call_1", "call_3"], "the siblings that finished must be in the ledger before the pause"
    state = await app.aget_state(t)
    assert state is not None and state.status == "interrupted" and state.current_node == "tools"

    values = await app_for([lookup, approve, email], calls, await backend.open()).ainvoke(
        Command(resume="yes"), {"thread_id": t}
    )
    assert started == {"lookup": 1, "approve": 2, "email": 1}, "a finished sibling ran again on resume"
    assert finished == {"lookup": 1, "approve": 1, "email": 1}
    results = tool_messages(values)
    assert [results[c].content for c in ("call_1", "call_2", "call_3")] == ["order 4821", "approval: yes", "sent"]


async def test_parallel_interrupts_have_distinct_ids_and_get_their_own_resume_values(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()

    @tool
    async def ask(question: str) -> str:
        return f"{question} -> {interrupt({'question': question})}"

    calls = [call("call_1", "ask", question="charge?"), call("call_2", "ask", question="email?")]
    app = app_for([ask], calls, checkpointer)
    paused = await app.ainvoke("go", {"thread_id": t})
    first, second = paused["__interrupt__"]
    assert first.id != second.id
    by_call = {i.tool_call_id: i for i in paused["__interrupt__"]}
    assert by_call["call_1"].payload == {"question": "charge?"} and by_call["call_2"].payload == {"question": "email?"}

    with pytest.raises(ThreadStateError) as raised:
        await app.ainvoke(Command(resume="yes"), {"thread_id": t})
    assert (
        "2 pending interrupts" in str(raised.value) and first.id in str(raised.value) and second.id in str(raised.value)
    )
    assert "mapping" in str(raised.value)
    state = await app.aget_state(t)
    assert state is not None and state.status == "interrupted", "a rejected resume must leave the thread paused"

    answers = {by_call["call_1"].id: "yes", by_call["call_2"].id: "no"}
    values = await app.ainvoke(Command(resume=answers), {"thread_id": t})
    results = tool_messages(values)
    assert results["call_1"].content == "charge? -> yes"
    assert results["call_2"].content == "email? -> no", "a resume value went to the wrong interrupt"


async def test_answering_one_of_two_interrupts_pauses_again_on_the_other(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()

    @tool
    async def ask(question: str) -> str:
        return f"{question} -> {interrupt(question)}"

    calls = [call("call_1", "ask", question="a"), call("call_2", "ask", question="b")]
    app = app_for([ask], calls, checkpointer)
    paused = await app.ainvoke("go", {"thread_id": t})
    by_call = {i.tool_call_id: i for i in paused["__interrupt__"]}
    again = await app.ainvoke(Command(resume={by_call["call_1"].id: 1}), {"thread_id": t})
    assert [i.id for i in again["__interrupt__"]] == [by_call["call_2"].id]
    values = await app.ainvoke(Command(resume=2), {"thread_id": t})
    assert [m.content for m in values["messages"] if m.role == "tool"] == ["a -> 1", "b -> 2"]


@pytest.mark.parametrize("sync", [False, True], ids=["async-node", "sync-node"])
async def test_interrupt_in_a_plain_node(backend: Backend, checkpointer: Checkpointer, sync: bool) -> None:
    t = backend.thread()
    runs: Counter[str] = Counter()

    def review_sync(state: dict[str, Any]) -> dict[str, Any]:
        runs["review"] += 1
        first = interrupt({"draft": state["messages"][-1].content}, message="edit the draft?")
        second = interrupt("send it?")
        return {"messages": [assistant(f"final: {first} / {second}")]}

    async def review_async(state: dict[str, Any]) -> dict[str, Any]:
        return review_sync(state)

    graph = StateGraph()
    graph.add_node("review", review_sync if sync else review_async)
    graph.add_edge(START, "review")
    graph.add_edge("review", END)
    app = graph.compile(checkpointer)
    paused = await app.ainvoke("hello", {"thread_id": t})
    [first] = paused["__interrupt__"]
    assert first.payload == {"draft": "hello"} and first.node == "review" and first.tool_call_id is None
    paused = await app.ainvoke(Command(resume="edited"), {"thread_id": t})
    [second] = paused["__interrupt__"]
    assert second.id != first.id and second.payload == "send it?"
    values = await app.ainvoke(Command(resume="yes"), {"thread_id": t})
    assert values["messages"][-1].content == "final: edited / yes"
    assert runs["review"] == 3, "the interrupted node runs again from its start on every resume"


async def test_resume_value_survives_a_crash_before_the_node_finishes(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    answered = asyncio.Event()
    hang = True

    async def review(state: dict[str, Any]) -> dict[str, Any]:
        answer = interrupt("approve?")
        answered.set()
        if hang:
            await asyncio.sleep(3600)  # the process dies here, after the resume was accepted
        return {"messages": [assistant(f"answer: {answer}")]}

    graph = StateGraph()
    graph.add_node("review", review)
    graph.add_edge(START, "review")
    graph.add_edge("review", END)
    app = graph.compile(checkpointer)
    await app.ainvoke("hello", {"thread_id": t})
    run = asyncio.create_task(app.ainvoke(Command(resume="approved"), {"thread_id": t}))
    await answered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    state = await app.aget_state(t)
    assert state is not None and state.status == "running", "Command(resume) was not persisted before the node re-ran"

    hang = False
    restarted = graph.compile(await backend.open())
    values = await restarted.ainvoke(None, {"thread_id": t})
    assert values["messages"][-1].content == "answer: approved", "the resume value was lost in the crash"
    with pytest.raises(ThreadStateError):
        await restarted.ainvoke(Command(resume="again"), {"thread_id": t})
