"""A thread's stored messages are validated when first read, and still reach nodes as a plain list of messages.

What is protected (issue 34 item 3): the list a node receives from a loaded thread behaves as the same list
of plain messages in every way nodes use it (one test per operation, against a plain list); a node that reads
only the last message of a 10,000-message thread validates that message alone (counted: a message not yet
validated is not of type ``Message``); the state read back equals the state written, at 10,000 messages, on
every store; a node that mutates its input cannot change the stored history; and a stored message the schema
rejects fails loudly (``StorageError`` naming it) where it is read.
"""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import sqlite3
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel, TypeAdapter

from agentrun import END, START, StateGraph, StorageError
from agentrun.checkpoint import Checkpointer, InMemoryCheckpointer, SqliteCheckpointer
from agentrun.integrations.langchain import to_langchain
from agentrun.messages import Message, ToolCall, assistant, stored_messages, system, tool_message, user
from agentrun.models.openai import to_wire
from agentrun_dev.databases import postgres_dsn
from tests.support.checkpointers import Backend, write

HISTORY = 10_000


def conversation(count: int) -> list[Message]:
    """``count`` messages of every shape a thread holds: text, tool calls and answers, parts, a named one."""
    shapes: list[Callable[[int], Message]] = [
        lambda i: user(f"question {i}"),
        lambda i: assistant("", [ToolCall(id=f"call_{i}", name="lookup", arguments=f'{{"key": {i}}}')]),
        lambda i: tool_message(f"value {i}", tool_call_id=f"call_{i - 1}", name="lookup", is_error=i % 7 == 0),
        lambda i: assistant(f"answer {i} ünïcode"),
        lambda i: Message(role="user", content="a picture", parts=[{"type": "image_url", "image_url": {"url": "x"}}]),
        lambda i: system(f"note {i}", name="ops"),
    ]
    return [shapes[i % len(shapes)](i) for i in range(count)]


def as_stored(messages: list[Message]) -> list[Message]:
    """``messages`` as a store's load gives them back (their JSON texts and ids, nothing validated)."""
    return stored_messages([m.id for m in messages], [json.dumps(m.to_json()) for m in messages])


def unvalidated(messages: list[Message]) -> int:
    """How many of ``messages`` were never validated (``type()`` reads no attribute, so it validates none)."""
    return sum(type(m) is not Message for m in messages)


# -- the list a node receives ------------------------------------------------------------------------------------


NEW = user("new", id="msg_new")


class Holder(BaseModel):
    messages: list[Message]


