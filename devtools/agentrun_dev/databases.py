"""Throwaway PostgreSQL databases for tests and benchmarks (created on the server at ``AGENTRUN_TEST_POSTGRES_DSN``)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import queue
import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg

POSTGRES_DSN_ENV = "AGENTRUN_TEST_POSTGRES_DSN"
DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def postgres_dsn() -> str:
    """The PostgreSQL server tests and benchmarks use (``AGENTRUN_TEST_POSTGRES_DSN``, else this machine's)."""
    return os.environ.get(POSTGRES_DSN_ENV, DEFAULT_POSTGRES_DSN)


def with_database(dsn: str, database: str) -> str:
    """``dsn`` naming ``database`` instead of its own."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


PREFIX = "agentrun_t_"
_swept = False


async def create_database() -> str:
    """A new empty database on the test server; returns its DSN. Its name carries this process's PID, so that
    the first one created also sweeps what a killed test process left (see ``_orphans``)."""
    global _swept
    name = f"{PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres_dsn())
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        if not _swept:
            _swept = True
            rows = await admin.fetch("SELECT datname FROM pg_database WHERE datname LIKE $1", PREFIX + "%")
            for orphan in _orphans([row["datname"] for row in rows]):
                drop_database_later(with_database(postgres_dsn(), orphan))
    finally:
        await admin.close()
    return with_database(postgres_dsn(), name)


async def drop_database(dsn: str) -> None:
    """Drop the database of ``dsn``, whoever is still connected to it."""
    name = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(postgres_dsn())
    try:
        # WITH (FORCE): a child process killed mid-test may still hold a session for a moment.
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


class _LaterDrops:
    """Drops databases on a thread of its own, so that a test's teardown does not wait for it: a DROP DATABASE
    waits for a checkpoint, 0.2 s on an idle server and 1.3-1.6 s measured in the cluster tier's teardowns. The
    queue is drained before the process exits (``atexit``)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, dsn: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="drop-databases", daemon=True)
                self._thread.start()
                atexit.register(self._queue.join)
        self._queue.put(dsn)

    def _run(self) -> None:
        while True:
            dsn = self._queue.get()
            try:
                asyncio.run(drop_database(dsn))
            except Exception:  # a server gone at the end of a run: the database goes with it, or stays, named
                logging.getLogger(__name__).warning("could not drop %s", urlsplit(dsn).path, exc_info=True)
            finally:
                self._queue.task_done()


_LATER = _LaterDrops()


def _orphans(names: list[str]) -> list[str]:
    """The throwaway databases whose creating process is gone: a test process killed (CI's time limit, Ctrl-C
    twice) drains no queue. Only on a server on this machine, where the PIDs are ours to check."""
    if urlsplit(postgres_dsn()).hostname not in ("127.0.0.1", "localhost", "::1"):
        return []
    gone = []
    for name in names:
        pid, named, _ = name.removeprefix(PREFIX).partition("_")  # an older name has no PID: left alone
        if named and pid.isdigit() and not _alive(int(pid)):
            gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def drop_database_later(dsn: str) -> None:
    """Drop the database of ``dsn`` in the background (before this process exits)."""
    _LATER.put(dsn)


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A fresh database (its DSN) for a fixture, dropped after it in the background (from synchronous code)."""
    database = asyncio.run(create_database())
    try:
        yield database
    finally:
        drop_database_later(database)
