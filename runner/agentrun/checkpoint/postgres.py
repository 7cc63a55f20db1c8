"""The production checkpointer: PostgreSQL through an asyncpg pool.

``PgCheckpointer`` is composed by concern, one module each: ``pg_connection``
(the pool, retries, transactions, the fence), ``pg_state`` (checkpoints),
``pg_ledger`` (ledger and intents), ``pg_reads`` (the history reads); this
module holds its constructor, fencing registration, stops, run inputs and
threads. The guarantees below are the whole store's.

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
import json
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import asyncpg
from typing_extensions import override

from .base import (
    RunInputsRecord,
    StopWatch,
    claim,
)
from .batch import TurnBatch
from .group import LEDGER_GROUP_WINDOW
from .listen import ProgressEvent, events, nothing
from .pg_connection import (
    _ENSURE_THREAD,
    _LOCK_THREAD,
    _OWNER,
    _POOL_ONLY,
    _POOLER_STARTUP_PARAMETERS,
    _PUT_OWNER,
    _RECORD_RUN,
    _SEEN_RUN,
    _dumps,
    _keep_session,
    _literal,
    _lock_thread,
    _owner,
    check_thread_id,
)
from .pg_connection import _fence_txn as _fence_txn  # re-exported: tests fence by hand
from .pg_connection import _tool_row_outcome as _tool_row_outcome  # re-exported (tests)
from .pg_ledger import PgLedger
from .pg_listen import StopListener
from .pg_progress import ProgressNotifier, hear
from .pg_reads import PgHistory
from .pg_schema import (
    normalize_thread_id_type,
    validate_schema_name,
)
from .pg_state import PgState, _Chain
from .pg_url import TRANSACTION, parse_store_url

if TYPE_CHECKING:
    from .pg_schema import Connection

log = logging.getLogger("agentrun.checkpoint.postgres")

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


class PgCheckpointer(PgState, PgLedger, PgHistory):
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
    rides_lg_steps = True  # acommit_with_lg_step (pg_state): a LangGraph run's progress row in its step's statement

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
