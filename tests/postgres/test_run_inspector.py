"""The run inspector read from a real PostgreSQL store (checkpoint.pg_inspect, agentrun.inspector).

A real graph (a model that asks for a tool, the tool, a node that writes the order's status) runs on
PgCheckpointer with state deltas; the store reads back the run's input, its conversation and, per
checkpoint, the state as of it and what its step changed, digests computed by PostgreSQL: a value is
never read whole (a 1 MB key costs its preview).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import asyncpg
import pytest

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tool, tools_condition
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.history import PREVIEW_CHARS
from agentrun.inspector import conversation, step
from agentrun.messages import add_messages
from agentrun.models import ScriptedModel
from agentrun_history import pages
from agentrun_operator.kubectl_plugin import print_conversation

pytestmark = pytest.mark.postgres

THREAD = "default/inspect-1"
BIG = "x" * (1 << 20)


class OrderState(TypedDict, total=False):
    messages: Annotated[list[Message], add_messages]
    order: str
    status: str
    big: str


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


def _model(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        return assistant(
            "Let me look.", tool_calls=[ToolCall(id="call_1", name="lookup_order", arguments='{"order_id": "4821"}')]
        )
    return assistant("Your order 4821 has shipped.")


def _record(state: dict[str, Any]) -> dict[str, Any]:
    return {"status": "answered", "big": BIG}


def graph() -> StateGraph:
    g = StateGraph(OrderState)
    g.add_node("model", ScriptedModel(_model))
    g.add_node("tools", ToolNode([lookup_order]))
    g.add_node("record", _record)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, {"tools": "tools", END: "record"})
    g.add_edge("tools", "model")
    g.add_edge("record", END)
    return g


async def test_the_input_conversation_and_each_steps_state_and_changes_read_back(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = PgCheckpointer(pg_dsn)
    given = {"messages": [{"role": "user", "content": "where is order 4821?"}], "order": "4821"}
    try:
        await store.put_run_inputs(THREAD, run_uid="uid-1", attempt=1, input=given, resume=None)
        await graph().compile(store).ainvoke(given, {"thread_id": THREAD, "attempt": 1, "run_uid": "uid-1"})
        found, rows, total, shape = await store.thread_conversation(THREAD, run_uid="uid-1")
        steps = {}
        version = 1
        while (detail := await store.thread_step(THREAD, version)) is not None:
            steps[version] = step(detail, version)
            version += 1
        assert await store.thread_step(THREAD, 999) is None
    finally:
        await store.aclose()

    talk = conversation(found, rows, total, shape)
    assert talk.input is not None and json.loads(talk.input.preview) == given, "the turn's input, as given"
    assert [(m.role, m.content.preview if m.content else None) for m in talk.messages] == [
        ("user", "where is order 4821?"),
        ("assistant", "Let me look."),
        ("tool", "order 4821: shipped"),
        ("assistant", "Your order 4821 has shipped."),
    ]
    asked = talk.messages[1]
    assert [(c.id, c.name, c.arguments and c.arguments.preview) for c in asked.tool_calls] == [
        ("call_1", "lookup_order", '{"order_id": "4821"}')
    ], "the tool call as content: its name and arguments"
    assert talk.messages[2].tool_call_id == "call_1" and not talk.messages[2].is_error
    assert talk.total == 4 and all(m.version is not None for m in talk.messages)
    for m in talk.messages:  # the version named is the checkpoint whose step appended it
        assert m.version is not None and m.index in [x.index for x in steps[m.version].messages], (m, steps)

    # Each step: the messages it appended and the keys it changed, against the version before.
    by_version = {v: s for v, s in steps.items()}
    appended = {v: [m.role for m in s.messages] for v, s in by_version.items() if s.messages}
    assert sorted(r for roles in appended.values() for r in roles) == ["assistant", "assistant", "tool", "user"]
    said = next(s for s in by_version.values() if [m.role for m in s.messages] == ["tool"])
    assert said.messages[0].content is not None and said.messages[0].content.preview == "order 4821: shipped"
    last = by_version[max(by_version)]
    assert last.status == "completed" and last.state["order"].preview == "4821"
    recorded = next(s for s in by_version.values() if any(c.key == "status" for c in s.changes))
    assert [(c.key, c.change) for c in recorded.changes] == [("big", "added"), ("status", "added")]
    big = recorded.state["big"]
    assert (big.bytes, big.sha256, big.truncated) == (len(BIG), hashlib.sha256(BIG.encode()).hexdigest(), True)
    assert len(big.preview) == PREVIEW_CHARS, "a 1 MB value costs its preview, not its bytes"
    first = by_version[1]
    assert first.previous_version is None and {c.change for c in first.changes} <= {"added"}
    unchanged = [s for s in by_version.values() if s.previous_version is not None and not s.changes]
    assert unchanged, "a step that changed no key (the model's) shows no change, only its messages"

    html = pages.step_detail(recorded)
    assert re.search(r"<tr class=change-added><td><code>big</code>", html) and "1048576 B" in html
    html = pages.conversation(talk)
    assert "lookup_order" in html and "&quot;order_id&quot;: &quot;4821&quot;" in html and "role-tool" in html

    print_conversation(talk.model_dump(mode="json"))
    out = capsys.readouterr().out
    assert '"content": "where is order 4821?"' in out.splitlines()[0], "the input first"
    assert re.search(r'v\d+ assistant -> lookup_order\(\{"order_id": "4821"\}\) \[call_1\]', out), out
    assert re.search(r"v\d+ tool \[call_1\]: order 4821: shipped", out), out

    # The graph's structure, recorded on the turn's opening checkpoint only, drawn with where the run is.
    assert talk.graph is not None and talk.graph.nodes == ["__start__", "model", "tools", "record", "__end__"]
    assert sorted(map(tuple, talk.graph.edges)) == [
        ("__start__", "model", False),
        ("model", "record", True),
        ("model", "tools", True),
        ("record", "__end__", False),
        ("tools", "model", False),
    ]
    svg = pages.graph_picture(talk.graph, "record")
    assert re.search(r'<g class="gnode current" data-node="record">', svg) and svg.count("<path class=edge") == 5
    assert svg.count('stroke-dasharray="5 4"') == 2, "the two conditional edges dashed"
    carried = [v for v, s in steps.items() if s.state.get("graph")]
    assert carried == [], "the structure is meta of the opening checkpoint, never state"


class Crash(BaseException):
    """Stands in for the process dying in the model's first call: nothing after it runs."""


