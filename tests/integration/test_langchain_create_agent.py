"""A LangChain ``create_agent`` agent through agentrun's ledger (``LedgerMiddleware``, issue 32 item 7).

Guarantees protected: the example runs as written (``python -m``, from a fresh folder);
the seed scenario as ``create_agent`` builds it
(``examples.langchain_create_agent``: a LangChain chat model asking for three
tools in one message, ``create_agent``'s own tool node), run by the real
runner process on a SQLite store and SIGKILLed right after ``charge_card``
was recorded, then the next attempt: the card charged once, every call with
agentrun's idempotency key, the run completed and ``charge_card`` answered
from the ledger. In process, on a real SQLite store: a call recorded before
its node could finish is answered on the replay with the recorded result,
the tool not called again (async and sync agents); a failed tool is counted
as failed (an error result, or an exception that fails the run) and never
recorded as a result, so it runs again; a superseded attempt stops with
``FencedError``; an agent on another checkpointer is refused naming
``LedgerMiddleware``.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt.tool_node import ToolCallRequest

from agentrun.checkpoint import SqliteCheckpointer
from agentrun.context import ToolCounts
from agentrun.errors import FencedError
from agentrun.integrations.langgraph import AgentrunSaver, LedgerMiddleware, current_idempotency_key
from agentrun.integrations.langgraph.tools import track
from examples.support_agent import count_effects
from tests.conftest import ROOT

THREAD = "default/ca-4821"
KEY = "ai-1:c1"  # <assistant message id>:<tool call id> of the scripted model's one call
CALLS: list[tuple[str, str | None]] = []
FAILURES = {"left": 0}  # how many more times charge_card fails


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    FAILURES["left"] = 0


# -- the real runner process, SIGKILLed --------------------------------------------------------------------------


def _run_pod(tmp_path: Path, env: dict[str, str], *, attempt: str, fault: str | None = None) -> tuple[int, str]:
    pod_env = dict(
        env,
        AGENTRUN_GRAPH="examples.langchain_create_agent:app",
        AGENTRUN_THREAD_ID=THREAD,
        AGENTRUN_RUN_NAME="ca-4821",
        AGENTRUN_RUN_UID="uid-1",
        AGENTRUN_ATTEMPT=attempt,
        AGENTRUN_INPUT=json.dumps({"messages": [{"role": "user", "content": "charge my saved card for order 4821"}]}),
        AGENTRUN_STORE=f"sqlite:///{tmp_path / 'agentrun.db'}",
        AGENTRUN_METRICS_PORT="0",
        AGENTRUN_TERMINATION_LOG=str(tmp_path / "termination-log"),
    )
    if fault:
        pod_env["AGENTRUN_FAULT_POINT"] = fault
    proc = subprocess.run(
        [sys.executable, "-m", "agentrun.runner"], env=pod_env, cwd=ROOT, capture_output=True, text=True, timeout=90
    )
    return proc.returncode, proc.stderr


def _latest(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    conn = sqlite3.connect(tmp_path / "agentrun.db")
    try:
        status, meta = conn.execute(
            "SELECT status, meta FROM states WHERE thread_id = ? ORDER BY version DESC LIMIT 1", (THREAD,)
        ).fetchone()
    finally:
        conn.close()
    return status, json.loads(meta)


def test_a_create_agent_run_killed_after_charge_card_was_recorded_charges_once(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    code, err = _run_pod(tmp_path, subprocess_env, attempt="1", fault="after_ledger_record:charge_card")
    assert code == -signal.SIGKILL, f"the runner was supposed to die after charge_card was recorded:\n{err[-3000:]}"
    code, err = _run_pod(tmp_path, subprocess_env, attempt="2")
    assert code == 0, f"the resumed attempt failed:\n{err[-3000:]}"
    effects_db = subprocess_env["SUPPORT_EFFECTS_DB"]
    assert count_effects(effects_db)["charges"] == 1, "GUARANTEE BROKEN: the card was charged twice"
    conn = sqlite3.connect(effects_db)
    try:
        invocations = conn.execute("SELECT tool, idempotency_key FROM tool_invocations").fetchall()
    finally:
        conn.close()
    charges = [key for tool_name, key in invocations if tool_name == "charge_card"]
    assert len(charges) == 1, f"GUARANTEE BROKEN: charge_card ran {len(charges)} times after it was recorded"
    assert all(key and key.startswith("ar-") for _, key in invocations), f"a call had no idempotency key: {invocations}"
    assert "(charge_card) replayed from ledger" in err, "the resumed attempt did not answer charge_card from the ledger"
    status, meta = _latest(tmp_path)
    assert status == "completed" and meta["result"]["message"].startswith("Done: "), (status, meta)
    assert "charged 4999 cents" in meta["result"]["message"], "the model did not get charge_card's recorded result"
    assert meta["tool_calls"]["replayed"] >= 1, meta["tool_calls"]


def test_the_example_runs_as_written(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "examples.langchain_create_agent"],
        env=subprocess_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert ran.returncode == 0, f"examples/langchain_create_agent.py does not run:\n{ran.stderr[-3000:]}"
    assert ran.stdout.startswith("Done: order 4821: 4999 cents") and "charged 4999 cents" in ran.stdout, ran.stdout
    assert count_effects(subprocess_env["SUPPORT_EFFECTS_DB"])["charges"] == 1
    assert (tmp_path / "agentrun.db").exists(), "the example's own run goes to ./agentrun.db"


# -- in process, on a real SQLite store ---------------------------------------------------------------------------


@tool
async def charge_card(order_id: str) -> str:
    """Charge the card."""
    CALLS.append(("charge_card", current_idempotency_key()))
    if FAILURES["left"] > 0:
        FAILURES["left"] -= 1
        raise ToolException(f"card declined for order {order_id}")
    return f"charged order {order_id}"


@tool
def charge_card_sync(order_id: str) -> str:
    """Charge the card (a sync tool)."""
    CALLS.append(("charge_card_sync", current_idempotency_key()))
    return f"charged order {order_id}"


@tool
async def explode(order_id: str) -> str:
    """A tool whose bug fails the run."""
    CALLS.append(("explode", current_idempotency_key()))
    raise RuntimeError(f"bug while handling order {order_id}")


class OneCallModel(BaseChatModel):
    """Calls the tool its user message names, once (``ai-1``/``c1``), then answers with the tool's result."""

    @property
    def _llm_type(self) -> str:
        return "one-call-scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        if isinstance(last, HumanMessage):
            call = {"id": "c1", "name": str(last.content), "args": {"order_id": "7"}}
            reply = AIMessage(content="", id="ai-1", tool_calls=[call])
        else:
            reply = AIMessage(content=f"done: {last.content}", id="ai-2")
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self


