"""MCP tools through the tool node (issue 12): a real FastMCP server over stdio and streamable HTTP (loopback).

Guarantees protected: an MCP side-effect tool executes once across a SIGKILL
and a resume in a new process; the idempotency key reaches the server (as an
argument and in the request metadata); a server that never answers ends as
NODE_TIMEOUT_002 within the deadline and the next call works; a stop ends a
run hung in an MCP call within 2 s; a server killed mid-call gives a tool
error, the run continues, and the next call restarts (stdio) or reconnects
(HTTP).

Issue 22, one connection shared by many calls: a call that reaches its
deadline, or whose run is stopped, is cancelled alone (MCP
``notifications/cancelled``); its siblings on the same connection, of the same
run, of another run, or of another OS thread of the process, finish and are
recorded, charged once. A connection lost under a side-effect call leaves that
call in doubt under its declared policy (retry with the SAME idempotency key,
report, interrupt), never a plain failure the model would retry with a new
key. Per-tool deadlines in one ``amcp_tools`` call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun import Command, InMemoryCheckpointer, RunStopped, blocking
from agentrun.engine import CompiledGraph
from agentrun.integrations.mcp import MCPServer, amcp_tools, mcp_tools
from agentrun.metrics import TOOL_TIMEOUTS
from agentrun_dev.servers import free_port
from tests.unit.helpers import call, calling_model, tool_graph, tool_messages

ROOT = Path(__file__).resolve().parents[2]


def charges(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def server_env(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, str]:
    return dict(
        subprocess_env,
        MCP_CHARGES_FILE=str(tmp_path / "charges.jsonl"),
        MCP_PID_FILE=str(tmp_path / "server.pid"),
        MCP_CANCELS_FILE=str(tmp_path / "cancels.jsonl"),
    )


class HttpServer:
    """The test MCP server as a streamable-HTTP process on 127.0.0.1; restartable on the same port."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.mcp_server", "http", str(self.port)],
                env=self.env,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"the MCP HTTP server did not listen in 20 s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)


