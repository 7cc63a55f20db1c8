"""The runner pod entrypoint as a real process: env contract in, exit code and store out, signals for real."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentrun.checkpoint import SqliteCheckpointer
from examples.support_agent import count_effects
from tests.conftest import ROOT

INPUT = {"messages": [{"role": "user", "content": "charge my saved card for order 4821 and email me the receipt"}]}


@pytest.fixture
def pod_env(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, str]:
    return dict(
        subprocess_env,
        AGENTRUN_GRAPH="examples.support_agent:app",
        AGENTRUN_THREAD_ID="default/order-4821",
        AGENTRUN_RUN_NAME="order-4821",
        AGENTRUN_RUN_UID="uid-1",
        AGENTRUN_ATTEMPT="1",
        AGENTRUN_INPUT=json.dumps(INPUT),
        AGENTRUN_STORE=f"sqlite:///{tmp_path / 'agentrun.db'}",
        AGENTRUN_METRICS_PORT="0",
        AGENTRUN_TERMINATION_LOG=str(tmp_path / "termination-log"),
    )


def start(env: dict[str, str], **overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentrun.runner"],
        env={**env, **overrides},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(env: dict[str, str], **overrides: str) -> tuple[int, str]:
    proc = start(env, **overrides)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def status(env: dict[str, str]) -> tuple[str, str | None]:
    conn = sqlite3.connect(env["AGENTRUN_STORE"].removeprefix("sqlite:///"))
    try:
        row = conn.execute(
            "SELECT status, current_node FROM states WHERE thread_id = ? ORDER BY version DESC LIMIT 1",
            (env["AGENTRUN_THREAD_ID"],),
        ).fetchone()
    finally:
        conn.close()
    return row


def wait_for_node(env: dict[str, str], node: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if status(env) == ("running", node):
                return
        except (sqlite3.Error, TypeError):
            pass
        time.sleep(0.1)
    pytest.fail(f"the runner never reached node {node}")


def test_completed_run_exits_0_and_a_rescheduled_pod_does_not_run_the_turn_again(pod_env: dict[str, str]) -> None:
    code, err = run(pod_env)
    assert code == 0, err
    assert status(pod_env) == ("completed", "__end__")
    # The operator could start attempt 2 if it missed attempt 1's exit; it must not charge again.
    code, err = run(pod_env, AGENTRUN_ATTEMPT="2")
    assert code == 0, err
    assert count_effects(pod_env["SUPPORT_EFFECTS_DB"])["tool_invocations"] == 2  # charge + receipt, once each


def test_sigterm_preempts_at_a_safe_point_exit_6_and_the_next_attempt_finishes(pod_env: dict[str, str]) -> None:
    """Preemption: the current node finishes (within the window), the state is checkpointed, exit 6."""
    proc = start(pod_env, SUPPORT_TOOL_DELAY="1.5", AGENTRUN_PREEMPT_FINISH_SECONDS="20")
    wait_for_node(pod_env, "tools")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 6, err
    assert status(pod_env) == ("running", "model"), "the tool node should have finished and been checkpointed"
    code, err = run(pod_env, AGENTRUN_ATTEMPT="2")
    assert code == 0, err
    effects = count_effects(pod_env["SUPPORT_EFFECTS_DB"])
    assert effects["charges"] == 1 and effects["tool_invocations"] == 2, effects


def test_sigterm_cancels_a_hung_node_after_the_window_and_stays_resumable(pod_env: dict[str, str]) -> None:
    proc = start(pod_env, SUPPORT_TOOL_DELAY="3600", AGENTRUN_PREEMPT_FINISH_SECONDS="0.5")
    wait_for_node(pod_env, "tools")
    time.sleep(0.3)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 6, err
    # The contract is the pod's grace period (terminationGracePeriodSeconds, 30 s by default), not a speed.
    assert time.monotonic() - started < 25, "preemption must fit in a pod's termination grace period"
    assert status(pod_env) == ("running", "tools")
    code, err = run(pod_env, AGENTRUN_ATTEMPT="2")
    assert code == 0, err
    assert count_effects(pod_env["SUPPORT_EFFECTS_DB"])["charges"] == 1


def test_stop_request_exits_4(pod_env: dict[str, str]) -> None:
    proc = start(pod_env, SUPPORT_TOOL_DELAY="3600")
    wait_for_node(pod_env, "tools")
    # As the operator will: a stop request in the store, from another process.
    asked = subprocess.run(
        [sys.executable, "-m", "agentrun.cli", "stop", "--thread-id", pod_env["AGENTRUN_THREAD_ID"]],
        env={**pod_env, "AGENTRUN_STORE": pod_env["AGENTRUN_STORE"]},
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert asked.returncode == 0, asked.stderr
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert status(pod_env) == ("stopped", "tools")
    assert "RUN_STOPPED_001" in Path(pod_env["AGENTRUN_TERMINATION_LOG"]).read_text()


def test_unknown_graph_exits_5_with_the_reason_in_the_termination_log(pod_env: dict[str, str]) -> None:
    code, err = run(pod_env, AGENTRUN_GRAPH="examples.nope:app")
    assert code == 5, err
    message = Path(pod_env["AGENTRUN_TERMINATION_LOG"]).read_text()
    assert "GRAPH_REFERENCE_001" in message and "examples.nope" in message


def test_missing_environment_exits_5_naming_the_variable(pod_env: dict[str, str]) -> None:
    env = {k: v for k, v in pod_env.items() if k != "AGENTRUN_GRAPH"}
    code, err = run(env)
    assert code == 5 and "AGENTRUN_GRAPH" in err


def test_a_superseded_attempt_exits_7_and_does_nothing(pod_env: dict[str, str]) -> None:
    code, err = run(pod_env, AGENTRUN_ATTEMPT="3", AGENTRUN_INPUT="null", AGENTRUN_GRAPH="examples.support_agent:app")
    # Attempt 3 registered (and failed for lack of input); attempt 2 arriving late must be fenced off.
    assert code == 5, err
    code, err = run(pod_env, AGENTRUN_ATTEMPT="2")
    assert code == 7, err
    assert count_effects(pod_env["SUPPORT_EFFECTS_DB"])["tool_invocations"] == 0


def test_interrupt_exits_3_and_resume_value_completes(pod_env: dict[str, str], tmp_path: Path) -> None:
    """The refund tool is in doubt after a crash between its start and its record; in_doubt=interrupt pauses."""
    refund = {"messages": [{"role": "user", "content": "please refund order 4821"}]}
    env = dict(pod_env, AGENTRUN_INPUT=json.dumps(refund))
    code, err = run(env, AGENTRUN_FAULT_POINT="after_tool:refund_payment")
    assert code == -signal.SIGKILL, err
    code, err = run(env, AGENTRUN_ATTEMPT="2")
    assert code == 3, err
    assert status(env) == ("interrupted", "tools")
    assert "Interrupted" in Path(env["AGENTRUN_TERMINATION_LOG"]).read_text()
    answer = {"value": {"result": {"status": "refunded"}}}
    code, err = run(env, AGENTRUN_ATTEMPT="3", AGENTRUN_RESUME=json.dumps(answer))
    assert code == 0, err
    assert count_effects(env["SUPPORT_EFFECTS_DB"])["refunds"] == 1, "the human's answer must not refund again"


# -- inputs from the store (AGENTRUN_INPUTS_IN_STORE): too large for the environment -----------------

MIB = 1024 * 1024


def put_inputs(
    env: dict[str, str], attempt: int, *, input: dict[str, Any] | None, resume: dict[str, Any] | None
) -> None:
    """What the operator does before it creates the pod of ``attempt``."""

    async def put() -> None:
        store = SqliteCheckpointer(env["AGENTRUN_STORE"].removeprefix("sqlite:///"))
        try:
            await store.setup()
            await store.put_run_inputs(
                env["AGENTRUN_THREAD_ID"], run_uid=env["AGENTRUN_RUN_UID"], attempt=attempt, input=input, resume=resume
            )
        finally:
            await store.aclose()

    asyncio.run(put())


def final_reply(env: dict[str, str]) -> str:
    async def get() -> str:
        store = SqliteCheckpointer(env["AGENTRUN_STORE"].removeprefix("sqlite:///"))
        try:
            checkpoint = await store.aget(env["AGENTRUN_THREAD_ID"])
        finally:
            await store.aclose()
        assert checkpoint is not None and checkpoint.status == "completed"
        return checkpoint.messages[-1].content

    return asyncio.run(get())


def test_a_1_mib_input_and_a_1_mib_resume_value_reach_the_run_through_the_store(pod_env: dict[str, str]) -> None:
    from tests.integration.large_inputs_graph import digest

    env = {k: v for k, v in pod_env.items() if k != "AGENTRUN_INPUT"}
    env.update(AGENTRUN_GRAPH="tests.integration.large_inputs_graph:app", AGENTRUN_INPUTS_IN_STORE="true")
    text = ("caf\u00e9 \U0001f600 " * (MIB // 10))[: MIB // 2] + "x" * (MIB // 2)
    answer = {"approved": True, "note": "y" * MIB}
    assert len(text.encode()) > MIB and len(json.dumps(answer)) > MIB, "each value must exceed 1 MiB"
    put_inputs(env, 1, input={"messages": [{"role": "user", "content": text}]}, resume=None)
    code, err = run(env)
    assert code == 3, f"the run should pause for the resume value\n{err[-2000:]}"

    put_inputs(env, 2, input={"messages": [{"role": "user", "content": text}]}, resume={"value": answer})
    code, err = run(env, AGENTRUN_ATTEMPT="2")
    assert code == 0, err[-2000:]
    assert final_reply(env) == f"input {digest(text)} resume {digest(answer)}", "a large value did not arrive whole"


def test_inputs_in_store_without_a_record_fail_with_one_clear_line(pod_env: dict[str, str]) -> None:
    env = {k: v for k, v in pod_env.items() if k != "AGENTRUN_INPUT"}
    code, err = run(env, AGENTRUN_INPUTS_IN_STORE="true", AGENTRUN_ATTEMPT="3")
    assert code == 5, err
    message = Path(env["AGENTRUN_TERMINATION_LOG"]).read_text()
    assert message.startswith("RUNNER_INPUT_001: ") and "attempt 3" in message and "\n" not in message, message
    assert err.strip().splitlines()[-1] == message, "the last stderr line must be the termination message, unprefixed"


def test_a_failing_exit_ends_stderr_with_the_plain_termination_line(pod_env: dict[str, str]) -> None:
    """Kubelets fall back to the log tail when the termination file is empty: it must read like the file."""
    code, err = run(pod_env, AGENTRUN_GRAPH="examples.nope:app", AGENTRUN_TERMINATION_LOG="/nonexistent/dir/log")
    assert code == 5, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("GRAPH_REFERENCE_001: ") and "[GRAPH_REFERENCE_001]" not in last, last


def test_a_re_applied_agentrun_with_the_same_request_key_never_runs_the_tools_again(pod_env: dict[str, str]) -> None:
    """kubectl delete + apply: a new run uid, the same request key; finished or not, the tools run once."""
    keyed = dict(pod_env, AGENTRUN_REQUEST_KEY="default/order-4821/0123456789abcdef")
    proc = start(keyed, SUPPORT_TOOL_DELAY="1.5", AGENTRUN_PREEMPT_FINISH_SECONDS="20")
    wait_for_node(keyed, "tools")
    proc.send_signal(signal.SIGTERM)  # the pod goes away mid-turn
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 6, err
    code, err = run(keyed, AGENTRUN_RUN_UID="uid-2")  # the same request, applied again
    assert code == 0, err
    assert status(keyed) == ("completed", "__end__")
    code, err = run(keyed, AGENTRUN_RUN_UID="uid-3")  # and once more, after it completed
    assert code == 0, err
    effects = count_effects(keyed["SUPPORT_EFFECTS_DB"])
    assert effects["charges"] == 1 and effects["tool_invocations"] == 2, f"GUARANTEE BROKEN: {effects}"
    code, err = run(keyed, AGENTRUN_RUN_UID="uid-4", AGENTRUN_REQUEST_KEY="default/order-4821/another")
    assert code == 0, err
    assert count_effects(keyed["SUPPORT_EFFECTS_DB"])["tool_invocations"] == 4, "a new request key is a new turn"


def test_fail_on_tool_error_exits_5_with_the_tool_error_code(pod_env: dict[str, str], tmp_path: Path) -> None:
    failing = dict(
        pod_env,
        AGENTRUN_CONFIG=json.dumps({"failOnToolError": True}),
        AGENTRUN_INPUT=json.dumps({"messages": [{"role": "user", "content": "charge my card for order 9999"}]}),
    )
    code, err = run(failing)
    assert code == 5, err
    line = (tmp_path / "termination-log").read_text()
    assert line.startswith("TOOL_ERROR_001: "), line
    assert status(failing) == ("failed", "tools")


def test_an_uncompiled_graph_or_one_compiled_with_its_own_store_runs_on_the_runs_store_and_says_so(
    pod_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 24 item 7: neither case may pass silently; both run, on the run's store, with a WARNING that says so."""
    own = tmp_path / "module-own.db"
    (tmp_path / "my_agent.py").write_text(
        "from agentrun import SqliteCheckpointer\n"
        "from examples.support_agent import graph\n"
        f"app = graph.compile(checkpointer=SqliteCheckpointer({str(own)!r}))\n"
    )
    env = dict(pod_env, PYTHONPATH=f"{tmp_path}:{pod_env['PYTHONPATH']}")
    code, err = run(env, AGENTRUN_GRAPH="my_agent:graph", AGENTRUN_THREAD_ID="default/uncompiled")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "WARNING" in line and "my_agent:graph" in line]
    assert len(warnings) == 1 and "is an uncompiled StateGraph: it is compiled here" in warnings[0], err

    code, err = run(env, AGENTRUN_GRAPH="my_agent:app", AGENTRUN_THREAD_ID="default/own-store")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "WARNING" in line and "my_agent:app" in line]
    assert len(warnings) == 1, err
    assert f"compiled with its own checkpointer (SqliteCheckpointer {own})" in warnings[0], warnings[0]
    assert "nothing is read from or written to the module's checkpointer" in warnings[0], warnings[0]
    assert not own.exists(), "the module's own store must not be touched: the run's store replaces it"
    assert status(dict(env, AGENTRUN_THREAD_ID="default/own-store")) == ("completed", "__end__")

    code, err = run(pod_env, AGENTRUN_THREAD_ID="default/plain")  # examples.support_agent:app, compiled bare
    assert code == 0 and "WARNING" not in err, err
