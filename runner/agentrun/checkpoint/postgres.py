"""The production checkpointer: PostgreSQL through an asyncpg pool.

Every runner pod of a cluster writes here, so these are the product's
guarantees (DESIGN.md section 2, "PostgreSQL rules" and "Fencing"):

- Versioned writes. ``aput`` runs one transaction: ensure the thread row,
  lock it with ``SELECT ... FOR UPDATE``, compare the latest version with the
  version the run started from, insert the next version with that step's new
  messages. A mismatch raises ``StaleStateError`` (``STORAGE_CONFLICT_001``)
  and nothing of the write lands; ``UNIQUE (thread_id, version)`` backs the
  lock up. Only the messages a step added or replaced are sent. The whole
  write is one statement, one round trip (the server-side function of
  migration 8, autocommitted); ledger records likewise (migration 9), and
  intents by their claim (migration 17), and a connection goes back to the pool without a reset
  query (``_keep_session``).
- State rows carry only what changed (migration 11): a row holds the
  channels its step changed on top of the previous version, with a full
  snapshot at least every ``snapshot_every`` rows and whenever the deltas
  since the last one add up to its size, so an unchanged large channel is
  not rewritten each step. Every row is still one versioned, fenced,
  atomic write; ``aget`` folds the snapshot and its deltas in one snapshot
  read and refuses a broken chain (``StorageError``) rather than return a
  state that was never written. A delta goes only on top of a row this
  store wrote itself (the server checks the chain and the incarnation);
  anything else, and the first write of a process, is a snapshot.
- Stop requests are heard, not polled: the request's transaction notifies
  ``agentrun_stop`` (migration 11) and each store LISTENs on one connection
  of its own while runs watch (``pg_listen``, which has the fallbacks).
- The ledger (``tool_executions``) is insert-if-absent: the first recorded
  result stays authoritative; ``ledger_replace`` repairs a malformed row by
  compare-and-swap on its exact text. Parallel calls' results that finish
  within ``ledger_group_window`` (2 ms) share one statement and one commit
  (``ledger_put_many``, migration 15; the policy is ``checkpoint.group``), and
  a side-effect call's intent, with its arguments digest, is looked up and
  recorded in one round trip (``intent_claim``). Ledger rows, intents, stop requests,
  the owner and the runs seen go with their thread (``ON DELETE CASCADE``);
  nothing is deleted implicitly, only by ``delete_thread``.
- Fencing. ``register_attempt`` records the run (AgentRun uid) and attempt
  that own a thread, and every run uid that ever registered on it
  (``base.claim`` is the rule: a new AgentRun claims a thread that outlived
  the previous one, a superseded run cannot take it back). Every write that
  carries another run's uid or an older attempt is refused with
  ``FencedError``. Writes and registration serialize on the thread row
  lock, so no fenced write commits after the registration that fenced it.
- The schema migrates itself (``pg_schema``), under an advisory lock.
- The Redis hot cache is a wrapper (``cached.CachedStore``), built by
  ``agentrun.checkpoint.open_store(dsn, redis_url=...)``; ``ahead`` and the
  ``Commit`` of ``acommit`` give it the incarnation and version it checks.
- ``aget_progress`` gives the operator version, node, step, status, error,
  tool call counts and the owner (run uid, attempt) from one indexed query.

HAZARDS (what this store cannot promise, and what to do):
- Fencing refuses *writes*; it cannot recall a tool call that an old
  attempt already started (a pod frozen mid-call resumes the call when it
  thaws). Side effects must carry the idempotency key agentrun passes.
- Outages are ridden out, for a bounded time. Every call retries transient
  failures (connection refused or reset, the server starting up or shutting
  down, too many connections, a serialization failure or deadlock that
  rolled the transaction back) with jittered exponential backoff, until the
  store has been unreachable for ``retry_timeout`` seconds (default 60; one
  clock per outage, shared by all calls, so a long outage fails every call
  fast instead of each waiting its own bound). Then ``StoreUnavailableError``
  (the runner exits 8, a disruption). Configuration errors (malformed DSN,
  authentication failed, database missing, permission denied) are not
  retried: ``StoreConfigError`` at once, naming the problem, never the DSN
  or the password. ``stop_requested`` does not wait: the next check is its
  retry.
- Retries keep every guarantee. A retried checkpoint write is a new
  transaction, locked, fenced and version-checked like the first. A write
  whose COMMIT was acknowledged to nobody (the connection died during it)
  must not turn into a false ``StaleStateError`` on retry: each write
  carries an id in its meta (``write_id``, hidden from readers), and a retry
  that finds the next version already written with its own id returns that
  commit. Ledger records stay ``ON CONFLICT DO NOTHING``; a retried record
  that finds exactly its own row (same text, attempt and run) reports
  success. Intents, registrations, stop requests and run inputs are
  idempotent. While a call retries it holds no lock and no connection.
- A SIGTERM during an outage: a checkpoint write in its retries keeps
  retrying, so a pod's grace period shorter than ``retry_timeout`` ends in
  SIGKILL, which is a crash like any other (nothing partial lands).
- A frozen process (SIGSTOP, a stalled VM) that holds a write transaction
  holds the thread's row lock. ``idle_in_transaction_timeout`` makes the
  server end such a session and release the lock; ``lock_timeout`` bounds
  how long others wait for it (they fail with ``StorageError``).
- With ``durable_checkpoint_every_step: false`` a crash resumes from the
  last durable version: the non-durable steps run again (tool calls among
  them are durable before they run, so the ledger still holds their results).
- Thread ids are at most 253 characters (``MAX_THREAD_ID_LENGTH``).
- Behind PgBouncer in transaction mode (``agentrun_pooler=transaction`` in the
  URL, or ``pooler="transaction"``) a server session lasts one transaction,
  so the store keeps none: no LISTEN (runs hear of stops on Redis or poll),
  no prepared-statement cache (``statement_cache_size=0``: asyncpg parses each
  statement again, one more round trip per statement), the session settings
  (``search_path``, ``lock_timeout``, ``idle_in_transaction_session_timeout``)
  sent as ``SET LOCAL`` in the same round trip as ``BEGIN`` of every call, so
  every call is a transaction (a one-statement call costs four round trips
  instead of one), and the migration lock taken per transaction
  (``pg_schema``). PgBouncer refuses those settings as startup parameters; a
  store that forgot the URL parameter fails at connect, it does not run
  unsafely. Without it, behind such a pooler, the migration's session lock and
  LISTEN would silently land on server connections other clients then get.
- A state channel changed without going through a node's update (a value a
  node returned and keeps mutating from elsewhere) is not seen as changed,
  so it is not rewritten until it is updated or the next snapshot; as in
  LangGraph, a channel's value is what its last update wrote.
- Rows written with deltas read as JSON ``null`` state to agentrun versions
  older than migration 11: do not roll runners back past it on live threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
from typing_extensions import override

from ..errors import FencedError, StaleStateError, StorageError, StoreConfigError, StoreUnavailableError
from ..faults import armed, fault_point
from ..messages import Message
from . import pg_inspect
from .base import (
    PAUSED_SUFFIX,
    PROGRESS_META,
    Checkpoint,
    Checkpointer,
    CheckpointWrite,
    Commit,
    Head,
    HistoryReads,
    Intent,
    LedgerEntry,
    LedgerRow,
    Owner,
    Progress,
    RunInputsRecord,
    StopWatch,
    Turn,
    check_fence,
    claim,
    turn_fields,
)
from .batch import TurnBatch
from .group import LEDGER_GROUP_WINDOW
from .listen import ProgressEvent, events, nothing
from .pg_history import ThreadRows, UnreadableRowError, find_run_txn, recorded_runs_txn, thread_rows_txn
from .pg_listen import StopListener
from .pg_progress import ProgressNotifier, hear, notify_sql
from .pg_schema import (
    MAX_THREAD_ID_LENGTH,
    MIGRATIONS,
    apply_migrations,
    normalize_thread_id_type,
    validate_schema_name,
)
from .pg_schema import transaction as in_transaction
from .pg_url import TRANSACTION, parse_store_url

if TYPE_CHECKING:
    from .pg_schema import Connection

log = logging.getLogger("agentrun.checkpoint.postgres")

T = TypeVar("T")

# -- SQL: thread row and fencing --------------------------------------------------------------

_ENSURE_THREAD = "INSERT INTO threads (thread_id) VALUES ($1) ON CONFLICT (thread_id) DO NOTHING"
# FOR UPDATE: one writer of versions at a time per thread, and registration of an attempt
# excludes every write of the thread while it commits (fencing needs that order).
_LOCK_THREAD = "SELECT incarnation::text FROM threads WHERE thread_id = $1 FOR UPDATE"
# FOR SHARE: ledger and intent writes of parallel tool calls do not wait for each other, but do
# wait for a checkpoint or a registration in flight, and then see the registered attempt.
_SHARE_THREAD = "SELECT incarnation::text FROM threads WHERE thread_id = $1 FOR SHARE"
# Read in a statement after the lock is granted: in READ COMMITTED each statement takes a new
# snapshot, so this sees whatever the transaction we waited for committed.
_OWNER = "SELECT run_uid, attempt FROM attempts WHERE thread_id = $1"
_SEEN_RUN = "SELECT EXISTS (SELECT 1 FROM thread_runs WHERE thread_id = $1 AND run_uid = $2)"
# The thread row is locked FOR UPDATE and base.claim() decided under it, so the row simply takes
# the new owner (a new AgentRun's attempt may be lower than the previous run's).
_PUT_OWNER = """
    INSERT INTO attempts (thread_id, attempt, run_uid) VALUES ($1, $2, $3)
    ON CONFLICT (thread_id) DO UPDATE SET attempt = EXCLUDED.attempt, run_uid = EXCLUDED.run_uid,
        registered_at = now()
