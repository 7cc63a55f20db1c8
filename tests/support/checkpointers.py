"""The checkpointer backends of the shared conformance suite, one parameter each.

``tests/conftest.py`` turns ``BACKENDS`` into the ``backend`` and
``checkpointer`` fixtures, so every test that asks for them runs once per
backend (``tests/support/checkpointer_contract.py`` is the conformance suite;
other unit tests use them where a guarantee must hold on every store).

To add a backend: add a ``pytest.param`` below and a branch in
``Backend.open``. The PostgreSQL parameter is already here; it carries the
``postgres`` tier marker (so ``pytest -m unit`` never touches a server) and
skips, with the reason, until ``agentrun.checkpoint.postgres`` exists and the
server at ``AGENTRUN_TEST_POSTGRES_DSN`` answers. Tests on a shared server
must not assume an empty store: use ``Backend.thread()`` for thread ids (unique
per test, deleted at teardown) and filter ``list_threads()`` by them.
"""

from __future__ import annotations

import importlib.util
import socket
import uuid
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from agentrun.checkpoint import Checkpointer, CheckpointWrite, InMemoryCheckpointer, SqliteCheckpointer
from agentrun.messages import Message
from agentrun_dev.databases import POSTGRES_DSN_ENV, postgres_dsn

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@cache
def postgres_unavailable() -> str | None:
    """Why the PostgreSQL backend cannot run here, or ``None`` when it can (probed once per session)."""
    if importlib.util.find_spec("agentrun.checkpoint.postgres") is None:
        return "agentrun.checkpoint.postgres does not exist yet"
    parts = urlsplit(postgres_dsn())
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    try:
        with socket.create_connection((host, port), timeout=0.5):
            pass
    except OSError as e:
        return f"PostgreSQL at {host}:{port} is not reachable ({e}); set {POSTGRES_DSN_ENV}"
    return None


class Backend:
    """One store for one test; ``open()`` gives another connection to it, as another process would."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self.path = tmp_path / "agentrun.db"
        self.prefix = f"t{uuid.uuid4().hex[:10]}"
        self._memory: InMemoryCheckpointer | None = None
        self._opened: list[Checkpointer] = []
        self._threads: list[str] = []

    def thread(self, name: str = "thread") -> str:
        """A thread id unique to this test (shared servers hold other tests' threads)."""
        thread_id = f"{self.prefix}-{name}"
        self._threads.append(thread_id)
        return thread_id

    async def open(self) -> Checkpointer:
        """A set-up checkpointer on this test's store. Memory has one process, so it is always the same object."""
        checkpointer: Checkpointer
        if self.name == "memory":
            if self._memory is None:
                self._memory = InMemoryCheckpointer()
                self._opened.append(self._memory)
            checkpointer = self._memory
        elif self.name == "sqlite":
            checkpointer = SqliteCheckpointer(self.path)
            self._opened.append(checkpointer)
        elif self.name == "postgres":
            from agentrun.checkpoint.postgres import PgCheckpointer  # type: ignore[import-not-found,unused-ignore]

            checkpointer = PgCheckpointer(postgres_dsn())
            self._opened.append(checkpointer)
        else:
            raise ValueError(f"unknown backend {self.name!r}")
        await checkpointer.setup()
        return checkpointer

    async def close(self) -> None:
        if self._opened and self.name == "postgres":
            for thread_id in self._threads:
                await self._opened[0].delete_thread(thread_id)
        for checkpointer in reversed(self._opened):
            await checkpointer.aclose()
        self._opened.clear()


def write(
    *messages: tuple[int, Message],
    count: int,
    step: int = 0,
    status: Any = "running",
    node: str | None = "model",
    values: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> CheckpointWrite:
    """A checkpoint write for store-level tests: ``(index, message)`` pairs and the total count."""
    return CheckpointWrite(
        values=values or {},
        current_node=node,
        step=step,
        status=status,
        meta=meta or {},
        message_count=count,
        messages=list(messages),
    )
