"""Loading a long thread reads its messages in the primary key's order: no sort, no temporary file.

What is protected (issue 34 item 3): the load of a 10,000-message thread (``PgCheckpointer.aget``) makes
the server write no temporary file. Left to its costs the planner may read a long thread's rows with a
bitmap or sequential scan and sort them, and that sort (about 4 MB of rows) spilled past the default
``work_mem`` to disk: 20 ms on the server instead of 6. The database here makes any sort spill
(``work_mem`` at its minimum), makes index scans look expensive, and refuses any temporary file
(``temp_file_limit``): a load that sorts fails, one that reads the index in order does not.
"""

from __future__ import annotations

import asyncpg
import pytest

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.messages import assistant, user
from tests.support.checkpointers import write

HISTORY = 10_000


async def test_a_long_threads_load_sorts_nothing(pg_dsn: str) -> None:
    store = PgCheckpointer(pg_dsn)
    await store.setup()
    history = [user(f"question {i} " + "x" * 150) if i % 2 == 0 else assistant(f"answer {i}") for i in range(HISTORY)]
    await store.aput(
        "long", write(*enumerate(history), count=HISTORY, status="completed", node=None), expected_version=0
    )
    await store.aclose()
    admin = await asyncpg.connect(pg_dsn)
    try:
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'ALTER DATABASE "{database}" SET work_mem = "64kB"')
        await admin.execute(f'ALTER DATABASE "{database}" SET random_page_cost = 1000')
        await admin.execute(f'ALTER DATABASE "{database}" SET temp_file_limit = "64kB"')
        # The control: the same query as planned without the load's setting sorts, and that sort fails here.
        probe = await asyncpg.connect(pg_dsn, server_settings={"search_path": store.schema})
        try:
            with pytest.raises(asyncpg.PostgresError, match="temp_file_limit"):
                await probe.fetch(
                    "SELECT message_id, body FROM messages WHERE thread_id = $1 AND idx < $2 ORDER BY idx",
                    "long",
                    HISTORY,
                )
        finally:
            await probe.close()
    finally:
        await admin.close()

    reader = PgCheckpointer(pg_dsn)
    try:
        checkpoint = await reader.aget("long")  # raises (temp_file_limit) if the load sorted
    finally:
        await reader.aclose()
    assert checkpoint is not None
    assert [m.id for m in checkpoint.messages] == [m.id for m in history]
    assert checkpoint.messages[-1].content == history[-1].content
