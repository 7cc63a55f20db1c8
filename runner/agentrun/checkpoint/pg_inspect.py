"""What a run saw and said, read back for the run inspector (``agentrun.inspect``): SQL only, no policy.

Three reads beside ``pg_history``'s, each in one read-only snapshot and each bounded:

- the run's **graph structure** (``agentrun.structure``: the newest its turns recorded);
- the turn's **input** (``run_inputs.input`` of the run's newest attempt that has one) as a digest;
- the thread's **conversation**: its last ``CONVERSATION_LIMIT`` messages, each with its role, content,
  tool calls and answers as digests, and the version whose checkpoint appended it (the first state whose
  ``message_count`` passed its index);
- one **step** (a state version): the state as of that version and as of the one before, key by key as
  digests (a delta row holds only the keys its step changed: a key's value is that of the newest row of the
  version's chain, back to its snapshot, that holds it), and the messages the step appended (at most
  ``STEP_MESSAGES_LIMIT``).

As in ``pg_history``, PostgreSQL computes every digest and preview: a value is never sent whole, a
``\\u0000`` shows as that text, and a value's text is a string's own text, else its JSON.

HAZARDS
- Messages are updated in place (a replaced message keeps its index): a message shows its newest body, and
  the step that appended it, not the step that last replaced it.
- Messages belong to the thread, not to one AgentRun: a thread's earlier turns show too (their versions
  are before the run's first step).
- A LangGraph thread's state and messages live in LangGraph's own checkpoints (its serializer's bytes), not
  in these tables: its steps show no state here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .pg_history import _digest, _readable, _shown

if TYPE_CHECKING:
    from .pg_history import Connection

CONVERSATION_LIMIT = 200
GRAPH_BYTES = 256 * 1024  # a structure is bounded when written (agentrun.structure); a larger one is not shown
STEP_MESSAGES_LIMIT = 100


def _message_columns(body: str) -> str:
    """SQL: a message's role, name, tool call id, error flag, content digest and tool calls (digested args)."""
    return f"""
    {body} ->> 'role' AS role, {body} ->> 'name' AS name, {body} ->> 'tool_call_id' AS tool_call_id,
    COALESCE({body} -> 'is_error' = 'true'::jsonb, false) AS is_error,
    {_digest(_shown(body, "content"))} AS content,
    (SELECT jsonb_agg(jsonb_build_object('id', c -> 'id', 'name', c -> 'name',
            'arguments', {_digest(_shown("c", "arguments"))}::jsonb))
     FROM jsonb_array_elements(CASE jsonb_typeof({body} -> 'tool_calls') WHEN 'array' THEN {body} -> 'tool_calls' END) c
     WHERE jsonb_typeof(c) = 'object')::text AS tool_calls
    """


