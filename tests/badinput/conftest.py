"""Bad input: what hostile or broken input may cost, and what it may never cost (issue 13).

Every test here feeds the real product something it did not ask for (fuzzed
AgentRun specs, fuzzed tool arguments, corrupted ledger rows, a 10 MB tool
result, a canary password) and checks the guarantee that must hold anyway:
a tool error message instead of a node failure, a warning and a re-run
instead of a silent skip, a run that ends in a phase with a reason, a secret
that appears nowhere. Real parts only: real SQLite files, the real
PostgreSQL of this machine (a private database per test), real runner
processes, and for the cluster scenarios the emulated cluster with the real
operator process and real kubectl.

Tiers are per module (``pytestmark``), since this folder spans several.
Fixtures:

- ``store``: ``"sqlite"`` or ``"postgres"`` (parametrized); ``store.open()``
  gives a set-up checkpointer on this test's own store (a SQLite file, or a
  PostgreSQL database created for the test and dropped after it), and
  ``store.sql(query, *args)`` runs raw SQL on it, as an operator with psql would.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentrun.checkpoint import Checkpointer, SqliteCheckpointer
from agentrun_dev.databases import create_database, drop_database
from tests.support.checkpointers import postgres_unavailable


class Store:
    """One real store (SQLite file or PostgreSQL database) for one test."""

    def __init__(self, kind: str, *, path: Path, dsn: str | None) -> None:
        self.kind = kind
        self.path = path
        self.dsn = dsn
        self._opened: list[Checkpointer] = []
        self.pg_schema = "agentrun"  # PgCheckpointer's default schema

    async def open(self) -> Checkpointer:
        """A set-up checkpointer on this store, closed with the fixture."""
        checkpointer = await self.connect()
        self._opened.append(checkpointer)
        return checkpointer

    async def connect(self) -> Checkpointer:
        """A set-up checkpointer on this store that the caller closes (``aclose``)."""
        checkpointer: Checkpointer
        if self.kind == "sqlite":
            checkpointer = SqliteCheckpointer(self.path)
        else:
            from agentrun.checkpoint.postgres import PgCheckpointer

            assert self.dsn is not None
            checkpointer = PgCheckpointer(self.dsn)
        await checkpointer.setup()
        return checkpointer

    async def close(self) -> None:
        for checkpointer in reversed(self._opened):
            await checkpointer.aclose()
        self._opened.clear()

    async def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run ``query`` on the store (``$1`` placeholders for both backends) and return its rows."""
        if self.kind == "postgres":
            conn = await asyncpg.connect(self.dsn, server_settings={"search_path": self.pg_schema})
            try:
                return [tuple(r) for r in await conn.fetch(query, *args)]
            finally:
                await conn.close()
        return await asyncio.to_thread(self._sqlite, query.replace("$1", "?1").replace("$2", "?2"), args)

    def _sqlite(self, query: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        db = sqlite3.connect(self.path)
        try:
            with db:
                return db.execute(query, args).fetchall()
        finally:
            db.close()


@pytest.fixture(params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    dsn = None
    if request.param == "postgres":
        if reason := postgres_unavailable():
            pytest.skip(reason)
        dsn = await create_database()
    opened = Store(request.param, path=tmp_path / "agentrun.db", dsn=dsn)
    try:
        yield opened
    finally:
        await opened.close()
        if dsn is not None:
            await drop_database(dsn)


# The emulated cluster as the cluster tier configures it (kubesim's pytest plugin gives ``cluster`` and
# ``kubelet``): the AgentRun CRD, the runner images, pods that import this repository.
from tests.cluster.conftest import kubesim_base_env, kubesim_crd_files, kubesim_known_images  # noqa: E402

__all__ = ["Store", "kubesim_base_env", "kubesim_crd_files", "kubesim_known_images"]
