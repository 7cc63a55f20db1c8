"""PostgreSQL connections, step latency and commits/s at N concurrent runs: direct vs through PgBouncer.

``make bench`` (``python -m bench.pgbouncer``) starts a private PostgreSQL and a private PgBouncer in
transaction mode in front of it (``agentrun_dev.servers``; PgBouncer may open at most ``--server-conns``
server connections, 40 by default: what a PostgreSQL with ``max_connections = 50`` leaves after its
reserve), then runs the same load twice, once per road, each in a fresh database:

- ``--runs`` runs at once, spread over ``--workers`` processes; each run has a store of its own
  (``open_store(dsn)``: its own pool and, direct, its own stop listener), as each runner pod has, and
  runs the benchmark's plain chain of ``--steps`` durable steps (``bench.graphs``).
- ``connections_peak``: the most client backends ``pg_stat_activity`` showed on the database (sampled
  every 0.1 s); ``step_ms_p50`` / ``step_ms_p95``: a run's wall time per step, across runs;
  ``checkpoint_commits_per_s``: durable checkpoints (state rows) committed per second;
  ``transactions_per_s``: ``pg_stat_database.xact_commit`` over the load's wall time (every
  transaction the server committed: checkpoints, autocommitted reads, stop polls, notifications).

Results go to ``bench/results/latest.json`` under ``pgbouncer``; ``bench/REPORT.md`` has the figures
of a run by hand and what the machine was doing. HAZARD: the runs share the machine's cores with
PostgreSQL and PgBouncer, so the figures are of the whole, not of one part.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from agentrun_dev.servers import PrivatePgBouncer, PrivatePostgres

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Params:
    runs: int = 300
    steps: int = 200
    workers: int = 6
    server_conns: int = 40

    @classmethod
    def quick(cls) -> Params:
        return cls(runs=8, steps=20, workers=2, server_conns=10)


# -- a worker process: its share of the runs, each with a store of its own ---------------------------------


async def _worker(dsn: str, runs: int, steps: int) -> list[float]:
    """Runs ``runs`` runs at once after a line on stdin; prints each run's seconds per step as JSON."""
    from agentrun.checkpoint import open_store
    from bench.graphs import agentrun_plain

    stores = [open_store(dsn) for _ in range(runs)]
    await asyncio.gather(*(s.setup() for s in stores))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    async def one(store: Any) -> float:
        app = agentrun_plain(store, steps)
        started = time.perf_counter()
        await app.ainvoke({"items": []}, {"thread_id": f"bench-{uuid.uuid4().hex}", "recursion_limit": steps + 5})
        return (time.perf_counter() - started) / steps

    try:
        return list(await asyncio.gather(*(one(s) for s in stores)))
    finally:
        await asyncio.gather(*(s.aclose() for s in stores), return_exceptions=True)


# -- the driver ------------------------------------------------------------------------------------------


async def _stats(dsn: str) -> tuple[int, int]:
    """(xact_commit, state rows) of the database of ``dsn``."""
    conn = await asyncpg.connect(dsn)
    try:
        commits = await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        rows = await conn.fetchval("SELECT CASE WHEN to_regclass('agentrun.states') IS NULL THEN 0 ELSE 1 END")
        if rows:
            rows = await conn.fetchval("SELECT count(*) FROM agentrun.states")
        return int(commits), int(rows)
    finally:
        await conn.close()


