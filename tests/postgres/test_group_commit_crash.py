"""Group commit under SIGKILL: the runner (``python -m agentrun.runner``) on PostgreSQL, killed for real.

The graph (``tests.postgres.parallel_tools``) asks for three parallel charges in one
message; each charge appends to an fsynced effects file, so the test counts what
every process did. Guarantees:

- a call that finished more than the group-commit window before the crash is
  recorded, even while a sibling still runs: the resumed attempt replays it from
  the ledger and does not charge again (only the call that was still running,
  started but unrecorded, runs again, with the same idempotency key);
- a crash right after a batch's commit loses nothing: on resume every call of the
  batch is replayed, each charged exactly once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

from .helpers import fetch
from .parallel_tools import TOOLS, charges, effects

THREAD = "default/group-crash"
# How long after the fast charges returned the test kills the process: far beyond the 2 ms window plus
# a commit on a busy machine, and far below the slow charge's time (it would then have finished).
KILL_AFTER = 0.5
SLOW_SECONDS = "60"


def pod_env(subprocess_env: dict[str, str], dsn: str, effects_file: Path, **extra: str) -> dict[str, str]:
    return dict(
        subprocess_env,
        AGENTRUN_GRAPH="tests.postgres.parallel_tools:app",
        AGENTRUN_THREAD_ID=THREAD,
        AGENTRUN_RUN_NAME="group-crash",
        AGENTRUN_RUN_UID="uid-1",
        AGENTRUN_ATTEMPT="1",
        AGENTRUN_INPUT=json.dumps({"messages": [{"role": "user", "content": "charge all three"}]}),
        AGENTRUN_POSTGRES_DSN=dsn,
        AGENTRUN_METRICS_PORT="0",
        AGENTRUN_TERMINATION_LOG=str(effects_file.parent / "termination-log"),
        GROUP_EFFECTS=str(effects_file),
        **extra,
    )


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "agentrun.runner"], env=env, cwd=ROOT, stdout=out, stderr=out)


def charged_at(path: str, name: str) -> float | None:
    times = [float(w[-1]) for w in effects(path) if w[:2] == ["charged", name]]
    return max(times) if times else None


async def recorded(dsn: str) -> set[str]:
    return {
        r["tool_name"] for r in await fetch(dsn, "SELECT tool_name FROM tool_executions WHERE thread_id = $1", THREAD)
    }


def resume(env: dict[str, str], log: Path) -> str:
    """Attempt 2, as a rescheduled pod: it must complete; returns its log."""
    process = start({**env, "AGENTRUN_ATTEMPT": "2", "GROUP_SLOW_SECONDS": "0"}, log)
    assert process.wait(timeout=60) == 0, f"the resumed attempt failed:\n{log.read_text()}"
    return log.read_text()


async def test_a_sigkill_while_a_slow_sibling_runs_keeps_the_finished_calls_and_they_never_charge_again(
    pg_dsn: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    effects_file = tmp_path / "effects.log"
    env = pod_env(subprocess_env, pg_dsn, effects_file, GROUP_SLOW_SECONDS=SLOW_SECONDS)
    process = start(env, tmp_path / "attempt-1.log")
    try:
        deadline = time.monotonic() + 60
        while (
            charged_at(str(effects_file), "charge_a") is None
            or charged_at(str(effects_file), "charge_b") is None
            or not any(w[:2] == ["start", "charge_slow"] for w in effects(str(effects_file)))
        ):
            assert process.poll() is None, f"the runner ended early:\n{(tmp_path / 'attempt-1.log').read_text()}"
            assert time.monotonic() < deadline, "the fast charges never returned"
            await asyncio.sleep(0.01)
        fast_done = max(charged_at(str(effects_file), n) or 0.0 for n in ("charge_a", "charge_b"))
        await asyncio.sleep(max(0.0, fast_done + KILL_AFTER - time.time()))
        assert process.poll() is None, "the slow charge must still be running when the process is killed"
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    at_kill = await recorded(pg_dsn)
    assert at_kill == {"charge_a", "charge_b"}, (
        f"GUARANTEE BROKEN: calls that finished {KILL_AFTER}s before the crash (window 2 ms) were lost; "
        f"the ledger held {sorted(at_kill)}"
    )

    log = resume(env, tmp_path / "attempt-2.log")
    path = str(effects_file)
    assert (charges(path, "charge_a"), charges(path, "charge_b")) == (1, 1), (
        f"GUARANTEE BROKEN: a recorded call ran again after the crash: {effects(path)}"
    )
    # The documented window: started, not recorded when the process died; retried with the same key.
    slow = [w for w in effects(path) if w[:2] == ["charged", "charge_slow"]]
    starts = [w for w in effects(path) if w[:2] == ["start", "charge_slow"]]
    assert len(starts) == 2 and len(slow) == 1, f"the slow charge must start twice and charge once: {effects(path)}"
    for name in ("charge_a", "charge_b"):
        assert f"({name}) from the ledger; not executed again" in log, (
            f"{name} was not replayed from the ledger on resume:\n{log}"
        )
    assert await recorded(pg_dsn) == set(TOOLS)


async def test_a_sigkill_right_after_a_batch_commit_charges_each_call_once(
    pg_dsn: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    effects_file = tmp_path / "effects.log"
    # A 1 s window makes the three one batch however the machine schedules their intent records.
    dsn = pg_dsn + "?agentrun_ledger_window_ms=1000"
    env = pod_env(subprocess_env, dsn, effects_file)
    log1 = tmp_path / "attempt-1.log"
    process = start({**env, "AGENTRUN_FAULT_POINT": "after_ledger_group_commit:3"}, log1)
    assert process.wait(timeout=60) == -signal.SIGKILL, f"the runner was to die at the fault point:\n{log1.read_text()}"
    assert "AGENTRUN-FAULT after_ledger_group_commit:3" in log1.read_text()
    path = str(effects_file)
    assert [charges(path, n) for n in TOOLS] == [1, 1, 1]
    rows = await fetch(pg_dsn, "SELECT xmin::text AS x, tool_name FROM tool_executions WHERE thread_id = $1", THREAD)
    assert {r["tool_name"] for r in rows} == set(TOOLS) and len({r["x"] for r in rows}) == 1, (
        f"the three results must have been committed by one transaction before the kill: {rows}"
    )

    log = resume(env, tmp_path / "attempt-2.log")
    assert [charges(path, n) for n in TOOLS] == [1, 1, 1], (
        f"GUARANTEE BROKEN: a call of a committed batch charged again after the crash: {effects(path)}"
    )
    for name in TOOLS:
        assert f"({name}) from the ledger; not executed again" in log, f"{name} was not replayed:\n{log}"
