"""The runner's story in its log (issue 11): a line per node and per tool call, JSON lines on request,
and a termination message that says why a pod that ended on purpose is no failure."""

from __future__ import annotations

import io
import json
import logging

import pytest

from agentrun import tool, user
from agentrun.checkpoint import InMemoryCheckpointer
from agentrun.context import run_logger
from agentrun.contract import ExitCode
from agentrun.logs import JsonFormatter
from agentrun.runner import explained
from agentrun_operator.decide.podspec import RunRef, build_pod
from agentrun_operator.decide.spec import parse_spec
from agentrun_operator.settings import OperatorSettings
from tests.unit.helpers import call, calling_model, tool_graph


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
