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
``private_postgres``) on a free port in a temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from agentrun.checkpoint import Checkpointer
from agentrun.checkpoint.cached import CachedStore
from agentrun.checkpoint.postgres import PgCheckpointer
from tests.support.checkpointers import Backend
from tests.support.databases import create_database, drop_database

REDIS_URL_ENV = "AGENTRUN_TEST_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
ROOT = Path(__file__).resolve().parents[2]


def redis_url() -> str:
    return os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        await drop_database(dsn)


@pytest.fixture(scope="module")
def module_pg_dsn() -> Iterator[str]:
    """One fresh database for a whole module (the crash matrix: one thread per case); dropped afterwards."""
    dsn = asyncio.run(create_database())
    try:
        yield dsn
    finally:
        asyncio.run(drop_database(dsn))


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


@dataclass
class PrivateRedis:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test alone, on a free port, without persistence; killed afterwards."""
    port = free_port()
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = PrivateRedis(port, process)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"private redis-server did not start on port {port}") from None
                time.sleep(0.05)
        yield server
    finally:
        server.kill()


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    on_path = shutil.which(name)
    if on_path is None:
        raise RuntimeError(f"{name} not found under /usr/lib/postgresql/*/bin or on PATH")
    return on_path


class PrivatePostgres:
    """A throwaway PostgreSQL cluster (initdb in a temp dir, a free port) that a test may stop and start.

    PostgreSQL refuses to run as root, so when the tests run as root the
    server runs as the ``postgres`` OS user.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="agentrun-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as_user, *cmd], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "30", "start"
        )

    def stop(self) -> None:
        # fast: disconnect every client, roll back their transactions, shut down cleanly.
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL; destroyed (stopped, files removed) afterwards."""
    server = PrivatePostgres()
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()
