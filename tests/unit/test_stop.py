"""Stop (DESIGN §2): a stop request, from any process, ends even a hung run within about a second.

Time is fast-forwarded with looptime: the tool hangs for an hour of loop
time, and "within a second" is asserted on the loop clock, not on the wall.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrun import RunStopped, SqliteCheckpointer, ThreadNotFoundError, ThreadStateError, tool
from agentrun.checkpoint import Checkpointer
from tests.support.checkpointers import Backend

from .helpers import app_for, call

STOP_AT = 10.0


@tool
async def stuck() -> str:
    await asyncio.sleep(3600)
    return "never"


async def stop_later(checkpointer: Checkpointer, thread_id: str, reason: str = "operator") -> float:
    await asyncio.sleep(STOP_AT)
    await checkpointer.request_stop(thread_id, reason)
    return asyncio.get_running_loop().time()


async def assert_stopped(checkpointer: Checkpointer, thread_id: str, reason: str = "operator") -> None:
    state = await checkpointer.aget(thread_id)
    assert state is not None and state.status == "stopped", "the stopped state was not persisted"
    assert state.current_node == "tools" and state.meta["stop_reason"] == reason
    assert await checkpointer.stop_requested(thread_id) is None, "the stop request was not acknowledged (cleared)"


@pytest.mark.looptime
async def test_stop_ends_a_tool_stuck_in_sleep_within_a_second(
    backend: Backend, checkpointer: Checkpointer, looptime: Any
) -> None:
    t = backend.thread()
    app = app_for([stuck], [call("call_1", "stuck")], checkpointer)
    stopper = asyncio.create_task(stop_later(checkpointer, t))
    with pytest.raises(RunStopped) as raised:
        await app.ainvoke("go", {"thread_id": t})
    requested_at = await stopper
    assert requested_at >= STOP_AT, "the run ended before anyone asked it to stop"
    assert looptime - requested_at <= 1.0, f"the stop took {looptime - requested_at}s of loop time to take effect"
    assert raised.value.code == "RUN_STOPPED_001"
    assert (raised.value.thread_id, raised.value.node, raised.value.reason) == (t, "tools", "operator")
    await assert_stopped(checkpointer, t)
    state = await checkpointer.aget(t)
    assert state is not None and raised.value.version == state.version


@pytest.mark.looptime
async def test_stop_works_through_astream(backend: Backend, checkpointer: Checkpointer, looptime: Any) -> None:
    t = backend.thread()
    app = app_for([stuck], [call("call_1", "stuck")], checkpointer)
    stopper = asyncio.create_task(stop_later(checkpointer, t))
    events = []
    with pytest.raises(RunStopped):
        async for event in app.astream("go", {"thread_id": t}):
            events.append(event)
    requested_at = await stopper
    assert looptime - requested_at <= 1.0
    assert [(e.kind, e.node) for e in events] == [("step", "model")], "the model step streamed before the stop"
    await assert_stopped(checkpointer, t)


async def test_stop_requested_before_the_run_starts(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    ran: list[str] = []

    @tool
    async def lookup() -> str:
        ran.append("lookup")
        return "ok"

    app = app_for([lookup], [call("call_1", "lookup")], checkpointer)
    await checkpointer.request_stop(t, "before start")
    with pytest.raises(RunStopped) as raised:
        await app.ainvoke("go", {"thread_id": t})
    assert raised.value.node == "model" and raised.value.reason == "before start"
    assert ran == []
    state = await checkpointer.aget(t)
    assert state is not None and state.status == "stopped" and state.current_node == "model"
    assert [m.content for m in state.messages] == ["go"], "the input that started the run must be kept"
    assert await checkpointer.stop_requested(t) is None


@pytest.mark.looptime
async def test_stop_from_another_connection_to_the_store(
    backend: Backend, checkpointer: Checkpointer, looptime: Any
) -> None:
    """As ``agentrun stop`` from another process does: a second checkpointer on the same store."""
    t = backend.thread()
    other = await backend.open()
    app = app_for([stuck], [call("call_1", "stuck")], checkpointer)
    stopper = asyncio.create_task(stop_later(other, t, "from another process"))
    with pytest.raises(RunStopped):
        await app.ainvoke("go", {"thread_id": t})
    requested_at = await stopper
    assert looptime - requested_at <= 1.0
    await assert_stopped(other, t, "from another process")


@pytest.mark.looptime
async def test_stop_from_a_second_sqlite_checkpointer_on_the_same_file(tmp_path: Any, looptime: Any) -> None:
    running, stopping = SqliteCheckpointer(tmp_path / "store.db"), SqliteCheckpointer(tmp_path / "store.db")
    try:
        await running.setup()
        await stopping.setup()
        app = app_for([stuck], [call("call_1", "stuck")], running)
        stopper = asyncio.create_task(stop_later(stopping, "t"))
        with pytest.raises(RunStopped):
            await app.ainvoke("go", {"thread_id": "t"})
        assert looptime - await stopper <= 1.0
        await assert_stopped(stopping, "t")
    finally:
        await running.aclose()
        await stopping.aclose()


async def test_stopped_thread_takes_new_input_but_cannot_be_resumed(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    started = asyncio.Event()

    @tool
    async def lookup() -> str:
        if not started.is_set():
            started.set()
            await asyncio.sleep(3600)  # the first turn hangs until it is stopped
        return "ok"

    app = app_for([lookup], [call("call_1", "lookup")], checkpointer)

    async def stop_it() -> None:
        await started.wait()
        await app.arequest_stop(t, "halt")

    stopper = asyncio.create_task(stop_it())
    with pytest.raises(RunStopped):
        await app.ainvoke("first", {"thread_id": t})
    await stopper
    with pytest.raises(ThreadStateError) as raised:
        await app.ainvoke(None, {"thread_id": t})
    assert "no unfinished run to resume (status: stopped)" in str(raised.value)
    values = await app.ainvoke("second", {"thread_id": t})
    assert values["messages"][-1].content == "done: call_1=ok"


async def test_a_stop_belongs_to_a_turn_in_progress(backend: Backend, checkpointer: Checkpointer) -> None:
    """Issue 22 item 6: a stop for an unknown thread or an ended turn is refused, never kept for the next turn."""
    t = backend.thread()

    @tool
    async def lookup() -> str:
        return "ok"

    app = app_for([lookup], [call("call_1", "lookup")], checkpointer)
    with pytest.raises(ThreadNotFoundError, match="does not exist"):
        await app.arequest_stop(t, "too early")
    assert await checkpointer.stop_requested(t) is None
    await app.ainvoke("first", {"thread_id": t})
    with pytest.raises(ThreadStateError, match="no run in progress"):
        await app.arequest_stop(t, "too late")
    assert await checkpointer.stop_requested(t) is None, "a refused stop was kept for the next turn"
    values = await app.ainvoke("second", {"thread_id": t})  # the next turn runs, not stopped at its first node
    assert values["messages"][-1].content == "done: call_1=ok"