"""
# DO NOTHING: a run's first registration on the thread is what marks it as seen.
_RECORD_RUN = """
    INSERT INTO thread_runs (thread_id, run_uid) VALUES ($1, $2) ON CONFLICT (thread_id, run_uid) DO NOTHING
"""

# -- SQL: state and messages ------------------------------------------------------------------

# The whole checkpoint in one statement and one round trip, autocommitted (pg_schema migrations 8 and 11:
# lock FOR UPDATE, fence, version check, a retry's own row, state or its delta, messages, turn). Inside
# an explicit transaction only for the crash tests' ``in_checkpoint_txn`` fault point.
_PUT_CHECKPOINT = """
    SELECT o_outcome, o_version, o_incarnation, o_created_at, o_owner_run_uid, o_owner_attempt
    FROM agentrun_put_checkpoint($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                                 $19, $20, $21::bigint, $22::text)
"""
# The cheap head of a thread: what a cache entry must match exactly to be served.
_HEAD_VERSION = """
    SELECT t.incarnation::text AS incarnation,
           (SELECT MAX(version) FROM states s WHERE s.thread_id = t.thread_id) AS version
    FROM threads t WHERE t.thread_id = $1
"""
# The latest row and, when it is a delta (migration 11), every row back to its snapshot, oldest first:
# the state is the snapshot's values with each delta applied in version order (``_fold``).
_LATEST = """
    WITH latest AS (
        SELECT version, base_version FROM states WHERE thread_id = $1 ORDER BY version DESC LIMIT 1
    )
    SELECT s.version, s.base_version, s.current_node, s.step, s.status, s.state_values, s.state_delta, s.meta,
           s.message_count, extract(epoch FROM s.created_at)::float8 AS created_at
    FROM latest l JOIN states s ON s.thread_id = $1 AND s.version BETWEEN COALESCE(l.base_version, l.version)
                                                                      AND l.version
    ORDER BY s.version
"""
_MESSAGES = "SELECT body FROM messages WHERE thread_id = $1 AND idx < $2 ORDER BY idx"
# ``executed_since``: the results recorded after the latest checkpoint (``context.executed_since``, the same
# rule the runner applies when it resumes): a call counts as executed once it is recorded, not only at its
# step's checkpoint, and one whose process died before that checkpoint still counts. A scan of the thread's
# ledger rows on its primary key.
_PROGRESS = """
    SELECT t.incarnation::text AS incarnation, s.version, s.current_node, s.step, s.status,
           extract(epoch FROM s.created_at)::float8 AS updated_at,
           s.meta -> 'error' AS error, s.meta -> 'stop_reason' AS stop_reason,
           s.meta -> 'tool_calls' AS tool_calls, s.meta -> 'interrupts' AS interrupts,
           s.meta -> 'request_key' AS request_key, s.meta -> 'result' AS result,
           s.meta -> 'last_tool_error' AS last_tool_error, s.meta -> 'model_usage' AS model_usage,
           a.attempt, a.run_uid,
           (SELECT count(*) FROM tool_executions e
            WHERE e.thread_id = t.thread_id AND e.created_at > s.created_at
              AND e.tool_call_id NOT LIKE '%' || $2) AS executed_since
    FROM threads t LEFT JOIN attempts a ON a.thread_id = t.thread_id JOIN states s ON s.thread_id = t.thread_id
    WHERE t.thread_id = $1 ORDER BY s.version DESC LIMIT 1
"""

_GET_TURN = """
    SELECT run_uid, status, version, error, result, tool_calls,
           extract(epoch FROM started_at)::float8 AS started_at, extract(epoch FROM updated_at)::float8 AS updated_at
    FROM turns WHERE thread_id = $1 AND request_key = $2
"""

# -- SQL: ledger, intents, stop, threads --------------------------------------------------------

# A ledger record or an intent in one statement and one round trip (pg_schema migration 9): the thread
# row FOR SHARE, the fence read after the lock, the insert ON CONFLICT DO NOTHING (the first recorded
# result, the first intent with its start time and idempotency key, stays authoritative).
_PUT_TOOL_ROW = """
    SELECT o_outcome, o_owner_run_uid, o_owner_attempt FROM agentrun_put_tool_row($1, $2, $3, $4, $5, $6, $7, $8, $9)
"""
# The group commit of parallel calls' results (pg_schema migration 15, checkpoint.group): one statement,
# one commit, fenced like _PUT_TOOL_ROW; o_rows has each row's outcome: inserted, own or exists.
_PUT_TOOL_RESULTS = """
    SELECT o_outcome, o_owner_run_uid, o_owner_attempt, o_rows
    FROM agentrun_put_tool_results($1, $2::text[], $3::text[], $4::text[], $5::text[], $6, $7)
"""
# Intents' lookups and records in one round trip (migration 17): per key the recorded intent (with its
# arguments digest), or this one inserted; the claims of parallel calls that start together share it.
_CLAIM_INTENTS = """
    SELECT o_outcome, o_owner_run_uid, o_owner_attempt, o_rows, o_tool_names, o_idempotency_keys, o_started_at,
           o_args_digests
    FROM agentrun_claim_intents($1, $2::text[], $3::text[], $4::text[], $5::text[], $6, $7)
"""
# Compare-and-swap on the exact stored text (the repair of a malformed row). The UPDATE locks the
# row; a second repairer waits, then re-checks the WHERE on the row the first one wrote (READ
# COMMITTED re-evaluates it), finds other text and updates nothing: one repair wins.
_REPLACE_LEDGER = """
    UPDATE tool_executions SET result = $4::text::jsonb, result_text = $5, attempt = $6, run_uid = $7
    WHERE thread_id = $1 AND tool_call_id = $2 AND tool_name = $3
      AND COALESCE(result_text, result::text) = $8
"""
# A retried record's own row: the first try committed and its acknowledgement was lost.
_OWN_LEDGER = """
    SELECT EXISTS (SELECT 1 FROM tool_executions WHERE thread_id = $1 AND tool_call_id = $2 AND tool_name = $3
        AND result_text = $4 AND attempt IS NOT DISTINCT FROM $5 AND run_uid IS NOT DISTINCT FROM $6)
"""
# result_text is the exact recorded text; result::text only for rows written by other tools.
_GET_LEDGER = """
    SELECT tool_name, COALESCE(result_text, result::text) AS result,
           extract(epoch FROM created_at)::float8 AS created_at
    FROM tool_executions WHERE thread_id = $1 AND tool_call_id = $2