async def _flush_stats(dsn: str) -> None:
    """End the database's other sessions (PgBouncer's idle server connections): a backend reports its
    transaction counts when it goes idle for a while or exits, so the counters are complete after this."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        for _ in range(50):
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if not others:
                break
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    await asyncio.sleep(0.5)


async def _sample_connections(dsn: str, stop: asyncio.Event) -> int:
    conn = await asyncpg.connect(dsn)
    peak = 0
    try:
        while not stop.is_set():
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            peak = max(peak, int(count))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
    finally:
        await conn.close()
    return peak


async def _load(direct: str, through: str, p: Params) -> dict[str, float]:
    """The load on ``through`` (the DSN runs use); ``direct`` (same database) for the counters."""
    commits0, rows0 = await _stats(direct)  # before the workers: their setup counts too (a few per store)
    shares = [p.runs // p.workers + (1 if i < p.runs % p.workers else 0) for i in range(p.workers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.pgbouncer",
            "worker",
            through,
            str(share),
            str(p.steps),
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for share in shares
        if share
    ]
    for worker in workers:
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 300)
        if line.strip() != b"ready":
            raise RuntimeError(f"a bench worker did not get ready: {line!r}")
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_connections(direct, stop))
    started = time.perf_counter()
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        await worker.stdin.drain()
    per_step: list[float] = []
    for worker in workers:
        out, _ = await asyncio.wait_for(worker.communicate(), 1800)
        if worker.returncode != 0:
            raise RuntimeError(f"a bench worker failed (exit {worker.returncode})")
        per_step += json.loads(out.decode().strip().splitlines()[-1])
    wall = time.perf_counter() - started
    stop.set()
    peak = await sampler
    await _flush_stats(direct)
    commits1, rows1 = await _stats(direct)
    ms = [s * 1000 for s in per_step]
    cuts = statistics.quantiles(ms, n=20) if len(ms) > 1 else ms * 19
    return {
        "connections_peak": peak,
        "step_ms_p50": round(statistics.median(per_step) * 1000, 3),
        "step_ms_p95": round(cuts[18], 3),
        "transactions_per_s": round((commits1 - commits0) / wall, 1),
        "checkpoint_commits_per_s": round((rows1 - rows0) / wall, 1),
        "wall_s": round(wall, 2),
    }


async def _database(admin: str, name: str) -> str:
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return admin.rsplit("/", 1)[0] + f"/{name}"


def measure(p: Params) -> dict[str, Any]:
    """Both roads at ``p``; raises when a run fails."""
    # Direct, every run holds its pool and a stop listener: room for all of them (and the sampler).
    settings = {"max_connections": str(max(100, 4 * p.runs + 20))}
    with (
        PrivatePostgres(settings=settings, prefix="agentrun-bench-pg-").running() as pg,
        PrivatePgBouncer(pg.port, pool_size=p.server_conns, max_db_connections=p.server_conns).running() as bouncer,
    ):
        figures: dict[str, Any] = {}
        for road in ("direct", "pgbouncer"):
            name = f"bench_{road}"
            direct = asyncio.run(_database(pg.dsn, name))
            through = direct if road == "direct" else bouncer.dsn(name)
            print(f"bench.pgbouncer: {p.runs} runs x {p.steps} steps, {road}", flush=True)
            figures[road] = asyncio.run(_load(direct, through, p))
            print(f"  {figures[road]}", flush=True)
        return figures


def _load_average() -> float:
    return os.getloadavg()[0]


def merge(out: Path, section: dict[str, Any]) -> None:
    """Write ``section`` as ``pgbouncer`` into ``out``, keeping every other key."""
    existing: dict[str, Any] = {}
    if out.exists():
        with contextlib.suppress(ValueError):
            existing = json.loads(out.read_text())
    existing["pgbouncer"] = section
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(existing, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        dsn, runs, steps = argv[1], int(argv[2]), int(argv[3])
        print(json.dumps(asyncio.run(_worker(dsn, runs, steps))), flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="bench.pgbouncer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=Params.runs)
    parser.add_argument("--steps", type=int, default=Params.steps)
    parser.add_argument("--workers", type=int, default=Params.workers)
    parser.add_argument("--server-conns", type=int, default=Params.server_conns)
    parser.add_argument("--quick", action="store_true", help="the smoke: a few runs")
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args(argv)
    p = Params.quick() if args.quick else Params(args.runs, args.steps, args.workers, args.server_conns)
    load = _load_average()
    section = {
        "meta": {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip(),
            "params": asdict(p),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_at_start": load},
        },
        "figures": measure(p),
    }
    merge(args.out, section)
    print(json.dumps(section, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