async def test_the_graph_structure_is_on_the_opening_checkpoint_only(pg_dsn: str) -> None:
    """Written with the turn's opening checkpoint, never carried on: not by the next steps, and not by an attempt
    that resumes from that very checkpoint (it died in the first node)."""
    crash = True

    def dies_once(messages: Sequence[Message]) -> Message:
        if crash:
            raise Crash
        return _model(messages)

    g = graph()
    g.nodes.pop("model")
    g.add_node("model", ScriptedModel(dies_once))
    store = PgCheckpointer(pg_dsn)
    try:
        with pytest.raises(Crash):
            await g.compile(store).ainvoke({"messages": [{"role": "user", "content": "hi"}]}, {"thread_id": THREAD})
        crash = False
        await g.compile(store).ainvoke(None, {"thread_id": THREAD})
        pool_rows = await store.thread_rows(THREAD)
        conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": store.schema})
        try:
            carrying = await conn.fetch(
                "SELECT version, step FROM states WHERE thread_id = $1 AND meta -> 'graph' IS NOT NULL", THREAD
            )
        finally:
            await conn.close()
    finally:
        await store.aclose()
    assert [(r["version"], r["step"]) for r in carrying] == [(1, 0)], "one row: the turn's opening checkpoint"
    assert len(pool_rows.states) > 3
