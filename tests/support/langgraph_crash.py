"""The LangGraph crash scenario, driven in child processes (``tests.support.drive_langgraph``) and counted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("lookup_order", "charge_card", "send_receipt")
FINAL_ANSWER = "done: order 4821: 49.99 EUR | charged 4999 cents for order 4821 | receipt for 4821 sent"


def drive(
    env: dict[str, str],
    saver: str,
    store: str,
    thread_id: str,
    *,
    text: str | None,
    mode: str,
    fault: str | None,
    extra: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    child_env = dict(env)
    if fault:
        child_env["AGENTRUN_FAULT_POINT"] = fault
    cmd = [sys.executable, "-m", "tests.support.drive_langgraph", saver, store, thread_id, "--mode", mode, *extra]
    if text is not None:
        cmd += ["--input", text]
    return subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=90, cwd=ROOT)


def crash_then_resume(
    env: dict[str, str],
    effects: Path,
    saver: str,
    store: str,
    thread_id: str,
    *,
    mode: str,
    fault: str,
    extra: Sequence[str] = (),
) -> tuple[Counter[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """SIGKILL at ``fault``, resume in a new process; executions per tool, the effect lines, the final messages.

    ``extra``: more arguments of ``tests.support.drive_langgraph`` for both processes.
    """
    env = dict(env, LG_EFFECTS_FILE=str(effects))
    crashed = drive(env, saver, store, thread_id, text="charge order 4821", mode=mode, fault=fault, extra=extra)
    assert crashed.returncode == -signal.SIGKILL, f"the run was supposed to die at {fault}:\n{crashed.stderr[-3000:]}"
    resumed = drive(env, saver, store, thread_id, text=None, mode=mode, fault=None, extra=extra)
    assert resumed.returncode == 0, f"the resume failed:\n{resumed.stderr[-3000:]}"
    lines = [json.loads(line) for line in effects.read_text().splitlines()]
    final = json.loads(next(line for line in resumed.stdout.splitlines() if line.startswith("FINAL "))[6:])
    return Counter(line["tool"] for line in lines), lines, final
