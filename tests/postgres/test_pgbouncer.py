"""The store through a real PgBouncer in transaction mode (``agentrun_pooler=transaction`` in the URL).

Real PgBouncer (Debian's package, ``scripts/pgbouncer.sh``; each test starts its own process on a free
loopback port, ``agentrun_dev.servers.PrivatePgBouncer``), the shared PostgreSQL behind it, real runner
processes (``python -m agentrun.runner``) with the store Secret's DSN pointing at PgBouncer.

Guarantees: the schema migrates through the pooler, also with several processes at once, and leaves
no advisory lock behind (a session-level lock would stay on a server connection that another client
gets next); runs complete; a stop request reaches a run inside a hung tool within 2 s, by polling and
by Redis pub/sub, since LISTEN cannot pass a transaction pooler (and no store opens a listener);
a SIGKILL after a charge, or inside the checkpoint transaction, charges once after the next attempt;
a superseded attempt is fenced. A URL without the parameter fails at connect with a clear
``STORAGE_CONFIG_001`` instead of running with session state through the pooler.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agentrun.checkpoint import open_store
from agentrun.checkpoint.pg_schema import MIGRATIONS
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.contract import Env
from agentrun.errors import StoreConfigError
from agentrun_dev.databases import postgres_dsn
from agentrun_dev.servers import PrivatePgBouncer
from examples.support_agent import count_effects
from tests.conftest import ROOT

from .conftest import redis_url
from .helpers import fetchval, invocations

pytestmark = pytest.mark.timeout(120)

INPUT = {"messages": [{"role": "user", "content": "charge my saved card for order 4821 and email me the receipt"}]}
# Generous (the tool sleeps an hour): the stop check's 1 s is proven on loop time (unit/test_stop.py) and the
# 2 s end to end is measured by `make bench`.
STOP_BOUND = 20.0


@pytest.fixture
def bouncer() -> Iterator[PrivatePgBouncer]:
    """A PgBouncer of this test (transaction mode, 4 server connections per database) before the shared server."""
    port = urlsplit(postgres_dsn()).port or 5432
    with PrivatePgBouncer(port, pool_size=4).running() as server:
        yield server


def pooled(bouncer: PrivatePgBouncer, dsn: str) -> str:
    """``dsn``'s database through ``bouncer``, with ``agentrun_pooler=transaction``."""
    parts = urlsplit(dsn)
    return bouncer.dsn(parts.path.lstrip("/"))


def pod_env(subprocess_env: dict[str, str], tmp_path: Path, dsn: str, thread: str, **extra: str) -> dict[str, str]:
    return {
        **subprocess_env,
        Env.GRAPH: "examples.support_agent:app",
        Env.THREAD_ID: thread,
        Env.RUN_NAME: "order-4821",
        Env.RUN_UID: "uid-1",
        Env.ATTEMPT: "1",
        Env.INPUT: json.dumps(INPUT),
        Env.POSTGRES_DSN: dsn,
        Env.METRICS_PORT: "0",
        Env.TERMINATION_LOG: str(tmp_path / "termination-log"),
        **extra,
    }


