"""The run's message list is appended to in place: no step copies a thread's history (issue 34 item 3).

What is protected: a step of a loaded thread makes no copy of its message list in the reducer (counted:
``MessageList`` constructions per invoke, one per invoke before the change made fifty), and the run keeps
one list object from the load to its end (seen by a router, which gets the run's state itself); what a
step replaced in place is still written exactly (the run's ``replaced`` positions and the rows read back);
an update that fails leaves the run's list as it was, so the failure checkpoint holds none of it; the
``add_messages`` reducer called by anyone else still changes nothing it is given; a node's input is still
its own copy; and the values an invoke returned do not change when the thread runs again.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from agentrun import END, START, StateGraph
from agentrun.checkpoint import Checkpoint, Checkpointer
from agentrun.errors import InvalidUpdateError
from agentrun.messages import Message, MessageList, add_messages, assistant, stored_messages, user
from agentrun.persistence import Run
from agentrun.state import StateSchema
from tests.support.checkpointers import Backend, write

HISTORY = 1_000
STEPS = 50


async def seed(checkpointer: Checkpointer, thread: str, count: int) -> list[Message]:
    history = [user(f"q {i}") if i % 2 == 0 else assistant(f"a {i}") for i in range(count)]
    await checkpointer.aput(
        thread, write(*enumerate(history), count=count, status="completed", node=None), expected_version=0
    )
    return history


def chain(checkpointer: Checkpointer, steps: int, seen: list[list[Message]] | None = None) -> Any:
    """``steps`` nodes, each appending one message; the routers record the run's own list when ``seen``."""
    graph = StateGraph()
    for i in range(steps):
        graph.add_node(f"n{i}", lambda state, i=i: {"messages": [assistant(f"step {i}")]})
    graph.add_edge(START, "n0")

    def route(state: dict[str, Any], target: str) -> str:
        if seen is not None:
            seen.append(state["messages"])  # a router reads the run's state, not a copy
        return target

    for i in range(steps - 1):
        graph.add_conditional_edges(f"n{i}", functools.partial(route, target=f"n{i + 1}"))
    graph.add_edge(f"n{steps - 1}", END)
    return graph.compile(checkpointer)


