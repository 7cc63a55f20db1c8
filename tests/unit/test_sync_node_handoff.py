"""A sync node's hand-off (``supervisor``, ``sync.start_sync``): its call is the future of its worker thread,
awaited by the supervisor without a task around it, in a context of its own holding the run's variables.

What is protected: no node task is created for a sync node (counted with the loop's task factory; an async
node still gets its task); the node sees its run context on its thread and the runs' contexts do not mix; a
sync function that returns an awaitable is awaited on the loop in the same context; a sync node past its
deadline is abandoned with ``NODE_TIMEOUT_001`` as before.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentrun import END, START, NodeTimeoutError, StateGraph, assistant
from agentrun.checkpoint import InMemoryCheckpointer
from agentrun.context import get_run_context

NODES = 5


def _sync(i: int) -> Any:
    def node(state: dict[str, Any]) -> dict[str, Any]:
        ctx = get_run_context()
        assert threading.current_thread() is not threading.main_thread()
        return {"messages": [assistant(f"{ctx.thread_id}:{ctx.node}:{i}")]}

    return node


def chain(*nodes: Any) -> Any:
    graph = StateGraph()
    for i, fn in enumerate(nodes):
        graph.add_node(f"n{i}", fn)
        graph.add_edge(START if i == 0 else f"n{i - 1}", f"n{i}")
    graph.add_edge(f"n{len(nodes) - 1}", END)
    return graph.compile(InMemoryCheckpointer())


async def test_no_task_around_a_sync_node_and_its_context_on_its_thread() -> None:
    loop = asyncio.get_running_loop()
    created: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)  # named after the factory returns
        return task

    async def awaited(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [assistant(f"async:{get_run_context().node}")]}

    app = chain(*[_sync(i) for i in range(NODES)], awaited)
    loop.set_task_factory(factory)
    try:
        runs = await asyncio.gather(*(app.ainvoke("go", {"thread_id": f"t{k}"}) for k in range(2)))
    finally:
        loop.set_task_factory(None)
    for k, out in enumerate(runs):
        assert [m.content for m in out["messages"]][1:] == [
            *(f"t{k}:n{i}:{i}" for i in range(NODES)),
            f"async:n{NODES}",
        ]
    node_tasks = [t.get_name() for t in created if t.get_name().startswith("agentrun:t")]
    assert sorted(node_tasks) == [f"agentrun:t{k}:n{NODES}" for k in range(2)], (
        f"only the async node runs in a task of its own: {node_tasks}"
    )


async def test_a_sync_function_returning_an_awaitable_is_awaited_in_its_context() -> None:
    def factory(state: dict[str, Any]) -> Any:
        async def later() -> dict[str, Any]:
            return {"messages": [assistant(f"later:{get_run_context().node}")]}

        return later()

    out = await chain(factory).ainvoke("go", {"thread_id": "awaitable"})
    assert [m.content for m in out["messages"]] == ["go", "later:n0"]


async def test_a_sync_node_past_its_deadline_is_abandoned() -> None:
    release = threading.Event()

    def stuck(state: dict[str, Any]) -> dict[str, Any]:
        release.wait(10)
        return {}

    try:
        with pytest.raises(NodeTimeoutError) as raised:
            await chain(stuck).ainvoke("go", {"thread_id": "stuck", "node_timeout": 0.3})
        assert raised.value.code == NodeTimeoutError.NODE
    finally:
        release.set()  # the abandoned thread returns