def start(env: dict[str, str], **overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentrun.runner"],
        env={**env, **overrides},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(env: dict[str, str], **overrides: str) -> tuple[int, str]:
    proc = start(env, **overrides)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


async def in_tool(direct: str, thread: str, within: float = 30) -> None:
    """Returns once ``thread``'s latest checkpoint says it runs its tools (read on the direct DSN)."""
    store = PgCheckpointer(direct)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            seen = await store.aget_progress(thread)
            if seen is not None and (seen.current_node, seen.status) == ("tools", "running"):
                return
            await asyncio.sleep(0.05)
    finally:
        await store.aclose()
    raise AssertionError(f"{thread} never reached its tools")


async def session_state(direct: str) -> tuple[int, int]:
    """(advisory locks held, stop listener sessions) on the database of ``direct``, whoever holds them."""
    locks = await fetchval(
        direct,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    listeners = await fetchval(
        direct,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agentrun-stop-listener' "
        "AND datname = current_database()",
    )
    return int(locks), int(listeners)


async def test_several_processes_migrate_at_once_through_pgbouncer_and_leave_no_lock(
    pg_dsn: str, bouncer: PrivatePgBouncer
) -> None:
    """Four stores set up a fresh schema at once over 4 server connections: each step once, no lock left.

    With the former session-level lock, a migrator's lock stayed on whichever server connection ran
    ``pg_advisory_lock``; another client that got that connection took the same lock again
    (re-entrant within a session) and both migrated at once.
    """
    stores = [PgCheckpointer(pooled(bouncer, pg_dsn)) for _ in range(4)]
    try:
        await asyncio.gather(*(store.setup() for store in stores))
    finally:
        for store in stores:
            await store.aclose()
    version = await fetchval(pg_dsn, "SELECT max(version) FROM agentrun.agentrun_migrations")
    assert version == len(MIGRATIONS), f"GUARANTEE BROKEN: the schema stopped at {version} through PgBouncer"
    assert await session_state(pg_dsn) == (0, 0), "a migrator left an advisory lock on a pooled server connection"


async def test_a_pooled_url_without_the_parameter_fails_clearly_at_connect(
    pg_dsn: str, bouncer: PrivatePgBouncer
) -> None:
    """PgBouncer refuses the session settings a direct store sends: STORAGE_CONFIG_001 naming the remedy."""
    plain = pooled(bouncer, pg_dsn).split("?")[0]
    store = PgCheckpointer(plain, retry_timeout=5)
    try:
        with pytest.raises(StoreConfigError, match="agentrun_pooler=transaction"):
            await store.setup()
    finally:
        await store.aclose()


def test_a_run_through_pgbouncer_completes_without_session_state(
    pg_dsn: str, bouncer: PrivatePgBouncer, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    env = pod_env(subprocess_env, tmp_path, pooled(bouncer, pg_dsn), "default/pooled-run")
    code, err = run(env)
    assert code == 0, err
    effects = count_effects(env["SUPPORT_EFFECTS_DB"])
    assert (effects["charges"], effects["receipts"], effects["tool_invocations"]) == (1, 1, 2), effects
    assert asyncio.run(session_state(pg_dsn)) == (0, 0)
    again, err = run(env, **{Env.ATTEMPT: "2"})  # a rescheduled pod: the turn completed, nothing runs again
    assert again == 0, err
    assert count_effects(env["SUPPORT_EFFECTS_DB"])["tool_invocations"] == 2


@pytest.mark.parametrize("hear_by", ["polling", "redis"])
def test_a_stop_reaches_a_hung_tool_through_pgbouncer(
    hear_by: str, pg_dsn: str, bouncer: PrivatePgBouncer, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """LISTEN cannot pass the pooler: the run polls (every 0.5 s) or hears Redis; either way the stop ends it."""
    dsn = pooled(bouncer, pg_dsn)
    thread = f"default/stop-{hear_by}-{uuid.uuid4().hex[:8]}"
    redis = {Env.REDIS_URL: redis_url()} if hear_by == "redis" else {}
    env = pod_env(subprocess_env, tmp_path, dsn, thread, SUPPORT_TOOL_DELAY="3600", **redis)
    proc = start(env)
    try:
        asyncio.run(in_tool(pg_dsn, thread))
        time.sleep(1.5)  # past the run's first stop checks, so a stop is news to it (and Redis is subscribed)
        assert asyncio.run(session_state(pg_dsn))[1] == 0, "a store behind PgBouncer opened a LISTEN connection"

        async def request() -> float:
            operator = open_store(dsn, redis_url=redis.get(Env.REDIS_URL))  # as the operator would
            try:
                await operator.setup()
                await operator.request_stop(thread, "stopped by the test")
                return time.monotonic()
            finally:
                await operator.aclose()

        asked = asyncio.run(request())
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 4, err
    print(f"stop through PgBouncer ({hear_by}): the runner exited {took:.2f}s after the request committed")
    assert took <= STOP_BOUND, f"GUARANTEE BROKEN: a stop took {took:.2f}s to end a hung run through PgBouncer"


@pytest.mark.parametrize("fault", ["after_ledger_record:charge_card", "in_checkpoint_txn", "after_tool:charge_card"])
def test_a_sigkill_through_pgbouncer_then_the_next_attempt_charges_once(
    fault: str, pg_dsn: str, bouncer: PrivatePgBouncer, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Killed after the charge was recorded, inside the checkpoint's transaction, or before the record."""
    env = pod_env(subprocess_env, tmp_path, pooled(bouncer, pg_dsn), f"default/kill-{uuid.uuid4().hex[:8]}")
    code, err = run(env, **{Env.FAULT_POINT: fault})
    assert code == -signal.SIGKILL, err
    code, err = run(env, **{Env.ATTEMPT: "2"})
    assert code == 0, err
    effects = count_effects(env["SUPPORT_EFFECTS_DB"])
    assert (effects["charges"], effects["receipts"]) == (1, 1), f"GUARANTEE BROKEN after {fault}: {effects}"
    if fault.startswith("after_ledger_record"):
        charged = invocations(env["SUPPORT_EFFECTS_DB"], "charge_card")
        assert charged == 1, f"GUARANTEE BROKEN: a recorded charge ran again ({charged} calls)"
    assert asyncio.run(session_state(pg_dsn)) == (0, 0)


def test_a_superseded_attempt_is_fenced_through_pgbouncer(
    pg_dsn: str, bouncer: PrivatePgBouncer, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Attempt 3 registered; attempt 2 arriving late exits 7 (FENCED) and runs no tool."""
    env = pod_env(subprocess_env, tmp_path, pooled(bouncer, pg_dsn), f"default/fence-{uuid.uuid4().hex[:8]}")
    code, err = run(env, **{Env.ATTEMPT: "3", Env.INPUT: "null"})
    assert code == 5, err  # registered, then failed for lack of input
    code, err = run(env, **{Env.ATTEMPT: "2"})
    assert code == 7, err
    assert count_effects(env["SUPPORT_EFFECTS_DB"])["tool_invocations"] == 0


async def test_a_frozen_writer_is_fenced_by_its_successor_through_pgbouncer(
    pg_dsn: str, bouncer: PrivatePgBouncer
) -> None:
    """Store-level: attempt 1's checkpoint after attempt 2 registered is refused, through the pooler."""
    from agentrun.checkpoint.base import CheckpointWrite
    from agentrun.errors import FencedError

    dsn = pooled(bouncer, pg_dsn)
    old, new = PgCheckpointer(dsn), PgCheckpointer(dsn)
    try:
        await old.register_attempt("default/fenced", 1, run_uid="r")
        write = CheckpointWrite(values={"n": 1}, current_node="a", step=1, status="running", meta={}, message_count=0)
        first = await old.acommit("default/fenced", write, expected_version=0, attempt=1, run_uid="r")
        await new.register_attempt("default/fenced", 2, run_uid="r")
        with pytest.raises(FencedError):
            await old.acommit("default/fenced", write, expected_version=first.version, attempt=1, run_uid="r")
        assert await old.ledger_put("default/fenced", "m:1", "t", 1, attempt=2, run_uid="r")
        with pytest.raises(FencedError):
            await old.ledger_put("default/fenced", "m:2", "t", 1, attempt=1, run_uid="r")
    finally:
        await old.aclose()
        await new.aclose()


def test_the_pgbouncer_bench_runs_and_reports_both_roads(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """``make bench``'s PgBouncer job at a few runs: both roads measured, PgBouncer's peak within its cap."""
    out = tmp_path / "latest.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.pgbouncer", "--quick", "--out", str(out)],
        env=subprocess_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, f"the PgBouncer bench failed, so `make bench` is broken:\n{done.stderr[-3000:]}"
    figures = json.loads(out.read_text())["pgbouncer"]["figures"]
    for road in ("direct", "pgbouncer"):
        wanted = {"connections_peak", "step_ms_p50", "step_ms_p95", "checkpoint_commits_per_s", "transactions_per_s"}
        assert wanted <= set(figures[road]), figures
    peak = figures["pgbouncer"]["connections_peak"]
    assert peak <= 10, f"PgBouncer opened {peak} server connections, more than its 10: {figures}"
