"""PostgreSQL store, connection and retries: the pool, the retry loop and its error classes, transactions.

Part of ``PgCheckpointer`` (``postgres``), which composes this base with ``pg_state`` (checkpoints),
``pg_ledger`` (ledger and intents) and ``pg_history`` (the history reads); the guarantees and HAZARDS of
the whole store are ``postgres``'s docstring. Also the helpers every part uses (JSON, thread ids, the
thread row lock and the fence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
from typing_extensions import override

from ..errors import FencedError, StaleStateError, StorageError, StoreConfigError, StoreUnavailableError
from .base import (
    Checkpointer,
    Owner,
    check_fence,
)
from .pg_listen import StopListener
from .pg_progress import ProgressNotifier
from .pg_schema import (
    MAX_THREAD_ID_LENGTH,
    MIGRATIONS,
    apply_migrations,
)
from .pg_schema import transaction as in_transaction

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    from .pg_schema import Connection

log = logging.getLogger("agentrun.checkpoint.postgres")  # one logger for the store, whichever module

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
# How long the spare connection stays out of the pool unused (``PgConnection._keep_spare``).
SPARE_SECONDS = 1.0
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


class PgConnection(Checkpointer):
    """The pool and the retry loop of ``PgCheckpointer`` (abstract: the store is ``postgres.PgCheckpointer``)."""

    # Set by PgCheckpointer.__init__ (the one constructor of the composed store).
    dsn: str
    pooler: str | None
    listen_dsn: str | None
    retry_timeout: float
    retry_base_delay: float
    retry_max_delay: float
    _outage_since: float | None
    _last_failure: float
    schema: str
    thread_id_type: str
    _pool_kwargs: dict[str, Any]
    _begin: str
    _pool: asyncpg.Pool[asyncpg.Record] | None
    _pool_lock: asyncio.Lock
    _setup_done: bool
    listen_for_stops: bool
    stop_sweep_interval: float
    _stop_listener: StopListener | None
    _progress: ProgressNotifier
    # The connection kept out of the pool for the next call (``_keep_spare``); class defaults, so the
    # constructor (``postgres``) need not know.
    _spare: PoolConnectionProxy[asyncpg.Record] | None = None
    _spare_uses = 0
    _spare_timer: asyncio.TimerHandle | None = None
    _closing = False  # aclose is under way: no call keeps a spare
    _releasing: asyncio.Future[None] | None = None  # the timer's release in flight (a reference keeps it alive)

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
    async def _connection(
        self, *, txn: bool = False, snapshot: bool = False, raw: bool = False
    ) -> AsyncIterator[Connection]:
        """A pooled connection for one call; in a transaction when asked, or always behind a transaction pooler.

        ``snapshot``: a read-only repeatable-read transaction (one snapshot for several reads). Behind a
        transaction pooler the transaction starts with the session's settings (``self._begin``); nothing
        outlives it. ``raw``: never a transaction of ours (the statement brings its own). Raises what asyncpg
        raises (``_call`` classifies it).

        The connection comes from the store's spare when there is one (``_keep_spare``), else the pool.
        """
        pool = await self._get_pool()
        conn = self._spare
        self._spare = None
        if conn is None or conn.is_closed():
            if conn is not None:
                await pool.release(conn)  # asyncpg ends a closed one and frees its slot
            conn = await pool.acquire()
        clean = False
        try:
            if raw or not (txn or snapshot or self.pooler):
                yield conn
            else:
                begin = self._begin.replace("BEGIN", _SNAPSHOT_BEGIN, 1) if snapshot else self._begin
                async with in_transaction(conn, begin):
                    yield conn
            clean = True
        finally:
            if not (clean and self._keep_spare(conn, pool)):
                await pool.release(conn)

    def _keep_spare(self, conn: PoolConnectionProxy[asyncpg.Record], pool: asyncpg.Pool) -> bool:
        """Keep ``conn`` out of the pool for the next call, when it is clean and no other is kept.

        Why: asyncpg's ``Pool.acquire`` and ``release`` are Python (a holder, a proxy, a future, a shielded
        release task): about a tenth of a plain durable step's CPU. A run stepping back to back takes the
        same connection from call to call instead; one that waits (a long node, a human) gives it back to
        the pool after ``SPARE_SECONDS`` unused (a timer per interval, not per call), so the pool's own
        care of idle connections (lifetime, expiry, close) applies. Only a connection that finished its
        call without an error, outside a transaction and open is kept; at most one, so the pool's other
        connections serve everything else (nothing here waits for the spare).

        Never while the store closes, nor from a pool that is no longer the store's: a call still running
        then (a run's step while its store was closed under it) kept a connection its pool had already let go,
        and the next call took it and failed ("released back to the pool"), retried as an outage.
        """
        if self._spare is not None or self._closing or pool is not self._pool:
            return False
        if conn.is_in_transaction() or conn.is_closed():
            return False
        self._spare = conn
        self._spare_uses += 1
        if self._spare_timer is None:
            self._spare_timer = asyncio.get_running_loop().call_later(SPARE_SECONDS, self._spare_idle, self._spare_uses)
        return True

    def _spare_idle(self, uses: int) -> None:
        """The timer: give the spare back to the pool if nobody took it since the timer was armed."""
        self._spare_timer = None
        conn = self._spare
        if conn is None:
            return  # taken: the call that keeps it again arms the next timer
        if self._spare_uses != uses:  # kept again meanwhile: look again one interval later
            self._spare_timer = asyncio.get_running_loop().call_later(SPARE_SECONDS, self._spare_idle, self._spare_uses)
            return
        self._spare = None
        self._releasing = asyncio.ensure_future(self._release(conn))

    async def _release(self, conn: PoolConnectionProxy[asyncpg.Record]) -> None:
        if self._pool is not None:
            with contextlib.suppress(*_DB_ERRORS):
                await self._pool.release(conn)

    async def _drop_spare(self) -> None:
        """Give the spare back (before the pool closes: ``Pool.close`` waits for every acquired connection)."""
        if self._spare_timer is not None:
            self._spare_timer.cancel()
            self._spare_timer = None
        conn, self._spare = self._spare, None
        if conn is not None:
            await self._release(conn)
        if self._releasing is not None:
            releasing, self._releasing = self._releasing, None
            await asyncio.gather(releasing, return_exceptions=True)

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
        self._closing = True
        try:
            await self._aclose()
        finally:
            self._closing = False

    async def _aclose(self) -> None:
        await self._progress.aclose()  # before the pool goes: the last steps' notifications
        if self._stop_listener is not None:
            listener, self._stop_listener = self._stop_listener, None
            await listener.aclose()
        await self._drop_spare()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), timeout=5)
            except (TimeoutError, *_DB_ERRORS):
                pool.terminate()
        self._setup_done = False
