"""Throwaway PostgreSQL databases for tests and benchmarks (created on the server at ``AGENTRUN_TEST_POSTGRES_DSN``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
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


async def create_database() -> str:
    """A new empty database on the test server; returns its DSN."""
    name = f"agentrun_t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_dsn())
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
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


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A fresh database (its DSN) for a fixture, dropped after it (from synchronous code)."""
    database = asyncio.run(create_database())
    try:
        yield database
    finally:
        asyncio.run(drop_database(database))
