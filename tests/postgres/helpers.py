"""Helpers of the PostgreSQL tier: driving the support example in child processes and reading the store."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

REQUEST = "charge my saved card for order 4821 and email me the receipt"
SIDE_EFFECT_TOOLS = ("charge_card", "send_receipt")


async def fetch(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on a connection of its own (a reader outside the checkpointer)."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": "agentrun"})
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def fetchval(dsn: str, query: str, *args: Any) -> Any:
    rows = await fetch(dsn, query, *args)
    return rows[0][0] if rows else None


def invocations(effects_db: str, tool: str) -> int:
    """How often a side-effect tool body ran (the example logs every invocation)."""
    conn = sqlite3.connect(effects_db)
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tool_invocations (id INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT NOT NULL, "
            "order_id TEXT, idempotency_key TEXT, at REAL NOT NULL)"
        )
        return int(conn.execute("SELECT COUNT(*) FROM tool_invocations WHERE tool = ?", (tool,)).fetchone()[0])
    finally:
        conn.close()


@dataclass
class Driven:
    """A finished child process of ``tests.postgres.drive_pg``."""

    returncode: int
    stdout: str
    stderr: str

    def final(self) -> list[dict[str, Any]]:
        lines = [line for line in self.stdout.splitlines() if line.startswith("FINAL ")]
        assert lines, f"no final state printed (exit {self.returncode})\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return json.loads(lines[-1].removeprefix("FINAL "))  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def driver_args(
    dsn: str,
    thread_id: str,
    *,
    text: str | None = None,
    auto: str | None = None,
    attempt: int | None = None,
    run_uid: str | None = None,
    redis: str | None = None,
    redis_prefix: str | None = None,
    freeze_before: int | None = None,
    request_key: str | None = None,
) -> list[str]:
    cmd = [sys.executable, "-m", "tests.postgres.drive_pg", dsn, thread_id]
    if text is not None:
        cmd += ["--input", text]
    if auto is not None:
        cmd += ["--auto", auto]
    if attempt is not None:
        cmd += ["--attempt", str(attempt)]
    if run_uid is not None:
        cmd += ["--run-uid", run_uid]
    if redis is not None:
        cmd += ["--redis", redis]
    if redis_prefix is not None:
        cmd += ["--redis-prefix", redis_prefix]
    if freeze_before is not None:
        cmd += ["--stop-self-before-version", str(freeze_before)]
    if request_key is not None:
        cmd += ["--request-key", request_key]
    return cmd


async def spawn(env: dict[str, str], cmd: Sequence[str], *, fault: str | None = None) -> asyncio.subprocess.Process:
    child_env = dict(env)
    if fault:
        child_env["AGENTRUN_FAULT_POINT"] = fault
    return await asyncio.create_subprocess_exec(
        *cmd, env=child_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def finish(process: asyncio.subprocess.Process, *, within: float = 60) -> Driven:
    stdout, stderr = await asyncio.wait_for(process.communicate(), within)
    assert process.returncode is not None
    return Driven(process.returncode, stdout.decode(), stderr.decode())


async def drive(env: dict[str, str], cmd: Sequence[str], *, fault: str | None = None, within: float = 60) -> Driven:
    return await finish(await spawn(env, cmd, fault=fault), within=within)


async def wait_for_line(process: asyncio.subprocess.Process, prefix: str, *, within: float = 30) -> list[str]:
    """Read stdout until a line starting with ``prefix``; returns the lines read (the rest stays buffered)."""
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + within
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {prefix!r} line within {within}s; got {seen}"
        raw = await asyncio.wait_for(process.stdout.readline(), remaining)
        assert raw, f"the process ended before printing {prefix!r}; got {seen}"
        line = raw.decode().rstrip("\n")
        seen.append(line)
        if line.startswith(prefix):
            return seen


async def server_done_with_the_dead(dsn: str) -> None:
    """Wait until PostgreSQL has no session on ``dsn``'s database but this one: a SIGKILLed child's statement
    that was on the wire when it died still runs to its commit on the server (autocommitted). Read what the
    kill left before that and the record (or checkpoint) may land after the read; the resume then sees more
    than the test did."""
    conn = await asyncpg.connect(dsn)
    try:
        for _ in range(600):
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if others == 0:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the killed child's sessions outlived it on the server for 30 s")
    finally:
        await conn.close()


async def wait_until(predicate: Any, *, within: float = 20, what: str = "condition") -> None:
    """Poll an async predicate every 20 ms."""
    deadline = time.monotonic() + within
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(0.02)


async def until_redis_delivers(url: str, channel: str, *, pattern: bool = False) -> None:
    """Until a message on ``channel`` would reach a subscriber: a fixed sleep was not enough on a loaded CI
    machine (stop 41: the run's stop subscription came after 1 s, and the stop published before it was lost).

    A channel subscription is counted by ``PUBSUB NUMSUB``; a pattern's only by the receivers of a
    ``PUBLISH``, so ``pattern`` publishes an empty message on ``channel`` (choose one nobody acts on).
    """
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:

        async def delivered() -> bool:
            if pattern:
                return bool(await client.publish(channel, ""))
            return bool(dict(await client.pubsub_numsub(channel)).get(channel.encode()))

        await wait_until(delivered, what=f"a Redis subscriber of {channel}")
    finally:
        await client.aclose()


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process (``T`` when stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


async def wait_until_stopped(pid: int, *, within: float = 20) -> None:
    """Wait until the process is stopped by SIGSTOP (its own or ours)."""

    async def stopped() -> bool:
        return process_state(pid) == "T"

    await wait_until(stopped, within=within, what=f"process {pid} to stop")
