"""Throwaway test databases: what a killed test process left is dropped by the next process that creates one."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import asyncpg
import pytest

from agentrun_dev.databases import create_database, drop_database, postgres_dsn

pytestmark = pytest.mark.postgres

CREATE_AND_WAIT = """
import asyncio, sys
from agentrun_dev.databases import create_database
print(asyncio.run(create_database()).rsplit("/", 1)[1], flush=True)
sys.stdin.read()  # killed here: nothing drops its database
"""

CREATE_ONE = """
import asyncio
from agentrun_dev.databases import create_database, drop_database_later
drop_database_later(asyncio.run(create_database()))
"""


async def _names() -> set[str]:
    admin = await asyncpg.connect(postgres_dsn())
    try:
        return {row["datname"] for row in await admin.fetch("SELECT datname FROM pg_database")}
    finally:
        await admin.close()


def test_a_killed_processs_database_is_dropped_by_the_next_process_and_a_live_ones_is_kept() -> None:
    mine = asyncio.run(create_database())  # this process is alive: its database must stay
    try:
        with subprocess.Popen(
            [sys.executable, "-c", CREATE_AND_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        ) as killed:
            assert killed.stdout is not None
            orphan = killed.stdout.readline().decode().strip()
            assert orphan in asyncio.run(_names())
            killed.send_signal(signal.SIGKILL)
        # A new process's first database sweeps; its exit drains the drops it queued.
        subprocess.run([sys.executable, "-c", CREATE_ONE], check=True, timeout=60)
        names = asyncio.run(_names())
        assert orphan not in names
        assert mine.rsplit("/", 1)[1] in names
    finally:
        asyncio.run(drop_database(mine))
