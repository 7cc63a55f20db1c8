"""The runner's pure decision: what an attempt does given the thread's latest checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.checkpoint.base import Checkpoint
from agentrun.contract import ExitCode
from agentrun.errors import (
    FencedError,
    GraphReferenceError,
    ModelError,
    NodeError,
    NodeTimeoutError,
    RunPreempted,
    RunStopped,
    StaleStateError,
    StorageError,
    ToolError,
)
from agentrun.interrupts import Command
from agentrun.runner import (
    RunnerSettings,
    exit_code_for,
    plan,
)

INPUT = {"messages": [{"role": "user", "content": "hi"}]}


def settings(**kw: Any) -> RunnerSettings:
    base: dict[str, Any] = {"graph": "examples.support_agent:app", "thread_id": "ns/t", "run_uid": "uid-1"}
    return RunnerSettings(**{**base, **kw})


def checkpoint(status: str, run_uid: str | None = "uid-1") -> Checkpoint:
    meta = {"run_uid": run_uid} if run_uid else {}
    return Checkpoint("ns/t", 3, {}, [], "tools", 1, status, meta)  # type: ignore[arg-type]


def test_first_attempt_starts_the_turn_with_the_input() -> None:
    decided = plan(None, settings(input=INPUT))
    assert decided.action == "start" and decided.payload == INPUT


def test_a_rescheduled_attempt_resumes_instead_of_starting_the_turn_again() -> None:
    for status in ("running", "failed"):
        decided = plan(checkpoint(status), settings(input=INPUT, attempt=2))
        assert decided.action == "resume" and decided.payload is None, status


def test_a_turn_that_already_finished_is_not_run_again() -> None:
    assert plan(checkpoint("completed"), settings(input=INPUT)).exit_code == ExitCode.COMPLETED
    assert plan(checkpoint("completed"), settings(input=INPUT)).action == "exit"
    assert plan(checkpoint("stopped"), settings(input=INPUT)).exit_code == ExitCode.STOPPED


def test_interrupted_waits_for_resume_then_answers_with_it() -> None:
    waiting = plan(checkpoint("interrupted"), settings(input=INPUT))
    assert (waiting.action, waiting.exit_code) == ("exit", ExitCode.INTERRUPTED)
    single = plan(checkpoint("interrupted"), settings(input=INPUT, resume={"value": {"approve": True}}))
    assert single.action == "resume" and single.payload == Command(resume={"approve": True})
    several = plan(checkpoint("interrupted"), settings(resume={"values": {"a": 1, "b": 2}}))
    assert several.payload == Command(resume={"a": 1, "b": 2})


def test_a_new_agentrun_on_a_finished_thread_starts_the_next_turn() -> None:
    decided = plan(checkpoint("completed", run_uid="older"), settings(input=INPUT))
    assert decided.action == "start"


def test_a_new_agentrun_never_hijacks_another_runs_unfinished_turn() -> None:
    for status in ("running", "interrupted"):
        decided = plan(checkpoint(status, run_uid="other"), settings(input=INPUT))
        assert decided.exit_code == ExitCode.FAILED and "ThreadBusy" in decided.reason


def test_missing_input_for_a_new_turn_fails_permanently() -> None:
    decided = plan(None, settings())
    assert decided.exit_code == ExitCode.FAILED and "InputMissing" in decided.reason


def _caused(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RunStopped("t", node="n", version=1), ExitCode.STOPPED),
        (RunPreempted("p"), ExitCode.PREEMPTED),
        (FencedError("f"), ExitCode.FENCED),
        (GraphReferenceError("g"), ExitCode.FAILED),
        (NodeError("n", node="x"), ExitCode.FAILED),
        (NodeTimeoutError("slow", timeout=1), ExitCode.CRASH),
        (ModelError("503"), ExitCode.CRASH),
        (StorageError("down"), ExitCode.CRASH),
        (StaleStateError("t", 1, 2), ExitCode.CRASH),
        (OSError("disk"), ExitCode.CRASH),
        (_caused(NodeError("n", node="x"), ConnectionResetError()), ExitCode.CRASH),
        (_caused(NodeError("n", node="x"), ValueError()), ExitCode.FAILED),
    ],
)
def test_errors_map_to_the_pod_exit_code_table(error: BaseException, code: int) -> None:
    assert exit_code_for(error) == code


def test_crd_config_keys_become_run_config_keys() -> None:
    config = settings(config={"toolTimeoutSeconds": 60, "recursionLimit": 9}, attempt=4).run_config()
    assert config == {"tool_timeout": 60, "recursion_limit": 9, "thread_id": "ns/t", "attempt": 4, "run_uid": "uid-1"}


def keyed(status: str, key: str, run_uid: str = "uid-old") -> Checkpoint:
    meta = {"run_uid": run_uid, "request_key": key}
    return Checkpoint("ns/t", 3, {}, [], "tools", 1, status, meta)  # type: ignore[arg-type]


def test_with_a_request_key_a_re_applied_agentrun_owns_the_turn_of_its_request() -> None:
    """A new uid with the same request key (kubectl delete + apply) resumes or answers that turn, never re-runs it."""
    again = settings(input=INPUT, run_uid="uid-new", request_key="ns/run/abc")
    for status in ("running", "failed"):
        decided = plan(keyed(status, "ns/run/abc"), again)
        assert (decided.action, decided.payload) == ("resume", None), f"{status}: the request's turn must resume"
    done = plan(keyed("completed", "ns/run/abc"), again)
    assert (done.action, done.exit_code) == ("exit", ExitCode.COMPLETED), "a completed request is not run again"
    assert plan(keyed("stopped", "ns/run/abc"), again).exit_code == ExitCode.STOPPED
    assert plan(keyed("interrupted", "ns/run/abc"), again).exit_code == ExitCode.INTERRUPTED


def test_with_a_request_key_another_requests_turn_is_not_ours_even_from_the_same_run() -> None:
    other = settings(input=INPUT, run_uid="uid-old", request_key="ns/run/new")
    assert "ThreadBusy" in plan(keyed("running", "ns/run/abc"), other).reason
    # Ended: start, and the engine answers from the turn record if this key completed earlier.
    assert plan(keyed("completed", "ns/run/abc"), other).action == "start"


def test_the_request_key_and_fail_on_tool_error_reach_the_run_config() -> None:
    config = settings(config={"failOnToolError": True}, request_key="ns/run/abc").run_config()
    assert (config["fail_on_tool_error"], config["request_key"]) == (True, "ns/run/abc")
    assert "request_key" not in settings().run_config(), "no request key: every input starts a new turn"


def test_a_tool_error_that_fails_the_run_is_permanent() -> None:
    assert exit_code_for(ToolError("charge_card failed", tool="charge_card")) == ExitCode.FAILED
