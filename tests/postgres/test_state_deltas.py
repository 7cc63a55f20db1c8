"""State rows that carry only what changed (migration 11): fewer bytes per step, the same state on every read.

What is protected: a large channel that a step did not change is not
written again (counted from the rows and bytes in ``states``), the state
read back after any number of delta rows, across snapshots, equals the
state written, a delta never lands on a chain it does not continue (another
writer, a deleted and re-created thread), a broken chain is refused rather
than read as a state that was never written, and a SIGKILL at any point of
a run whose rows are mostly deltas resumes to exactly the state of an
uninterrupted run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrun import StorageError
from agentrun.checkpoint.base import CheckpointWrite
from agentrun.checkpoint.postgres import PgCheckpointer
from tests.postgres.drive_deltas import BIG, STEPS, graph, summary

from .helpers import Driven, drive, fetch, fetchval, finish, spawn, wait_for_line

ROOT = Path(__file__).resolve().parents[2]


def state_write(values: dict[str, Any], changed: set[str] | None, step: int) -> CheckpointWrite:
    return CheckpointWrite(
        values=dict(values),
        current_node="n",
        step=step,
        status="running",
        meta={},
        message_count=0,
        changed=None if changed is None else frozenset(changed),
    )


async def row_sizes(dsn: str, thread_id: str) -> list[tuple[int, int | None, int]]:
    """(version, base_version, bytes of state written) of every state row, oldest first."""
    rows = await fetch(
        dsn,
        "SELECT version, base_version, octet_length(state_values::text) + "
        "COALESCE(octet_length(state_delta::text), 0) AS bytes FROM states WHERE thread_id = $1 ORDER BY version",
        thread_id,
    )
    return [(r["version"], r["base_version"], r["bytes"]) for r in rows]


async def test_a_large_unchanged_channel_is_not_rewritten_each_step(pg_dsn: str) -> None:
    checkpointer = PgCheckpointer(pg_dsn)
    try:
        values = await graph().compile(checkpointer).ainvoke({"n": 0}, {"thread_id": "big"})
    finally:
        await checkpointer.aclose()
    assert values["n"] == STEPS and values["big"] == BIG
    rows = await row_sizes(pg_dsn, "big")
    assert len(rows) == STEPS + 2  # the opening write, init, and one per step
    big_rows = [version for version, _, size in rows if size >= len(BIG)]
    total = sum(size for _, _, size in rows)
    # Without deltas every row after init would carry the ~100 KB channel: 41 x 100 KB.
    assert len(big_rows) == 1, f"the unchanged 100 KB channel was written again at versions {big_rows}"
    assert total < len(BIG) + 64 * len(rows), f"{total} bytes of state written over {len(rows)} rows"
    # Only a step's own channels: the delta of a plain step is {"n": k}, not the state.
    assert max(size for _, base, size in rows if base is not None) < 200


async def test_steps_kept_only_in_the_cache_reach_the_next_durable_delta(pg_dsn: str) -> None:
    """With durable_checkpoint_every_step false, the next durable write carries every channel changed since."""
    checkpointer = PgCheckpointer(pg_dsn)
    reader = PgCheckpointer(pg_dsn)
    try:
        app = graph().compile(checkpointer)
        config = {"thread_id": "lazy", "durable_checkpoint_every_step": False}
        values = await app.ainvoke({"n": 0}, config)
        checkpoint = await reader.aget("lazy")
    finally:
        await checkpointer.aclose()
        await reader.aclose()
    assert checkpoint is not None and checkpoint.status == "completed"
    assert checkpoint.values == values and values["n"] == STEPS and values["log"] == list(range(3, STEPS + 1, 3))


async def test_restore_after_many_delta_rows_across_snapshots_is_exact(pg_dsn: str) -> None:
    """A seeded random walk over three channels; after every write a fresh store reads exactly that state."""
    rng = random.Random(4821)
    writer = PgCheckpointer(pg_dsn, snapshot_every=5)
    reader = PgCheckpointer(pg_dsn)
    values: dict[str, Any] = {"big": "x" * 5000, "n": 0, "items": []}
    try:
        version = await writer.aput("t", state_write(values, None, 0), expected_version=0)
        for step in range(1, 120):
            changed: set[str] = set()
            if rng.random() < 0.7:
                values["n"] += 1
                changed.add("n")
            if rng.random() < 0.3:
                values["items"] = [*values["items"], step]
                changed.add("items")
            if rng.random() < 0.02:
                values["big"] = f"{step}" * 2000
                changed.add("big")
            if rng.random() < 0.05:
                values[f"new_{step}"] = {"added": step}  # a channel that appears late
                changed.add(f"new_{step}")
            version = await writer.aput("t", state_write(values, changed, step), expected_version=version)
            checkpoint = await reader.aget("t")
            assert checkpoint is not None and checkpoint.version == version
            assert checkpoint.values == values, f"version {version} read back differently"
            assert checkpoint.step == step
    finally:
        await writer.aclose()
        await reader.aclose()
    rows = await row_sizes(pg_dsn, "t")
    snapshots = [v for v, base, _ in rows if base is None]
    assert len(rows) - len(snapshots) > len(rows) // 2, "most rows should have been deltas"
    gaps = [b - a for a, b in zip(snapshots, [*snapshots[1:], rows[-1][0] + 1], strict=True)]
    assert max(gaps) <= 6, f"a chain ran past snapshot_every=5 deltas: snapshots at {snapshots}"


async def test_a_delta_never_lands_on_a_chain_it_does_not_continue(pg_dsn: str) -> None:
    """The thread was deleted and written again up to the same version: the old writer's delta is refused
    by the server ('rebase') and it writes its full state instead; nothing of the two states mixes."""
    a = PgCheckpointer(pg_dsn)
    b = PgCheckpointer(pg_dsn)
    try:
        mine = {"big": "a" * 3000, "n": 1}
        await a.aput("t", state_write(mine, None, 1), expected_version=0)
        mine["n"] = 2
        await a.aput("t", state_write(mine, {"n"}, 2), expected_version=1)
        await b.delete_thread("t")
        theirs = {"big": "b" * 3000, "n": 100, "other": True}
        await b.aput("t", state_write(theirs, None, 1), expected_version=0)
        theirs["n"] = 101
        await b.aput("t", state_write(theirs, {"n"}, 2), expected_version=1)
        mine["n"] = 3
        assert await a.aput("t", state_write(mine, {"n"}, 3), expected_version=2) == 3
        checkpoint = await b.aget("t")
        assert checkpoint is not None and checkpoint.values == mine, "a delta was applied onto another state"
        assert await fetchval(pg_dsn, "SELECT base_version FROM states WHERE thread_id = 't' AND version = 3") is None
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_broken_chain_is_refused_not_read_as_a_state(pg_dsn: str) -> None:
    checkpointer = PgCheckpointer(pg_dsn)
    try:
        values = {"big": "x" * 3000, "n": 0}
        version = await checkpointer.aput("t", state_write(values, None, 0), expected_version=0)
        for step in range(1, 4):
            values["n"] = step
            version = await checkpointer.aput("t", state_write(values, {"n"}, step), expected_version=version)
        await fetch(pg_dsn, "DELETE FROM states WHERE thread_id = 't' AND version = 2")
        with pytest.raises(StorageError, match="chain"):
            await checkpointer.aget("t")
    finally:
        await checkpointer.aclose()


# -- crashes -------------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def final(driven: Driven) -> dict[str, Any]:
    lines = [line for line in driven.stdout.splitlines() if line.startswith("FINAL ")]
    assert lines, str(driven)
    return json.loads(lines[-1].removeprefix("FINAL "))  # type: ignore[no-any-return]


REFERENCE = summary({"big": BIG, "n": STEPS, "log": list(range(3, STEPS + 1, 3))})


@pytest.mark.parametrize(
    "fault",
    [
        # Versions: 1 the opening write, 2 init (big arrives), then one per step: deltas, with a snapshot
        # every 9th row (snapshot_every=8 in the driver). Killed with the row inserted, not committed:
        "in_checkpoint_txn:5",  # a delta
        "in_checkpoint_txn:11",  # the snapshot that starts a new chain
        "in_checkpoint_txn:16",  # a delta of the second chain
        "after_checkpoint:step",  # just after the first delta committed
        "before_checkpoint:step",
    ],
)
async def test_a_sigkill_in_a_run_of_delta_rows_resumes_to_the_exact_state(pg_dsn: str, fault: str) -> None:
    cmd = [sys.executable, "-m", "tests.postgres.drive_deltas", pg_dsn, "t"]
    crashed = await drive(child_env(), cmd, fault=fault)
    assert crashed.returncode == -9, f"the fault point did not kill the process\n{crashed}"
    assert "AGENTRUN-FAULT" in crashed.stderr
    resumed = await drive(child_env(), cmd)
    assert resumed.returncode == 0, str(resumed)
    assert final(resumed) == REFERENCE, "the resumed run's state differs from an uninterrupted run's"
    versions = [r["version"] for r in await fetch(pg_dsn, "SELECT version FROM states ORDER BY version")]
    assert versions == list(range(1, len(versions) + 1))
    # And a reader that folds the stored rows gets the same state (not only the process that resumed).
    checkpointer = PgCheckpointer(pg_dsn)
    try:
        checkpoint = await checkpointer.aget("t")
    finally:
        await checkpointer.aclose()
    assert checkpoint is not None and summary(checkpoint.values) == REFERENCE


async def test_random_sigkills_in_a_run_of_delta_rows_resume_to_the_exact_state(pg_dsn: str) -> None:
    rng = random.Random(1729)
    cmd = [sys.executable, "-m", "tests.postgres.drive_deltas", pg_dsn, "r"]
    env = {**child_env(), "DELTAS_STEP_DELAY": "0.02"}
    for _ in range(3):
        process = await spawn(env, cmd)
        await wait_for_line(process, "READY")
        await asyncio.sleep(rng.uniform(0.05, 0.6))
        if process.returncode is None:
            process.kill()
        await finish(process)
    resumed = await drive(child_env(), cmd)
    assert resumed.returncode == 0, str(resumed)
    assert final(resumed) == REFERENCE