OPERATIONS: dict[str, Callable[[list[Message]], Any]] = {
    "isinstance-list": lambda ms: (isinstance(ms, list), all(isinstance(m, Message) for m in ms)),
    "len": len,
    "last": lambda ms: ms[-1],
    "slice": lambda ms: ms[2:9],
    "step-slice": lambda ms: ms[::5],
    "iterate": lambda ms: [(m.role, m.content) for m in ms],
    "reversed": lambda ms: list(reversed(ms)),
    "enumerate-zip": lambda ms: list(zip(range(len(ms)), ms, strict=True)),
    "contains": lambda ms: (NEW in ms, ms[3] in ms),
    "index-count": lambda ms: (ms.index(ms[4]), ms.count(ms[4])),
    "equals": lambda ms: (ms == ms[:], ms[:] == ms, ms != ms[:-1], ms == [*ms[:-1], NEW]),
    "concatenate": lambda ms: (ms + [NEW], [NEW] + ms, [*ms, NEW]),  # noqa: RUF005 (the + operators are the test)
    "repeat": lambda ms: ms * 2,
    "sorted": lambda ms: sorted(ms, key=lambda m: (m.role, m.content)),
    "tuple": tuple,
    "filter-by-role": lambda ms: [m for m in ms if m.role == "assistant" and m.tool_calls],
    "tool-arguments": lambda ms: [c.parsed_arguments() for m in ms for c in m.tool_calls],
    "copy": lambda ms: (copy.copy(ms), [copy.copy(m) for m in ms]),
    "deepcopy": copy.deepcopy,
    "pickle": lambda ms: pickle.loads(pickle.dumps(ms)),
    "json-dumps-default": lambda ms: json.dumps(ms, default=lambda m: m.model_dump()),
    "json-dumps-to-json": lambda ms: json.dumps([m.to_json() for m in ms]),
    "pydantic-dump-json": lambda ms: TypeAdapter(list[Message]).dump_json(ms),
    "pydantic-dump-python": lambda ms: TypeAdapter(list[Message]).dump_python(ms, mode="json"),
    "pydantic-validate": lambda ms: TypeAdapter(list[Message]).validate_python(ms),
    "pydantic-model-holding-them": lambda ms: Holder(messages=ms).model_dump_json(),
    "model-methods": lambda ms: [(m.model_dump(), m.model_fields_set, dict(m), vars(m).copy()) for m in ms],
    "model-copy": lambda ms: [m.model_copy(update={"content": "edited"}) for m in ms],
    "repr-str": lambda ms: (repr(ms), [str(m) for m in ms]),
    "openai-wire": lambda ms: [to_wire(m) for m in ms],
    "langchain-messages": lambda ms: [to_langchain(m) for m in ms],
    "type-after-use": lambda ms: [type(m) for m in ms if m.content is not None],
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_stored_list_behaves_as_the_plain_list_for(operation: str) -> None:
    messages = conversation(24)
    # The plain list: the same texts validated at once, as every store loaded them before (their fields set
    # is every stored field, not the ones a constructor was given).
    plain = Message.many_from_json_texts([json.dumps(m.to_json()) for m in messages])
    stored = as_stored(messages)
    assert unvalidated(stored) == len(stored)  # nothing validated by the load
    got, expected = OPERATIONS[operation](stored), OPERATIONS[operation](plain)
    assert got == expected, f"GUARANTEE BROKEN: a loaded thread's messages differ from a plain list's in {operation}"


def test_a_stored_message_set_or_mutated_in_place_is_a_plain_message() -> None:
    plain = conversation(6)
    stored = as_stored(plain)
    stored[3].content = "changed"  # pydantic's __setattr__ writes into the validated fields
    stored[1].tool_calls.append(ToolCall(id="c", name="n"))
    assert type(stored[3]) is Message and stored[3].content == "changed"
    assert [c.id for c in stored[1].tool_calls] == ["call_1", "c"]
    assert unvalidated(stored) == 4


def test_reading_the_id_validates_nothing_and_the_rest_validates_once() -> None:
    plain = conversation(6)
    stored = as_stored(plain)
    assert [m.id for m in stored] == [m.id for m in plain]
    assert unvalidated(stored) == 6
    assert stored[2].role == "tool" and type(stored[2]) is Message
    assert unvalidated(stored) == 5


# -- through the engine, on every store ---------------------------------------------------------------------------


async def seed(checkpointer: Checkpointer, thread: str, messages: list[Message]) -> None:
    """A thread holding ``messages`` (a completed earlier turn), written in one checkpoint."""
    await checkpointer.aput(
        thread, write(*enumerate(messages), count=len(messages), status="completed", node=None), expected_version=0
    )


async def test_a_node_reading_only_the_last_message_validates_only_it(backend: Backend) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    history = conversation(HISTORY)
    await seed(checkpointer, thread, history)
    seen: list[list[Message]] = []

    def reply(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(state["messages"])
        # The thread's last message before this turn's input (the engine read it too: was it a tool request?).
        return {"messages": [assistant(f"after {state['messages'][-2].content}")]}

    graph = StateGraph()
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    graph.add_edge("reply", END)
    values = await graph.compile(checkpointer).ainvoke({"messages": [user("next")]}, {"thread_id": thread})

    (given,) = seen
    assert type(given) is list and len(given) == HISTORY + 1
    assert unvalidated(given[:HISTORY]) == HISTORY - 1, (
        "GUARANTEE BROKEN: a node reading only the last message validated "
        f"{HISTORY - unvalidated(given[:HISTORY])} stored messages, not 1"
    )
    assert values["messages"][-1].content == f"after {history[-1].content}"  # the last one, read from its row
    assert unvalidated(values["messages"]) == HISTORY - 1


async def test_the_restored_state_equals_the_written_one_at_10000_messages(backend: Backend) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    history = conversation(HISTORY)
    await seed(checkpointer, thread, history)
    replaced = history[17].model_copy(update={"content": "replaced in place"})
    added = assistant("the last one")
    second = write((17, replaced), (HISTORY, added), count=HISTORY + 1, status="completed", node=None)
    await checkpointer.aput(thread, second, expected_version=1)

    reader = await backend.open()  # another connection, as another process reads it
    checkpoint = await reader.aget(thread)
    assert checkpoint is not None
    expected = [*history[:17], replaced, *history[18:], added]
    assert [m.id for m in checkpoint.messages] == [m.id for m in expected]
    assert checkpoint.messages == expected, "GUARANTEE BROKEN: the messages read back differ from those written"
    assert [m.to_json() for m in checkpoint.messages] == [m.to_json() for m in expected]


async def test_a_node_that_mutates_its_input_cannot_change_the_stored_history(backend: Backend) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    history = conversation(48)
    await seed(checkpointer, thread, history)

    def vandal(state: dict[str, Any]) -> dict[str, Any]:
        messages = state["messages"]
        messages[0].content = "rewritten in place"  # a message object the run shares: never written back
        messages[1] = user("forged")
        del messages[2:10]
        messages.reverse()
        messages.append(user("smuggled"))
        return {"messages": [assistant("done")]}

    graph = StateGraph()
    graph.add_node("vandal", vandal)
    graph.add_edge(START, "vandal")
    graph.add_edge("vandal", END)
    await graph.compile(checkpointer).ainvoke({"messages": [user("go")]}, {"thread_id": thread})

    checkpoint = await (await backend.open()).aget(thread)
    assert checkpoint is not None
    stored = checkpoint.messages
    assert len(stored) == 50, "GUARANTEE BROKEN: a node's changes to its input list reached the store"
    assert stored[:48] == history, "GUARANTEE BROKEN: a node that mutated its input changed the stored history"
    assert (stored[48].content, stored[49].content) == ("go", "done")


async def corrupt(backend: Backend, checkpointer: Checkpointer, thread: str, idx: int, body: str) -> None:
    """Overwrite message ``idx``'s stored form behind the store's back (a hand edit, another version)."""
    if isinstance(checkpointer, InMemoryCheckpointer):
        checkpointer._threads[thread].messages[idx] = json.loads(body)
    elif isinstance(checkpointer, SqliteCheckpointer):
        with contextlib.closing(sqlite3.connect(backend.path)) as db, db:
            db.execute("UPDATE messages SET body = ? WHERE thread_id = ? AND idx = ?", (body, thread, idx))
    else:
        conn = await asyncpg.connect(postgres_dsn(), server_settings={"search_path": checkpointer.schema})  # type: ignore[attr-defined]
        try:
            await conn.execute("UPDATE messages SET body = $1 WHERE thread_id = $2 AND idx = $3", body, thread, idx)
        finally:
            await conn.close()


@pytest.mark.parametrize("reads", ["all", "last"])
async def test_a_stored_message_the_schema_rejects_fails_loudly_where_it_is_read(backend: Backend, reads: str) -> None:
    checkpointer = await backend.open()
    thread = backend.thread()
    history = conversation(20)
    await seed(checkpointer, thread, history)
    bad = history[5]
    await corrupt(backend, checkpointer, thread, 5, json.dumps({**bad.to_json(), "role": "robot"}))

    def node(state: dict[str, Any]) -> dict[str, Any]:
        read = state["messages"] if reads == "all" else state["messages"][-1:]
        return {"messages": [assistant(f"read {sum(len(m.content) for m in read)} characters")]}

    graph = StateGraph()
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    graph.add_edge("node", END)
    app = graph.compile(checkpointer)
    if reads == "last":  # never read, never rewritten: the run does not depend on it
        values = await app.ainvoke({"messages": [user("go")]}, {"thread_id": thread})
        assert values["messages"][-1].content.startswith("read ")
        return
    with pytest.raises(StorageError, match=rf"stored message '{bad.id}' is not a valid message") as raised:
        await app.ainvoke({"messages": [user("go")]}, {"thread_id": thread})
    assert "role" in str(raised.value)
    snapshot = await app.aget_state(thread)
    assert snapshot is not None and snapshot.status == "failed", "GUARANTEE BROKEN: an unreadable message went unseen"