"""
# The lookups of parallel tool calls, coalesced (ledger_get): one query for all the keys asked at once.
_GET_LEDGER_MANY = """
    SELECT tool_call_id, tool_name, COALESCE(result_text, result::text) AS result,
           extract(epoch FROM created_at)::float8 AS created_at
    FROM tool_executions WHERE thread_id = $1 AND tool_call_id = ANY($2::text[])
"""
_LIST_LEDGER = """
    SELECT tool_call_id, tool_name, COALESCE(result_text, result::text) AS result,
           extract(epoch FROM created_at)::float8 AS created_at
    FROM tool_executions WHERE thread_id = $1 ORDER BY created_at, tool_call_id
"""
_GET_INTENT = """
    SELECT tool_name, idempotency_key, extract(epoch FROM started_at)::float8 AS started_at, args_digest
    FROM tool_intents WHERE thread_id = $1 AND tool_call_id = $2
"""
# DO NOTHING: a pending request keeps its first reason until the run acknowledges it.
_REQUEST_STOP = """
    INSERT INTO stop_requests (thread_id, reason) VALUES ($1, $2) ON CONFLICT (thread_id) DO NOTHING
"""
_STOP_REQUESTED = "SELECT reason FROM stop_requests WHERE thread_id = $1"
_CLEAR_STOP = "DELETE FROM stop_requests WHERE thread_id = $1"
# Upsert: the operator may write an attempt's inputs again (a retried reconcile); the last write wins.
_PUT_RUN_INPUTS = """
    INSERT INTO run_inputs (thread_id, run_uid, attempt, input, resume) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (thread_id, run_uid, attempt) DO UPDATE SET input = EXCLUDED.input, resume = EXCLUDED.resume,
        created_at = now()
"""
# A run's runner reads its inputs once, at start: older attempts' rows are dead weight.
_PRUNE_RUN_INPUTS = "DELETE FROM run_inputs WHERE thread_id = $1 AND run_uid = $2 AND attempt < $3"
_GET_RUN_INPUTS = "SELECT input, resume FROM run_inputs WHERE thread_id = $1 AND run_uid = $2 AND attempt = $3"
# Every other table references threads with ON DELETE CASCADE: one statement removes it all.
_DELETE_THREAD = "DELETE FROM threads WHERE thread_id = $1"
_LIST_THREADS = """
    SELECT thread_id FROM threads t WHERE EXISTS (SELECT 1 FROM states s WHERE s.thread_id = t.thread_id)
    ORDER BY created_at, thread_id
"""

# Errors that mean "the database did not answer", as opposed to a conflict or a bug.
_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)
# Of those, the ones after which the same call on a fresh connection moments later may well succeed.
# A transaction that failed with one of them was rolled back, or its COMMIT outcome is unknown (the
# retry of a write checks for its own row). Not QueryCanceledError: a statement timeout is no outage.
_TRANSIENT = (
    asyncpg.PostgresConnectionError,  # connection failure, lost connection, CannotConnectNow's siblings
    asyncpg.exceptions.CannotConnectNowError,  # starting up, shutting down, in recovery
    asyncpg.exceptions.AdminShutdownError,  # the server terminated the session (restart, pg_terminate_backend)
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.InterfaceError,  # "connection is closed" and the like; ClientConfigurationError is caught first
    # An idle pooled connection that got the server's "terminating connection" (a restart) is stuck
    # consuming that error until its socket closes; a query on it meanwhile fails with "cannot switch
    # to state 12; another operation (2) is in progress" (asyncpg issue 1069): a lost connection too.
    asyncpg.exceptions.InternalClientError,
    OSError,  # refused, reset, unreachable, DNS not answering (a Service not ready yet)
    TimeoutError,  # connect timeout
)
# Of those, the ones where the server is likely up and only this connection died: retried at once.
_CONNECTION_LOST = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    ConnectionResetError,
)
# Configuration errors: retrying cannot help; the message names the problem, never the secret.
_CONFIG = (
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # wrong password, unknown role, pg_hba refusal
    asyncpg.exceptions.InvalidCatalogNameError,  # the database does not exist
    asyncpg.exceptions.InsufficientPrivilegeError,  # the role may not create the schema or use the tables
    asyncpg.exceptions.ClientConfigurationError,  # a DSN parameter asyncpg rejects
)
# While an outage lasts, calls are at most this far apart (the longest backoff, and the stop poll):
# a failure after a longer quiet spell starts a new outage with a fresh bound.
_OUTAGE_GAP = 10.0
# create_pool's own arguments: what the stop listener's plain connection must not be given.
_POOL_ONLY = frozenset(
    {"min_size", "max_size", "max_queries", "max_inactive_connection_lifetime", "setup", "init", "reset"}
)
# How many threads' chains a store remembers (a delta needs its writer to remember the chain).
_MAX_CHAINS = 10_000
# The meta key of a checkpoint's write id (stripped when a checkpoint is read).
_WRITE_ID = "write_id"
# The startup parameters PgBouncer tracks per client (it refuses any other that is not in its
# ignore_startup_parameters): behind a transaction pooler every other server setting is SET LOCAL.
_POOLER_STARTUP_PARAMETERS = frozenset(
    {"application_name", "client_encoding", "datestyle", "timezone", "standard_conforming_strings"}
)
_SNAPSHOT_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)")
_PASSWORD_PARAM = re.compile(r"(password=)([^&\s]*)", re.IGNORECASE)


def _literal(value: object) -> str:
    """A setting's value as an SQL string literal (``SET LOCAL name = '...'``)."""
    return "'" + str(value).replace("'", "''") + "'"