async def test_no_step_copies_the_history_in_the_reducer(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    await seed(checkpointer, thread, HISTORY)
    app = chain(checkpointer, STEPS)
    made: list[int] = []
    init = MessageList.__init__

    def counted(self: MessageList, items: Any = ()) -> None:
        init(self, items)
        made.append(len(self))

    monkeypatch.setattr(MessageList, "__init__", counted)
    values = await app.ainvoke({"messages": [user("next")]}, {"thread_id": thread})

    assert len(values["messages"]) == HISTORY + 1 + STEPS
    copies = [n for n in made if n >= HISTORY]
    # The load's list (stored_messages) and the run's copy of it (copy_messages): per invoke, not per step.
    assert len(copies) <= 2, (
        f"GUARANTEE BROKEN: an invoke of {STEPS} steps on a {HISTORY}-message thread made {len(copies)} message "
        "lists of its whole history: a step copies the history again"
    )


async def test_the_run_keeps_one_message_list_from_the_load_to_its_end(backend: Backend) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    history = await seed(checkpointer, thread, HISTORY)
    seen: list[list[Message]] = []
    values = await chain(checkpointer, 5, seen).ainvoke({"messages": [user("next")]}, {"thread_id": thread})

    assert len(seen) == 4
    assert all(s is values["messages"] for s in seen), "GUARANTEE BROKEN: a step made a new list of the history"
    checkpoint = await (await backend.open()).aget(thread)
    assert checkpoint is not None
    assert checkpoint.messages == [*history, user("next", id=values["messages"][HISTORY].id), *values["messages"][-5:]]


def loaded(count: int) -> tuple[Run, StateSchema, list[Message]]:
    history = [user(f"q {i}") for i in range(count)]
    checkpoint = Checkpoint(
        thread_id="t",
        version=1,
        values={},
        messages=stored_messages([m.id for m in history], [m.to_json() for m in history]),
        current_node="n",
        step=0,
        status="running",
    )
    schema = StateSchema()
    return Run.from_checkpoint(checkpoint, schema), schema, history


def test_replaced_positions_stay_exact_when_appending_in_place() -> None:
    run, schema, history = loaded(10)
    own = run.messages
    run.apply(schema, {"messages": [assistant("new one", id="msg_new")]})
    # A durable message replaced (position 3), and one appended this step then replaced (position 10): only the
    # durable one is a replaced row; the other is still a new one.
    run.apply(schema, {"messages": [user("edited", id=history[3].id), assistant("edited too", id="msg_new")]})

    assert run.messages is own, "GUARANTEE BROKEN: the run's list was copied, not appended to"
    assert run.replaced == {3}
    assert [m.content for m in run.messages[3:4] + run.messages[10:]] == ["edited", "edited too"]
    assert len(run.messages) == 11


@pytest.mark.parametrize(
    "update",
    [
        {"messages": [assistant("kept out"), {"role": "robot", "content": "no such role"}]},
        {"messages": [assistant("kept out")], "no_such_channel": 1},
    ],
    ids=["a-message-that-cannot-be-made", "an-unknown-channel"],
)
def test_an_update_that_fails_leaves_the_runs_list_as_it_was(update: dict[str, Any]) -> None:
    run, schema, history = loaded(10)
    state = run.state
    with pytest.raises((InvalidUpdateError, ValueError)):
        run.apply(schema, update)
    assert run.state is state
    assert run.messages == history, "GUARANTEE BROKEN: a failed update left messages in the run's list"
    assert run.replaced == set()


async def test_a_failed_update_is_not_in_the_failure_checkpoint(backend: Backend) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    history = await seed(checkpointer, thread, 10)
    graph = StateGraph()
    graph.add_node("ok", lambda state: {"messages": [assistant("fine")]})
    graph.add_node("bad", lambda state: {"messages": [assistant("kept out")], "no_such_channel": 1})
    graph.add_edge(START, "ok")
    graph.add_edge("ok", "bad")
    graph.add_edge("bad", END)
    with pytest.raises(InvalidUpdateError):
        await graph.compile(checkpointer).ainvoke({"messages": [user("go")]}, {"thread_id": thread})

    checkpoint = await (await backend.open()).aget(thread)
    assert checkpoint is not None and checkpoint.status == "failed"
    assert [m.content for m in checkpoint.messages[10:]] == ["go", "fine"]
    assert checkpoint.messages[:10] == history


def test_add_messages_called_by_anyone_else_changes_nothing_it_is_given() -> None:
    first = add_messages([], [user("a", id="msg_a")])
    kept = list(first)
    second = add_messages(first, [user("b", id="msg_b"), user("a again", id="msg_a")])
    assert first == kept and second is not first
    assert [m.content for m in second] == ["a again", "b"]


async def test_a_node_still_gets_its_own_copy(backend: Backend) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    await seed(checkpointer, thread, 10)
    inputs: list[list[Message]] = []

    def keep(state: dict[str, Any]) -> dict[str, Any]:
        inputs.append(state["messages"])
        state["messages"].append(user("smuggled"))  # a node may change its input: the run must not see it
        return {"messages": [assistant(f"step {len(inputs)}")]}

    graph = StateGraph()
    graph.add_node("a", keep)
    graph.add_node("b", keep)
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    values = await graph.compile(checkpointer).ainvoke({"messages": [user("go")]}, {"thread_id": thread})

    assert [len(i) for i in inputs] == [12, 13], "a node's input changed after the node returned"
    assert [m.content for m in values["messages"][10:]] == ["go", "step 1", "step 2"]


async def test_the_values_an_invoke_returned_do_not_change_when_the_thread_runs_again(backend: Backend) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    await seed(checkpointer, thread, 10)
    app = chain(checkpointer, 3)
    first = await app.ainvoke({"messages": [user("one")]}, {"thread_id": thread})
    held = list(first["messages"])
    second = await app.ainvoke({"messages": [user("two")]}, {"thread_id": thread})

    assert first["messages"] == held, "GUARANTEE BROKEN: a later invoke appended to values handed out earlier"
    assert len(second["messages"]) == len(held) + 4
