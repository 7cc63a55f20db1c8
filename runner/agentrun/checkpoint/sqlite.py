"""The embedded checkpointer: one SQLite file, safe for several local processes.

WAL mode lets readers proceed while one process writes; every write runs in
``BEGIN IMMEDIATE``, which takes SQLite's single write lock up front. That
lock plays the part of PostgreSQL's ``SELECT ... FOR UPDATE``: the version
check and the insert of the next version happen with no other writer in
between, so of two processes that loaded the same version exactly one
commits and the other gets ``StaleStateError``.

All SQL runs on one private worker thread per checkpointer (sqlite3
connections are not shared across threads), so the event loop never blocks
on disk I/O.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from typing_extensions import override

from ..errors import StaleStateError, StorageError
from ..messages import stored_messages
from .base import (
    Checkpoint,
    Checkpointer,
    CheckpointWrite,
    Commit,
    Head,
    Intent,
    LedgerEntry,
    Owner,
    RunInputsRecord,
    Turn,
    check_fence,
    claim,
    turn_fields,
)

T = TypeVar("T")

# The position of a migration in this list is the schema version it produces
# (PRAGMA user_version). Append only; never edit a released step.
MIGRATIONS: list[str] = [
    # 1: threads, versioned states, messages
    """
    CREATE TABLE IF NOT EXISTS threads (
        thread_id TEXT PRIMARY KEY,
        created_at REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS states (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        version INTEGER NOT NULL,
        current_node TEXT,
        step INTEGER NOT NULL,
        status TEXT NOT NULL,
        state_values TEXT NOT NULL,
        meta TEXT NOT NULL,
        message_count INTEGER NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (thread_id, version)
    );
    CREATE TABLE IF NOT EXISTS messages (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        message_id TEXT,
        body TEXT NOT NULL,
        version INTEGER NOT NULL,
        PRIMARY KEY (thread_id, idx)
    );
    """,
    # 2: the tool ledger and intents
    """
    CREATE TABLE IF NOT EXISTS tool_executions (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        tool_call_id TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        result TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (thread_id, tool_call_id)
    );
    CREATE TABLE IF NOT EXISTS tool_intents (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        tool_call_id TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        idempotency_key TEXT,
        started_at REAL NOT NULL,
        PRIMARY KEY (thread_id, tool_call_id)
    );
    """,
    # 3: stop requests and fencing
    """
    CREATE TABLE IF NOT EXISTS stop_requests (
        thread_id TEXT PRIMARY KEY REFERENCES threads(thread_id) ON DELETE CASCADE,
        reason TEXT NOT NULL,
        requested_at REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS attempts (
        thread_id TEXT PRIMARY KEY REFERENCES threads(thread_id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        registered_at REAL NOT NULL
    );
    """,
    # 4: fencing across AgentRuns (the owner's run uid, every run that registered) and thread incarnations
    """
    ALTER TABLE attempts ADD COLUMN run_uid TEXT;
    CREATE TABLE IF NOT EXISTS thread_runs (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        run_uid TEXT NOT NULL,
        registered_at REAL NOT NULL,
        PRIMARY KEY (thread_id, run_uid)
    );
    -- NULL on threads created before this migration: they read as incarnation 'legacy'.
    ALTER TABLE threads ADD COLUMN incarnation TEXT;
    """,
    # 5: run inputs (input and resume of an attempt, too large for the environment)
    """
    CREATE TABLE IF NOT EXISTS run_inputs (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        run_uid TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        input TEXT,
        resume TEXT,
        created_at REAL NOT NULL,
        PRIMARY KEY (thread_id, run_uid, attempt)
    );
    """,
    # 6: turns (one per request key on a thread: its status, result and error)
    """
    CREATE TABLE IF NOT EXISTS turns (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        request_key TEXT NOT NULL,
        run_uid TEXT,
        status TEXT NOT NULL,
        version INTEGER NOT NULL,
        error TEXT,
        result TEXT,
        tool_calls TEXT NOT NULL,
        started_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (thread_id, request_key)
    );
    """,
    # 7: LangGraph checkpoints, channel blobs and pending writes (agentrun.integrations.langgraph), by our threads
    """
    CREATE TABLE IF NOT EXISTS lg_checkpoints (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        parent_checkpoint_id TEXT,
        checkpoint_type TEXT NOT NULL,
        checkpoint BLOB NOT NULL,
        metadata_type TEXT NOT NULL,
        metadata BLOB NOT NULL,
        channel_versions TEXT NOT NULL,
        run_id TEXT,
        attempt INTEGER,
        run_uid TEXT,
        created_at REAL NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    );
    CREATE INDEX IF NOT EXISTS lg_checkpoints_run_id ON lg_checkpoints (run_id);
    CREATE TABLE IF NOT EXISTS lg_blobs (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        checkpoint_ns TEXT NOT NULL,
        channel TEXT NOT NULL,
        version TEXT NOT NULL,
        blob_type TEXT NOT NULL,
        blob BLOB,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
    );
    CREATE TABLE IF NOT EXISTS lg_writes (
        thread_id TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        value_type TEXT NOT NULL,
        value BLOB,
        task_path TEXT NOT NULL DEFAULT '',
        attempt INTEGER,
        run_uid TEXT,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    );
    """,
    # 8: the arguments digest of an intent (a start of the key with other arguments is another call's)
    """
    ALTER TABLE tool_intents ADD COLUMN args_digest TEXT;
    """,
]

# OR IGNORE: the thread row is created once; a new incarnation only after a deletion.
_ENSURE_THREAD = "INSERT OR IGNORE INTO threads (thread_id, created_at, incarnation) VALUES (?, ?, ?)"
_HEAD = """
    SELECT COALESCE(t.incarnation, 'legacy'), (SELECT MAX(version) FROM states s WHERE s.thread_id = t.thread_id)
    FROM threads t WHERE t.thread_id = ?
"""
_OWNER = "SELECT run_uid, attempt FROM attempts WHERE thread_id = ?"
_SEEN_RUN = "SELECT 1 FROM thread_runs WHERE thread_id = ? AND run_uid = ?"
# The write lock is held (BEGIN IMMEDIATE), and claim() decided: the row simply takes the new owner.
_PUT_OWNER = """
    INSERT INTO attempts (thread_id, attempt, run_uid, registered_at) VALUES (?, ?, ?, ?)
    ON CONFLICT (thread_id) DO UPDATE SET attempt = excluded.attempt, run_uid = excluded.run_uid,
        registered_at = excluded.registered_at
"""
# DO NOTHING: the first registration of a run on the thread is the one that matters.
_RECORD_RUN = """
    INSERT INTO thread_runs (thread_id, run_uid, registered_at) VALUES (?, ?, ?)
    ON CONFLICT (thread_id, run_uid) DO NOTHING
"""
# Upsert: the operator may write an attempt's inputs again (a retried reconcile); the last write wins.
_PUT_RUN_INPUTS = """
    INSERT INTO run_inputs (thread_id, run_uid, attempt, input, resume, created_at) VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, run_uid, attempt) DO UPDATE SET input = excluded.input, resume = excluded.resume,
        created_at = excluded.created_at
"""
# A run's runner reads its inputs once, at start: older attempts' rows are dead weight.
_PRUNE_RUN_INPUTS = "DELETE FROM run_inputs WHERE thread_id = ? AND run_uid = ? AND attempt < ?"
_GET_RUN_INPUTS = "SELECT input, resume FROM run_inputs WHERE thread_id = ? AND run_uid = ? AND attempt = ?"
# Upsert: a turn is recorded at its first checkpoint and again at each interrupted or terminal one;
# started_at stays the first write's.
_PUT_TURN = """
    INSERT INTO turns (thread_id, request_key, run_uid, status, version, error, result, tool_calls, started_at,
                       updated_at)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, request_key) DO UPDATE SET run_uid = excluded.run_uid, status = excluded.status,
        version = excluded.version, error = excluded.error, result = excluded.result,
        tool_calls = excluded.tool_calls, updated_at = excluded.updated_at
"""
_GET_TURN = """
    SELECT run_uid, status, version, error, result, tool_calls, started_at, updated_at
    FROM turns WHERE thread_id = ? AND request_key = ?
"""
_MAX_VERSION = "SELECT COALESCE(MAX(version), 0) FROM states WHERE thread_id = ?"
_LATEST = """
    SELECT version, current_node, step, status, state_values, meta, message_count, created_at
    FROM states WHERE thread_id = ? ORDER BY version DESC LIMIT 1
"""
_INSERT_STATE = """
    INSERT INTO states (thread_id, version, current_node, step, status, state_values, meta, message_count, created_at)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
# Upsert: an index below the stored count replaces a message (add_messages with a known id).
_PUT_MESSAGE = """
    INSERT INTO messages (thread_id, idx, message_id, body, version) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, idx) DO UPDATE SET message_id = excluded.message_id,
        body = excluded.body, version = excluded.version
"""
# DO NOTHING: the first recorded result stays authoritative.
_PUT_LEDGER = """
    INSERT INTO tool_executions (thread_id, tool_call_id, tool_name, result, created_at) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, tool_call_id) DO NOTHING
"""
# Compare-and-swap on the exact stored text: of two repairers only the first matches.
_REPLACE_LEDGER = """
    UPDATE tool_executions SET result = ?
    WHERE thread_id = ? AND tool_call_id = ? AND tool_name = ? AND result = ?
"""
_PUT_INTENT = """
    INSERT INTO tool_intents (thread_id, tool_call_id, tool_name, idempotency_key, started_at, args_digest)
    VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id, tool_call_id) DO NOTHING
"""


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise StorageError(f"state is not JSON-serializable: {e}") from e


class SqliteCheckpointer(Checkpointer):
    """``SqliteCheckpointer("agentrun.db")``; ``":memory:"`` works for one process."""

    backend = "sqlite"

    def __init__(self, path: str | Path = "agentrun.db", *, busy_timeout: float = 30.0) -> None:
        self.path = str(path)
        self.busy_timeout = busy_timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrun-sqlite")
        self._conn: sqlite3.Connection | None = None

    # -- plumbing ------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL" if self.path == ":memory:" else "PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            return fn(self._connection())

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except sqlite3.Error as e:
            raise StorageError(f"sqlite {self.path}: {e}") from e

    @staticmethod
    def _write_txn(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    @staticmethod
    def _ensure_thread(conn: sqlite3.Connection, thread_id: str, now: float) -> None:
        conn.execute(_ENSURE_THREAD, (thread_id, now, uuid.uuid4().hex))

    @staticmethod
    def _owner(conn: sqlite3.Connection, thread_id: str) -> Owner | None:
        row = conn.execute(_OWNER, (thread_id,)).fetchone()
        return None if row is None else Owner(row[0], int(row[1]))

    @classmethod
    def _check_fence(cls, conn: sqlite3.Connection, thread_id: str, attempt: int | None, run_uid: str | None) -> None:
        check_fence(thread_id, cls._owner(conn, thread_id), attempt=attempt, run_uid=run_uid)

    # -- schema ----------------------------------------------------------------

    @override
    async def setup(self) -> None:
        def migrate(conn: sqlite3.Connection) -> None:
            if conn.execute("PRAGMA user_version").fetchone()[0] >= len(MIGRATIONS):
                return  # fast path: already current, no write lock taken

            def apply(c: sqlite3.Connection) -> None:
                # Re-read under the write lock: another process may have migrated meanwhile.
                current = c.execute("PRAGMA user_version").fetchone()[0]
                for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
                    for statement in filter(str.strip, script.split(";")):
                        c.execute(statement)
                    c.execute(f"PRAGMA user_version = {version}")

            self._write_txn(conn, apply)

        await self._run(migrate)

    @override
    async def aclose(self) -> None:
        def close(conn: sqlite3.Connection) -> None:
            conn.close()

        if self._conn is not None:
            await self._run(close)
            self._conn = None
        self._executor.shutdown(wait=True)

    # -- state -------------------------------------------------------------------

    @override
    async def aget(self, thread_id: str) -> Checkpoint | None:
        def load(conn: sqlite3.Connection) -> Checkpoint | None:
            # One read transaction so the state row and its messages are a consistent snapshot.
            conn.execute("BEGIN")
            try:
                row = conn.execute(_LATEST, (thread_id,)).fetchone()
                if row is None:
                    return None
                version, node, step, status, values, meta, count, created = row
                # The id column too: the reducer's index without validating a message (each is validated
                # when first used: ``messages.stored_messages``).
                stored = conn.execute(
                    "SELECT message_id, body FROM messages WHERE thread_id = ? AND idx < ? ORDER BY idx",
                    (thread_id, count),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            return Checkpoint(
                thread_id=thread_id,
                version=version,
                values=json.loads(values),
                messages=stored_messages([i for i, _ in stored], [b for _, b in stored]),
                current_node=node,
                step=step,
                status=status,
                meta=json.loads(meta),
                created_at=created,
            )

        return await self._run(load)

    @override
    async def ahead(self, thread_id: str) -> Head | None:
        def get(conn: sqlite3.Connection) -> Head | None:
            row = conn.execute(_HEAD, (thread_id,)).fetchone()
            return None if row is None or row[1] is None else Head(int(row[1]), str(row[0]))

        return await self._run(get)

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
        values, meta = _dumps(write.values), _dumps(write.meta)
        bodies = [(i, m.id, json.dumps(m.to_json(), separators=(",", ":"))) for i, m in write.messages]
        now = time.time()
        turn = turn_fields(write)

        def put(conn: sqlite3.Connection) -> Commit:
            self._ensure_thread(conn, thread_id, now)
            self._check_fence(conn, thread_id, attempt, run_uid)
            current = int(conn.execute(_MAX_VERSION, (thread_id,)).fetchone()[0])
            if current != expected_version:
                raise StaleStateError(thread_id, expected_version, current)
            version = current + 1
            conn.execute(
                _INSERT_STATE,
                (
                    thread_id,
                    version,
                    write.current_node,
                    write.step,
                    write.status,
                    values,
                    meta,
                    write.message_count,
                    now,
                ),
            )
            conn.executemany(_PUT_MESSAGE, [(thread_id, i, mid, body, version) for i, mid, body in bodies])
            if turn is not None:
                conn.execute(
                    _PUT_TURN,
                    (
                        thread_id,
                        turn["request_key"],
                        turn["run_uid"],
                        turn["status"],
                        version,
                        None if turn["error"] is None else _dumps(turn["error"]),
                        None if turn["result"] is None else _dumps(turn["result"]),
                        _dumps(turn["tool_calls"]),
                        now,
                        now,
                    ),
                )
            incarnation = conn.execute(_HEAD, (thread_id,)).fetchone()[0]
            return Commit(version, str(incarnation), now)

        return await self._run(lambda conn: self._write_txn(conn, put))

    @override
    async def aget_turn(self, thread_id: str, request_key: str) -> Turn | None:
        def get(conn: sqlite3.Connection) -> Turn | None:
            row = conn.execute(_GET_TURN, (thread_id, request_key)).fetchone()
            if row is None:
                return None
            run_uid, status, version, error, result, tool_calls, started, updated = row
            return Turn(
                thread_id=thread_id,
                request_key=request_key,
                run_uid=run_uid,
                status=status,
                version=int(version),
                started_at=started,
                updated_at=updated,
                error=None if error is None else json.loads(error),
                result=None if result is None else json.loads(result),
                tool_calls=json.loads(tool_calls),
            )

        return await self._run(get)

    # -- ledger and intents ------------------------------------------------------

    @override
    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        def get(conn: sqlite3.Connection) -> LedgerEntry | None:
            row = conn.execute(
                "SELECT tool_name, result, created_at FROM tool_executions WHERE thread_id = ? AND tool_call_id = ?",
                (thread_id, key),
            ).fetchone()
            if row is None:
                return None
            try:
                result = json.loads(row[1])
            except (TypeError, ValueError):
                result = None  # unreadable: the engine treats it as a miss
            return LedgerEntry(key, row[0], result, row[2], text=row[1])

        return await self._run(get)

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
        body, now = _dumps(result), time.time()

        def put(conn: sqlite3.Connection) -> bool:
            self._ensure_thread(conn, thread_id, now)
            self._check_fence(conn, thread_id, attempt, run_uid)
            return conn.execute(_PUT_LEDGER, (thread_id, key, tool_name, body, now)).rowcount == 1

        return await self._run(lambda conn: self._write_txn(conn, put))

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
        body = _dumps(result)

        def replace(conn: sqlite3.Connection) -> bool:
            self._check_fence(conn, thread_id, attempt, run_uid)
            return conn.execute(_REPLACE_LEDGER, (body, thread_id, key, tool_name, expected_text)).rowcount == 1

        return await self._run(lambda conn: self._write_txn(conn, replace))

    @override
    async def ledger_list(self, thread_id: str) -> list[LedgerEntry]:
        def get(conn: sqlite3.Connection) -> list[LedgerEntry]:
            rows = conn.execute(
                "SELECT tool_call_id, tool_name, result, created_at FROM tool_executions "
                "WHERE thread_id = ? ORDER BY created_at, tool_call_id",
                (thread_id,),
            ).fetchall()
            entries = []
            for key, name, body, created in rows:
                try:
                    result = json.loads(body)
                except (TypeError, ValueError):
                    result = None
                entries.append(LedgerEntry(key, name, result, created, text=body))
            return entries

        return await self._run(get)

    @override
    async def intent_get(self, thread_id: str, key: str) -> Intent | None:
        def get(conn: sqlite3.Connection) -> Intent | None:
            row = conn.execute(
                "SELECT tool_name, idempotency_key, started_at, args_digest FROM tool_intents "
                "WHERE thread_id = ? AND tool_call_id = ?",
                (thread_id, key),
            ).fetchone()
            return None if row is None else Intent(key, row[0], row[1], row[2], row[3])

        return await self._run(get)

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
        now = time.time()

        def put(conn: sqlite3.Connection) -> None:
            self._ensure_thread(conn, thread_id, now)
            self._check_fence(conn, thread_id, attempt, run_uid)
            conn.execute(_PUT_INTENT, (thread_id, key, tool_name, idempotency_key, now, args_digest))

        await self._run(lambda conn: self._write_txn(conn, put))

    # -- fencing, stop, threads ----------------------------------------------------

    @override
    async def register_attempt(self, thread_id: str, attempt: int, *, run_uid: str | None = None) -> None:
        now = time.time()

        def put(conn: sqlite3.Connection) -> None:
            self._ensure_thread(conn, thread_id, now)
            seen = run_uid is not None and conn.execute(_SEEN_RUN, (thread_id, run_uid)).fetchone() is not None
            owner = claim(thread_id, self._owner(conn, thread_id), attempt=attempt, run_uid=run_uid, seen=seen)
            conn.execute(_PUT_OWNER, (thread_id, owner.attempt, owner.run_uid, now))
            if run_uid is not None:
                conn.execute(_RECORD_RUN, (thread_id, run_uid, now))

        await self._run(lambda conn: self._write_txn(conn, put))

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
        texts = [None if value is None else _dumps(value) for value in (input, resume)]
        now = time.time()

        def put(conn: sqlite3.Connection) -> None:
            self._ensure_thread(conn, thread_id, now)
            conn.execute(_PRUNE_RUN_INPUTS, (thread_id, run_uid, attempt))
            conn.execute(_PUT_RUN_INPUTS, (thread_id, run_uid, attempt, *texts, now))

        await self._run(lambda conn: self._write_txn(conn, put))

    @override
    async def aget_run_inputs(self, thread_id: str, *, run_uid: str, attempt: int) -> RunInputsRecord | None:
        def get(conn: sqlite3.Connection) -> tuple[str | None, str | None] | None:
            row = conn.execute(_GET_RUN_INPUTS, (thread_id, run_uid, attempt)).fetchone()
            return None if row is None else (row[0], row[1])

        row = await self._run(get)
        if row is None:
            return None
        return RunInputsRecord(*(None if text is None else json.loads(text) for text in row))

    @override
    async def request_stop(self, thread_id: str, reason: str = "") -> None:
        now = time.time()

        def put(conn: sqlite3.Connection) -> None:
            self._ensure_thread(conn, thread_id, now)
            conn.execute(
                "INSERT INTO stop_requests (thread_id, reason, requested_at) VALUES (?, ?, ?) "
                "ON CONFLICT (thread_id) DO NOTHING",
                (thread_id, reason, now),
            )

        await self._run(lambda conn: self._write_txn(conn, put))

    @override
    async def stop_requested(self, thread_id: str) -> str | None:
        def get(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT reason FROM stop_requests WHERE thread_id = ?", (thread_id,)).fetchone()
            return None if row is None else str(row[0])

        return await self._run(get)

    @override
    async def clear_stop(self, thread_id: str) -> None:
        await self._run(
            lambda conn: self._write_txn(
                conn, lambda c: c.execute("DELETE FROM stop_requests WHERE thread_id = ?", (thread_id,))
            )
        )

    @override
    async def delete_thread(self, thread_id: str) -> None:
        await self._run(
            lambda conn: self._write_txn(
                conn, lambda c: c.execute("DELETE FROM threads WHERE thread_id = ?", (thread_id,))
            )
        )

    @override
    async def list_threads(self) -> list[str]:
        def get(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT thread_id FROM threads t WHERE EXISTS (SELECT 1 FROM states s WHERE s.thread_id = t.thread_id) "
                "ORDER BY created_at"
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(get)
