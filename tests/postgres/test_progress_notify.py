"""Progress notifications (migration 10): a committed checkpoint NOTIFYs ``agentrun_progress`` with its thread id.

The operator listens instead of polling every run (``agentrun_operator/io/notify.py``); a missed or
extra notification would leave a status stale or cost a query, so both are checked here.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from agentrun import StaleStateError
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.messages import user
from tests.support.checkpointers import write

CHANNEL = "agentrun_progress"


async def _listen(dsn: str) -> tuple[asyncpg.Connection, asyncio.Queue[str]]:
    conn = await asyncpg.connect(dsn)
    queue: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener(CHANNEL, lambda _c, _pid, _ch, payload: queue.put_nowait(payload))
    return conn, queue


async def test_each_committed_checkpoint_notifies_its_thread_id_and_a_refused_one_does_not(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn)
    await cp.setup()
    conn, queue = await _listen(pg_dsn)
    try:
        await cp.aput("ns/thread-a", write((0, user("a")), count=1), expected_version=0)
        await cp.aput("ns/thread-a", write(count=1, step=1), expected_version=1)
        await cp.aput("ns/thread-b", write((0, user("b")), count=1), expected_version=0)
        got = [await asyncio.wait_for(queue.get(), 5) for _ in range(3)]
        assert got == ["ns/thread-a", "ns/thread-a", "ns/thread-b"], "a commit must notify its thread id, in order"
        with pytest.raises(StaleStateError):
            await cp.aput("ns/thread-a", write(count=1, step=9), expected_version=0)
        await asyncio.sleep(0.3)
        assert queue.empty(), "a write refused as stale committed nothing and must not wake the operator"
    finally:
        await conn.close()
        await cp.aclose()