class DieOnceAfterTheCall(AgentMiddleware):
    """Listed before the ledger: fails the tool node once after the call returned (and was recorded), as a
    process killed there would; LangGraph keeps no write of the node, so the next invoke runs it again."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def _die(self) -> None:
        if self.armed:
            self.armed = False
            raise ConnectionResetError("the process died after the tool returned")

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]
    ) -> Any:
        result = await handler(request)
        self._die()
        return result

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Any]) -> Any:
        result = handler(request)
        self._die()
        return result


async def _saver(tmp_path: Path, **kwargs: Any) -> AgentrunSaver:
    saver = AgentrunSaver(SqliteCheckpointer(tmp_path / "agentrun.db"), **kwargs)
    await saver.setup()
    return saver


def _agent(saver: Any, tools: list[Any], *outer: AgentMiddleware) -> Any:
    ledger = LedgerMiddleware(side_effects={"charge_card", "charge_card_sync"}, in_doubt={"charge_card": "retry"})
    middleware = [*outer, ledger]
    return create_agent(OneCallModel(), tools=tools, middleware=middleware, checkpointer=saver)


def _tool_message(values: dict[str, Any]) -> ToolMessage:
    return next(m for m in values["messages"] if isinstance(m, ToolMessage))


async def test_a_recorded_call_is_answered_from_the_ledger_on_replay_and_the_tool_is_not_called_again(
    tmp_path: Path,
) -> None:
    saver = await _saver(tmp_path)
    config: Any = {"configurable": {"thread_id": "t"}}
    counts = ToolCounts()
    track("t", counts)
    try:
        agent = _agent(saver, [charge_card], DieOnceAfterTheCall())
        with pytest.raises(ConnectionResetError):
            await agent.ainvoke({"messages": [HumanMessage("charge_card")]}, config)
        assert await saver.store.ledger_get("t", KEY) is not None, "the call was not recorded when it returned"
        values = await agent.ainvoke(None, config)  # the replay of the tool node
    finally:
        track("t", None)
        await saver.aclose()
    assert len(CALLS) == 1, f"GUARANTEE BROKEN: a recorded call ran again on replay: {CALLS}"
    assert CALLS[0][1] is not None and CALLS[0][1].startswith("ar-"), f"the tool had no idempotency key: {CALLS}"
    message = _tool_message(values)
    assert (message.content, message.status) == ("charged order 7", "success"), "not the recorded result"
    assert values["messages"][-1].content == "done: charged order 7"
    assert (counts.executed, counts.replayed, counts.failed) == (1, 1, 0), counts


def test_the_sync_api_answers_a_recorded_call_from_the_ledger(tmp_path: Path) -> None:
    saver = AgentrunSaver(SqliteCheckpointer(tmp_path / "agentrun.db"))
    config: Any = {"configurable": {"thread_id": "t"}}
    try:
        agent = _agent(saver, [charge_card_sync], DieOnceAfterTheCall())
        with pytest.raises(ConnectionResetError):
            agent.invoke({"messages": [HumanMessage("charge_card_sync")]}, config)
        values = agent.invoke(None, config)
    finally:
        saver.close()
    assert [name for name, _ in CALLS] == ["charge_card_sync"], f"GUARANTEE BROKEN: the sync replay ran it: {CALLS}"
    assert CALLS[0][1] is not None, "the sync tool had no idempotency key"
    assert _tool_message(values).content == "charged order 7"


async def test_a_failed_tool_is_counted_failed_never_recorded_as_a_result_and_runs_again(tmp_path: Path) -> None:
    charge_card.handle_tool_error = True  # a ToolException becomes an error result for the model
    FAILURES["left"] = 1
    saver = await _saver(tmp_path)
    config: Any = {"configurable": {"thread_id": "t"}}
    counts = ToolCounts()
    track("t", counts)
    try:
        agent = _agent(saver, [charge_card], DieOnceAfterTheCall())
        with pytest.raises(ConnectionResetError):
            await agent.ainvoke({"messages": [HumanMessage("charge_card")]}, config)
        assert await saver.store.ledger_get("t", KEY) is None, "GUARANTEE BROKEN: a failed call was recorded"
        values = await agent.ainvoke(None, config)
    finally:
        charge_card.handle_tool_error = False
        track("t", None)
        await saver.aclose()
    assert len(CALLS) == 2, f"a failed call must run again on replay, not be answered as a result: {CALLS}"
    assert CALLS[0][1] == CALLS[1][1], "the second run of the call had another idempotency key"
    # Its intent stays without a result, so the replay finds it in doubt; the policy here is "retry". The failure
    # counts as failed, not executed (as our engine counts it: the history derives both from the same records).
    assert (counts.executed, counts.failed, counts.replayed, counts.in_doubt) == (1, 1, 0, 1), counts
    assert counts.last_error is not None and counts.last_error["tool"] == "charge_card"
    assert "card declined" in counts.last_error["message"], counts.last_error
    assert _tool_message(values).content == "charged order 7"


async def test_a_tool_that_raises_fails_the_run_counted_as_failed_and_is_not_recorded(tmp_path: Path) -> None:
    saver = await _saver(tmp_path)
    counts = ToolCounts()
    track("t", counts)
    try:
        agent = _agent(saver, [explode])
        with pytest.raises(RuntimeError, match="bug while handling order 7"):
            await agent.ainvoke({"messages": [HumanMessage("explode")]}, {"configurable": {"thread_id": "t"}})
        recorded = await saver.store.ledger_get("t", KEY)
    finally:
        track("t", None)
        await saver.aclose()
    assert recorded is None, "GUARANTEE BROKEN: a call that raised was recorded as a result"
    assert (counts.executed, counts.failed) == (0, 1), f"the failed call is missing from the counts: {counts}"
    assert counts.last_error == {
        "tool": "explode",
        "code": "TOOL_ERROR_001",
        "message": "RuntimeError: bug while handling order 7",
    }


async def test_a_superseded_attempt_stops_with_fenced_error_before_the_side_effect(tmp_path: Path) -> None:
    saver = await _saver(tmp_path, attempt=1)
    try:
        await saver.store.register_attempt("t", 2)
        with pytest.raises(FencedError):
            await _agent(saver, [charge_card]).ainvoke(
                {"messages": [HumanMessage("charge_card")]}, {"configurable": {"thread_id": "t"}}
            )
    finally:
        await saver.aclose()
    assert CALLS == [], "GUARANTEE BROKEN: a fenced attempt started a side effect"


async def test_an_agent_on_another_checkpointer_is_refused_naming_the_middleware() -> None:
    agent = _agent(InMemorySaver(), [charge_card])
    with pytest.raises(TypeError, match="LedgerMiddleware records tool calls in agentrun's store"):
        await agent.ainvoke({"messages": [HumanMessage("charge_card")]}, {"configurable": {"thread_id": "t"}})
    assert CALLS == [], "the tool ran without a ledger"


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_create_react_agent_takes_a_ledger_tool_node_and_replays_a_recorded_call(tmp_path: Path) -> None:
    """README's other prebuilt: LangGraph's (deprecated) ``create_react_agent`` takes a ``LedgerToolNode`` as tools."""
    from langgraph.prebuilt import create_react_agent

    from agentrun.integrations.langgraph import LedgerToolNode

    saver = await _saver(tmp_path)
    config: Any = {"configurable": {"thread_id": "t"}}
    try:
        agent = create_react_agent(
            OneCallModel(), tools=LedgerToolNode([charge_card], side_effects={"charge_card"}), checkpointer=saver
        )
        await agent.ainvoke({"messages": [HumanMessage("charge_card")]}, config)
        # Replay the tool node from the checkpoint before it (time travel): the ledger answers.
        before_tools = [s.config async for s in agent.aget_state_history(config) if s.next == ("tools",)]
        values = await agent.ainvoke(None, before_tools[-1])
    finally:
        await saver.aclose()
    assert len(CALLS) == 1, f"GUARANTEE BROKEN: a recorded call ran again on replay: {CALLS}"
    assert values["messages"][-1].content == "done: charged order 7"
