"""PostgreSQL tier: ``PgCheckpointer`` and the Redis hot cache (``CachedStore``) against real servers.

What this tier proves, each in its own module: the checkpointer contract
with the cache on (the shared suite of tests/unit, re-run here), two
processes racing on one thread, the cache never serving older state than
PostgreSQL committed, migrations from every earlier schema version and by
two processes at once, fencing of a frozen attempt, PostgreSQL and Redis
going away mid-run, and the crash matrix (SIGKILL at every fault point and
at seeded random times, then a resume in a new process).

Isolation: every test gets a fresh database (``pg_dsn``), created on the
server at ``AGENTRUN_TEST_POSTGRES_DSN`` and dropped afterwards, and a Redis
key prefix of its own (``redis_prefix``) whose keys are deleted afterwards.
Tests that kill or restart a server start a private one (``private_redis``,
``private_postgres``, from ``agentrun_dev.servers``) on a free port in a temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from agentrun.checkpoint import Checkpointer
from agentrun.checkpoint.cached import CachedStore
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun_dev.databases import create_database, drop_database_later
from agentrun_dev.servers import PrivatePostgres, PrivateRedis
from tests.support.checkpointers import Backend

REDIS_URL_ENV = "AGENTRUN_TEST_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
ROOT = Path(__file__).resolve().parents[2]


def redis_url() -> str:
    return os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL)


_REDIS_FIXTURES = frozenset({"cached", "backend", "redis_prefix", "module_redis_prefix", "private_redis"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of this tier that need Redis also carry the ``redis`` marker (``-m "not redis"`` skips them)."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here) and _REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.redis)


# -- databases and key prefixes ------------------------------------------------------------------


@pytest.fixture
async def pg_dsn() -> AsyncIterator[str]:
    """A fresh, empty database for this test; dropped afterwards."""
    dsn = await create_database()
    try:
        yield dsn
    finally:
        drop_database_later(dsn)


@pytest.fixture(scope="module")
def module_pg_dsn() -> Iterator[str]:
    """One fresh database for a whole module (the crash matrix: one thread per case); dropped afterwards."""
    dsn = asyncio.run(create_database())
    try:
        yield dsn
    finally:
        drop_database_later(dsn)


async def delete_prefix(url: str, prefix: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def module_redis_prefix() -> Iterator[str]:
    """A Redis key prefix for a whole module; every key under it is deleted afterwards."""
    prefix = f"agentrun-test-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        asyncio.run(delete_prefix(redis_url(), prefix))


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    """A Redis key prefix no other test uses; every key under it is deleted afterwards."""
    prefix = f"agentrun-test-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        await delete_prefix(redis_url(), prefix)


@pytest.fixture
async def checkpointer(pg_dsn: str) -> AsyncIterator[PgCheckpointer]:
    """A set-up ``PgCheckpointer`` on this test's database, without Redis."""
    cp = PgCheckpointer(pg_dsn)
    await cp.setup()
    try:
        yield cp
    finally:
        await cp.aclose()


def cached_store(dsn: str, prefix: str) -> CachedStore:
    """``PgCheckpointer`` on ``dsn`` behind the Redis hot cache, keys under ``prefix`` (not set up)."""
    return CachedStore(PgCheckpointer(dsn), redis_url=redis_url(), redis_prefix=prefix)


@pytest.fixture
async def cached(pg_dsn: str, redis_prefix: str) -> AsyncIterator[CachedStore]:
    """A set-up ``PgCheckpointer`` on this test's database behind the Redis hot cache."""
    cp = cached_store(pg_dsn, redis_prefix)
    await cp.setup()
    try:
        yield cp
    finally:
        await cp.aclose()


# -- the shared conformance suite, with the cache on ------------------------------------------


class CachedPostgresBackend(Backend):
    """The shared suite's ``Backend`` on this test's database, every checkpointer with the Redis cache."""

    def __init__(self, tmp_path: Path, dsn: str, prefix: str) -> None:
        super().__init__("postgres", tmp_path)
        self.dsn = dsn
        self.redis_prefix = prefix

    async def open(self) -> Checkpointer:
        cp = cached_store(self.dsn, self.redis_prefix)
        self._opened.append(cp)
        await cp.setup()
        return cp


@pytest.fixture
async def backend(tmp_path: Path, pg_dsn: str, redis_prefix: str) -> AsyncIterator[Backend]:
    """Overrides the root ``backend``: PostgreSQL with the Redis cache, on a fresh database."""
    store = CachedPostgresBackend(tmp_path, pg_dsn, redis_prefix)
    try:
        yield store
    finally:
        await store.close()


# -- private servers that tests may kill ---------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test alone, on a free port, without persistence; killed afterwards."""
    server = PrivateRedis(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL; destroyed (stopped, files removed) afterwards."""
    with PrivatePostgres().running() as server:
        yield server
