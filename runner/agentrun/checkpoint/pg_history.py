"""What a thread recorded, read back for the run history (``agentrun.history``): SQL only, no policy.

One repeatable-read snapshot reads every table a run leaves behind (state
rows without their values, the messages that asked for and answered tool
calls, the ledger, intents, run inputs, the owner, the stop request), so the
history never mixes two moments of a running thread. Nothing here writes, and
nothing the runner writes changed for the history: every fact it shows is
one the runtime already records for its own guarantees.

HAZARDS
- A thread's rows are read whole, ledger results included: a run with many
  10 MB tool results costs that much memory per history request. The model
  (``agentrun.history``) keeps digests, sizes and a short preview only.
- Rows of other AgentRuns on the same thread (``run_uid``) are filtered out
  by the caller's ``run_uid``; rows written before run uids existed (NULL)
  are kept, as they cannot be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]

# $2: the AgentRun's uid (NULL: every row). The values and deltas are not read: the history needs the
# meta (interrupts, error, result, stop reason, tool counts) and the step's position, not the state.
_STATES = """
    SELECT version, current_node, step, status, attempt, run_uid, extract(epoch FROM created_at)::float8 AS at,
           meta -> 'interrupts' AS interrupts, meta -> 'error' AS error, meta -> 'result' AS result,
           meta -> 'stop_reason' AS stop_reason, meta -> 'tool_calls' AS tool_calls, meta -> 'resume' AS resume
    FROM states WHERE thread_id = $1 AND ($2::text IS NULL OR run_uid IS NULL OR run_uid = $2) ORDER BY version
"""
# Only the messages a tool call shows in: the assistant's requests and the tool answers.
_MESSAGES = """
    SELECT idx, message_id, body::text AS body, version FROM messages
    WHERE thread_id = $1 AND (body ->> 'role' = 'tool' OR json_array_length(body -> 'tool_calls') > 0)
    ORDER BY idx
"""
_LEDGER = """
    SELECT tool_call_id, tool_name, COALESCE(result_text, result::text) AS result, attempt, run_uid,
           extract(epoch FROM created_at)::float8 AS at
    FROM tool_executions WHERE thread_id = $1 AND ($2::text IS NULL OR run_uid IS NULL OR run_uid = $2)
"""
_INTENTS = """
    SELECT tool_call_id, tool_name, idempotency_key, attempt, run_uid, extract(epoch FROM started_at)::float8 AS at
    FROM tool_intents WHERE thread_id = $1 AND ($2::text IS NULL OR run_uid IS NULL OR run_uid = $2)
"""
_INPUTS = """
    SELECT attempt, resume::text AS resume, extract(epoch FROM created_at)::float8 AS at
    FROM run_inputs WHERE thread_id = $1 AND ($2::text IS NULL OR run_uid = $2) ORDER BY attempt
"""
# A deleted AgentRun's thread, by the request key the operator derived from it (decide/identity.py:
# "<namespace>/<name>/<digest of spec.input>"); a run with spec.requestId is not found this way.
_RUN_BY_REQUEST_KEY = """
    SELECT thread_id, run_uid FROM turns
    WHERE thread_id LIKE $1 ESCAPE '\\' AND request_key LIKE $2 ESCAPE '\\'
    ORDER BY updated_at DESC LIMIT 1
"""
_OWNER = "SELECT attempt, run_uid, extract(epoch FROM registered_at)::float8 AS at FROM attempts WHERE thread_id = $1"
_STOP = "SELECT reason, extract(epoch FROM requested_at)::float8 AS at FROM stop_requests WHERE thread_id = $1"


@dataclass(frozen=True)
class ThreadRows:
    """A thread's recorded rows, as plain dicts (JSON columns still text where noted)."""

    states: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # body: JSON text
    ledger: list[dict[str, Any]] = field(default_factory=list)  # result: the stored envelope text
    intents: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # resume: JSON text or None
    owner: dict[str, Any] | None = None
    stop: dict[str, Any] | None = None

    @property
    def empty(self) -> bool:
        """Whether the store holds nothing of the thread (no state, ledger row, intent or run input)."""
        return not self.states and not self.ledger and not self.intents and not self.inputs


async def thread_rows_txn(conn: Connection, thread_id: str, run_uid: str | None) -> ThreadRows:
    """Every row of ``thread_id`` the history shows; run it inside one read-only snapshot."""

    async def rows(sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in await conn.fetch(sql, *args)]

    owner = await conn.fetchrow(_OWNER, thread_id)
    stop = await conn.fetchrow(_STOP, thread_id)
    return ThreadRows(
        states=await rows(_STATES, thread_id, run_uid),
        messages=await rows(_MESSAGES, thread_id),
        ledger=await rows(_LEDGER, thread_id, run_uid),
        intents=await rows(_INTENTS, thread_id, run_uid),
        inputs=await rows(_INPUTS, thread_id, run_uid),
        owner=dict(owner) if owner is not None else None,
        stop=dict(stop) if stop is not None else None,
    )


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


async def find_run_txn(conn: Connection, namespace: str, name: str) -> tuple[str, str | None] | None:
    """(thread id, run uid) of the latest turn AgentRun ``namespace/name`` recorded, or None."""
    row = await conn.fetchrow(_RUN_BY_REQUEST_KEY, _like_prefix(f"{namespace}/"), _like_prefix(f"{namespace}/{name}/"))
    return (str(row["thread_id"]), row["run_uid"]) if row is not None else None
