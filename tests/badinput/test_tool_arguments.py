"""Fuzzed tool arguments through the tool node: always a tool error message, never a node failure (issue 13).

A model may write anything where tool arguments go: text that is not JSON,
JSON that is not an object, wrong types, missing or extra fields, strings of
megabytes, nesting ten thousand levels deep, NaN, unpaired surrogates. Each
example runs a real graph (model -> tools -> model) on a real store with one
assistant message asking for the same arguments of three kinds of tool at
once (a typed Python tool, a ``SchemaTool`` as the MCP adapter builds one,
a LangChain tool through the real adapter), and checks:

- the run completes, with exactly one result message per call, in order;
- a call either ran the tool (and says so) or is an ``Error: ...`` tool
  message, never an internal failure of the tool node;
- what the run wrote reads back identically from a second connection.

The same arguments then go through a real runner process
(``python -m agentrun.runner``): exit 0, one error message per bad call.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.tools import tool as langchain_tool

from agentrun import Message, ToolCall, assistant, tool
from agentrun.checkpoint import Checkpointer, SqliteCheckpointer
from agentrun.models import ScriptedModel
from agentrun.tools import SchemaTool
from tests.badinput.conftest import Store
from tests.badinput.graphs import NASTY_ARGUMENTS
from tests.conftest import ROOT
from tests.unit.helpers import tool_graph

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# --- the tools ------------------------------------------------------------------------------------------------------

ran: Counter[str] = Counter()


@tool
async def lookup_order(order_id: str, quantity: int = 1, tags: list[str] | None = None) -> dict[str, Any]:
    """A typed tool: pydantic validates the model's arguments against this signature."""
    ran["lookup_order"] += 1
    return {"order": order_id, "quantity": quantity, "tags": tags or []}


async def _remote(arguments: dict[str, Any], idempotency_key: str | None) -> Any:
    ran["remote_echo"] += 1
    return {"echo": arguments}  # a permissive MCP server: whatever it got, it answers with


