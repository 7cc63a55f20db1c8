"""PostgreSQL store, the history reads: ``HistoryReads`` over ``pg_history`` (run history) and ``pg_inspect``.

Part of ``PgCheckpointer`` (``postgres``). Every read is read-only, from one snapshot, and not patient: a person
waits (``PgConnection._read``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import pg_inspect
from .base import HistoryReads
from .pg_connection import PgConnection
from .pg_history import ThreadRows, UnreadableRowError, find_run_txn, recorded_runs_txn, thread_rows_txn

if TYPE_CHECKING:
    from .pg_schema import Connection

log = logging.getLogger("agentrun.checkpoint.postgres")  # the store's one logger


class PgHistory(PgConnection, HistoryReads):
    """The history reads of ``PgCheckpointer`` (``HistoryReads``), each from one read-only snapshot."""

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
