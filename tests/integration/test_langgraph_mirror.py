"""A LangGraph turn's mirror in our state rows (issue 23): what the operator reads of a LangGraph run.

Guarantees protected: the mirror carries the turn's status, LangGraph's step
and next node (``__end__`` once it ended, as our engine writes: ``kubectl get
ar``'s NODE), its result, the model usage of every LangChain chat model the
graph calls (tokens from ``usage_metadata``), which the operator turns into
``status.modelUsage`` and its metrics, and the thread's messages in our
messages table (what the history reads a call's request and answer from),
each written once: a later turn appends, it does not write them again.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from agentrun.checkpoint import SqliteCheckpointer
from agentrun.config import RunConfig
from agentrun.integrations.langgraph.run import prepare, run_turn


@dataclass
class _NoPreemption:
    requested: bool = False
    cancel_now: bool = False


async def test_a_langgraph_turn_mirrors_status_result_and_model_usage(tmp_path: Path) -> None:
    reply = AIMessage(
        content="hello there", usage_metadata={"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}
    )
    model = FakeMessagesListChatModel(responses=[reply, AIMessage(content="bye")])

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    store = SqliteCheckpointer(tmp_path / "agentrun.db")
    await store.setup()
    try:
        status, interrupts = await run_turn(
            prepare(graph, "test:graph"),
            store=store,
            cfg=RunConfig.from_any({"thread_id": "ns/t", "run_uid": "uid-1"}),
            payload={"messages": [{"role": "user", "content": "hi"}]},
            existing=None,
            preemption=_NoPreemption(),
        )
        assert (status, interrupts) == ("completed", [])
        checkpoint = await store.aget("ns/t")
        assert checkpoint is not None and checkpoint.status == "completed" and checkpoint.current_node == "__end__"
        assert [(m.role, m.content) for m in checkpoint.messages] == [("user", "hi"), ("assistant", "hello there")]
        assert checkpoint.meta["result"]["message"] == "hello there"
        assert checkpoint.meta["run_uid"] == "uid-1"
        usage = checkpoint.meta["model_usage"]
        (counts,) = usage.values()
        assert counts["tokens"] == {"prompt": 11, "completion": 7}, usage
        assert counts["requests"]["ok"] == 1, usage
        written = _message_versions(store)
        await run_turn(
            prepare(graph, "test:graph"),
            store=store,
            cfg=RunConfig.from_any({"thread_id": "ns/t", "run_uid": "uid-1", "attempt": 2}),
            payload={"messages": [{"role": "user", "content": "again"}]},
            existing=checkpoint,
            preemption=_NoPreemption(),
        )
        again = await store.aget("ns/t")
        assert again is not None
        assert [(m.role, m.content) for m in again.messages][2:] == [("user", "again"), ("assistant", "bye")]
        assert (_message_versions(store))[:2] == written, "the first turn's messages were written again"
    finally:
        await store.aclose()


def _message_versions(store: SqliteCheckpointer) -> list[int]:
    """The version that wrote each message of ``ns/t``, in order (a message written again has a newer one)."""
    conn = sqlite3.connect(store.path)
    try:
        rows = conn.execute("SELECT version FROM messages WHERE thread_id = ? ORDER BY idx", ("ns/t",)).fetchall()
    finally:
        conn.close()
    return [int(r[0]) for r in rows]