remote_echo = SchemaTool(
    _remote,
    name="remote_echo",
    parameters={"properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)


@langchain_tool
async def lc_lookup(order_id: str, quantity: int = 1) -> str:
    """A LangChain tool (its own pydantic schema validates the values)."""
    ran["lc_lookup"] += 1
    return f"order {order_id} x{quantity}"


TOOLS = [lookup_order, remote_echo, tool(lc_lookup)]
NAMES = [t.name for t in TOOLS]


# --- the arguments --------------------------------------------------------------------------------------------------

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=16)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def nested(depth: int, kind: str) -> str:
    inner = "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth
    return '{"order_id": "4821", "tags": ' + inner + "}"


WELL_FORMED = st.builds(
    lambda order, quantity: json.dumps({"order_id": order, "quantity": quantity}),
    st.text(max_size=40),
    st.integers(-(10**9), 10**9),
)
BAD = st.one_of(
    st.text(max_size=200),  # mostly not JSON at all
    WELL_FORMED.flatmap(lambda s: st.integers(1, len(s) - 1).map(lambda n: s[:n])),  # truncated JSON
    values.filter(lambda v: not isinstance(v, dict)).map(json.dumps),  # JSON, not an object
    st.fixed_dictionaries({"order_id": values, "quantity": values}).map(json.dumps),  # wrong types
    st.dictionaries(st.sampled_from(["quantity", "tags", "extra", "state", "idempotency_key"]), values, max_size=3).map(
        json.dumps
    ),  # missing fields, extra and injected names
    st.tuples(
        st.sampled_from([1, 50, 98, 99, 100, 101, 500, 998, 1000, 5000, 100_000]), st.sampled_from(["list", "obj"])
    ).map(lambda t: nested(*t)),  # deep nesting, around every limit there is
    st.sampled_from([1 << 20, 3 << 20]).map(lambda n: json.dumps({"order_id": "é" * n})),  # huge strings
    st.sampled_from(NASTY_ARGUMENTS),
)


@pytest.fixture
def log_lines() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("agentrun")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


examples = 0


@settings(
    max_examples=45,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(arguments=st.one_of(WELL_FORMED, BAD))
async def test_fuzzed_arguments_become_tool_errors_never_node_failures(
    store: Store, log_lines: list[logging.LogRecord], arguments: str
) -> None:
    global examples
    examples += 1
    thread = f"fuzz-{examples}"
    await check_one(store, log_lines, thread, arguments)


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(arguments=WELL_FORMED)
async def test_well_formed_arguments_run_the_typed_tool(
    store: Store, log_lines: list[logging.LogRecord], arguments: str
) -> None:
    """The oracle's other half: the fuzzing would pass if every call were refused; well-formed ones must run."""
    global examples
    examples += 1
    messages = await check_one(store, log_lines, f"good-{examples}", arguments)
    typed = messages[0]
    assert not typed.is_error, f"well-formed arguments were refused: {arguments!r} -> {typed.content[:300]!r}"
    assert json.loads(typed.content)["order"] == json.loads(arguments)["order_id"]


async def check_one(store: Store, log_lines: list[logging.LogRecord], thread: str, arguments: str) -> list[Message]:
    log_lines.clear()
    before = Counter(ran)
    calls = [ToolCall(id=f"call_{i}", name=name, arguments=arguments) for i, name in enumerate(NAMES, 1)]
    checkpointer = await store.connect()
    other = await store.connect()
    try:
        return await _run(checkpointer, other, thread, calls, arguments, log_lines, before)
    finally:
        await checkpointer.aclose()
        await other.aclose()


async def _run(
    checkpointer: Checkpointer,
    other: Checkpointer,
    thread: str,
    calls: list[ToolCall],
    arguments: str,
    log_lines: list[logging.LogRecord],
    before: Counter[str],
) -> list[Message]:
    def respond(messages: list[Message]) -> Message:
        if messages[-1].role == "user":
            return assistant(tool_calls=calls)
        return assistant("done")

    app = tool_graph(TOOLS, ScriptedModel(respond)).compile(checkpointer)
    shown = f"arguments {arguments[:200]!r}{'...' if len(arguments) > 200 else ''}"
    try:
        values = await app.ainvoke("go", {"thread_id": thread})
    except Exception as e:
        raise AssertionError(f"GUARANTEE BROKEN: bad tool arguments failed the run: {shown}: {e!r}") from e
    state = await app.aget_state(thread)
    assert state is not None and state.status == "completed", f"{shown}: {state and state.meta.get('error')}"
    results = [m for m in values["messages"] if m.role == "tool"]
    assert [m.tool_call_id for m in results] == ["call_1", "call_2", "call_3"], f"{shown}: one message per call"
    for message, name in zip(results, NAMES, strict=True):
        assert message.name == name
        if message.is_error:
            assert message.content.startswith("Error: ") and len(message.content) < 4096, message.content[:300]
    ran_now = ran - before
    for message, name in zip(results, NAMES, strict=True):
        assert ran_now[name] == (0 if message.is_error else 1), f"{shown}: {name} ran {ran_now[name]} times"
    internal = [r.getMessage() for r in log_lines if "tool node failed" in r.getMessage()]
    assert not internal, f"{shown}: the tool node itself failed instead of answering with a tool error: {internal}"
    # What the run wrote reads back whole from a second connection.
    stored = await other.aget(thread)
    assert stored is not None
    assert [m.to_json() for m in stored.messages] == [m.to_json() for m in values["messages"]]
    return results


def test_a_runner_process_answers_every_nasty_call_with_a_tool_error_and_exits_0(
    tmp_path: Any, subprocess_env: dict[str, str]
) -> None:
    """No crash of the runner: the real pod entrypoint, the nastiest arguments, all in one assistant message."""
    store = tmp_path / "agentrun.db"
    env = dict(
        subprocess_env,
        AGENTRUN_GRAPH="tests.badinput.graphs:nasty_calls",
        AGENTRUN_THREAD_ID="default/nasty",
        AGENTRUN_RUN_NAME="nasty",
        AGENTRUN_RUN_UID="uid-nasty",
        AGENTRUN_ATTEMPT="1",
        AGENTRUN_INPUT=json.dumps({"messages": [{"role": "user", "content": "go"}]}),
        AGENTRUN_STORE=f"sqlite:///{store}",
        AGENTRUN_METRICS_PORT="0",
        AGENTRUN_TERMINATION_LOG=str(tmp_path / "termination-log"),
    )
    done = subprocess.run([sys.executable, "-m", "agentrun.runner"], env=env, cwd=ROOT, capture_output=True, timeout=90)
    log = done.stderr.decode(errors="replace") + done.stdout.decode(errors="replace")
    assert done.returncode == 0, f"GUARANTEE BROKEN: the runner exited {done.returncode}:\n{log[-4000:]}"
    assert "tool node failed" not in log, log[-4000:]

    async def read() -> list[Message]:
        checkpointer = SqliteCheckpointer(store)
        try:
            state = await checkpointer.aget("default/nasty")
        finally:
            await checkpointer.aclose()
        assert state is not None and state.status == "completed"
        return [m for m in state.messages if m.role == "tool"]

    import asyncio

    results = asyncio.run(read())
    assert len(results) == len(NASTY_ARGUMENTS)
    refused = [m for m in results if m.is_error]
    assert len(refused) == len(NASTY_ARGUMENTS), [m.content[:120] for m in results if not m.is_error]


# --- whole assistant messages: odd names, missing and repeated call ids, many calls -----------------------------------

# A model's text fields (names, ids) arrive through its adapter as valid Unicode; NUL is allowed.
model_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
call_names = st.sampled_from(NAMES) | model_text | st.sampled_from(["", "x" * 100_000, "lookup_order "])
call_ids = st.none() | st.sampled_from(["", "call_1", "call_2"]) | model_text


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    calls=st.lists(
        st.builds(lambda n, i, a: ToolCall(id=i, name=n, arguments=a), call_names, call_ids, WELL_FORMED | BAD),
        min_size=1,
        max_size=6,
    )
)
async def test_any_assistant_message_gets_one_answer_per_call_and_the_run_completes(
    store: Store, log_lines: list[logging.LogRecord], calls: list[ToolCall]
) -> None:
    global examples
    examples += 1
    thread = f"calls-{examples}"
    log_lines.clear()
    before = Counter(ran)
    checkpointer = await store.connect()
    try:

        def respond(messages: list[Message]) -> Message:
            return assistant(tool_calls=calls) if messages[-1].role == "user" else assistant("done")

        app = tool_graph(TOOLS, ScriptedModel(respond)).compile(checkpointer)
        shown = repr(calls)[:600]
        try:
            values = await app.ainvoke("go", {"thread_id": thread})
        except Exception as e:
            raise AssertionError(f"GUARANTEE BROKEN: an assistant message failed the run: {shown}: {e!r}") from e
        results = [m for m in values["messages"] if m.role == "tool"]
        assert [m.tool_call_id for m in results] == [c.id for c in calls], f"{shown}: one answer per call, in order"
        ran_now = ran - before
        for name in NAMES:
            answered = sum(1 for m, c in zip(results, calls, strict=True) if c.name == name and not m.is_error)
            assert ran_now[name] == answered, f"{shown}: {name} ran {ran_now[name]} times for {answered} answers"
        for message, c in zip(results, calls, strict=True):
            if c.name not in NAMES:
                assert message.is_error and "unknown tool" in message.content and len(message.content) < 200_100
        internal = [r.getMessage() for r in log_lines if "tool node failed" in r.getMessage()]
        assert not internal, f"{shown}: the tool node itself failed: {internal}"
        state = await checkpointer.aget(thread)
        assert state is not None and state.status == "completed"
    finally:
        await checkpointer.aclose()


# --- a real MCP server ------------------------------------------------------------------------------------------------


async def test_nasty_arguments_to_a_real_mcp_server_are_tool_errors_and_the_session_survives(
    subprocess_env: dict[str, str], tmp_path: Any
) -> None:
    """The MCP adapter's ``SchemaTool`` in front of a real server (the mcp SDK's FastMCP, over stdio)."""
    from agentrun import InMemoryCheckpointer
    from agentrun.integrations.mcp import MCPServer, amcp_tools

    env = dict(subprocess_env, MCP_CHARGES_FILE=str(tmp_path / "c.jsonl"), MCP_PID_FILE=str(tmp_path / "p"))
    server = MCPServer.stdio(sys.executable, "-m", "tests.support.mcp_server", "stdio", env=env, cwd=str(ROOT))
    try:
        tools = [t for t in await amcp_tools(server) if t.name == "lookup"]
        nasty = [*NASTY_ARGUMENTS, json.dumps({"order_id": "é" * (1 << 20)}), '{"order_id": "4821"}']
        calls = [ToolCall(id=f"call_{i}", name="lookup", arguments=a) for i, a in enumerate(nasty)]

        def respond(messages: list[Message]) -> Message:
            return assistant(tool_calls=calls) if messages[-1].role == "user" else assistant("done")

        app = tool_graph(tools, ScriptedModel(respond)).compile(InMemoryCheckpointer())
        values = await app.ainvoke("go", {"thread_id": "mcp"})
        results = [m for m in values["messages"] if m.role == "tool"]
        assert [m.tool_call_id for m in results] == [c.id for c in calls]
        for arguments, message in zip(nasty, results, strict=True):
            if _may_succeed(arguments):
                continue  # the server decides (FastMCP ignores unknown fields)
            assert message.is_error, f"{arguments[:120]!r} was not refused: {message.content[:200]!r}"
        assert results[-1].content == "order 4821: 49.99 EUR", "a well-formed call among the nasty ones failed"
        assert "é" * 100 in results[-2].content, "the 1 MiB argument did not reach the server whole"
        # The session survived all of it: a new call on it works.
        again = (
            await tool_graph(tools, ScriptedModel(respond))
            .compile(InMemoryCheckpointer())
            .ainvoke("go", {"thread_id": "mcp-2"})
        )
        assert [m for m in again["messages"] if m.role == "tool"][-1].content == "order 4821: 49.99 EUR"
    finally:
        await server.aclose()


def _may_succeed(arguments: str) -> bool:
    try:
        value = ToolCall(id="x", name="x", arguments=arguments).parsed_arguments()
    except ValueError:
        return False
    return isinstance(value.get("order_id"), str)
