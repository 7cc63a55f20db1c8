"""The runner's story in its log (issue 11): a line per node and per tool call, JSON lines on request,
and a termination message that says why a pod that ended on purpose is no failure."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from agentrun import END, START, StateGraph, assistant, ledger, tool, user
from agentrun.checkpoint import InMemoryCheckpointer
from agentrun.context import run_logger
from agentrun.contract import ExitCode
from agentrun.logs import JsonFormatter
from agentrun.runner import explained
from agentrun_operator.decide.podspec import RunRef, build_pod
from agentrun_operator.decide.spec import parse_spec
from agentrun_operator.settings import OperatorSettings
from tests.unit.helpers import call, calling_model, seed_tool_step, tool_graph


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


async def test_each_node_and_each_tool_call_gets_a_line_with_its_duration_and_ledger_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryCheckpointer()
    app = tool_graph([lookup], calling_model([call("c1", "lookup", order="4821")])).compile(store)
    config = {"thread_id": "t-logs"}
    with caplog.at_level(logging.INFO, logger="agentrun"):
        await app.ainvoke({"messages": [user("where is 4821?")]}, config)
    lines = [r.getMessage() for r in caplog.records]
    for node in ("model", "tools"):
        assert any(f"node {node} started (step" in line for line in lines), f"no start line for {node}: {lines}"
        assert any(f"node {node} finished in " in line for line in lines), f"no finish line for {node}: {lines}"
    executed = [line for line in lines if "executed " in line and "(lookup)" in line]
    assert len(executed) == 1 and ":c1 (lookup) in " in executed[0], (
        f"a tool call's line must name its ledger key and duration: {lines}"
    )
    assert all(line.startswith("[thread=t-logs attempt=") for line in lines if "node " in line)


def test_json_lines_carry_the_thread_and_attempt_as_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("agentrun.test_json_lines")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        run_logger("agentrun.test_json_lines", "ns/t-1", 3).warning("replayed %s from the ledger", "m1:c1")
    finally:
        logger.removeHandler(handler)
    record = json.loads(stream.getvalue())
    assert record["thread_id"] == "ns/t-1" and record["attempt"] == 3
    assert record["level"] == "WARNING" and "replayed m1:c1 from the ledger" in record["message"]


@pytest.mark.parametrize("code", [ExitCode.INTERRUPTED, ExitCode.STOPPED, ExitCode.PREEMPTED, ExitCode.FENCED])
def test_a_pod_that_ended_on_purpose_says_so_in_its_termination_message(code: ExitCode) -> None:
    line = explained(code, "Something: happened")
    assert line.startswith("Something: happened (exit ") and f"exit {int(code)}" in line


@pytest.mark.parametrize("code", [ExitCode.FAILED, ExitCode.CRASH, 137])
def test_a_failure_keeps_its_termination_message_as_it_was(code: int) -> None:
    assert explained(code, "NODE_ERROR_001: boom") == "NODE_ERROR_001: boom"


@pytest.mark.parametrize(
    ("operator", "runner", "expected"),
    [("text", "", None), ("json", "", "json"), ("json", "text", None), ("text", "json", "json")],
)
def test_runner_pods_log_json_lines_when_the_operator_is_configured_so(
    operator: str, runner: str, expected: str | None
) -> None:
    settings = OperatorSettings(log_format=operator, runner_log_format=runner)
    spec = parse_spec({"graph": "examples.support_agent:app", "threadId": "t"})
    pod = build_pod(RunRef("ns", "run", "uid"), spec, attempt=1, settings=settings)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env.get("AGENTRUN_LOG_FORMAT") == expected


# -- a tool call's story, and a long step's heartbeat (issue 24 item 6) ---------------------------------------------

SECRET = "4242-4242-secret"


def _tool_lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"tool {event}: " in r.getMessage()]


async def test_a_tool_call_logs_its_start_with_an_arguments_digest_and_its_end_with_a_duration_never_the_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asked = call("c1", "lookup", order=SECRET)
    app = tool_graph([lookup], calling_model([asked])).compile(InMemoryCheckpointer())
    with caplog.at_level(logging.INFO, logger="agentrun"):
        await app.ainvoke({"messages": [user("where is it?")]}, {"thread_id": "t-story"})
    digest = hashlib.sha256(asked.arguments.encode()).hexdigest()
    [started] = _tool_lines(caplog, "started")
    assert started.startswith("[thread=t-story attempt="), f"the start line must carry the run's context: {started}"
    assert f"call c1 (lookup), arguments sha256:{digest[:12]} ({len(asked.arguments)} bytes)" in started, (
        f"the start line must name the call and a digest of its arguments: {started}"
    )
    [finished] = _tool_lines(caplog, "finished")
    assert re.search(r"executed \S+:c1 \(lookup\) in \d+\.\d{3}s; recording it in the ledger", finished), finished
    lines = [r.getMessage() for r in caplog.records]
    assert lines.index(started) < lines.index(finished)
    assert not [line for line in lines if SECRET in line], "ARGUMENTS LEAKED: a log line carries a tool's argument"


async def test_a_replayed_call_says_so_and_is_not_started() -> None:
    store = InMemoryCheckpointer()
    request = await seed_tool_step(store, "t-replay", [call("c1", "lookup", order="4821")])
    await store.ledger_put("t-replay", f"{request.id}:c1", "lookup", ledger.encode("order 4821: shipped"))
    records: list[str] = []
    with _capture(records):
        await tool_graph([lookup], calling_model([])).compile(store).ainvoke(None, {"thread_id": "t-replay"})
    assert [line for line in records if "tool replayed: " in line] == [
        f"[thread=t-replay attempt=1] tool replayed: {request.id}:c1 (lookup) from the ledger; not executed again"
    ]
    assert not [line for line in records if "tool started: " in line], "a replayed call must not be started"


async def test_a_failed_call_logs_why_and_after_how_long_without_its_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @tool
    async def refund(order: str) -> str:
        """Refund an order."""
        raise ValueError("the payment provider said no")

    calls = [call("c1", "refund", order=SECRET), call("c2", "refund", amount=SECRET), call("c3", "nope", x=SECRET)]
    app = tool_graph([refund], calling_model(calls)).compile(InMemoryCheckpointer())
    with caplog.at_level(logging.INFO, logger="agentrun"):
        await app.ainvoke({"messages": [user("refund it")]}, {"thread_id": "t-failed"})
    failed = sorted(_tool_lines(caplog, "failed"))
    assert len(failed) == 3, f"one failed line per failed call: {failed}"
    raised, invalid, unknown = failed
    assert re.search(r"call c1 \(refund\) raised ValueError after \d+\.\d{3}s: the payment provider said no$", raised)
    assert re.search(r"call c2 \(refund\) has invalid arguments, sha256:[0-9a-f]{12} \(\d+ bytes\); not run", invalid)
    assert "call c3 asks for unknown tool 'nope'; not run" in unknown
    assert len(_tool_lines(caplog, "started")) == 1, "only the call that ran was started"
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if SECRET in line], "ARGUMENTS LEAKED: a log line carries a tool's argument"


class _capture(logging.Handler):
    """Every agentrun line at INFO and above into ``lines`` (works under looptime, outside caplog's fixtures)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines
        self.logger = logging.getLogger("agentrun")

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> None:
        self.previous = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)

    def __exit__(self, *_: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.previous)


