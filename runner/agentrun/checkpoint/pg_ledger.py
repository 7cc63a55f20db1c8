"""PostgreSQL store, ledger and intents: insert-if-absent records, the group commit, batched lookups and claims.

Part of ``PgCheckpointer`` (``postgres``); lookups and claims of one loop turn share a round trip
(``batch.TurnBatch``), records of parallel calls a commit (``group``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from .base import (
    Intent,
    LedgerEntry,
    LedgerRow,
)
from .batch import TurnBatch
from .pg_connection import PgConnection, _dumps, _fence_txn, _loads, _tool_row_outcome, check_thread_id

if TYPE_CHECKING:
    from .pg_schema import Connection

log = logging.getLogger("agentrun.checkpoint.postgres")  # one logger for the store, whichever module

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
# Who writes an intent: the thread, the attempt and the run uid (claims of one writer share a statement).
_Writer = tuple[str, int | None, str | None]


@dataclass(frozen=True)
class _Claim:
    """An ``intent_claim`` waiting for its loop turn's statement (``batch.TurnBatch``)."""

    key: str
    tool_name: str
    idem: str | None
    args_digest: str | None


class PgLedger(PgConnection):
    """The ledger and intents of ``PgCheckpointer``."""

    _lookups: TurnBatch[str, str, LedgerEntry | None]
    _claims: TurnBatch[_Writer, _Claim, Intent | None]
    _ledger_group_window: float

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
