"""LangChain tools and chat models through agentrun (issue 12).

Guarantees protected: a LangChain ``@tool`` and a ``StructuredTool`` in one
parallel tool node execute once across a real SIGKILL and a resume in a new
process, with agentrun's idempotency key; a ``ToolException`` is a tool error
message, not a node failure; a LangChain chat model (the package's own fake,
no network) drives the support agent to completion and its token usage
reaches ``agentrun_model_tokens_total``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool, ToolException
from langchain_core.tools import tool as lc_tool

from agentrun import END, START, InMemoryCheckpointer, StateGraph, ToolNode, tool, tools_condition
from agentrun.errors import ModelError
from agentrun.metrics import MODEL_ERRORS, MODEL_TOKENS
from agentrun.models.langchain import LangChainChatModel
from tests.unit.helpers import call, calling_model, tool_graph, tool_messages

ROOT = Path(__file__).resolve().parents[2]


def drive(env: dict[str, str], store: str, *, text: str | None, fault: str | None = None) -> Any:
    child_env = dict(env)
    if fault:
        child_env["AGENTRUN_FAULT_POINT"] = fault
    cmd = [sys.executable, "-m", "tests.support.drive_langchain", store, "order-4821"]
    if text is not None:
        cmd += ["--input", text]
    return subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=90, cwd=ROOT)


@pytest.mark.parametrize(
    "fault", ["after_ledger_record:charge", "after_ledger_record:send_receipt", "after_checkpoint:tools"]
)
def test_sigkill_in_a_parallel_langchain_tool_node_then_resume_executes_each_tool_once(
    fault: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    effects = tmp_path / "effects.jsonl"
    env = dict(subprocess_env, LC_EFFECTS_FILE=str(effects))
    store = f"sqlite:///{tmp_path / 'agentrun.db'}"
    crashed = drive(env, store, text="charge order 4821 and send the receipt", fault=fault)
    assert crashed.returncode == -signal.SIGKILL, f"the run was supposed to die at {fault}:\n{crashed.stderr}"
    resumed = drive(env, store, text=None)
    assert resumed.returncode == 0, f"the resume failed:\n{resumed.stderr}"
    executed = [json.loads(line) for line in effects.read_text().splitlines()]
    by_tool = {name: [e for e in executed if e["tool"] == name] for name in ("charge", "send_receipt")}
    for name, runs in by_tool.items():
        keys = {r["key"] for r in runs}
        # Applied once: every execution of a call carries the same key, so a deduplicating provider acts once.
        assert len(keys) == 1, f"GUARANTEE BROKEN: {name} ran under different idempotency keys {keys}"
        assert runs[0]["key"] and runs[0]["key"].startswith("ar-"), f"{name} did not get the idempotency key"
        # Executed once, unless it is the sibling that was still running when the process died (its result was
        # never recorded: the documented window, retried under the same key).
        recorded_before_kill = fault.startswith("after_checkpoint") or fault.endswith(f":{name}")
        if recorded_before_kill:
            assert len(runs) == 1, f"GUARANTEE BROKEN: the LangChain tool {name} executed {len(runs)} times"
        else:
            assert len(runs) in (1, 2), f"the LangChain tool {name} executed {len(runs)} times"
    final = json.loads(next(line for line in resumed.stdout.splitlines() if line.startswith("FINAL "))[6:])
    assert final[-1]["content"] == "done: charged order 4821 | receipt for 4821 sent"


async def test_langchain_tools_keep_name_schema_and_tool_exception_is_a_tool_error() -> None:
    @lc_tool
    def refund(order_id: str, amount_cents: int) -> str:
        """Refund part of an order."""
        raise ToolException(f"order {order_id} cannot be refunded {amount_cents}")

    async def lookup(order_id: str) -> str:
        return f"order {order_id}: 49.99 EUR"

    structured = StructuredTool.from_function(coroutine=lookup, name="lookup", description="Look an order up.")
    node = ToolNode([refund, structured])
    assert set(node.tools) == {"refund", "lookup"}
    spec = node.tools["refund"].spec()["function"]
    assert spec["description"] == "Refund part of an order."
    assert set(spec["parameters"]["properties"]) == {"order_id", "amount_cents"}
    assert node.tools["lookup"].spec()["function"]["description"] == "Look an order up."

    app = tool_graph(
        [refund, structured],
        calling_model([call("call_1", "refund", order_id="7", amount_cents=5), call("call_2", "lookup", order_id="7")]),
    ).compile(InMemoryCheckpointer())
    values = await app.ainvoke("go", {"thread_id": "t"})
    results = tool_messages(values)
    assert results["call_1"].is_error and "order 7 cannot be refunded 5" in results["call_1"].content
    assert not results["call_2"].is_error and results["call_2"].content == "order 7: 49.99 EUR"
    assert values["messages"][-1].role == "assistant", "the run did not continue after the ToolException"


async def test_a_langchain_tool_with_handle_tool_error_is_a_tool_error_too() -> None:
    def fails(order_id: str) -> str:
        raise ToolException("declined")

    handled = StructuredTool.from_function(func=fails, name="fails", description="x", handle_tool_error=True)
    app = tool_graph([tool(handled)], calling_model([call("call_1", "fails", order_id="1")])).compile(
        InMemoryCheckpointer()
    )
    values = await app.ainvoke("go", {"thread_id": "t"})
    result = tool_messages(values)["call_1"]
    assert result.is_error and "declined" in result.content


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}


async def test_a_langchain_chat_model_drives_the_support_agent_to_completion_with_token_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPPORT_EFFECTS_DB", str(tmp_path / "effects.db"))
    from examples.support_agent import charge_card, count_effects, lookup_order, send_receipt

    args = {"order_id": "4821"}
    fake = FakeMessagesListChatModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[
                    {"name": "lookup_order", "args": args, "id": "call_1", "type": "tool_call"},
                    {"name": "charge_card", "args": args, "id": "call_2", "type": "tool_call"},
                    {"name": "send_receipt", "args": args, "id": "call_3", "type": "tool_call"},
                ],
                usage_metadata=_usage(120, 30),
            ),
            AIMessage(content="Charged 49.99 EUR and sent the receipt.", usage_metadata=_usage(200, 12)),
        ]
    )
    model = LangChainChatModel(fake, tools=[lookup_order, charge_card, send_receipt], model_label="fake-support")
    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup_order, charge_card, send_receipt]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    app = graph.compile(InMemoryCheckpointer())

    prompt_before = MODEL_TOKENS.labels("fake-support", "prompt")._value.get()
    completion_before = MODEL_TOKENS.labels("fake-support", "completion")._value.get()
    # The input holds a LangChain message: the messages channel (coerce_message) accepts it.
    text = "charge my saved card for order 4821"
    values = await app.ainvoke({"messages": [HumanMessage(text)]}, {"thread_id": "support-1"})

    assert values["messages"][-1].content == "Charged 49.99 EUR and sent the receipt."
    assert [m.role for m in values["messages"]] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    counts = count_effects(str(tmp_path / "effects.db"))
    assert counts["charges"] == 1 and counts["receipts"] == 1
    assert MODEL_TOKENS.labels("fake-support", "prompt")._value.get() == prompt_before + 320
    assert MODEL_TOKENS.labels("fake-support", "completion")._value.get() == completion_before + 42
    ids = [m.id for m in values["messages"] if m.role == "assistant"]
    assert len(set(ids)) == 2 and all(i and i.startswith("msg_") for i in ids), "replies need fresh agentrun ids"


async def test_a_failing_langchain_chat_model_raises_model_error_with_a_code() -> None:
    class Boom(FakeMessagesListChatModel):
        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("connection refused")

    model = LangChainChatModel(Boom(responses=[]), model_label="boom")
    before = MODEL_ERRORS.labels("MODEL_CONNECTION_001")._value.get()
    with pytest.raises(ModelError) as raised:
        await model({"messages": []})
    assert raised.value.code == "MODEL_CONNECTION_001"
    assert MODEL_ERRORS.labels("MODEL_CONNECTION_001")._value.get() == before + 1


async def test_a_bare_langchain_message_is_accepted_as_input() -> None:
    """Graphs ported from LangGraph are called with ``HumanMessage(...)``, not a dict."""

    def echo(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(f"echo: {state['messages'][-1].content}")]}

    graph = StateGraph()
    graph.add_node("echo", echo)
    graph.add_edge(START, "echo")
    graph.add_edge("echo", END)
    app = graph.compile(checkpointer=InMemoryCheckpointer())
    values = await app.ainvoke(HumanMessage(content="hi"), {"thread_id": "lc-input"})
    assert [(m.role, m.content) for m in values["messages"]] == [("user", "hi"), ("assistant", "echo: hi")]