def _dumps(value: Any, *, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise StorageError(f"{what} is not JSON-serializable: {e}") from e


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def check_thread_id(thread_id: str) -> None:
    """Raise ``ValueError`` unless ``thread_id`` is a non-empty string of at most 253 characters."""
    if not isinstance(thread_id, str) or not 0 < len(thread_id) <= MAX_THREAD_ID_LENGTH:
        raise ValueError(
            f"thread id must be 1 to {MAX_THREAD_ID_LENGTH} characters, got {len(str(thread_id))}: "
            f"{str(thread_id)[:40]!r}..."
        )


def _without_write_id(meta: dict[str, Any]) -> dict[str, Any]:
    meta.pop(_WRITE_ID, None)
    return meta


def _where(dsn: str) -> str:
    """``user@host:port/database`` of a DSN, for messages (no password); ``"the configured DSN"`` if unparsable."""
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
        user = f"{parts.username}@" if parts.username else ""
        return f"{user}{host}:{port}{parts.path or '/'}"
    except ValueError:
        return "the configured DSN"


def _owner(row: asyncpg.Record | None) -> Owner | None:
    if row is None or row["attempt"] is None:
        return None
    return Owner(row["run_uid"], int(row["attempt"]))


async def _fence_txn(conn: Connection, thread_id: str, attempt: int | None, run_uid: str | None) -> None:
    """Lock the thread row FOR SHARE and raise ``FencedError`` if the writer no longer owns the thread."""
    await _lock_thread(conn, thread_id, _SHARE_THREAD)
    check_fence(thread_id, _owner(await conn.fetchrow(_OWNER, thread_id)), attempt=attempt, run_uid=run_uid)


def _tool_row_outcome(
    thread_id: str,
    row: asyncpg.Record | None,
    *,
    attempt: int | None,
    run_uid: str | None,
    expected: str = "inserted",
) -> bool:
    """Whether a fenced tool-row function's outcome is ``expected`` (``_PUT_TOOL_ROW``: inserted).

    Raises ``FencedError`` (fenced) or ``StorageError`` (thread vanished).
    """
    assert row is not None  # a function with OUT parameters returns one row
    outcome = row["o_outcome"]
    if outcome == "fenced":
        check_fence(
            thread_id, Owner(row["o_owner_run_uid"], int(row["o_owner_attempt"])), attempt=attempt, run_uid=run_uid
        )
        raise FencedError(f"thread {thread_id!r} is owned by another attempt; this attempt must stop")
    if outcome == "vanished":
        raise StorageError(f"thread {thread_id!r} was deleted while being written, three times in a row")
    return bool(outcome == expected)


async def _keep_session(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """The pool's reset on release: nothing to reset, so no round trip.

    asyncpg's default sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``
    each time a connection goes back to the pool: a round trip per call. This store leaves no session
    state behind: settings come from ``server_settings`` at connect, the migration's advisory lock is
    released in a ``finally``, no cursor outlives its transaction, nothing LISTENs on a pooled
    connection; and asyncpg still rolls back a transaction left open before calling this.
    """


async def _lock_thread(conn: Connection, thread_id: str, lock_sql: str) -> str:
    """Ensure the thread row exists and lock it; returns its incarnation."""
    for _ in range(3):
        incarnation = await conn.fetchval(lock_sql, thread_id)
        if incarnation is not None:
            return str(incarnation)
        # First write of the thread: create the row, then lock it like any other.
        await conn.execute(_ENSURE_THREAD, thread_id)
    raise StorageError(f"thread {thread_id!r} was deleted while being written, three times in a row")


# Who writes an intent: the thread, the attempt and the run uid (claims of one writer share a statement).
_Writer = tuple[str, int | None, str | None]


@dataclass(frozen=True)
class _Claim:
    """An ``intent_claim`` waiting for its loop turn's statement (``batch.TurnBatch``)."""

    key: str
    tool_name: str
    idem: str | None
    args_digest: str | None


@dataclass(frozen=True)
class _Chain:
    """What this store last committed on a thread: where the next delta may go (``PgCheckpointer._delta``)."""

    incarnation: str
    version: int
    base: int  # the snapshot's version
    deltas: int  # delta rows since it
    delta_bytes: int
    snapshot_bytes: int


class _Rebase(Exception):
    """The delta's chain is not the thread's latest (another writer, a new incarnation): send a snapshot."""


def _fold(thread_id: str, rows: list[asyncpg.Record]) -> dict[str, Any]:
    """The state of the last of ``rows``: the snapshot (first row) with each delta after it applied in order.

    Raises ``StorageError`` when the rows are not one unbroken chain, rather
    than return a state that was never written.
    """
    first = rows[0]
    last = rows[-1]
    if first["base_version"] is not None or len(rows) != last["version"] - first["version"] + 1:
        raise StorageError(
            f"thread {thread_id!r}: the state of version {last['version']} is a delta whose chain back to "
            f"its snapshot (version {last['base_version']}) is incomplete"
        )
    values: dict[str, Any] = json.loads(first["state_values"])
    for row in rows[1:]:
        if row["base_version"] != first["version"] or row["state_delta"] is None:
            raise StorageError(
                f"thread {thread_id!r}: version {row['version']} does not continue the snapshot of version "
                f"{first['version']}"
            )
        values.update(json.loads(row["state_delta"]))
    return values


class PgCheckpointer(Checkpointer, HistoryReads):
    """``PgCheckpointer("postgresql://user@host/db")``; with Redis: ``open_store(dsn, redis_url=...)``.

    ``schema``: the PostgreSQL schema of the tables (created if missing).
    ``thread_id_type``: ``"text"`` (default) or ``"varchar(N)"``, N <= 253;
    chosen when the schema is first created.
    ``retry_timeout``: how long an outage may last before calls raise
    ``StoreUnavailableError`` (seconds; 0: one try, no backoff).
    ``listen_for_stops``: runs hear of stop requests by ``LISTEN`` on a
    connection of their own (``pg_listen``); ``False`` polls instead (behind
    PgBouncer in transaction mode). ``stop_sweep_interval``: how often that
    connection is checked (seconds).
    ``pooler``: ``"transaction"`` when ``dsn`` goes through a pooler in
    transaction mode (no session state kept; implies ``listen_for_stops=False``);
    ``agentrun_pooler=transaction`` in ``dsn`` says the same (``pg_url``).
    ``snapshot_every``: a state row holds only the channels its step changed,
    with a full snapshot at least every this many rows (0: always full).
    ``listen_dsn``: where ``watch_progress`` LISTENs, a direct DSN of the same
    database (the store Secret's ``postgresListenDsn``); by default ``dsn``
    itself, or nowhere when ``dsn`` goes through a transaction pooler.
    ``ledger_group_window``: seconds a finished tool call's record may wait
    for its parallel siblings' to share one commit (``checkpoint.group``);
    default ``LEDGER_GROUP_WINDOW`` (2 ms), or ``agentrun_ledger_window_ms``
    in ``dsn``; 0: every record commits on its own.
    """

    backend = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "agentrun",
        thread_id_type: str = "text",
        min_pool_size: int = 1,
        max_pool_size: int = 5,
        connect_timeout: float = 10.0,
        lock_timeout: float = 30.0,
        idle_in_transaction_timeout: float = 60.0,
        retry_timeout: float = 60.0,
        pool_options: dict[str, Any] | None = None,
        listen_for_stops: bool = True,
        stop_sweep_interval: float = 10.0,
        snapshot_every: int = 256,
        pooler: str | None = None,
        listen_dsn: str | None = None,
        ledger_group_window: float | None = None,
    ) -> None:
        url = parse_store_url(dsn)  # ValueError for an unknown agentrun parameter
        self.dsn = url.dsn
        if pooler not in (None, TRANSACTION):
            raise ValueError(f"pooler must be None or {TRANSACTION!r}, not {pooler!r}")
        self.pooler = pooler or url.pooler
        self.listen_dsn = listen_dsn if listen_dsn is not None else (None if self.pooler else self.dsn)
        self.retry_timeout = max(0.0, retry_timeout)
        self.retry_base_delay = 0.05
        self.retry_max_delay = 2.0
        self._outage_since: float | None = None
        self._last_failure = 0.0
        self.schema = validate_schema_name(schema)
        self.thread_id_type = normalize_thread_id_type(thread_id_type)
        self._pool_kwargs: dict[str, Any] = {
            "min_size": min_pool_size,
            "max_size": max_pool_size,
            "timeout": connect_timeout,
            "server_settings": {
                "search_path": self.schema,
                "application_name": "agentrun",
                "lock_timeout": f"{int(lock_timeout * 1000)}ms",
                "idle_in_transaction_session_timeout": f"{int(idle_in_transaction_timeout * 1000)}ms",
            },
            "reset": _keep_session,
            **(pool_options or {}),
        }
        # What each call's transaction starts with: "BEGIN" on a session of its own, else also the
        # session's settings as SET LOCAL, in one simple-query round trip (_connection).
        self._begin = "BEGIN"
        if self.pooler == TRANSACTION:
            settings = dict(self._pool_kwargs.pop("server_settings", {}))
            # PgBouncer passes only the parameters it tracks at connect (application_name among them).
            self._pool_kwargs["server_settings"] = {
                k: settings.pop(k) for k in list(settings) if k in _POOLER_STARTUP_PARAMETERS
            }
            self._pool_kwargs["statement_cache_size"] = 0  # a named statement would outlive the transaction
            self._begin = "; ".join(["BEGIN", *(f"SET LOCAL {k} = {_literal(v)}" for k, v in settings.items())])
            listen_for_stops = False
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._pool_lock = asyncio.Lock()
        self._setup_done = False
        # ledger_get calls of this loop turn share one query per thread.
        self._lookups = TurnBatch(self._look_up, lambda thread_id: f"agentrun:ledger-lookup:{thread_id}")
        # intent_claim calls of this loop turn share one statement per writer (thread, attempt, run uid).
        self._claims = TurnBatch(self._claim, lambda writer: f"agentrun:intent-claim:{writer[0]}")
        self.listen_for_stops = listen_for_stops and url.listen
        self.stop_sweep_interval = stop_sweep_interval
        self._stop_listener: StopListener | None = None
        self.snapshot_every = max(0, snapshot_every)
        window = ledger_group_window if ledger_group_window is not None else url.ledger_window
        self._ledger_group_window = LEDGER_GROUP_WINDOW if window is None else max(0.0, window)
        # Per thread, what this store last committed (the chain a delta continues).
        self._chains: dict[str, _Chain] = {}
        # The operator's wake-up after a commit (pg_progress: throttled, off the step's path).
        self._progress = ProgressNotifier(self._notify_progress)

    # -- plumbing ------------------------------------------------------------------------

    async def _get_pool(self) -> asyncpg.Pool[asyncpg.Record]:
        """The pool, created and migrated on first use; raises what asyncpg raised (``_call`` classifies it)."""
        if self._pool is not None and self._setup_done:
            return self._pool
        async with self._pool_lock:
            if self._pool is None:
                try:
                    self._pool = await asyncpg.create_pool(self.dsn, **self._pool_kwargs)
                except (ValueError, OverflowError) as e:  # asyncpg's DSN parser; ClientConfigurationError too
                    raise StoreConfigError(
                        f"malformed PostgreSQL DSN ({self._scrub(str(e))}); check the store Secret's postgresDsn"
                    ) from None
            if not self._setup_done:
                async with self._pool.acquire() as conn:
                    await apply_migrations(
                        conn, MIGRATIONS, schema=self.schema, thread_id_type=self.thread_id_type, begin=self._begin
                    )
                self._setup_done = True
        return self._pool

    async def _call(self, op: str, call: Callable[[], Awaitable[T]], *, patient: bool = True) -> T:
        """Run ``call``, retrying transient failures with backoff while the outage is shorter than ``retry_timeout``.

        Raises ``StoreConfigError`` (not retried), ``StoreUnavailableError``
        (the outage outlasted the bound, or ``patient=False`` and one quick
        retry on a fresh connection failed too) and ``StorageError`` (any other
        database failure). Conflicts and fencing pass through unchanged.
        """
        retries = 0
        while True:
            try:
                result = await call()
            except StoreConfigError:
                raise
            except _CONFIG as e:
                raise StoreConfigError(self._config_problem(e)) from None  # the cause may quote the DSN
            except asyncpg.exceptions.ProtocolViolationError as e:
                if "startup parameter" not in str(e):
                    raise StorageError(f"postgres {op} failed: {self._describe(e)}") from e
                # A pooler (PgBouncer) refusing the session settings: the URL lacks agentrun_pooler.
                raise StoreConfigError(self._config_problem(e)) from None
            except (StaleStateError, StoreUnavailableError):
                raise
            except StorageError as e:  # pg_schema wraps what the migration met; retry it if that was an outage
                if not isinstance(e.__cause__, _TRANSIENT):
                    if isinstance(e.__cause__, _CONFIG):
                        raise StoreConfigError(self._config_problem(e.__cause__)) from None
                    raise
                error: BaseException = e.__cause__
            except _TRANSIENT as e:
                error = e
            except _DB_ERRORS as e:
                raise StorageError(f"postgres {op} failed: {type(e).__name__}: {self._scrub(str(e))}") from e
            else:
                if self._outage_since is not None:
                    log.warning(
                        "PostgreSQL reachable again after %.1fs (%s succeeded); carrying on",
                        time.monotonic() - self._outage_since,
                        op,
                    )
                    self._outage_since = None
                return result
            delay = self._next_delay(op, error, retries, patient=patient)
            retries += 1
            await asyncio.sleep(delay)

    def _next_delay(self, op: str, error: BaseException, retries: int, *, patient: bool) -> float:
        """The wait before the next try after ``error``; raises ``StoreUnavailableError`` when it is time to stop."""
        now = time.monotonic()
        if self._outage_since is None or now - self._last_failure > _OUTAGE_GAP:
            self._outage_since = now
            log.warning(
                "PostgreSQL unavailable during %s (%s); every call retries with backoff for up to %.0fs, "
                "then fails with %s",
                op,
                self._describe(error),
                self.retry_timeout,
                StoreUnavailableError.code,
            )
        self._last_failure = now
        down = now - self._outage_since
        if retries == 0 and isinstance(error, _CONNECTION_LOST):
            return 0.0  # a pool's idle connections all die with a restart: one quick try on a new one
        if not patient or down >= self.retry_timeout:
            raise StoreUnavailableError(
                f"PostgreSQL unavailable for {down:.0f}s (retry bound {self.retry_timeout:.0f}s); "
                f"{op} failed: {self._describe(error)}"
            ) from error
        ceiling = min(self.retry_max_delay, self.retry_base_delay * 2.0**retries)
        return min(ceiling * random.uniform(0.5, 1.0), self.retry_timeout - down)

    def _describe(self, error: BaseException) -> str:
        return f"{type(error).__name__}: {self._scrub(str(error))}"

    def _scrub(self, text: str) -> str:
        """``text`` without the DSN or its password, whatever quoted them."""
        text = text.replace(self.dsn, "<dsn>")
        for pattern in (_PASSWORD_IN_URL, _PASSWORD_PARAM):
            for match in pattern.finditer(self.dsn):
                if match.group(2):
                    text = text.replace(match.group(2), "***")
        return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***\3", text))

    def _config_problem(self, error: BaseException) -> str:
        """What is wrong with the store's configuration, for people: the server's words and where, no secret."""
        where = _where(self.dsn)
        if isinstance(error, asyncpg.exceptions.InvalidPasswordError):
            problem = "authentication failed (wrong password)"
        elif isinstance(error, asyncpg.exceptions.InvalidAuthorizationSpecificationError):
            problem = f"authentication failed: {self._scrub(str(error))}"
        elif isinstance(error, asyncpg.exceptions.InvalidCatalogNameError):
            problem = self._scrub(str(error))
        elif isinstance(error, asyncpg.exceptions.InsufficientPrivilegeError):
            problem = f"permission denied: {self._scrub(str(error))}"
        elif isinstance(error, asyncpg.exceptions.ProtocolViolationError):
            problem = (
                f"{self._scrub(str(error))}: a pooler in transaction mode (PgBouncer) refuses session settings; "
                "add agentrun_pooler=transaction to the URL"
            )
        else:
            problem = f"malformed PostgreSQL DSN: {self._scrub(str(error))}"
        return f"PostgreSQL store at {where}: {problem}; check the store Secret's postgresDsn"

    @contextlib.asynccontextmanager
    async def _connection(self, *, txn: bool = False, snapshot: bool = False) -> AsyncIterator[Connection]:
        """A pooled connection for one call; in a transaction when asked, or always behind a transaction pooler.

        ``snapshot``: a read-only repeatable-read transaction (one snapshot for several reads). Behind a
        transaction pooler the transaction starts with the session's settings (``self._begin``); nothing
        outlives it. Raises what asyncpg raises (``_call`` classifies it).
        """
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            if not (txn or snapshot or self.pooler):
                yield conn
                return
            begin = self._begin.replace("BEGIN", _SNAPSHOT_BEGIN, 1) if snapshot else self._begin
            async with in_transaction(conn, begin):
                yield conn

    async def _write(self, op: str, txn: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``txn`` in one transaction, retried as ``_call`` says (``txn`` must be safe to run again)."""

        async def once() -> T:
            async with self._connection(txn=True) as conn:
                return await txn(conn)

        return await self._call(op, once)

    async def _read(
        self, op: str, query: Callable[[Connection], Awaitable[T]], *, snapshot: bool = False, patient: bool = True
    ) -> T:
        """Run a read, retried as ``_call`` says."""

        async def once() -> T:
            # snapshot: one snapshot for the state row and its messages (messages are updated in place).
            async with self._connection(snapshot=snapshot) as conn:
                return await query(conn)

        return await self._call(op, once, patient=patient)

    # -- life cycle ------------------------------------------------------------------------

    async def setup(self) -> None:
        """Connect and create or migrate the schema (fast when current), riding out an outage like any call.

        Raises ``StoreConfigError`` (bad DSN, credentials, database),
        ``StoreUnavailableError`` (unreachable past ``retry_timeout``) or ``StorageError``.
        """
        await self._call("setup", self._get_pool)

    @override
    async def aclose(self) -> None:
        await self._progress.aclose()  # before the pool goes: the last steps' notifications
        if self._stop_listener is not None:
            listener, self._stop_listener = self._stop_listener, None
            await listener.aclose()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), timeout=5)
            except (TimeoutError, *_DB_ERRORS):
                pool.terminate()
        self._setup_done = False

    # -- state -----------------------------------------------------------------------------

    async def aget(self, thread_id: str) -> Checkpoint | None:
        """The latest checkpoint, its state row and messages read in one snapshot."""
        return await self._read("aget", lambda conn: self._load_txn(conn, thread_id), snapshot=True)

    @staticmethod
    async def _load_txn(conn: Connection, thread_id: str) -> Checkpoint | None:
        rows = await conn.fetch(_LATEST, thread_id)
        if not rows:
            return None
        row = rows[-1]
        bodies = [r["body"] for r in await conn.fetch(_MESSAGES, thread_id, row["message_count"])]
        return Checkpoint(
            thread_id=thread_id,
            version=int(row["version"]),
            values=_fold(thread_id, rows),
            messages=Message.many_from_json_texts(bodies),
            current_node=row["current_node"],
            step=row["step"],
            status=row["status"],
            meta=_without_write_id(json.loads(row["meta"])),
            created_at=row["created_at"],
        )

    async def ahead(self, thread_id: str) -> Head | None:
        """Latest version and incarnation from one index lookup (what a cache entry must match)."""
        row = await self._read("head", lambda conn: conn.fetchrow(_HEAD_VERSION, thread_id))
        if row is None or row["version"] is None:
            return None
        return Head(int(row["version"]), row["incarnation"])

    @override
    async def acommit(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> Commit:
        check_thread_id(thread_id)
        # The id lets a retry recognize its own row when the first try's COMMIT went unacknowledged.
        write_id = uuid.uuid4().hex
        meta = _dumps({**write.meta, _WRITE_ID: write_id}, what="run metadata")
        bodies = [(index, message.id, _dumps(message.to_json(), what="a message")) for index, message in write.messages]
        fields = turn_fields(write)
        turn = (
            None
            if fields is None
            else (
                fields["request_key"],
                fields["run_uid"],
                fields["status"],
                None if fields["error"] is None else _dumps(fields["error"], what="the turn's error"),
                None if fields["result"] is None else _dumps(fields["result"], what="the turn's result"),
                _dumps(fields["tool_calls"], what="the turn's tool calls"),
            )
        )
        # Taken out while the write is in flight: after any failure the next write is a snapshot.
        chain = self._chains.pop(thread_id, None)
        delta = self._delta(chain, write, expected_version)
        while True:
            values = delta if delta is not None else _dumps(write.values, what="state")
            base = (chain.base, chain.incarnation) if delta is not None and chain is not None else (None, None)
            args = (
                thread_id,
                expected_version,
                attempt,
                run_uid,
                write_id,
                write.current_node,
                write.step,
                write.status,
                values,
                meta,
                write.message_count,
                [i for i, _, _ in bodies],
                [mid for _, mid, _ in bodies],
                [body for _, _, body in bodies],
                *(turn if turn is not None else (None,) * 6),
                *base,
            )
            try:
                commit = await self._call(
                    "checkpoint",
                    lambda args=args: self._put_one_statement(  # type: ignore[misc]
                        thread_id, args, expected_version, attempt, run_uid
                    ),
                )
            except _Rebase:
                log.info("checkpoint of %s: the delta's chain moved on; writing a full snapshot", thread_id)
                delta = None
                continue
            break
        if len(self._chains) >= _MAX_CHAINS:
            self._chains.clear()
        if delta is not None and chain is not None:
            self._chains[thread_id] = _Chain(
                chain.incarnation,
                commit.version,
                chain.base,
                chain.deltas + 1,
                chain.delta_bytes + len(values),
                chain.snapshot_bytes,
            )
        else:
            self._chains[thread_id] = _Chain(commit.incarnation, commit.version, commit.version, 0, 0, len(values))
        self._progress.committed(thread_id, final=write.status != "running")
        return commit

    async def _notify_progress(self, thread_id: str) -> None:
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            # Its own transaction in one simple query (no setting of the session needed): pooler or not.
            await conn.execute(notify_sql(thread_id))

    def _delta(self, chain: _Chain | None, write: CheckpointWrite, expected_version: int) -> str | None:
        """The JSON of only the channels ``write`` changed, when it may go on top of ``chain``; else ``None``.

        A snapshot instead when this store did not write the version the run
        starts from, when every channel changed, after ``snapshot_every``
        deltas, or once the deltas since the snapshot add up to its size: a
        restore reads at most ``snapshot_every + 1`` rows and about twice the
        state's size.
        """
        if (
            chain is None
            or write.changed is None
            or chain.version != expected_version
            or chain.deltas >= self.snapshot_every
        ):
            return None
        changed = {k: v for k, v in write.values.items() if k in write.changed}
        if len(changed) == len(write.values):
            return None
        text = _dumps(changed, what="state")
        return text if chain.delta_bytes + len(text) <= chain.snapshot_bytes else None

    async def _put_one_statement(
        self, thread_id: str, args: tuple[Any, ...], expected_version: int, attempt: int | None, run_uid: str | None
    ) -> Commit:
        """``_PUT_CHECKPOINT`` on a pooled connection (autocommit); the outcome turned into a commit or an error."""
        async with self._connection() as conn:
            try:
                if armed("in_checkpoint_txn"):
                    # The crash tests' fault point: killed after the insert, before the commit.
                    async with contextlib.nullcontext() if self.pooler else conn.transaction():
                        row = await conn.fetchrow(_PUT_CHECKPOINT, *args)
                        if row is not None and row["o_outcome"] == "ok":
                            fault_point("in_checkpoint_txn", str(row["o_version"]))
                else:
                    row = await conn.fetchrow(_PUT_CHECKPOINT, *args)
            except asyncpg.UniqueViolationError as e:
                # Unreachable while every writer takes the row lock; kept as the documented backstop.
                raise StaleStateError(thread_id, expected_version, expected_version + 1) from e
        assert row is not None  # a function with OUT parameters returns one row
        outcome = row["o_outcome"]
        if outcome == "ok":
            return Commit(int(row["o_version"]), row["o_incarnation"], float(row["o_created_at"]))
        if outcome == "committed":
            log.info("checkpoint version %d of %s had committed before the retry", expected_version + 1, thread_id)
            return Commit(expected_version + 1, row["o_incarnation"], float(row["o_created_at"]))
        if outcome == "stale":
            raise StaleStateError(thread_id, expected_version, int(row["o_version"]))
        if outcome == "fenced":
            owner = Owner(row["o_owner_run_uid"], int(row["o_owner_attempt"]))
            check_fence(thread_id, owner, attempt=attempt, run_uid=run_uid)
            raise FencedError(f"thread {thread_id!r} is owned by another attempt; this attempt must stop")
        if outcome == "rebase":
            raise _Rebase()
        raise StorageError(f"thread {thread_id!r} was deleted while being written, three times in a row")

    async def aget_progress(self, thread_id: str) -> Progress | None:
        """Latest version, node, step, owner and outcome from one indexed query (no messages read)."""
        row = await self._read("progress", lambda conn: conn.fetchrow(_PROGRESS, thread_id, PAUSED_SUFFIX))
        if row is None:
            return None
        meta = {key: _loads(row[key]) for key in PROGRESS_META}  # each a JSON value of the meta (_PROGRESS)
        if row["executed_since"]:
            calls = dict(meta.get("tool_calls") or {})
            calls["executed"] = int(calls.get("executed") or 0) + int(row["executed_since"])
            meta["tool_calls"] = calls
        return Progress.from_meta(
            meta,
            thread_id=thread_id,
            version=int(row["version"]),
            current_node=row["current_node"],
            step=row["step"],
            status=row["status"],
            updated_at=row["updated_at"],
            attempt=row["attempt"],
            run_uid=row["run_uid"],
            incarnation=row["incarnation"],
        )

    @override
    async def aget_turn(self, thread_id: str, request_key: str) -> Turn | None:
        row = await self._read("turn read", lambda conn: conn.fetchrow(_GET_TURN, thread_id, request_key))
        if row is None:
            return None
        return Turn(
            thread_id=thread_id,
            request_key=request_key,
            run_uid=row["run_uid"],
            status=row["status"],
            version=int(row["version"]),
            started_at=row["started_at"],
            updated_at=row["updated_at"],
            error=_loads(row["error"]),
            result=_loads(row["result"]),
            tool_calls=_loads(row["tool_calls"]) or {},
        )

    # -- ledger and intents ------------------------------------------------------------------

    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        """The entry of ``key``; lookups of one thread asked in the same loop turn share one query.

        The parallel calls of an assistant message look their keys up at once
        (the tool node starts them together), so a message costs one round trip
        of lookups, not one per call. A failed query fails each of its lookups.
        """
        return await self._lookups.ask(thread_id, key)

    async def _look_up(self, thread_id: str, asked: list[str]) -> list[LedgerEntry | None]:
        """One query for the keys ``asked`` (a key asked twice is read once): each one's entry, in order."""
        keys = list(dict.fromkeys(asked))
        if len(keys) == 1:
            row = await self._read("ledger read", lambda conn: conn.fetchrow(_GET_LEDGER, thread_id, keys[0]))
            rows = {} if row is None else {keys[0]: row}
        else:
            found = await self._read("ledger read", lambda conn: conn.fetch(_GET_LEDGER_MANY, thread_id, keys))
            rows = {r["tool_call_id"]: r for r in found}
        entries = {
            key: LedgerEntry(key, row["tool_name"], _loads(row["result"]), row["created_at"], text=row["result"])
            for key, row in rows.items()
        }
        return [entries.get(key) for key in asked]

    @override
    async def ledger_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        check_thread_id(thread_id)
        body = _dumps(result, what=f"the result of {tool_name}")
        queryable = None if "\\u0000" in body else body  # JSONB cannot hold U+0000; result_text can
        tries = 0

        async def once() -> bool:
            nonlocal tries
            tries += 1
            async with self._connection() as conn:
                row = await conn.fetchrow(
                    _PUT_TOOL_ROW, "tool_executions", thread_id, key, tool_name, queryable, body, None, attempt, run_uid
                )
                if _tool_row_outcome(thread_id, row, attempt=attempt, run_uid=run_uid):
                    # The operator counts a call once it is recorded (``_PROGRESS``), not at the step's end.
                    self._progress.committed(thread_id, final=False)
                    return True
                # A retry whose first try committed unacknowledged: exactly this writer's row means it landed.
                return tries > 1 and bool(
                    await conn.fetchval(_OWN_LEDGER, thread_id, key, tool_name, body, attempt, run_uid)
                )

        return await self._call("ledger record", once)

    @property
    @override
    def ledger_group_window(self) -> float:
        return self._ledger_group_window

    @override
    async def ledger_put_many(
        self,
        thread_id: str,
        rows: Sequence[LedgerRow],
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> list[bool]:
        """All of ``rows`` in one statement and one commit (migration 15), or none of them.

        A retry whose first try committed unacknowledged finds rows that are
        exactly this writer's (same text, attempt and run) and reports them recorded.
        """
        if len(rows) == 1:
            row = rows[0]
            return [
                await self.ledger_put(thread_id, row.key, row.tool_name, row.result, attempt=attempt, run_uid=run_uid)
            ]
        check_thread_id(thread_id)
        bodies = [_dumps(row.result, what=f"the result of {row.tool_name}") for row in rows]
        args = (
            thread_id,
            [row.key for row in rows],
            [row.tool_name for row in rows],
            [None if "\\u0000" in body else body for body in bodies],  # JSONB cannot hold U+0000; result_text can
            bodies,
            attempt,
            run_uid,
        )
        tries = 0

        async def once() -> list[bool]:
            nonlocal tries
            tries += 1
            async with self._connection() as conn:
                row = await conn.fetchrow(_PUT_TOOL_RESULTS, *args)
            _tool_row_outcome(thread_id, row, attempt=attempt, run_uid=run_uid, expected="ok")
            assert row is not None
            outcomes = [o == "inserted" or (o == "own" and tries > 1) for o in row["o_rows"]]
            if any(outcomes):
                self._progress.committed(thread_id, final=False)  # the operator counts recorded calls
            return outcomes

        return await self._call("ledger group record", once)

    @override
    async def ledger_replace(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        expected_text: str,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        check_thread_id(thread_id)
        body = _dumps(result, what=f"the result of {tool_name}")
        tries = 0

        async def txn(conn: Connection) -> str:
            nonlocal tries
            tries += 1
            return await self._ledger_write_txn(
                conn,
                thread_id,
                _REPLACE_LEDGER,
                (key, tool_name, body),
                attempt=attempt,
                run_uid=run_uid,
                success="UPDATE 1",
                retried=tries > 1,
                extra=(expected_text,),
            )

        return await self._write("ledger repair", txn) == "UPDATE 1"

    @staticmethod
    async def _ledger_write_txn(
        conn: Connection,
        thread_id: str,
        sql: str,
        row: tuple[str, str, str],
        *,
        attempt: int | None,
        run_uid: str | None,
        success: str,
        retried: bool,
        extra: tuple[str, ...] = (),
    ) -> str:
        """``_REPLACE_LEDGER`` of ``(key, tool name, body)``, fenced; returns the status tag.

        ``retried``: an earlier try may have committed unacknowledged; if the
        row is exactly this writer's, the tag is ``success`` (it did land).
        """
        await _fence_txn(conn, thread_id, attempt, run_uid)
        key, tool_name, body = row
        queryable = None if "\\u0000" in body else body  # JSONB cannot hold U+0000; result_text can
        status = str(await conn.execute(sql, thread_id, key, tool_name, queryable, body, attempt, run_uid, *extra))
        if (
            status != success
            and retried
            and await conn.fetchval(_OWN_LEDGER, thread_id, key, tool_name, body, attempt, run_uid)
        ):
            return success
        return status

    @override
    async def ledger_list(self, thread_id: str) -> list[LedgerEntry]:
        rows = await self._read("ledger list", lambda conn: conn.fetch(_LIST_LEDGER, thread_id))
        return [
            LedgerEntry(r["tool_call_id"], r["tool_name"], _loads(r["result"]), r["created_at"], text=r["result"])
            for r in rows
        ]

    @override
    async def intent_get(self, thread_id: str, key: str) -> Intent | None:
        row = await self._read("intent read", lambda conn: conn.fetchrow(_GET_INTENT, thread_id, key))
        if row is None:
            return None
        return Intent(key, row["tool_name"], row["idempotency_key"], row["started_at"], row["args_digest"])

    @override
    async def intent_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        args_digest: str | None = None,
    ) -> None:
        """A claim whose answer is not needed: the same statement (it keeps an intent already recorded)."""
        await self.intent_claim(
            thread_id, key, tool_name, idempotency_key, attempt=attempt, run_uid=run_uid, args_digest=args_digest
        )

    @override
    async def intent_claim(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        args_digest: str | None = None,
    ) -> Intent | None:
        """The recorded intent, or this one recorded; claims of one thread in one loop turn share one statement.

        The side-effect calls of an assistant message start together, so their
        intents cost one round trip (migration 17), not a lookup and an
        insert per call. A failed or fenced statement fails each of its claims.
        """
        check_thread_id(thread_id)
        return await self._claims.ask(
            (thread_id, attempt, run_uid), _Claim(key, tool_name, idempotency_key, args_digest)
        )

    async def _claim(self, writer: _Writer, claims: list[_Claim]) -> list[Intent | None]:
        """One statement for ``claims``: per claim the earlier intent, or ``None`` (recorded now)."""
        thread_id, attempt, run_uid = writer
        tries = 0

        def intent(
            claim: _Claim, outcome: str, tool: str | None, key: str | None, at: float | None, digest: str | None
        ) -> Intent | None:
            if outcome == "inserted" or (outcome == "own" and tries > 1):  # a retry finding its own first try
                return None
            return Intent(claim.key, str(tool), key, float(at or 0.0), digest)

        async def once() -> list[Intent | None]:
            nonlocal tries
            tries += 1
            async with self._connection() as conn:
                row = await conn.fetchrow(
                    _CLAIM_INTENTS,
                    thread_id,
                    [c.key for c in claims],
                    [c.tool_name for c in claims],
                    [c.idem for c in claims],
                    [c.args_digest for c in claims],
                    attempt,
                    run_uid,
                )
            _tool_row_outcome(thread_id, row, attempt=attempt, run_uid=run_uid)
            assert row is not None
            fields = zip(
                row["o_rows"],
                row["o_tool_names"],
                row["o_idempotency_keys"],
                row["o_started_at"],
                row["o_args_digests"],
                strict=True,
            )
            return [intent(c, *f) for c, f in zip(claims, fields, strict=True)]

        return await self._call("intent claim", once)

    # -- fencing, stop, threads ---------------------------------------------------------------

    @override
    async def register_attempt(self, thread_id: str, attempt: int, *, run_uid: str | None = None) -> None:
        check_thread_id(thread_id)
        await self._write(
            "attempt registration", lambda conn: self._register_attempt_txn(conn, thread_id, attempt, run_uid)
        )

    @staticmethod
    async def _register_attempt_txn(conn: Connection, thread_id: str, attempt: int, run_uid: str | None) -> None:
        await _lock_thread(conn, thread_id, _LOCK_THREAD)
        owner = _owner(await conn.fetchrow(_OWNER, thread_id))
        seen = run_uid is not None and bool(await conn.fetchval(_SEEN_RUN, thread_id, run_uid))
        owner = claim(thread_id, owner, attempt=attempt, run_uid=run_uid, seen=seen)
        await conn.execute(_PUT_OWNER, thread_id, owner.attempt, owner.run_uid)
        if run_uid is not None:
            await conn.execute(_RECORD_RUN, thread_id, run_uid)

    @override
    async def request_stop(self, thread_id: str, reason: str = "") -> None:
        check_thread_id(thread_id)
        await self._write("stop request", lambda conn: self._request_stop_txn(conn, thread_id, reason))

    @staticmethod
    async def _request_stop_txn(conn: Connection, thread_id: str, reason: str) -> None:
        await conn.execute(_ENSURE_THREAD, thread_id)
        await conn.execute(_REQUEST_STOP, thread_id, reason)

    @override
    async def put_run_inputs(
        self,
        thread_id: str,
        *,
        run_uid: str,
        attempt: int,
        input: dict[str, Any] | None,
        resume: dict[str, Any] | None,
    ) -> None:
        check_thread_id(thread_id)
        texts = [
            None if value is None else _dumps(value, what=what)
            for value, what in ((input, "input"), (resume, "resume"))
        ]

        async def txn(conn: Connection) -> None:
            await conn.execute(_ENSURE_THREAD, thread_id)
            await conn.execute(_PRUNE_RUN_INPUTS, thread_id, run_uid, attempt)
            await conn.execute(_PUT_RUN_INPUTS, thread_id, run_uid, attempt, *texts)

        await self._write("run inputs record", txn)

    @override
    async def aget_run_inputs(self, thread_id: str, *, run_uid: str, attempt: int) -> RunInputsRecord | None:
        row = await self._read(
            "run inputs read", lambda conn: conn.fetchrow(_GET_RUN_INPUTS, thread_id, run_uid, attempt)
        )
        if row is None:
            return None
        return RunInputsRecord(
            None if row["input"] is None else json.loads(row["input"]),
            None if row["resume"] is None else json.loads(row["resume"]),
        )

    @override
    async def stop_requested(self, thread_id: str) -> str | None:
        # Polled every second while a node runs: the next poll is the retry, so do not wait here.
        reason = await self._read("stop poll", lambda conn: conn.fetchval(_STOP_REQUESTED, thread_id), patient=False)
        return None if reason is None else str(reason)

    async def watch_stops(self, thread_id: str) -> StopWatch:
        """A watch due when a stop request for ``thread_id`` is notified (``pg_listen``), polling while unheard."""
        if not self.listen_for_stops:
            return StopWatch()
        if self._stop_listener is None:
            self._stop_listener = StopListener(self._connect_listener, sweep_interval=self.stop_sweep_interval)
        return self._stop_listener.watch(thread_id)

    def watch_progress(self, *, name: str = "agentrun-progress") -> AsyncGenerator[ProgressEvent, None]:
        """Progress as notified on ``listen_dsn`` (``pg_progress.hear``); nothing without a ``listen_dsn``.

        Opens no pool and never migrates: a listener (the operator, the history server) needs no schema.
        """
        dsn = self.listen_dsn
        if dsn is None:
            return nothing()
        timeout = self._pool_kwargs["timeout"]

        async def connect() -> asyncpg.Connection[asyncpg.Record]:
            return await asyncpg.connect(dsn, timeout=timeout, server_settings={"application_name": name})

        return events(lambda emit: hear(connect, emit))

    async def _connect_listener(self) -> asyncpg.Connection[asyncpg.Record]:
        """A connection of its own for LISTEN, with the pool's settings; raises what asyncpg raises."""
        await self._get_pool()  # the schema (and its notifying trigger) exists before anyone listens
        options = {k: v for k, v in self._pool_kwargs.items() if k not in _POOL_ONLY}
        settings = {**options.pop("server_settings", {}), "application_name": "agentrun-stop-listener"}
        return await asyncpg.connect(self.dsn, server_settings=settings, **options)

    @override
    async def clear_stop(self, thread_id: str) -> None:
        await self._write("stop acknowledgement", lambda conn: conn.execute(_CLEAR_STOP, thread_id))

    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread; states, messages, ledger, intents, stop request and owner go by cascade."""
        self._chains.pop(thread_id, None)
        await self._write("thread deletion", lambda conn: conn.execute(_DELETE_THREAD, thread_id))

    @override
    async def list_threads(self) -> list[str]:
        rows = await self._read("thread list", lambda conn: conn.fetch(_LIST_THREADS))
        return [r["thread_id"] for r in rows]

    async def thread_rows(self, thread_id: str, *, run_uid: str | None = None) -> ThreadRows:
        """Everything the run history shows of ``thread_id`` (``pg_history``), from one read-only snapshot.

        A row PostgreSQL cannot read does not fail the read: it is read again carefully, naming that row.
        """
        try:
            return await self._read(
                "history read", lambda conn: thread_rows_txn(conn, thread_id, run_uid), snapshot=True, patient=False
            )
        except UnreadableRowError as e:
            log.warning("history of %s: %s; reading it row by row", thread_id, e)
        return await self._read(
            "history read",
            lambda conn: thread_rows_txn(conn, thread_id, run_uid, careful=True),
            snapshot=True,
            patient=False,
        )

    async def thread_conversation(
        self, thread_id: str, *, run_uid: str | None = None
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int, str | None]:
        """The run's input, the thread's newest messages, their total and the run's graph structure (JSON text)
        (``pg_inspect``), in one snapshot."""

        async def read(conn: Connection) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int, str | None]:
            found = await pg_inspect.input_txn(conn, thread_id, run_uid)
            rows, total = await pg_inspect.conversation_txn(conn, thread_id)
            return found, rows, total, await pg_inspect.graph_txn(conn, thread_id, run_uid)

        return await self._read("conversation read", read, snapshot=True, patient=False)

    async def thread_step(self, thread_id: str, version: int) -> dict[str, Any] | None:
        """One state version of ``thread_id``: its state by key, the one before, its messages (``pg_inspect``)."""
        return await self._read(
            "step read", lambda conn: pg_inspect.step_txn(conn, thread_id, version), snapshot=True, patient=False
        )

    async def find_run(self, namespace: str, name: str) -> tuple[str, str | None] | None:
        """The thread and run uid a (deleted) AgentRun recorded its turn under, by its derived request key."""
        return await self._read("history lookup", lambda conn: find_run_txn(conn, namespace, name), patient=False)

    async def recorded_runs(self, namespace: str | None, *, limit: int = 500) -> list[dict[str, Any]]:
        """The AgentRuns that recorded a turn (``namespace``'s, or all), newest first: the run list's archive."""
        return await self._read(
            "history list", lambda conn: recorded_runs_txn(conn, namespace, limit), snapshot=True, patient=False
        )
