"""Fencing with real processes: a frozen attempt that thaws after its successor finished writes nothing.

Attempt 1 is frozen with SIGSTOP (as a node partition or a stalled VM would
freeze a pod the operator presumed dead), attempt 2 registers and runs the
thread to the end, then attempt 1 gets SIGCONT. Its next write must be
refused with ``FencedError`` and the store must look exactly as attempt 2
left it.

The documented limit: a tool call attempt 1 had already started finishes
when it thaws (fencing refuses writes, it cannot recall a call in flight);
the payment provider deduplicates it by the idempotency key, so the
customer is still charged once.
"""

from __future__ import annotations

import signal
from typing import Any

from examples.support_agent import count_effects

from .helpers import (
    REQUEST,
    drive,
    driver_args,
    fetch,
    fetchval,
    finish,
    invocations,
    spawn,
    wait_until,
    wait_until_stopped,
)

EXIT_FENCED = 7


async def store_snapshot(dsn: str) -> dict[str, Any]:
    return {
        "states": [
            tuple(r)
            for r in await fetch(dsn, "SELECT version, attempt, status, message_count FROM states ORDER BY version")
        ],
        "messages": [tuple(r) for r in await fetch(dsn, "SELECT idx, body::text, version FROM messages ORDER BY idx")],
        "ledger": [
            tuple(r)
            for r in await fetch(
                dsn, "SELECT tool_call_id, attempt, result::text, created_at FROM tool_executions ORDER BY tool_call_id"
            )
        ],
        "intents": [
            tuple(r)
            for r in await fetch(
                dsn, "SELECT tool_call_id, attempt, started_at FROM tool_intents ORDER BY tool_call_id"
            )
        ],
    }


async def writes_of_attempt_1_after_attempt_2_registered(dsn: str) -> int:
    return int(
        await fetchval(
            dsn,
            """SELECT (SELECT count(*) FROM states WHERE attempt = 1 AND created_at > r.at)
                + (SELECT count(*) FROM tool_executions WHERE attempt = 1 AND created_at > r.at)
                + (SELECT count(*) FROM tool_intents WHERE attempt = 1 AND started_at > r.at)
           FROM (SELECT registered_at AS at FROM attempts WHERE attempt = 2) r""",
        )
    )