@pytest.fixture
def http_server(server_env: dict[str, str], tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(server_env, tmp_path / "http-server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["stdio", "http"])
async def transport(request: pytest.FixtureRequest, server_env: dict[str, str]) -> AsyncIterator[tuple[str, Any]]:
    """(kind, MCPServer); for http also the HttpServer, to kill and restart it."""
    if request.param == "stdio":
        server = MCPServer.stdio(sys.executable, "-m", "tests.support.mcp_server", "stdio", env=server_env)
        http = None
    else:
        http = request.getfixturevalue("http_server")
        server = MCPServer.http(http.url)
    try:
        yield request.param, (server, http)
    finally:
        await server.aclose()


async def app_calling(server: MCPServer, *calls: Any, side_effects: dict[str, Any] | None = None) -> CompiledGraph:
    tools = await amcp_tools(server, side_effects=side_effects or {"charge": "retry"})
    return tool_graph(tools, calling_model(list(calls))).compile(InMemoryCheckpointer())


async def test_mcp_tool_runs_through_the_tool_node_with_the_idempotency_key(
    transport: tuple[str, Any], server_env: dict[str, str]
) -> None:
    _, (server, _) = transport
    app = await app_calling(
        server, call("call_1", "charge", order_id="4821"), call("call_2", "lookup", order_id="4821")
    )
    values = await app.ainvoke("go", {"thread_id": "t1"})
    results = tool_messages(values)
    assert not results["call_1"].is_error and "succeeded" in results["call_1"].content
    assert results["call_2"].content == "order 4821: 49.99 EUR"
    executed = charges(Path(server_env["MCP_CHARGES_FILE"]))
    assert len(executed) == 1, "charge did not execute exactly once"
    key = executed[0]["argument"]
    assert key and key.startswith("ar-"), "the idempotency key did not reach the MCP tool as its argument"
    assert executed[0]["meta"] == key, "the idempotency key did not reach the MCP server in the request metadata"


async def test_mcp_server_error_is_a_tool_error_and_the_run_continues(transport: tuple[str, Any]) -> None:
    _, (server, _) = transport
    app = await app_calling(server, call("call_1", "refuse", order_id="7"))
    values = await app.ainvoke("go", {"thread_id": "t1"})
    result = tool_messages(values)["call_1"]
    assert result.is_error and "order 7 is locked" in result.content
    assert values["messages"][-1].role == "assistant", "the run did not continue after the tool error"


async def test_hung_mcp_tool_ends_as_node_timeout_002_and_the_next_call_works(
    transport: tuple[str, Any], server_env: dict[str, str]
) -> None:
    _, (server, _) = transport
    before = TOOL_TIMEOUTS.labels("hang")._value.get()
    app = await app_calling(server, call("call_1", "hang"))
    started = time.monotonic()
    values = await app.ainvoke("go", {"thread_id": "t1", "tool_timeout": 1})
    elapsed = time.monotonic() - started
    result = tool_messages(values)["call_1"]
    assert result.is_error and "did not finish within 1s" in result.content, result.content
    assert TOOL_TIMEOUTS.labels("hang")._value.get() == before + 1, "the timeout was not a NODE_TIMEOUT_002"
    # Generous: the call hangs for good, so any end is the deadline's; how close to 1 s is the unit tier's (looptime).
    assert elapsed < 30, f"a hung MCP call took {elapsed:.1f}s to time out with tool_timeout=1"
    # The same server object: the hung session was dropped, a new one answers.
    again = await app_calling(server, call("call_1", "charge", order_id="1"))
    values = await again.ainvoke("go", {"thread_id": "t2", "tool_timeout": 10})
    assert not tool_messages(values)["call_1"].is_error, "the call after a timeout did not work"
    assert len(charges(Path(server_env["MCP_CHARGES_FILE"]))) == 1


async def test_stop_ends_a_run_hung_in_an_mcp_call(transport: tuple[str, Any]) -> None:
    """The call hangs for good (no tool deadline): only the stop ends it. The bound is generous on purpose: the 1 s
    of the stop check is proven on loop time (unit/test_stop.py), the 2 s end to end is `make bench`'s figure."""
    _, (server, _) = transport
    app = await app_calling(server, call("call_1", "hang"))
    checkpointer = app.checkpointer
    run = asyncio.create_task(app.ainvoke("go", {"thread_id": "t1", "tool_timeout": 0}))
    await asyncio.sleep(1.5)
    assert not run.done(), "the run was supposed to hang in the MCP call"
    requested = time.monotonic()
    await checkpointer.request_stop("t1", "operator")
    with pytest.raises(RunStopped):
        await run
    took = time.monotonic() - requested
    assert took < 20, f"the stop took {took:.2f}s to end a run hung in an MCP call"


async def test_server_killed_mid_call_is_a_tool_error_and_the_next_call_reconnects(
    transport: tuple[str, Any], server_env: dict[str, str]
) -> None:
    kind, (server, http) = transport
    pid_file = Path(server_env["MCP_PID_FILE"])
    app = await app_calling(server, call("call_1", "slow", seconds=60))

    def kill_when_called() -> None:
        deadline = time.monotonic() + 20
        while (not pid_file.exists() or not pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    killer = asyncio.create_task(asyncio.to_thread(kill_when_called))
    started = time.monotonic()
    values = await app.ainvoke("go", {"thread_id": "t1", "tool_timeout": 100})
    await killer
    result = tool_messages(values)["call_1"]
    assert result.is_error and "outcome is unknown" in result.content, result.content
    assert time.monotonic() - started < 50, "the dead server was only noticed by the tool deadline (100 s)"
    assert values["messages"][-1].role == "assistant", "the run did not continue after the server died"
    if http is not None:
        http.stop()
        http.start()  # the same URL, a new process: the adapter reconnects
    again = await app_calling(server, call("call_1", "charge", order_id="1"))
    values = await again.ainvoke("go", {"thread_id": "t2", "tool_timeout": 20})
    assert not tool_messages(values)["call_1"].is_error, f"the next call after the server died failed ({kind})"


async def test_mcp_tools_at_import_time_inside_the_runners_running_loop(transport: tuple[str, Any]) -> None:
    """The runner imports the graph module inside its event loop: module-level ``mcp_tools()`` must work there."""
    _, (server, _) = transport
    tools = mcp_tools(server, side_effects={"charge": "retry"}, include=["lookup", "charge"])
    assert sorted(t.name for t in tools) == ["charge", "lookup"]
    app = tool_graph(tools, calling_model([call("call_1", "lookup", order_id="4821")])).compile(InMemoryCheckpointer())
    values = await app.ainvoke("go", {"thread_id": "t1"})
    assert tool_messages(values)["call_1"].content == "order 4821: 49.99 EUR"


# -- one connection, many calls (issue 22) ------------------------------------------------------------


def charge_key(values: dict[str, Any], call_id: str) -> str:
    """The ledger key of ``call_id`` in the turn's tool request."""
    request = next(m for m in values["messages"] if m.role == "assistant" and m.tool_calls)
    return f"{request.id}:{call_id}"


def lines(path: str) -> list[dict[str, Any]]:
    return charges(Path(path))


async def test_a_call_past_its_deadline_is_cancelled_alone_and_its_sibling_charge_completes_recorded_once(
    transport: tuple[str, Any], server_env: dict[str, str]
) -> None:
    _, (server, _) = transport
    # Two groups of one server object (one connection), each with its deadline.
    hung = await amcp_tools(server, include=["hang"], tool_timeout=1)
    paying = await amcp_tools(server, include=["charge"], side_effects={"charge": "retry"}, tool_timeout=20)
    checkpointer = InMemoryCheckpointer()
    calls = [call("call_1", "hang"), call("call_2", "charge", order_id="4821", seconds=2.5)]
    app = tool_graph([*hung, *paying], calling_model(calls)).compile(checkpointer)
    values = await app.ainvoke("go", {"thread_id": "t1", "tool_timeout": 30})
    results = tool_messages(values)
    assert results["call_1"].is_error and "did not finish within 1s" in results["call_1"].content
    assert not results["call_2"].is_error, (
        "GUARANTEE BROKEN: a charge in flight failed because a sibling call on the same MCP connection reached "
        f"its deadline: {results['call_2'].content}"
    )
    assert len(lines(server_env["MCP_CHARGES_FILE"])) == 1, "the charge did not execute exactly once"
    entry = await checkpointer.ledger_get("t1", charge_key(values, "call_2"))
    assert entry is not None, "the sibling charge completed but is not in the ledger: a replay would charge again"
    cancels = lines(server_env["MCP_CANCELS_FILE"])
    assert len(cancels) == 1, f"the server did not see the timed-out call cancelled (once): {cancels}"
    state = await checkpointer.aget("t1")
    assert state is not None and state.meta["tool_calls"]["failed"] == 1, state.meta if state else None


async def test_per_tool_deadlines_in_one_amcp_tools_call(
    transport: tuple[str, Any], server_env: dict[str, str]
) -> None:
    _, (server, _) = transport
    with pytest.raises(ValueError, match="chrage"):
        await amcp_tools(server, timeouts={"chrage": 5})
    tools = await amcp_tools(server, side_effects={"charge": "retry"}, timeouts={"hang": 1, "charge": 20})
    calls = [call("call_1", "hang"), call("call_2", "charge", order_id="1", seconds=3)]
    app = tool_graph(tools, calling_model(calls)).compile(InMemoryCheckpointer())
    # The run's deadline (2 s) would cut the 3 s charge off: its own 20 s applies instead. Which deadline ended
    # each call shows in its result, so no clock is needed here.
    values = await app.ainvoke("go", {"thread_id": "t1", "tool_timeout": 2})
    results = tool_messages(values)
    assert results["call_1"].is_error and "did not finish within 1s" in results["call_1"].content
    assert not results["call_2"].is_error, f"charge did not get its own deadline: {results['call_2'].content}"
    # Without a per-tool deadline, a tool of the call keeps tool_timeout (backwards compatible).
    lookups = await amcp_tools(server, include=["lookup"], tool_timeout=7, timeouts={})
    assert lookups[0].timeout == 7


async def test_a_stopped_run_cancels_its_own_mcp_call_and_another_runs_charge_on_the_connection_completes(
    transport: tuple[str, Any], server_env: dict[str, str]
) -> None:
    _, (server, _) = transport
    tools = await amcp_tools(server, side_effects={"charge": "retry"})
    stopped = tool_graph(tools, calling_model([call("call_1", "hang")])).compile(InMemoryCheckpointer())
    checkpointer = InMemoryCheckpointer()
    paying = tool_graph(tools, calling_model([call("call_1", "charge", order_id="9", seconds=3)])).compile(checkpointer)
    hung = asyncio.create_task(stopped.ainvoke("go", {"thread_id": "user-a", "tool_timeout": 0}))
    charging = asyncio.create_task(paying.ainvoke("go", {"thread_id": "user-b", "tool_timeout": 30}))
    await asyncio.sleep(1.5)
    await stopped.checkpointer.request_stop("user-a", "operator")
    with pytest.raises(RunStopped):
        await hung
    values = await charging
    result = tool_messages(values)["call_1"]
    assert not result.is_error, f"GUARANTEE BROKEN: stopping one run failed another run's charge: {result.content}"
    assert len(lines(server_env["MCP_CHARGES_FILE"])) == 1
    assert await checkpointer.ledger_get("user-b", charge_key(values, "call_1")) is not None
    assert len(lines(server_env["MCP_CANCELS_FILE"])) == 1, "the stopped call was not cancelled on the server"


@pytest.mark.parametrize("kind", ["stdio", "http"])
def test_two_threads_sharing_one_server_one_users_hung_call_does_not_fail_another_users_charge(
    kind: str, server_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    if kind == "stdio":
        server = MCPServer.stdio(sys.executable, "-m", "tests.support.mcp_server", "stdio", env=server_env)
    else:
        server = MCPServer.http(request.getfixturevalue("http_server").url)
    try:
        hang_tools = mcp_tools(server, include=["hang"], tool_timeout=1.5)
        pay_tools = mcp_tools(server, include=["charge"], side_effects={"charge": "retry"}, tool_timeout=20)
        hung = tool_graph(hang_tools, calling_model([call("call_1", "hang")])).compile(InMemoryCheckpointer())
        checkpointer = InMemoryCheckpointer()
        charge_call = call("call_1", "charge", order_id="4821", seconds=3)
        paying = tool_graph(pay_tools, calling_model([charge_call])).compile(checkpointer)
        results: dict[str, Any] = {}

        def run(name: str, app: CompiledGraph) -> None:
            try:
                results[name] = app.invoke("go", {"thread_id": name})
            except BaseException as e:  # reported by the assertions below
                results[name] = e

        threads = [threading.Thread(target=run, args=args) for args in (("user-b", paying), ("user-a", hung))]
        for t in threads:
            t.start()
            time.sleep(0.3)
        for t in threads:
            t.join(60)
        assert isinstance(results.get("user-a"), dict) and isinstance(results.get("user-b"), dict), results
        assert tool_messages(results["user-a"])["call_1"].is_error, "the hung call was supposed to time out"
        charged = tool_messages(results["user-b"])["call_1"]
        assert not charged.is_error, (
            f"GUARANTEE BROKEN: one user's hung MCP call failed another user's charge in another thread: "
            f"{charged.content}"
        )
        assert len(lines(server_env["MCP_CHARGES_FILE"])) == 1
        key = charge_key(results["user-b"], "call_1")
        assert blocking.run(lambda: checkpointer.ledger_get("user-b", key), caller="test") is not None
    finally:
        blocking.run(server.aclose, caller="test")


@pytest.mark.parametrize(
    ("kind", "policy"),
    [("stdio", "retry"), ("stdio", "report"), ("stdio", "interrupt"), ("http", "interrupt")],
)
async def test_connection_lost_under_a_side_effect_call_is_in_doubt_under_its_policy_never_a_plain_failure(
    kind: str, policy: str, server_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    http = request.getfixturevalue("http_server") if kind == "http" else None
    if http is None:
        server = MCPServer.stdio(sys.executable, "-m", "tests.support.mcp_server", "stdio", env=server_env)
    else:
        server = MCPServer.http(http.url)
    charges_file = Path(server_env["MCP_CHARGES_FILE"])
    pid_file = Path(server_env["MCP_PID_FILE"])

    def kill_once_charged() -> None:
        deadline = time.monotonic() + 30
        while not charges(charges_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the card is charged, the answer never comes
        if http is not None:
            http.stop()
            http.start()  # at once, on the same port: the port probe alone would not see the loss

    try:
        tools = await amcp_tools(server, side_effects={"charge": policy})
        checkpointer = InMemoryCheckpointer()
        app = tool_graph(tools, calling_model([call("call_1", "charge", order_id="7", seconds=60)])).compile(
            checkpointer
        )
        killer = asyncio.create_task(asyncio.to_thread(kill_once_charged))
        started = time.monotonic()
        values = await app.ainvoke("go", {"thread_id": "t1", "tool_timeout": 100})
        await killer
        assert time.monotonic() - started < 50, "the lost connection was only noticed by the tool deadline (100 s)"
        state = await checkpointer.aget("t1")
        assert state is not None
        counts = state.meta["tool_calls"]
        assert counts["failed"] == 0 and counts["in_doubt"] >= 1, (
            f"GUARANTEE BROKEN: a side-effect call whose connection was lost was counted {counts}, "
            "a plain failure instead of in doubt"
        )
        if policy == "report":
            result = tool_messages(values)["call_1"]
            key = charges(charges_file)[0]["argument"]
            assert result.is_error and "outcome is unknown" in result.content and key in result.content
            assert len(charges(charges_file)) == 1, "report must not run the call again"
            return
        if policy == "interrupt":
            pending = values.get("__interrupt__") or []
            assert len(pending) == 1 and pending[0].payload["reason"] == "in_doubt", (
                f"the in-doubt call did not pause the run for a human: {values['messages'][-1]}"
            )
            assert len(charges(charges_file)) == 1
            values = await app.ainvoke(Command(resume="retry"), {"thread_id": "t1", "tool_timeout": 30})
        result = tool_messages(values)["call_1"]
        assert not result.is_error, result.content
        executed = charges(charges_file)
        assert len(executed) == 2, f"the in-doubt charge was not retried exactly once: {executed}"
        keys = {c["argument"] for c in executed} | {c["meta"] for c in executed}
        assert len(keys) == 1 and None not in keys, f"GUARANTEE BROKEN: the retry used a new key {keys}"
        assert await checkpointer.ledger_get("t1", charge_key(values, "call_1")) is not None
    finally:
        await server.aclose()


# -- the crash scenario, in real processes ---------------------------------------------------------


def drive(env: dict[str, str], store: str, target: list[str], *, text: str | None, fault: str | None = None) -> Any:
    child_env = dict(env)
    if fault:
        child_env["AGENTRUN_FAULT_POINT"] = fault
    cmd = [sys.executable, "-m", "tests.support.drive_mcp", store, "order-4821", *target]
    if text is not None:
        cmd += ["--input", text]
    return subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=90, cwd=ROOT)


@pytest.mark.parametrize("kind", ["stdio", "http"])
@pytest.mark.parametrize(
    ("fault", "executions"),
    [
        # charge returned and was recorded: the resume replays it from the ledger.
        pytest.param("after_ledger_record:charge", 1, id="after-charge-recorded"),
        # charge returned, not recorded: in doubt, policy retry, the SAME idempotency key reaches the server.
        pytest.param("after_tool:charge", 2, id="charge-returned-not-recorded"),
    ],
)
def test_sigkill_after_mcp_charge_then_resume_in_a_new_process_charges_once(
    kind: str, fault: str, executions: int, tmp_path: Path, server_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    target = ["--stdio"] if kind == "stdio" else ["--url", request.getfixturevalue("http_server").url]
    store = f"sqlite:///{tmp_path / 'agentrun.db'}"
    crashed = drive(server_env, store, target, text="charge order 4821", fault=fault)
    assert crashed.returncode == -signal.SIGKILL, f"the run was supposed to die at {fault}:\n{crashed.stderr}"
    resumed = drive(server_env, store, target, text=None)
    assert resumed.returncode == 0, f"the resume failed:\n{resumed.stderr}"
    executed = charges(Path(server_env["MCP_CHARGES_FILE"]))
    assert len(executed) == executions, f"charge executed {len(executed)} times; only the documented window re-runs"
    keys = {c["argument"] for c in executed} | {c["meta"] for c in executed}
    assert len(keys) == 1 and None not in keys, f"GUARANTEE BROKEN: the charges used different keys {keys}"
    if executions == 1:
        assert "(charge) from the ledger; not executed again" in resumed.stderr, resumed.stderr
    final = json.loads(next(line for line in resumed.stdout.splitlines() if line.startswith("FINAL "))[6:])
    assert final[-1]["role"] == "assistant" and "succeeded" in final[-1]["content"]
