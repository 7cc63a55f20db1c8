"""What a thread recorded, read back for the run history (``agentrun.history``): SQL only, no policy.

One repeatable-read snapshot reads every table a run leaves behind (state
rows without their values, the messages that asked for and answered tool
calls, the ledger, intents, run inputs, the owner, the stop request), so the
history never mixes two moments of a running thread. Nothing here writes, and
nothing the runner writes changed for the history: every fact it shows is
one the runtime already records for its own guarantees.

Values are never fetched whole: PostgreSQL computes each shown value's
digest (SHA-256 and size of its text) and cuts its preview (``PREVIEW_CHARS``),
so a history request costs the server kilobytes however large the results
(a 10 MB result used to be fetched twice, from the ledger and from its answer
message, on every request). The text of a value is a string's own text, else
its JSON; a ledger record's digest is of the envelope exactly as stored.

Anything a graph, a tool or a model wrote is readable: the ``json`` columns
accept ``\\u0000`` but PostgreSQL cannot turn it into text, so any JSON
operator on such a value fails (``UntranslatableCharacterError``). Each
JSON value is read through ``_readable``: a ``\\u0000`` escape becomes an
escaped backslash, so the value shows the six characters ``\\u0000`` where the
NUL was (and digests and sizes of such a text are of that shown form).

A row PostgreSQL still cannot read (a damaged ledger row that is not JSON, a
number beyond ``numeric``) does not hide the others: the read then runs again
in ``careful`` mode, each table behind a savepoint and, for a table that
fails, row by row; the rows that fail come back with their stored text only
and ``unreadable`` naming the row and the error.

HAZARDS
- Rows of other AgentRuns on the same thread (``run_uid``) are filtered out
  by the caller's ``run_uid``; rows written before run uids existed (NULL)
  are kept, as they cannot be told apart.
- ``careful`` mode re-reads a failing table one row per round trip (for the
  messages: every message of the thread); it runs only when a row failed.
- An interrupt's answer when several ids were answered at once is the digest
  of the checkpoint's whole resume map (``resume_all``), not of those ids only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

from ..errors import StorageError
from .base import ThreadRows as ThreadRows  # moved to base (the HistoryReads protocol's type); re-exported

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]

PREVIEW_CHARS = 2000
# A value shown whole (an error, a final result, a stop reason: small by construction) is cut above this.
BOUNDED_BYTES = 64 * 1024

# Errors of one row's data, not of the store: PostgreSQL cannot convert or parse what the row holds.
_ROW_ERRORS = (asyncpg.exceptions.DataError, asyncpg.exceptions.ProgramLimitExceededError)

# A \u0000 escape is one after an even run of backslashes (after an odd one it is text: "\\u0000"); it
# becomes an escaped backslash and "u0000", which any JSON operator reads.
_NUL = r"'\u0000'"
_NUL_ESCAPE = r"'(?<!\\)((?:\\\\)*)\\u0000'"
_NUL_SHOWN = r"'\1\\\\u0000'"


def _readable(text: str) -> str:
    """SQL: JSON text ``text`` as jsonb, each ``\\u0000`` escape turned into the visible text ``\\u0000``."""
    return (
        f"(CASE WHEN strpos({text}, {_NUL}) > 0 THEN regexp_replace({text}, {_NUL_ESCAPE}, {_NUL_SHOWN}, 'g')"
        f" ELSE {text} END)::jsonb"
    )


def _shown(value: str, path: str) -> str:
    """SQL: the text a person reads at ``path`` in jsonb ``value``: a string's own text, anything else its JSON.

    A path (``#>>``), not ``->`` steps: each step would copy the value it returns (a 10 MB result, each time).
    SQL NULL for JSON ``null`` (a payload of None shows none) and for a missing key.
    """
    return f"({value} #>> '{{{path}}}')"


# Every value is computed once per row: "OFFSET 0" keeps PostgreSQL from inlining a subquery's output into
# each place it is used (without it a 10 MB body was parsed once per column that reads it: seconds a request).
def _digest(text: str) -> str:
    """SQL: the digest of text ``text`` (``history.Digest``'s fields, as JSON text), NULL when it is NULL."""
    return (
        "(SELECT jsonb_build_object('sha256', encode(sha256(convert_to(t, 'UTF8')), 'hex'), 'bytes', octet_length(t),"
        f" 'preview', left(t, {PREVIEW_CHARS}), 'truncated', char_length(t) > {PREVIEW_CHARS})::text"
        f" FROM (SELECT {text} AS t OFFSET 0) d WHERE t IS NOT NULL)"
    )


def _bounded(value: str) -> str:
    """SQL: jsonb ``value`` as JSON text when small, else its first characters as a JSON string (never whole)."""
    return (
        f"CASE WHEN octet_length({value}::text) <= {BOUNDED_BYTES} THEN {value}::text"
        f" ELSE to_jsonb(left({value}::text, {PREVIEW_CHARS}) || ' ...(cut)')::text END"
    )


def _array(value: str) -> str:
    return f"CASE jsonb_typeof({value}) WHEN 'array' THEN {value} END"


@dataclass(frozen=True)
class _Table:
    """One table's history read: ``sql`` with its parsed ``columns`` (read from the jsonb ``parse`` gives), or
    ``plain`` ones from the stored text only (a row PostgreSQL cannot parse), or one row (``key`` = its key)."""

    name: str
    sql: str
    columns: str
    plain: str
    parse: str
    key: str  # the column naming one row, as selected
    scoped: bool = True  # filtered by run uid ($2)

    def args(self, thread_id: str, run_uid: str | None) -> tuple[Any, ...]:
        return (thread_id, run_uid) if self.scoped else (thread_id,)

    def query(self, *, plain: bool = False, one: bool = False) -> str:
        where = f"AND {self.key} = ${3 if self.scoped else 2}" if one else ""
        parse = "NULL::jsonb" if plain else self.parse
        columns = self.plain if plain else self.columns
        return self.sql.replace("{columns}", columns).replace("{parse}", parse).replace("{one}", where)


# $1 the thread, $2 the AgentRun's uid (NULL: every row), then one row's key (careful mode). The values and
# deltas of states are not read: the history needs their meta and the step's position, not the state.
_STATES = _Table(
    name="states",
    sql="""
    SELECT s.version, s.current_node, s.step, s.status, s.attempt, s.run_uid,
           extract(epoch FROM s.created_at)::float8 AS at, {columns}
    FROM states s CROSS JOIN LATERAL (SELECT {parse} AS m OFFSET 0) p
    WHERE s.thread_id = $1 AND ($2::text IS NULL OR s.run_uid IS NULL OR s.run_uid = $2) {one} ORDER BY s.version
    """,
    columns=f"""
    (SELECT jsonb_agg(jsonb_build_object('id', i -> 'id', 'message', left(i ->> 'message', {PREVIEW_CHARS}),
            'payload', {_digest(_shown("i", "payload"))}::jsonb))
     FROM jsonb_array_elements({_array("m -> 'interrupts'")}) i WHERE jsonb_typeof(i) = 'object')::text AS interrupts,
    (SELECT jsonb_object_agg(r.key, {_digest(f"COALESCE({_shown('r.value', '')}, 'null')")}::jsonb)
     FROM jsonb_each(CASE jsonb_typeof(m -> 'resume') WHEN 'object' THEN m -> 'resume' END) r)::text AS resume,
    {_digest(_shown("m", "resume"))} AS resume_all,
    {_bounded("(m -> 'error')")} AS error, {_bounded("(m -> 'result')")} AS result,
    {_bounded("(m -> 'stop_reason')")} AS stop_reason, NULL AS unreadable
    """,
    plain="NULL AS interrupts, NULL AS resume, NULL AS resume_all, NULL AS error, NULL AS result, NULL AS stop_reason",
    parse=_readable("s.meta::text"),
    key="s.version",
)
# Only the messages a tool call shows in: the assistant's requests and the tool answers (no run uid: $1 only).
_MESSAGES = _Table(
    name="messages",
    sql=f"""
    SELECT m.idx, m.message_id, m.version, {{columns}}
    FROM messages m CROSS JOIN LATERAL (SELECT {{parse}} AS b OFFSET 0) p
    WHERE m.thread_id = $1 {{one}}
      AND (b IS NULL OR b ->> 'role' = 'tool' OR jsonb_array_length(COALESCE({_array("b -> 'tool_calls'")}, '[]')) > 0)
    ORDER BY m.idx
    """,
    columns=f"""
    b ->> 'id' AS id, b ->> 'role' AS role, b ->> 'tool_call_id' AS tool_call_id,
    COALESCE(b -> 'is_error' = 'true'::jsonb, false) AS is_error, {_digest(_shown("b", "content"))} AS content,
    (SELECT jsonb_agg(jsonb_build_object('id', c -> 'id', 'name', c -> 'name',
            'arguments', {_digest(_shown("c", "arguments"))}::jsonb))
     FROM jsonb_array_elements({_array("b -> 'tool_calls'")}) c WHERE jsonb_typeof(c) = 'object')::text AS tool_calls,
    NULL AS unreadable
    """,
    plain="NULL AS id, NULL AS role, NULL AS tool_call_id, false AS is_error, NULL AS content, NULL AS tool_calls",
    parse=_readable("m.body::text"),
    key="m.idx",
    scoped=False,
)
# A record's digest is of its envelope as stored; its preview is what the model read (a message's content: ours,
# or a LangChain ToolMessage's as LedgerToolNode records it, ``message_to_dict``), else the envelope's value, else
# (not an envelope, or not parsed: e is NULL) the stored text.
_LANGCHAIN_TOOL = "(e #>> '{value,type}' = 'tool' AND jsonb_typeof(e #> '{value,data}') = 'object')"
_LEDGER = _Table(
    name="tool_executions",
    sql=f"""
    SELECT l.tool_call_id, l.tool_name, l.attempt, l.run_uid, extract(epoch FROM l.created_at)::float8 AS at,
           encode(sha256(convert_to(stored, 'UTF8')), 'hex') AS result_sha256, octet_length(stored) AS result_bytes,
           left(shown, {PREVIEW_CHARS}) AS result_preview, char_length(shown) > {PREVIEW_CHARS} AS result_truncated,
           COALESCE(e ->> '__kind__' = 'message' AND e #> '{{value,is_error}}' = 'true'::jsonb
                    OR {_LANGCHAIN_TOOL} AND e #>> '{{value,data,status}}' = 'error', false)
               AS result_is_error, {{columns}}
    FROM tool_executions l CROSS JOIN LATERAL (SELECT COALESCE(l.result_text, l.result::text) AS stored OFFSET 0) s
         CROSS JOIN LATERAL (SELECT {{parse}} AS e OFFSET 0) p
         CROSS JOIN LATERAL (SELECT
             CASE WHEN e ->> '__kind__' = 'message' THEN COALESCE({_shown("e", "value,content")}, '')
                  WHEN {_LANGCHAIN_TOOL} THEN COALESCE({_shown("e", "value,data,content")}, '')
                  WHEN jsonb_typeof(e) = 'object' AND e ? 'value' THEN {_shown("e", "value")} ELSE stored END
             AS shown OFFSET 0) v
    WHERE l.thread_id = $1 AND ($2::text IS NULL OR l.run_uid IS NULL OR l.run_uid = $2) {{one}}
    ORDER BY l.created_at, l.tool_call_id
    """,
    columns="e ->> 'args' AS args_digest, NULL AS unreadable",
    plain="NULL AS args_digest, NULL AS unreadable",
    parse=_readable("stored"),
    key="l.tool_call_id",
)
_INTENTS = """
    SELECT tool_call_id, tool_name, idempotency_key, attempt, run_uid, extract(epoch FROM started_at)::float8 AS at,
           args_digest
    FROM tool_intents WHERE thread_id = $1 AND ($2::text IS NULL OR run_uid IS NULL OR run_uid = $2)
"""
# The resume value's digest, of its JSON text as stored: never parsed, so never unreadable.
_INPUTS = f"""
    SELECT attempt, {_digest("resume::text")} AS resume, extract(epoch FROM created_at)::float8 AS at
    FROM run_inputs WHERE thread_id = $1 AND ($2::text IS NULL OR run_uid = $2) ORDER BY attempt
"""
# A deleted AgentRun's thread, by the request key the operator derived from it (decide/identity.py:
# "<namespace>/<name>/<digest of spec.input>"); a run with spec.requestId is not found this way.
_RUN_BY_REQUEST_KEY = """
    SELECT thread_id, run_uid FROM turns
    WHERE thread_id LIKE $1 ESCAPE '\\' AND request_key LIKE $2 ESCAPE '\\'
    ORDER BY updated_at DESC LIMIT 1
"""
# The AgentRuns the store recorded turns for, by the same derived request key: the latest turn of each
# (namespace, name), newest first, for the run list's deleted runs. The key's shape is checked (a
# spec.requestId may hold slashes too) and its namespace must be its thread's.
_RECORDED_RUNS = """
    SELECT namespace, name, thread_id, run_uid, status, started_at, updated_at FROM (
        SELECT DISTINCT ON (namespace, name) namespace, name, thread_id, run_uid, status,
               extract(epoch FROM started_at)::float8 AS started_at,
               extract(epoch FROM updated_at)::float8 AS updated_at, updated_at AS updated
        FROM (
            SELECT split_part(request_key, '/', 1) AS namespace, split_part(request_key, '/', 2) AS name,
                   thread_id::text AS thread_id, run_uid, status, started_at, updated_at
            FROM turns
            WHERE request_key LIKE $1 ESCAPE '\\' AND request_key ~ '^[a-z0-9-]+/[a-z0-9.-]+/[0-9a-f]+$'
        ) keyed
        WHERE split_part(thread_id, '/', 1) = namespace
        ORDER BY namespace, name, updated_at DESC
    ) latest
    ORDER BY updated DESC LIMIT $2
"""
_OWNER = "SELECT attempt, run_uid, extract(epoch FROM registered_at)::float8 AS at FROM attempts WHERE thread_id = $1"
_STOP = "SELECT reason, extract(epoch FROM requested_at)::float8 AS at FROM stop_requests WHERE thread_id = $1"


class UnreadableRowError(StorageError):
    """A row of the thread holds what PostgreSQL cannot read (the fast read fails; ``careful`` finds the row)."""


async def thread_rows_txn(
    conn: Connection, thread_id: str, run_uid: str | None, *, careful: bool = False
) -> ThreadRows:
    """Every row of ``thread_id`` the history shows; run it inside one read-only snapshot.

    Raises ``UnreadableRowError`` when a row cannot be read, unless ``careful`` (slower: a savepoint per
    table and, in a table that fails, per row), which reads the others and names each such row.
    """
    unreadable: list[str] = []

    async def rows(sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in await conn.fetch(sql, *args)]

    async def table(read: _Table) -> list[dict[str, Any]]:
        args = read.args(thread_id, run_uid)
        if careful:
            return await _careful(conn, read, args, unreadable)
        try:
            return await rows(read.query(), *args)
        except _ROW_ERRORS as e:
            raise UnreadableRowError(
                f"a row of {read.name} of thread {thread_id} cannot be read: {type(e).__name__}: {e}"
            ) from e

    owner = await conn.fetchrow(_OWNER, thread_id)
    stop = await conn.fetchrow(_STOP, thread_id)
    return ThreadRows(
        states=await table(_STATES),
        messages=await table(_MESSAGES),
        ledger=await table(_LEDGER),
        intents=await rows(_INTENTS, thread_id, run_uid),
        inputs=await rows(_INPUTS, thread_id, run_uid),
        owner=dict(owner) if owner is not None else None,
        stop=dict(stop) if stop is not None else None,
        unreadable=unreadable,
    )


async def _careful(
    conn: Connection, read: _Table, args: tuple[Any, ...], unreadable: list[str]
) -> list[dict[str, Any]]:
    """``read``'s rows behind a savepoint; if one cannot be read, each row alone, those that fail as stored text."""
    try:
        return await _saved(conn, read.query(), args)
    except _ROW_ERRORS:
        pass  # which rows: each alone
    key = read.key.split(".")[-1]
    rows: list[dict[str, Any]] = []
    for plain in await conn.fetch(read.query(plain=True), *args):
        try:
            rows.extend(await _saved(conn, read.query(one=True), (*args, plain[key])))
        except _ROW_ERRORS as e:
            note = f"{read.name} row {key}={plain[key]!r}: {type(e).__name__}: {e}"
            unreadable.append(note)
            rows.append({**dict(plain), "unreadable": note})
    return rows


async def _saved(conn: Connection, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """``sql``'s rows, behind a savepoint (the snapshot's transaction survives a row that cannot be read)."""
    await conn.execute("SAVEPOINT agentrun_history_row")
    try:
        found = [dict(r) for r in await conn.fetch(sql, *args)]
    except _ROW_ERRORS:
        await conn.execute("ROLLBACK TO SAVEPOINT agentrun_history_row")
        raise
    await conn.execute("RELEASE SAVEPOINT agentrun_history_row")
    return found


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


async def recorded_runs_txn(conn: Connection, namespace: str | None, limit: int) -> list[dict[str, Any]]:
    """The AgentRuns with a turn recorded (``namespace``'s, or every namespace's), the latest turn of each,
    newest first, at most ``limit``: namespace, name, thread_id, run_uid, status, started_at, updated_at."""
    prefix = _like_prefix(f"{namespace}/") if namespace else "%"
    return [dict(row) for row in await conn.fetch(_RECORDED_RUNS, prefix, limit)]


async def find_run_txn(conn: Connection, namespace: str, name: str) -> tuple[str, str | None] | None:
    """(thread id, run uid) of the latest turn AgentRun ``namespace/name`` recorded, or None."""
    row = await conn.fetchrow(_RUN_BY_REQUEST_KEY, _like_prefix(f"{namespace}/"), _like_prefix(f"{namespace}/{name}/"))
    return (str(row["thread_id"]), row["run_uid"]) if row is not None else None
