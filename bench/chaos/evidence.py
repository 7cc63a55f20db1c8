"""What a trial leaves behind, read back after it: the store's rows, the raw executions, the AgentRun.

Everything the verdict needs is gathered here into plain data (``Evidence``), so the
verdict itself (``verdict.py``) is pure and a failed trial's evidence can be saved
as JSON and judged again.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, TypedDict

import asyncpg

SCHEMA = "agentrun"

_STATES = """
SELECT version, current_node, step, status, attempt, extract(epoch FROM created_at)::float8 AS at
FROM states WHERE thread_id = $1 ORDER BY version
"""
_MESSAGES = "SELECT idx, body::text AS body FROM messages WHERE thread_id = $1 ORDER BY idx"
_LEDGER = """
SELECT tool_call_id, tool_name, result_text, attempt, extract(epoch FROM created_at)::float8 AS at
FROM tool_executions WHERE thread_id = $1 ORDER BY created_at, tool_call_id
"""
_INTENTS = """
SELECT tool_call_id, tool_name, attempt, extract(epoch FROM started_at)::float8 AS at
FROM tool_intents WHERE thread_id = $1 ORDER BY started_at, tool_call_id
"""


class StateRow(TypedDict):
    version: int
    current_node: str
    step: int
    status: str
    attempt: int | None
    at: float


class LedgerRow(TypedDict):
    tool_call_id: str
    tool_name: str
    result_text: str | None
    attempt: int | None
    at: float


class IntentRow(TypedDict):
    tool_call_id: str
    tool_name: str
    attempt: int | None
    at: float


class ThreadRows(TypedDict):
    thread_id: str
    states: list[StateRow]
    messages: list[dict[str, Any]]
    ledger: list[LedgerRow]
    intents: list[IntentRow]


async def _read(dsn: str, thread_id: str) -> ThreadRows:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA}, timeout=5)
    try:
        states = [StateRow(**dict(r)) for r in await conn.fetch(_STATES, thread_id)]  # type: ignore[typeddict-item]
        messages = [json.loads(r["body"]) for r in await conn.fetch(_MESSAGES, thread_id)]
        ledger = [LedgerRow(**dict(r)) for r in await conn.fetch(_LEDGER, thread_id)]  # type: ignore[typeddict-item]
        intents = [IntentRow(**dict(r)) for r in await conn.fetch(_INTENTS, thread_id)]  # type: ignore[typeddict-item]
    finally:
        await conn.close()
    return ThreadRows(thread_id=thread_id, states=states, messages=messages, ledger=ledger, intents=intents)


def thread_rows(dsn: str, thread_id: str, *, timeout: float = 60) -> ThreadRows:
    """The thread's rows; retried while the store restarts (another trial's fault)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return asyncio.run(_read(dsn, thread_id))
        except Exception:  # any store failure while it restarts (asyncpg's InternalClientError too): retry
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


async def _newest_attempt(dsn: str, thread_id: str) -> int:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA}, timeout=5)
    try:
        value = await conn.fetchval("SELECT max(attempt) FROM states WHERE thread_id = $1", thread_id)
        return int(value or 0)
    finally:
        await conn.close()


def newest_written_attempt(dsn: str, thread_id: str) -> int:
    """The newest attempt that committed a state row on the thread (0 when none or unreadable now)."""
    try:
        return asyncio.run(_newest_attempt(dsn, thread_id))
    except Exception:  # unreadable now (a restart): ask again later
        return 0


def read_effects(path: Path) -> list[dict[str, Any]]:
    """The tool lines (``bench.chaos.graph``); a line cut by a kill (never seen: one write) is skipped."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return lines


class Evidence(TypedDict):
    seed: int
    plan: dict[str, Any]
    injected: list[dict[str, Any]]
    trial: ThreadRows
    baseline: ThreadRows
    trial_status: dict[str, Any]
    baseline_status: dict[str, Any]
    effects: list[dict[str, Any]]
    overlaps: list[list[str]]
    zombies: list[dict[str, Any]]
    fault_point_fired: bool
    seconds: float
    errors: list[str]
