"""What a step writes (DESIGN §2): only its new messages, and a state row that does not grow with history.

Asserted on the rows and their sizes in the SQLite file, never on time.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentrun import END, START, SqliteCheckpointer, StateGraph, assistant, tool
from agentrun.checkpoint import CheckpointWrite

from .helpers import app_for, call

TURNS = 12


class RecordingSqlite(SqliteCheckpointer):
    """Keeps what the engine handed to each write."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: list[CheckpointWrite] = []
        self.cached: list[CheckpointWrite] = []

    async def aput(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> int:
        self.writes.append(write)
        return await super().aput(thread_id, write, expected_version=expected_version, attempt=attempt, run_uid=run_uid)

    async def cache_put(self, thread_id: str, write: CheckpointWrite, *, version: int) -> None:
        self.cached.append(write)


def rows(path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


@tool
async def lookup(order_id: str) -> dict[str, str]:
    return {"order": order_id, "status": "shipped"}


async def test_bytes_per_step_do_not_grow_with_history(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    checkpointer = RecordingSqlite(path)
    try:
        app = app_for([lookup], [call("call_1", "lookup", order_id="4821")], checkpointer)
        for turn in range(TURNS):
            await app.ainvoke(f"where is order 4821? ({turn:02d})", {"thread_id": "t"})
    finally:
        await checkpointer.aclose()

    steps_per_turn = 4  # the input, the model's request, the tool result, the model's answer
    assert len(checkpointer.writes) == TURNS * steps_per_turn
    assert all(len(w.messages) == 1 for w in checkpointer.writes), (
        f"a checkpoint re-sent messages that were already stored: {[len(w.messages) for w in checkpointer.writes]}"
    )
    total = rows(path, "SELECT COUNT(*) FROM messages WHERE thread_id = 't'")[0][0]
    assert total == TURNS * steps_per_turn
    per_version = rows(path, "SELECT version, COUNT(*) FROM messages GROUP BY version ORDER BY version")
    assert [count for _, count in per_version] == [1] * (TURNS * steps_per_turn), "a step rewrote stored messages"

    state_rows = rows(
        path,
        "SELECT version, length(state_values) + length(meta) + length(coalesce(current_node, '')) "
        "FROM states WHERE thread_id = 't' ORDER BY version",
    )
    message_bytes = dict(rows(path, "SELECT version, SUM(length(body)) FROM messages GROUP BY version"))
    step_bytes = [size + message_bytes[version] for version, size in state_rows]
    first_turn, last_turn = step_bytes[:steps_per_turn], step_bytes[-steps_per_turn:]
    assert last_turn == first_turn, (
        f"the bytes written per step grew with the history: first turn {first_turn}, turn {TURNS} {last_turn}"
    )
    state_sizes = [size for _, size in state_rows]
    # Compared step by step of a turn: a turn's last row also carries its result (bounded, not history).
    for position in range(steps_per_turn):
        sizes = state_sizes[position::steps_per_turn]
        assert max(sizes) - min(sizes) < 64, f"state rows grow with history (step {position} of each turn): {sizes}"


def three_node_graph(ran: Counter[str], crash_in: str | None = None) -> StateGraph:
    def node(name: str) -> Any:
        async def fn(state: dict[str, Any]) -> dict[str, Any]:
            ran[name] += 1
            if name == crash_in:
                raise Crash
            return {"messages": [assistant(f"{name} done")]}

        return fn

    graph = StateGraph()
    for name in ("a", "b", "c"):
        graph.add_node(name, node(name))
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", "c")
    graph.add_edge("c", END)
    return graph


class Crash(BaseException):
    """Stands in for the process dying."""


@pytest.mark.parametrize("durable", [True, False])
async def test_durable_checkpoint_every_step_decides_which_steps_are_written(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "store.db"
    checkpointer = RecordingSqlite(path)
    ran: Counter[str] = Counter()
    try:
        app = three_node_graph(ran).compile(checkpointer)
        values = await app.ainvoke("go", {"thread_id": "t", "durable_checkpoint_every_step": durable})
        state = await app.aget_state("t")
    finally:
        await checkpointer.aclose()
    statuses = [status for (status,) in rows(path, "SELECT status FROM states ORDER BY version")]
    if durable:
        assert statuses == ["running", "running", "running", "completed"]
        assert checkpointer.cached == []
    else:
        assert statuses == ["running", "completed"], "intermediate steps were written durably"
        assert [w.current_node for w in checkpointer.cached] == ["b", "c"], "intermediate steps skipped the cache"
    assert [m.content for m in values["messages"]] == ["go", "a done", "b done", "c done"]
    assert state is not None and [m.content for m in state.values["messages"]] == ["go", "a done", "b done", "c done"]
    assert rows(path, "SELECT COUNT(*) FROM messages")[0][0] == 4, "the terminal write must carry the cached messages"


async def test_non_durable_steps_are_redone_after_a_crash(tmp_path: Path) -> None:
    """The documented price of durable_checkpoint_every_step: false."""
    path = tmp_path / "store.db"
    ran: Counter[str] = Counter()
    checkpointer = SqliteCheckpointer(path)
    try:
        config = {"thread_id": "t", "durable_checkpoint_every_step": False}
        with pytest.raises(Crash):
            await three_node_graph(ran, crash_in="c").compile(checkpointer).ainvoke("go", config)
        await three_node_graph(ran).compile(checkpointer).ainvoke(None, config)
    finally:
        await checkpointer.aclose()
    assert ran == {"a": 2, "b": 2, "c": 2}


async def test_tool_request_is_durable_before_the_tool_node_runs(tmp_path: Path) -> None:
    """Without it a crash would re-run the model under a new message id, and every tool with it."""
    path = tmp_path / "store.db"
    checkpointer = RecordingSqlite(path)
    seen: list[Any] = []

    @tool
    async def check(state: dict[str, Any]) -> str:
        request = state["messages"][-1]
        stored = await asyncio.to_thread(
            rows, path, "SELECT body FROM messages WHERE thread_id = 't' AND message_id = ?", request.id
        )
        seen.append(bool(stored))
        return "checked"

    try:
        app = app_for([check], [call("call_1", "check")], checkpointer)
        await app.ainvoke("go", {"thread_id": "t", "durable_checkpoint_every_step": False})
    finally:
        await checkpointer.aclose()
    assert seen == [True], "the assistant message with tool calls was not durable when its tools ran"
    statuses = [s for (s,) in rows(path, "SELECT status FROM states ORDER BY version")]
    assert statuses == ["running", "running", "completed"], "only the tool request and the end are durable"
    assert [w.current_node for w in checkpointer.cached] == ["model"], "the tool result step goes to the cache"
