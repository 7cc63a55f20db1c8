"""Crash safety on the embedded store: real processes, real SIGKILL at named points.

Each test runs the support example in a child process that kills itself with
SIGKILL exactly at a fault point (agentrun.faults), then runs the same thread
again in a new process and counts what the customer experienced: rows in
the example's payment and mail tables, and every tool invocation.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.support_agent import count_effects

REQUEST = "charge my saved card for order 4821 and email me the receipt"


def drive(
    env: dict[str, str],
    store: str,
    *,
    text: str | None,
    mode: str,
    fault: str | None = None,
    timeout: float = 60,
    request_key: str | None = None,
) -> subprocess.CompletedProcess[str]:
    child_env = dict(env)
    if fault:
        child_env["AGENTRUN_FAULT_POINT"] = fault
    cmd = [sys.executable, "-m", "tests.support.drive_support", store, "order-4821", "--mode", mode]
    if text is not None:
        cmd += ["--input", text]
    if request_key is not None:
        cmd += ["--request-key", request_key]
    return subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout)


def final_state(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FINAL ")]
    assert lines, f"no final state printed\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1].removeprefix("FINAL "))  # type: ignore[no-any-return]


def invocations(effects_db: str, tool: str) -> int:
    import sqlite3

    conn = sqlite3.connect(effects_db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM tool_invocations WHERE tool = ?", (tool,)).fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def reference(tmp_path: Path, subprocess_env: dict[str, str]) -> list[dict[str, Any]]:
    """The final state of an uninterrupted run, in a separate store and effects file."""
    env = dict(subprocess_env, SUPPORT_EFFECTS_DB=str(tmp_path / "reference-effects.db"))
    proc = drive(env, f"sqlite:///{tmp_path / 'reference.db'}", text=REQUEST, mode="astream")
    assert proc.returncode == 0, proc.stderr
    return final_state(proc)


# (fault point, expected charge_card invocations after the resume, tool calls the resume must replay)
CASES = [
    # The charge returned and was recorded; the node did not finish. Nothing may run twice.
    pytest.param("after_ledger_record:charge_card", 1, ["charge_card"], id="after-charge-recorded"),
    # The charge returned but was not recorded: the documented window. The call runs again with
    # the same idempotency key, so the provider deduplicates and the customer is charged once.
    pytest.param("after_tool:charge_card", 2, [], id="charge-returned-not-recorded"),
    # Between nodes: the model's tool request is checkpointed, no tool has started.
    pytest.param("after_checkpoint:model", 1, [], id="between-model-and-tools"),
    # Between nodes: the tool results are checkpointed; the resume must not re-enter the tool node.
    pytest.param("after_checkpoint:tools", 1, [], id="between-tools-and-model"),
]


@pytest.mark.parametrize("mode", ["invoke", "astream"])
@pytest.mark.parametrize(("fault", "charge_invocations", "replayed"), CASES)
def test_sigkill_at_fault_point_then_resume_charges_once(
    tmp_path: Path,
    subprocess_env: dict[str, str],
    reference: list[dict[str, Any]],
    fault: str,
    charge_invocations: int,
    replayed: list[str],
    mode: str,
) -> None:
    store = f"sqlite:///{tmp_path / 'agentrun.db'}"
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]

    crashed = drive(subprocess_env, store, text=REQUEST, mode=mode, fault=fault)
    assert crashed.returncode == -signal.SIGKILL, (
        f"the run was supposed to die by SIGKILL at {fault}\nstderr:\n{crashed.stderr}"
    )
    assert f"AGENTRUN-FAULT {fault.replace(':', ':', 1)}" in crashed.stderr

    resumed = drive(subprocess_env, store, text=None, mode=mode)
    assert resumed.returncode == 0, f"resume failed:\n{resumed.stderr}"

    counts = count_effects(effects)
    assert counts["charges"] == 1, f"GUARANTEE BROKEN: the card was charged {counts['charges']} times"
    assert counts["receipts"] == 1, f"GUARANTEE BROKEN: {counts['receipts']} receipts were sent"
    assert invocations(effects, "charge_card") == charge_invocations, (
        "charge_card ran an unexpected number of times; only the documented window may re-run it"
    )
    for tool_name in replayed:
        assert f"({tool_name}) from the ledger; not executed again" in resumed.stderr, (
            f"the resume did not log the replay of {tool_name}:\n{resumed.stderr}"
        )
    assert final_state(resumed) == reference, "the resumed run did not reach the state of an uninterrupted run"


def test_between_nodes_resume_reruns_no_tool(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """After the tool node's checkpoint, every tool ran exactly once across crash and resume."""
    store = f"sqlite:///{tmp_path / 'agentrun.db'}"
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    assert (
        drive(subprocess_env, store, text=REQUEST, mode="astream", fault="after_checkpoint:tools").returncode
        == -signal.SIGKILL
    )
    assert drive(subprocess_env, store, text=None, mode="astream").returncode == 0
    for tool_name in ("charge_card", "send_receipt"):
        assert invocations(effects, tool_name) == 1, f"{tool_name} ran again after its node was checkpointed"


def test_crash_before_record_of_every_tool_replays_the_recorded_ones(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Killed just before send_receipt is recorded: lookup and charge (recorded) replay, the receipt re-runs
    under the same idempotency key, and the mail provider still sends one receipt."""
    store = f"sqlite:///{tmp_path / 'agentrun.db'}"
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    env = dict(subprocess_env, SUPPORT_TOOL_DELAY="0")
    crashed = drive(env, store, text=REQUEST, mode="astream", fault="after_tool:send_receipt")
    assert crashed.returncode == -signal.SIGKILL
    resumed = drive(env, store, text=None, mode="astream")
    assert resumed.returncode == 0, resumed.stderr
    counts = count_effects(effects)
    assert counts["receipts"] == 1 and counts["charges"] == 1
    assert "retrying with the same idempotency key" in resumed.stderr


@pytest.mark.parametrize("fault", ["after_ledger_record:charge_card", "after_checkpoint:tools"])
def test_sigkill_mid_turn_then_the_same_request_again_resumes_and_charges_once(
    tmp_path: Path, subprocess_env: dict[str, str], reference: list[dict[str, Any]], fault: str
) -> None:
    """Like an AgentRun deleted and applied again after its pod died: the same request key and the same input.

    The second process resumes the request's turn instead of starting a new one, so
    the charge recorded before the kill replays and every tool body ran once in total.
    """
    store = f"sqlite:///{tmp_path / 'agentrun.db'}"
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    key = "default/support-4821/0123456789abcdef"
    crashed = drive(subprocess_env, store, text=REQUEST, mode="astream", fault=fault, request_key=key)
    assert crashed.returncode == -signal.SIGKILL, f"the run was supposed to die at {fault}\n{crashed.stderr}"
    again = drive(subprocess_env, store, text=REQUEST, mode="astream", request_key=key)
    assert again.returncode == 0, f"the same request sent again failed:\n{again.stderr}"
    for tool_name in ("charge_card", "send_receipt"):
        assert invocations(effects, tool_name) == 1, f"GUARANTEE BROKEN: {tool_name} ran again for the same request"
    if fault.startswith("after_ledger_record"):
        assert "(charge_card) from the ledger; not executed again" in again.stderr, again.stderr
    assert final_state(again) == reference, "the request sent again did not reach the state of one uninterrupted run"
    answered = drive(subprocess_env, store, text=REQUEST, mode="astream", request_key=key)
    assert answered.returncode == 0 and "already completed" in answered.stderr, answered.stderr
    assert invocations(effects, "charge_card") == 1, "a third send of a completed request charged again"
