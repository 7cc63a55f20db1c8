"""Child processes of the PostgreSQL tier that are not graph runs.

python -m tests.postgres.workers race DSN THREAD_ID NAME WRITES START_AT
    Load the thread, write one message on top, repeat until WRITES commits;
    start at the wall-clock time START_AT so two racers overlap. Prints one
    JSON line: {"committed": [[version, content], ...], "conflicts": [[expected, actual], ...]}.

python -m tests.postgres.workers migrate DSN
    Run the schema setup and print {"applied": [versions this process applied]}.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import asyncpg

from agentrun import StaleStateError
from agentrun.checkpoint.base import CheckpointWrite
from agentrun.checkpoint.pg_schema import MIGRATIONS, apply_migrations
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.messages import user


async def race(dsn: str, thread_id: str, name: str, writes: int, start_at: float) -> None:
    cp = PgCheckpointer(dsn)
    await cp.setup()
    committed: list[tuple[int, str]] = []
    conflicts: list[tuple[int, int]] = []
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        seq = 0
        while len(committed) < writes:
            current = await cp.aget(thread_id)
            version = current.version if current else 0
            count = len(current.messages) if current else 0
            content = f"{name}-{seq}"
            seq += 1
            # A short pause between read and write widens the window in which the other racer commits.
            await asyncio.sleep(random.random() * 0.002)
            write = CheckpointWrite(
                values={"writer": name},
                current_node="model",
                step=version,
                status="running",
                meta={"writer": name, "content": content},
                message_count=count + 1,
                messages=[(count, user(content))],
            )
            try:
                committed.append((await cp.aput(thread_id, write, expected_version=version), content))
            except StaleStateError as e:
                conflicts.append((e.expected, e.actual))
    finally:
        await cp.aclose()
    print(json.dumps({"committed": committed, "conflicts": conflicts}), flush=True)


async def migrate(dsn: str) -> None:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": "agentrun"})
    try:
        print("MIGRATING", flush=True)
        applied = await apply_migrations(conn, MIGRATIONS, schema="agentrun")
    finally:
        await conn.close()
    print(json.dumps({"applied": applied}), flush=True)


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "race":
        dsn, thread_id, name, writes, start_at = args
        asyncio.run(race(dsn, thread_id, name, int(writes), float(start_at)))
    elif command == "migrate":
        asyncio.run(migrate(args[0]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