async def test_attempt_frozen_mid_tool_cannot_record_anything_after_its_successor_finished(
    pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    first = await spawn(dict(subprocess_env, SUPPORT_TOOL_DELAY="2"), driver_args(pg_dsn, "t", text=REQUEST, attempt=1))

    async def tools_in_flight() -> bool:
        # Both side-effect calls started (intents) and lookup_order's record committed: attempt 1 now
        # holds no transaction, only two tool calls sleeping before their side effects.
        if not await fetchval(pg_dsn, "SELECT to_regclass('agentrun.tool_intents') IS NOT NULL"):
            return False
        intents = await fetchval(pg_dsn, "SELECT count(*) FROM tool_intents")
        ledger = await fetchval(pg_dsn, "SELECT count(*) FROM tool_executions")
        return bool(intents == 2 and ledger == 1)

    try:
        await wait_until(tools_in_flight, what="attempt 1 to start its side-effect tools")
        first.send_signal(signal.SIGSTOP)
        await wait_until_stopped(first.pid)

        second = await drive(subprocess_env, driver_args(pg_dsn, "t", attempt=2))
        assert second.returncode == 0, f"attempt 2 could not finish while attempt 1 was frozen\n{second}"
        settled = await store_snapshot(pg_dsn)
        assert count_effects(effects)["charges"] == 1

        first.send_signal(signal.SIGCONT)
        thawed = await finish(first)
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert thawed.returncode == EXIT_FENCED, f"attempt 1 must stop with FencedError when it thaws\n{thawed}"
    assert "STORAGE_FENCED_001" in thawed.stderr
    assert await store_snapshot(pg_dsn) == settled, "GUARANTEE BROKEN: the fenced attempt changed the store"
    assert await writes_of_attempt_1_after_attempt_2_registered(pg_dsn) == 0
    counts = count_effects(effects)
    assert (counts["charges"], counts["receipts"]) == (1, 1), f"the customer was charged or mailed twice: {counts}"
    # The documented limit: each call attempt 1 had in flight ran its body once more when it thawed
    # (deduplicated above by the idempotency key); attempt 1 started no new call.
    assert (invocations(effects, "charge_card"), invocations(effects, "send_receipt")) == (2, 2)


async def test_attempt_frozen_before_its_checkpoint_cannot_write_state_after_its_successor_finished(
    pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    # Version 3 is the checkpoint after the tool node: attempt 1 freezes with every tool recorded.
    first = await spawn(subprocess_env, driver_args(pg_dsn, "t", text=REQUEST, attempt=1, freeze_before=3))
    try:
        await wait_until_stopped(first.pid)
        second = await drive(subprocess_env, driver_args(pg_dsn, "t", attempt=2))
        assert second.returncode == 0, str(second)
        assert "from the ledger; not executed again" in second.stderr, "attempt 2 must replay attempt 1's tools"
        settled = await store_snapshot(pg_dsn)
        first.send_signal(signal.SIGCONT)
        thawed = await finish(first)
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert thawed.returncode == EXIT_FENCED, f"attempt 1's checkpoint must be refused with FencedError\n{thawed}"
    assert await store_snapshot(pg_dsn) == settled, "GUARANTEE BROKEN: the fenced attempt changed the store"
    assert await writes_of_attempt_1_after_attempt_2_registered(pg_dsn) == 0
    assert settled["states"][-1][1:3] == (2, "completed")
    for tool in ("charge_card", "send_receipt"):
        assert invocations(effects, tool) == 1, f"{tool} ran twice across the two attempts"


async def test_a_new_agentrun_on_a_used_thread_runs_and_the_old_runs_zombie_and_restart_are_fenced(
    pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    """A thread outlives its AgentRuns: run B's attempt 1 starts the next turn after run A's attempt 2.

    Run A's attempt 1 is frozen before its post-tools checkpoint, A's attempt 2
    finishes the turn, then run B (a new AgentRun, its attempt numbers start
    at 1 again) runs the next turn. When A's attempt 1 thaws, and when a pod
    of A starts again, both are fenced off: B owns the thread.
    """
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    zombie = await spawn(
        subprocess_env, driver_args(pg_dsn, "t", text=REQUEST, attempt=1, run_uid="uid-a", freeze_before=3)
    )
    try:
        await wait_until_stopped(zombie.pid)
        a2 = await drive(subprocess_env, driver_args(pg_dsn, "t", attempt=2, run_uid="uid-a"))
        assert a2.returncode == 0, str(a2)
        b1 = await drive(
            subprocess_env, driver_args(pg_dsn, "t", text="please refund order 4821", attempt=1, run_uid="uid-b")
        )
        assert b1.returncode == 0, f"a new AgentRun on a thread that already ran must start, not be fenced\n{b1}"
        settled = await store_snapshot(pg_dsn)
        zombie.send_signal(signal.SIGCONT)
        thawed = await finish(zombie)
    finally:
        if zombie.returncode is None:
            zombie.kill()
            await zombie.wait()
    assert thawed.returncode == EXIT_FENCED, f"run A's zombie must be fenced off by run B\n{thawed}"
    assert "uid-b" in thawed.stderr, "the fenced run must be told which run owns the thread"
    restarted = await drive(subprocess_env, driver_args(pg_dsn, "t", attempt=3, run_uid="uid-a"))
    assert restarted.returncode == EXIT_FENCED, f"a superseded run must not take the thread back\n{restarted}"
    assert await store_snapshot(pg_dsn) == settled, "GUARANTEE BROKEN: a fenced run changed the store"
    owner = await fetch(pg_dsn, "SELECT run_uid, attempt FROM attempts")
    assert [tuple(r) for r in owner] == [("uid-b", 1)]
    counts = count_effects(effects)
    assert (counts["charges"], counts["receipts"], counts["refunds"]) == (1, 1, 1), counts
