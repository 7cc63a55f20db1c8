"""PostgreSQL store, checkpoints: versioned state rows (snapshots and deltas), messages, progress, turns.

Part of ``PgCheckpointer`` (``postgres``); the guarantees are ``postgres``'s docstring ("Versioned writes",
"State rows carry only what changed").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
from typing_extensions import override

from ..errors import FencedError, StaleStateError, StorageError
from ..faults import armed, fault_point
from ..messages import stored_messages
from .base import (
    PAUSED_SUFFIX,
    PROGRESS_META,
    Checkpoint,
    CheckpointWrite,
    Commit,
    Head,
    Owner,
    Progress,
    Turn,
    check_fence,
    turn_fields,
)
from .pg_connection import _MAX_CHAINS, _WRITE_ID, PgConnection, _dumps, _loads, _without_write_id, check_thread_id
from .pg_progress import notify_sql

if TYPE_CHECKING:
    from .pg_schema import Connection

log = logging.getLogger("agentrun.checkpoint.postgres")  # one logger for the store, whichever module

# -- SQL: state and messages ------------------------------------------------------------------

# The whole checkpoint in one statement and one round trip, autocommitted (pg_schema migrations 8 and 11:
# lock FOR UPDATE, fence, version check, a retry's own row, state or its delta, messages, turn). Inside
# an explicit transaction only for the crash tests' ``in_checkpoint_txn`` fault point.
_PUT_CHECKPOINT = """
    SELECT o_outcome, o_version, o_incarnation, o_created_at, o_owner_run_uid, o_owner_attempt
    FROM agentrun_put_checkpoint($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                                 $19, $20, $21::bigint, $22::text)
"""
# The same with a LangGraph super-step in the statement (migration 19: a LangGraph run's progress row riding in
# its next step's statement, integrations/langgraph/run.py); the step's 22 parameters follow ours.
_PUT_CHECKPOINT_AND_LG_STEP = """
    SELECT o_outcome, o_version, o_incarnation, o_created_at, o_owner_run_uid, o_owner_attempt
    FROM agentrun_put_checkpoint_and_lg_step(
        $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
        $21::bigint, $22::text,
        $23, $24, $25, $26, $27, $28, $29, $30::json, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42,
        $43, $44)
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
# The id column beside each body: the reducer's index of a loaded thread, without validating a message
# (``messages.stored_messages``: each is validated when first used).
_MESSAGES = "SELECT message_id, body FROM messages WHERE thread_id = $1 AND idx < $2 ORDER BY idx"
# A long thread's messages, read in the primary key's order. Left to its costs, the planner reads a long thread
# with a bitmap (or sequential) scan and sorts the rows; at 10,000 messages that sort (about 4 MB of rows)
# spills past the default work_mem to disk: 20 ms on the server instead of 6 (issue 34 item 3). Without sorts
# the index scan is the plan left. Set for the rest of the load's transaction only (the state rows are read
# before it), and a statement text of its own: a plan the server caches for it is made without sorts too.
LONG_THREAD = 1_000  # messages: the setting's round trip is then under 1% of the load
_NO_SORT = "SET LOCAL enable_sort = off"
_MESSAGES_IN_ORDER = _MESSAGES + " -- in the index's order (_NO_SORT)"
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


class PgState(PgConnection):
    """The checkpoints of ``PgCheckpointer``."""

    snapshot_every: int
    _chains: dict[str, _Chain]

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
        count = row["message_count"]
        if count > LONG_THREAD:
            await conn.execute(_NO_SORT)
            stored = await conn.fetch(_MESSAGES_IN_ORDER, thread_id, count)
        else:
            stored = await conn.fetch(_MESSAGES, thread_id, count)
        return Checkpoint(
            thread_id=thread_id,
            version=int(row["version"]),
            values=_fold(thread_id, rows),
            messages=stored_messages([r[0] for r in stored], [r[1] for r in stored]),
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
        return await self._commit(thread_id, write, expected_version, attempt, run_uid, None)

    async def acommit_with_lg_step(
        self,
        thread_id: str,
        write: CheckpointWrite,
        lg_step: tuple[Any, ...],
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> Commit:
        """``acommit``, and a LangGraph super-step of the same thread in the same statement and commit.

        ``lg_step``: ``agentrun_lg_put_step``'s parameters after the thread id (``pg_rows.PgRows.step_args``).
        The step lands exactly when the state row does; any error means neither landed (migration 19).
        """
        return await self._commit(thread_id, write, expected_version, attempt, run_uid, lg_step)

    async def _commit(
        self,
        thread_id: str,
        write: CheckpointWrite,
        expected_version: int,
        attempt: int | None,
        run_uid: str | None,
        lg_step: tuple[Any, ...] | None,
    ) -> Commit:
        check_thread_id(thread_id)
        # The id lets a retry recognize its own row when the first try's COMMIT went unacknowledged.
        write_id = os.urandom(16).hex()  # 128 random bits, as uuid4 has 122 of, without building a UUID
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
        sql = _PUT_CHECKPOINT if lg_step is None else _PUT_CHECKPOINT_AND_LG_STEP
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
                *(lg_step or ()),
            )
            try:
                commit = await self._call(
                    "checkpoint",
                    lambda args=args: self._put_one_statement(  # type: ignore[misc]
                        thread_id, sql, args, expected_version, attempt, run_uid
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
        # raw: its own transaction in one simple query (no setting of the session needed), pooler or not.
        async with self._connection(raw=True) as conn:
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
        self,
        thread_id: str,
        sql: str,
        args: tuple[Any, ...],
        expected_version: int,
        attempt: int | None,
        run_uid: str | None,
    ) -> Commit:
        """``sql`` (``_PUT_CHECKPOINT`` or its LangGraph twin) on a pooled connection (autocommit); the outcome
        turned into a commit or an error."""
        async with self._connection() as conn:
            try:
                if armed("in_checkpoint_txn"):
                    # The crash tests' fault point: killed after the insert, before the commit.
                    async with contextlib.nullcontext() if self.pooler else conn.transaction():
                        row = await conn.fetchrow(sql, *args)
                        if row is not None and row["o_outcome"] == "ok":
                            fault_point("in_checkpoint_txn", str(row["o_version"]))
                else:
                    row = await conn.fetchrow(sql, *args)
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