@pytest.mark.looptime
async def test_a_step_running_longer_than_ten_seconds_logs_a_heartbeat_every_ten_seconds(looptime: Any) -> None:
    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(float(state["messages"][-1].content))
        return {"messages": [assistant("done")]}

    graph = StateGraph()
    graph.add_node("slow", slow)
    graph.add_edge(START, "slow")
    graph.add_edge("slow", END)
    app = graph.compile(InMemoryCheckpointer())
    lines: list[str] = []
    with _capture(lines):
        await app.ainvoke("35", {"thread_id": "t-beat", "node_timeout": 100})
        await app.ainvoke("9", {"thread_id": "t-quick"})
    beats = [line for line in lines if "still running" in line]
    assert beats == [
        f"[thread=t-beat attempt=1] node slow still running after {s}s (step 0); its deadline is in {100 - s}s"
        for s in (10, 20, 30)
    ], f"a 35 s step must say it is alive at 10, 20 and 30 s, and a 9 s step never: {lines}"


@pytest.mark.looptime
async def test_a_langgraph_step_running_longer_than_ten_seconds_logs_a_heartbeat_every_ten_seconds(
    looptime: Any, tmp_path: Path
) -> None:
    from langgraph.graph import START as LG_START
    from langgraph.graph import StateGraph as LangGraphStateGraph

    from agentrun.checkpoint import SqliteCheckpointer
    from agentrun.config import RunConfig
    from agentrun.integrations.langgraph.run import prepare, run_turn
    from agentrun.supervisor import Preemption

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(state["seconds"])
        return {"seconds": 0}

    graph = LangGraphStateGraph(dict)  # type: ignore[type-var]
    graph.add_node("slow", slow)
    graph.add_node("quick", slow)
    graph.add_edge(LG_START, "slow")
    graph.add_edge("slow", "quick")
    store = SqliteCheckpointer(tmp_path / "agentrun.db")  # AgentrunSaver needs a store with rows
    await store.setup()
    lines: list[str] = []
    try:
        with _capture(lines):
            status, _ = await run_turn(
                prepare(graph.compile(), "test:graph"),
                store=store,
                cfg=RunConfig.from_any({"thread_id": "ns/lg-beat"}),
                payload={"seconds": 25},
                existing=None,
                preemption=Preemption(),
            )
    finally:
        await store.aclose()
    assert status == "completed"
    beats = [line for line in lines if "still running" in line]
    assert beats == [f"thread ns/lg-beat: node slow still running after {s}s (LangGraph step 0)" for s in (10, 20)], (
        f"a 25 s LangGraph step must say it is alive at 10 and 20 s, its quick next step never: {lines}"
    )