_INPUT = f"""
    SELECT attempt, {_digest(_shown(_readable("input::text"), ""))} AS input
    FROM run_inputs WHERE thread_id = $1 AND ($2::text IS NULL OR run_uid = $2) AND input IS NOT NULL
    ORDER BY attempt DESC LIMIT 1
"""
# The newest messages, oldest first.
_CONVERSATION = f"""
    SELECT * FROM (
        SELECT m.idx, m.version AS written_version, {_message_columns("b")}
        FROM messages m CROSS JOIN LATERAL (SELECT {_readable("m.body::text")} AS b OFFSET 0) p
        WHERE m.thread_id = $1 ORDER BY m.idx DESC LIMIT $2
    ) newest ORDER BY idx
"""
_COUNT = "SELECT count(*) FROM messages WHERE thread_id = $1"
# The checkpoints whose message count changed (one pass over the thread's states), from index $2 on: where each
# shown message was appended (the first whose count passed its index).
_APPENDED = """
    SELECT version, message_count FROM (
        SELECT version, message_count, lag(message_count) OVER (ORDER BY version) AS before
        FROM states WHERE thread_id = $1
    ) counted WHERE before IS DISTINCT FROM message_count AND message_count > $2 ORDER BY version
"""
# The run's newest recorded graph structure (``agentrun.structure``, on a turn's opening checkpoint), if small.
_GRAPH = f"""
    SELECT CASE WHEN octet_length(g::text) <= {GRAPH_BYTES} THEN g::text END AS graph
    FROM states s CROSS JOIN LATERAL (SELECT s.meta -> 'graph' AS g OFFSET 0) p
    WHERE s.thread_id = $1 AND ($2::text IS NULL OR s.run_uid IS NULL OR s.run_uid = $2) AND g IS NOT NULL
    ORDER BY s.version DESC LIMIT 1
"""
# The version asked ($2) and the one before: where each is, how many messages it had, its chain's snapshot.
_STEP_ROWS = """
    SELECT version, COALESCE(base_version, version) AS base, message_count, status, current_node, step, attempt,
           run_uid, extract(epoch FROM created_at)::float8 AS at
    FROM states WHERE thread_id = $1 AND version IN ($2 - 1, $2) ORDER BY version
"""
# Each key of the state as of version "at" (one of $2 - 1, $2): the newest row back to its snapshot holding it.
_STEP_STATE = f"""
    WITH targets AS (
        SELECT version AS at, COALESCE(base_version, version) AS base
        FROM states WHERE thread_id = $1 AND version IN ($2 - 1, $2)
    ), kv AS (
        SELECT t.at, k.key, k.value, s.version
        FROM targets t JOIN states s ON s.thread_id = $1 AND s.version BETWEEN t.base AND t.at
        CROSS JOIN LATERAL json_each(
            CASE WHEN s.base_version IS NULL THEN s.state_values ELSE s.state_delta END) k
        WHERE json_typeof(CASE WHEN s.base_version IS NULL THEN s.state_values ELSE s.state_delta END) = 'object'
    ), latest AS (
        SELECT DISTINCT ON (at, key) at, key, value FROM kv ORDER BY at, key, version DESC
    )
    SELECT at, key, {_digest(_shown(_readable("value::text"), ""))} AS value FROM latest ORDER BY at, key
"""
_STEP_MESSAGES = f"""
    SELECT m.idx, m.version AS written_version, {_message_columns("b")}
    FROM messages m CROSS JOIN LATERAL (SELECT {_readable("m.body::text")} AS b OFFSET 0) p
    WHERE m.thread_id = $1 AND m.idx >= $2 AND m.idx < $3 ORDER BY m.idx LIMIT $4
"""


async def input_txn(conn: Connection, thread_id: str, run_uid: str | None) -> dict[str, Any] | None:
    """The run's input (its newest attempt's that has one): {attempt, input: digest JSON text}, or None."""
    row = await conn.fetchrow(_INPUT, thread_id, run_uid)
    return dict(row) if row is not None else None


async def conversation_txn(conn: Connection, thread_id: str) -> tuple[list[dict[str, Any]], int]:
    """The thread's newest ``CONVERSATION_LIMIT`` messages, oldest first, and how many it holds in all."""
    rows = [dict(r) for r in await conn.fetch(_CONVERSATION, thread_id, CONVERSATION_LIMIT)]
    total = int(await conn.fetchval(_COUNT, thread_id) or 0)
    if rows:
        changed = await conn.fetch(_APPENDED, thread_id, rows[0]["idx"])
        counts = [(int(r["version"]), int(r["message_count"])) for r in changed]
        for row in rows:  # "at_version": the first checkpoint whose message count passed the index
            row["at_version"] = next((v for v, count in counts if count > row["idx"]), None)
    return rows, total


async def graph_txn(conn: Connection, thread_id: str, run_uid: str | None) -> str | None:
    """The run's newest recorded graph structure as JSON text, or None."""
    return await conn.fetchval(_GRAPH, thread_id, run_uid)  # type: ignore[no-any-return]


async def step_txn(conn: Connection, thread_id: str, version: int) -> dict[str, Any] | None:
    """Version ``version`` of the thread: its row and the one before (``rows``), the state of each by key
    (``state``: {version: {key: digest JSON text}}), the messages it appended (``messages``, bounded) and how
    many it appended (``appended``); None when the thread has no such version."""
    rows = {int(r["version"]): dict(r) for r in await conn.fetch(_STEP_ROWS, thread_id, version)}
    if version not in rows:
        return None
    state: dict[int, dict[str, str]] = {v: {} for v in rows}
    for r in await conn.fetch(_STEP_STATE, thread_id, version):
        state[int(r["at"])][str(r["key"])] = r["value"]
    before = int(rows[version - 1]["message_count"]) if version - 1 in rows else 0
    after = int(rows[version]["message_count"])
    messages = [dict(r) for r in await conn.fetch(_STEP_MESSAGES, thread_id, before, after, STEP_MESSAGES_LIMIT)]
    return {"rows": rows, "state": state, "messages": messages, "appended": max(0, after - before)}
