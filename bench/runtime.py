"""What durability costs: agentrun's step on PostgreSQL, SQLite and in memory, LangGraph's, and the commit floor.

``make bench`` (``python -m bench.runtime``) runs every job of ``JOBS`` once
per round, each in its own process, the order rotated from round to round, with a
``CHECKPOINT`` and a short idle between jobs so that one job's writes do not
land on the next one's clock. Ratios are taken within a round, then the
median across rounds: on a shared 2-core machine that is what stays stable.

Writes ``bench/results/latest.json`` (every sample, medians, min/max,
versions, machine facts), ``bench/REPORT.md``'s figures table
(``bench/results/table.md``) and PNG plots.

``--baseline REV`` also runs the agentrun jobs on the code of git revision
``REV`` (a worktree), interleaved with the current code: before/after in one run.
``--quick`` is the smoke of ``tests/integration/test_bench_smoke.py``: a few
steps of every shape, one round, in process.

Every timed figure is per step (or per tool iteration) and excludes the
opening of the run: samples are the time between the first and the last
step event of a run, divided by the steps between them.
"""

# The driver blocks on purpose between jobs (git, files, the job's process): nothing else runs then.
# ruff: noqa: ASYNC221, ASYNC240

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/agentrun_bench"
HISTORIES = (0, 100, 1000, 10000)


class Params:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.nodes = 6 if quick else 50
        self.iterations = 3 if quick else 20
        self.runs = 1 if quick else 4  # runs (fresh threads) per job and round
        self.floor_commits = 20 if quick else 300
        self.histories = (0, 100) if quick else HISTORIES
        self.invoke_histories = (0, 100) if quick else (0, 10000)  # whole invokes: a fresh and a long thread
        self.cold_starts = 1 if quick else 2


def dsn() -> str:
    return os.environ.get("BENCH_DSN", DEFAULT_DSN)


def schema() -> str:
    return os.environ.get("BENCH_SCHEMA", "bench")


# -- timing helpers ------------------------------------------------------------------------------


def per_step(stamps: list[float]) -> float:
    """Milliseconds per step between the first and the last event."""
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000.0


async def agentrun_run(app: Any, input: Any, thread: str, *, counter: Any = None, every: int = 1) -> dict[str, Any]:
    """One agentrun run: per-step ms from its step events (every ``every``-th), and wire counts between them."""
    stamps: list[float] = []
    counts: list[tuple[int, int]] = []
    cpu: list[float] = []  # this process's CPU at each stamp: the client's share, whatever the disk does
    seen = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    async for event in app.astream(input, {"thread_id": thread}):
        if event.kind != "step":
            continue
        if seen % every == 0:
            stamps.append(time.perf_counter())
            cpu.append(time.process_time())
            if counter is not None:
                counts.append(counter.snapshot())
        seen += 1
    # The whole invoke: opening the run (loading the thread) and its end included.
    invoke_ms = (time.perf_counter() - started) * 1000.0
    out: dict[str, Any] = {
        "ms": per_step(stamps),
        "steps": len(stamps) - 1,
        "invoke_ms": invoke_ms,
        "cpu_ms": per_step(cpu),
        "invoke_cpu_ms": (time.process_time() - cpu_started) * 1000.0,
    }
    if counter is not None:
        steps = len(counts) - 1
        out["round_trips"] = (counts[-1][0] - counts[0][0]) / steps
        out["transactions"] = (counts[-1][1] - counts[0][1]) / steps
    return out


async def langgraph_run(app: Any, input: Any, thread: str, *, every: int = 1, node: str | None = None) -> float:
    stamps: list[float] = []
    seen = 0
    async for update in app.astream(
        input, {"configurable": {"thread_id": thread}}, durability="sync", stream_mode="updates"
    ):
        if node is not None and node not in update:
            continue
        if seen % every == 0:
            stamps.append(time.perf_counter())
        seen += 1
    return per_step(stamps)


# -- agentrun stores -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def agentrun_store(kind: str, counter: Any = None) -> Any:
    if kind == "postgres":
        from agentrun.checkpoint.postgres import PgCheckpointer

        options = {"init": counter.init} if counter is not None else {}
        store: Any = PgCheckpointer(dsn(), schema=schema(), pool_options=options)
    elif kind == "sqlite":
        from agentrun import SqliteCheckpointer

        tmp = tempfile.mkdtemp(prefix="agentrun-bench-")
        store = SqliteCheckpointer(os.path.join(tmp, "bench.db"))
    else:
        from agentrun import InMemoryCheckpointer

        store = InMemoryCheckpointer()
    await store.setup()
    try:
        yield store
    finally:
        await store.aclose()


async def seed_history(store: Any, thread: str, count: int) -> None:
    """A thread that already holds ``count`` ~200-byte messages (a completed earlier turn)."""
    if not count:
        return
    from agentrun.checkpoint.base import CheckpointWrite
    from agentrun.messages import assistant, user

    from .graphs import BODY

    messages = [user(BODY) if i % 2 == 0 else assistant(BODY) for i in range(count)]
    write = CheckpointWrite(
        values={},
        current_node=None,
        step=0,
        status="completed",
        meta={},
        message_count=count,
        messages=list(enumerate(messages)),
    )
    await store.aput(thread, write, expected_version=0)


# -- jobs ----------------------------------------------------------------------------------------


async def job_pg_commit(p: Params) -> dict[str, Any]:
    """The floor: one 1-row INSERT per transaction (autocommit) on one asyncpg connection."""
    import asyncpg

    conn = await asyncpg.connect(dsn())
    try:
        return {"samples": await commit_floor(conn, p.floor_commits)}
    finally:
        await conn.close()


async def commit_floor(conn: Any, commits: int) -> list[float]:
    """Milliseconds of each of ``commits`` 1-row INSERTs in autocommit on ``conn`` (after 5 not counted)."""
    await conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, v int)")
    samples = []
    for i in range(commits + 5):
        started = time.perf_counter()
        await conn.execute("INSERT INTO bench_floor (v) VALUES ($1)", i)
        if i >= 5:
            samples.append((time.perf_counter() - started) * 1000.0)
    await conn.execute("TRUNCATE bench_floor")
    return samples


def agentrun_step_job(kind: str, *, pure: bool = False) -> Callable[[Params], Awaitable[dict[str, Any]]]:
    """The plain chain on ``kind``'s store; ``pure``: its nodes declared ``agentrun.ahead.pure`` (inline, and
    computed while the previous checkpoint is in flight)."""

    async def job(p: Params) -> dict[str, Any]:
        from bench.counting import Counter

        from .graphs import agentrun_plain

        counter = Counter() if kind == "postgres" else None
        samples, trips, txns = [], [], []
        async with agentrun_store(kind, counter) as store:
            app = agentrun_plain(store, p.nodes, pure=pure)
            await agentrun_run(app, {"items": []}, f"warm-{uuid.uuid4().hex}")
            for _ in range(p.runs):
                out = await agentrun_run(app, {"items": []}, f"plain-{uuid.uuid4().hex}", counter=counter)
                samples.append(out["ms"])
                if counter is not None:
                    trips.append(out["round_trips"])
                    txns.append(out["transactions"])
        result: dict[str, Any] = {"samples": samples}
        if counter is not None:
            result["round_trips_per_step"] = trips
            result["transactions_per_step"] = txns
        return result

    return job


async def job_agentrun_big(p: Params) -> dict[str, Any]:
    """The plain chain over a state whose ~100 KB channel no step changes (each node bumps a counter)."""
    from bench.counting import Counter

    from .graphs import BIG, agentrun_big

    counter = Counter()
    samples, trips, txns = [], [], []
    async with agentrun_store("postgres", counter) as store:
        app = agentrun_big(store, p.nodes)
        await agentrun_run(app, {"big": BIG, "n": 0}, f"warm-{uuid.uuid4().hex}")
        for _ in range(p.runs):
            out = await agentrun_run(app, {"big": BIG, "n": 0}, f"big-{uuid.uuid4().hex}", counter=counter)
            samples.append(out["ms"])
            trips.append(out["round_trips"])
            txns.append(out["transactions"])
    return {"samples": samples, "round_trips_per_step": trips, "transactions_per_step": txns}


def agentrun_msg_job(history: int, *, whole: bool = False) -> Callable[[Params], Awaitable[dict[str, Any]]]:
    """The message chain on a thread of ``history`` messages: per step, or (``whole``) per whole invoke."""

    async def job(p: Params) -> dict[str, Any]:
        from agentrun.messages import user
        from bench.counting import Counter

        from .graphs import agentrun_msg

        # Not around a whole invoke: the counter frames every message the server sends in Python, and loading
        # 10,000 rows is 10,000 messages (tens of ms of this process's CPU that no runner spends).
        counter = None if whole else Counter()
        samples, trips, txns, cpu = [], [], [], []
        async with agentrun_store("postgres", counter) as store:
            app = agentrun_msg(store, p.nodes)
            await agentrun_run(app, {"messages": [user("hi")]}, f"warm-{uuid.uuid4().hex}")
            for _ in range(p.runs):
                thread = f"msg{history}-{uuid.uuid4().hex}"
                await seed_history(store, thread, history)
                # The seed's garbage collected here, not inside the run: making 10,000 validated messages (what
                # a runner never does before it loads a thread) left the collector's counts high enough that
                # the run paid a full collection (30-37 ms here) in 3 of 4 invokes. The run's own allocations
                # still trigger what they trigger.
                gc.collect()
                out = await agentrun_run(app, {"messages": [user("next")]}, thread, counter=counter)
                samples.append(out["invoke_ms"] if whole else out["ms"])
                cpu.append(out["invoke_cpu_ms"] if whole else out["cpu_ms"])
                if counter is not None:
                    trips.append(out["round_trips"])
                    txns.append(out["transactions"])
        return {"samples": samples, "cpu_samples": cpu, "round_trips_per_step": trips, "transactions_per_step": txns}

    return job


async def job_agentrun_tools(p: Params) -> dict[str, Any]:
    from agentrun.messages import user
    from bench.counting import Counter

    from .graphs import agentrun_tools

    counter = Counter()
    samples, trips, txns = [], [], []
    async with agentrun_store("postgres", counter) as store:
        app = agentrun_tools(store, p.iterations)
        await agentrun_run(app, {"messages": [user("hi")]}, f"warm-{uuid.uuid4().hex}")
        for _ in range(p.runs):
            # Two step events (model, tools) per iteration: every other one is an iteration boundary.
            out = await agentrun_run(
                app, {"messages": [user("go")]}, f"tools-{uuid.uuid4().hex}", counter=counter, every=2
            )
            samples.append(out["ms"])
            trips.append(out["round_trips"])
            txns.append(out["transactions"])
    return {"samples": samples, "round_trips_per_iteration": trips, "transactions_per_iteration": txns}


@contextlib.asynccontextmanager
async def langgraph_saver() -> Any:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(dsn()) as saver:
        await saver.setup()
        yield saver


async def job_langgraph_step(p: Params) -> dict[str, Any]:
    from .graphs import langgraph_plain

    samples = []
    async with langgraph_saver() as saver:
        app = langgraph_plain(saver, p.nodes)
        await langgraph_run(app, {"items": []}, f"warm-{uuid.uuid4().hex}")
        for _ in range(p.runs):
            samples.append(await langgraph_run(app, {"items": []}, f"lgplain-{uuid.uuid4().hex}"))
    return {"samples": samples}


async def job_langgraph_big(p: Params) -> dict[str, Any]:
    from .graphs import BIG, langgraph_big

    samples = []
    async with langgraph_saver() as saver:
        app = langgraph_big(saver, p.nodes)
        await langgraph_run(app, {"big": BIG, "n": 0}, f"warm-{uuid.uuid4().hex}")
        for _ in range(p.runs):
            samples.append(await langgraph_run(app, {"big": BIG, "n": 0}, f"lgbig-{uuid.uuid4().hex}"))
    return {"samples": samples}


def langgraph_msg_job(history: int) -> Callable[[Params], Awaitable[dict[str, Any]]]:
    async def job(p: Params) -> dict[str, Any]:
        from langchain_core.messages import AIMessage, HumanMessage

        from .graphs import BODY, langgraph_msg

        samples = []
        async with langgraph_saver() as saver:
            app = langgraph_msg(saver, p.nodes)
            await langgraph_run(app, {"messages": [HumanMessage("hi")]}, f"warm-{uuid.uuid4().hex}")
            for _ in range(p.runs):
                thread = f"lgmsg{history}-{uuid.uuid4().hex}"
                if history:
                    prior = [HumanMessage(BODY) if i % 2 == 0 else AIMessage(BODY) for i in range(history)]
                    await app.aupdate_state({"configurable": {"thread_id": thread}}, {"messages": prior}, as_node="n0")
                    # as_node: the seeded thread is at the chain's end: a new input starts from START.
                samples.append(await langgraph_run(app, {"messages": [HumanMessage("next")]}, thread))
        return {"samples": samples}

    return job


async def job_langgraph_tools(p: Params) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    from .graphs import langgraph_tools

    samples = []
    async with langgraph_saver() as saver:
        app = langgraph_tools(saver, p.iterations)
        await langgraph_run(app, {"messages": [HumanMessage("hi")]}, f"warm-{uuid.uuid4().hex}", node="model")
        for _ in range(p.runs):
            thread = f"lgtools-{uuid.uuid4().hex}"
            samples.append(await langgraph_run(app, {"messages": [HumanMessage("go")]}, thread, node="model"))
    return {"samples": samples}


async def job_cold_start(p: Params) -> dict[str, Any]:
    """``python -m agentrun.runner`` from exec to its first checkpoint row, seen by polling the store.

    Then once more under ``-X importtime``: where a start's time goes (``imports``, ms by top-level package).
    """
    import compileall

    import asyncpg

    import agentrun
    from agentrun.checkpoint.postgres import PgCheckpointer

    # Bytecode first, as the image has it (pip compiles at install): with PYTHONDONTWRITEBYTECODE set no
    # runner writes .pyc, and each start would compile agentrun from source (about twice the time).
    compileall.compile_dir(Path(agentrun.__file__).parent, quiet=1)
    compileall.compile_file(ROOT / "bench" / "graphs.py", quiet=1)
    # The runner's store is the default schema ("agentrun") of the bench database, migrated already
    # (as a pod's store is).
    setup = PgCheckpointer(dsn())
    await setup.setup()
    await setup.aclose()
    conn = await asyncpg.connect(dsn())
    try:
        samples = [(await _cold_start(conn))[0] for _ in range(p.cold_starts)]
        _, stderr = await _cold_start(conn, "-X", "importtime")
    finally:
        await conn.close()
    return {"samples": samples, "imports": import_profile(stderr)}


async def _cold_start(conn: Any, *python_options: str) -> tuple[float, str]:
    """One runner process: milliseconds from exec to its first checkpoint row, and its stderr."""
    from agentrun.contract import Env, RunnerInputs

    thread = f"cold-{uuid.uuid4().hex}"
    # The pod's environment as the operator renders it (contract.RunnerInputs), plus the store's DSN
    # (a secretKeyRef in a pod) and no termination log file.
    inputs = RunnerInputs(graph="bench.graphs:runner_graph", thread_id=thread, input={"items": []}, metrics_port=0)
    env = {
        **{k: v for k, v in os.environ.items() if k != Env.FAULT_POINT},
        "PYTHONPATH": os.pathsep.join([*sys.path[:1], os.environ.get("PYTHONPATH", ""), str(ROOT)]),
        **{e["name"]: e["value"] for e in inputs.to_env()},
        Env.POSTGRES_DSN: dsn(),
        Env.TERMINATION_LOG: os.devnull,
    }
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *python_options,
        "-m",
        "agentrun.runner",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    # stderr is read while polling: -X importtime writes more than a pipe holds.
    reading = asyncio.ensure_future(process.stderr.read()) if process.stderr else None
    seen = None
    while seen is None:
        found = await conn.fetchval("SELECT 1 FROM agentrun.states WHERE thread_id = $1 LIMIT 1", thread)
        if found:
            seen = time.perf_counter()
        elif process.returncode is not None or time.perf_counter() - started > 60:
            err = (await reading).decode() if reading else ""
            raise RuntimeError(f"the runner wrote no checkpoint (exit {process.returncode}): {err[-2000:]}")
        else:
            await asyncio.sleep(0.002)
    stderr = (await reading).decode() if reading else ""
    await process.wait()
    return (seen - started) * 1000.0, stderr


def import_profile(stderr: str) -> dict[str, float]:
    """``-X importtime`` output as milliseconds of import by package (each module's own time, summed by its
    top-level package; the standard library apart from asyncio as ``stdlib``), plus their ``total``."""
    groups: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        if not own.strip().isdigit():
            continue  # the header
        package = name.strip().split(".")[0]
        if package.startswith("__editable__"):
            package = "editable-install hook"  # this checkout's pip install -e; an image has none
        elif (package in sys.stdlib_module_names and package != "asyncio") or package.startswith("_"):
            package = "stdlib"
        groups[package] = groups.get(package, 0.0) + int(own) / 1000.0
    groups["total"] = sum(groups.values())
    return {k: round(v, 1) for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v >= 0.5}


def jobs(p: Params) -> dict[str, Callable[[Params], Awaitable[dict[str, Any]]]]:
    table: dict[str, Callable[[Params], Awaitable[dict[str, Any]]]] = {
        "pg_commit_ms": job_pg_commit,
        "agentrun_step_ms": agentrun_step_job("postgres"),
        "agentrun_step_ms_pure": agentrun_step_job("postgres", pure=True),
        "agentrun_step_ms_sqlite": agentrun_step_job("sqlite"),
        "agentrun_step_ms_memory": agentrun_step_job("memory"),
        "agentrun_tool_iteration_ms": job_agentrun_tools,
        "agentrun_step_ms_big_state": job_agentrun_big,
        "runner_cold_start_ms": job_cold_start,
    }
    for h in p.histories:
        table[f"agentrun_step_ms_msg_h{h}"] = agentrun_msg_job(h)
    for h in p.invoke_histories:
        table[f"agentrun_invoke_ms_msg_h{h}"] = agentrun_msg_job(h, whole=True)
    if langgraph_available():
        table["langgraph_step_ms"] = job_langgraph_step
        table["langgraph_tool_iteration_ms"] = job_langgraph_tools
        table["langgraph_step_ms_big_state"] = job_langgraph_big
        for h in p.histories:
            table[f"langgraph_step_ms_msg_h{h}"] = langgraph_msg_job(h)
    return table


# Jobs that also run on the baseline revision (``--baseline``).
BASELINE_JOBS = (
    "agentrun_step_ms",
    "agentrun_step_ms_sqlite",
    "agentrun_step_ms_memory",
    "agentrun_tool_iteration_ms",
    "agentrun_step_ms_msg_h0",
    "agentrun_step_ms_msg_h1000",
    "agentrun_step_ms_msg_h10000",
    "agentrun_step_ms_big_state",
)


def langgraph_available() -> bool:
    try:
        import langgraph.checkpoint.postgres.aio  # noqa: F401
    except ImportError:
        return False
    return True


# -- the driver ----------------------------------------------------------------------------------


async def ensure_database() -> None:
    import asyncpg

    target = dsn().rsplit("/", 1)
    try:
        conn = await asyncpg.connect(dsn())
    except asyncpg.InvalidCatalogNameError:
        admin = await asyncpg.connect(target[0] + "/postgres")
        try:
            await admin.execute(f'CREATE DATABASE "{target[1].split("?")[0]}"')
        finally:
            await admin.close()
        return
    await conn.close()


async def checkpoint_and_idle(idle: float) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn())
    try:
        with contextlib.suppress(asyncpg.PostgresError):  # CHECKPOINT needs superuser or pg_checkpoint
            await conn.execute("CHECKPOINT")
    finally:
        await conn.close()
    await asyncio.sleep(idle)


def run_job_process(name: str, p: Params, *, baseline: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    paths = [str(ROOT)]
    if baseline is not None:
        paths.insert(0, str(baseline / "runner"))
        env["BENCH_SCHEMA"] = schema() + "_base"
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("AGENTRUN_FAULT_POINT", None)
    cmd = [sys.executable, "-m", "bench.runtime", "job", name, *(["--quick"] if p.quick else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"job {name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("agentrun", "asyncpg", "langgraph", "langgraph-checkpoint-postgres", "psycopg", "pydantic"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    with contextlib.suppress(Exception):
        out["agentrun_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout.strip()
    return out


async def server_version() -> str:
    import asyncpg

    conn = await asyncpg.connect(dsn())
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


def machine() -> dict[str, Any]:
    facts: dict[str, Any] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        facts["loadavg_start"] = Path("/proc/loadavg").read_text().split()[:3]
    return facts


async def drive(
    p: Params,
    *,
    rounds: int,
    idle: float,
    baseline: str | None,
    inprocess: bool,
    out: Path,
    only: list[str] | None = None,
) -> dict[str, Any]:
    await ensure_database()
    table = jobs(p)
    if unknown := [n for n in only or () if n not in table]:
        raise SystemExit(f"unknown job(s) {', '.join(unknown)}; jobs: {', '.join(table)}")
    names = [n for n in table if only is None or n in only]
    worktree: Path | None = None
    planned: list[tuple[str, bool]] = [(n, False) for n in names]
    if baseline:
        worktree = Path(tempfile.mkdtemp(prefix="agentrun-bench-base-"))
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), baseline], cwd=ROOT, check=True, capture_output=True
        )
        planned += [(n, True) for n in baseline_jobs(only) if n in table]
    raw: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    facts = machine()  # before the run: its load average is the one at the start
    try:
        for r in range(rounds):
            shift = (r * len(planned)) // max(rounds, 1)
            order = planned[shift:] + planned[:shift]
            for name, base in order:
                await checkpoint_and_idle(idle)
                key = f"baseline:{name}" if base else name
                if inprocess and not base and name != "runner_cold_start_ms":
                    result = await table[name](p)
                else:
                    result = await asyncio.to_thread(run_job_process, name, p, baseline=worktree if base else None)
                result["round"] = r
                raw.setdefault(key, []).append(result)
                print(f"round {r} {key}: {statistics.median(result['samples']):.3f}", file=sys.stderr, flush=True)
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True)
    report = build_report(raw, rounds=rounds, baseline=baseline, baseline_names=baseline_jobs(only))
    report["meta"] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "rounds": rounds,
        "idle_between_jobs_s": idle,
        "quick": p.quick,
        "shape": {"nodes": p.nodes, "tool_iterations": p.iterations, "runs_per_job": p.runs},
        "versions": versions(),
        "postgres": await server_version(),
        "machine": facts,
        "baseline_revision": baseline,
    }
    with contextlib.suppress(OSError):
        report["meta"]["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    merge_results(out, report, partial=only is not None)
    return report


def baseline_jobs(only: list[str] | None) -> list[str]:
    """The jobs ``--baseline`` runs on the old code too: ``BASELINE_JOBS``, or the chosen agentrun jobs."""
    return list(BASELINE_JOBS) if only is None else [n for n in only if n.startswith("agentrun_")]


def merge_results(out: Path, report: dict[str, Any], *, partial: bool) -> None:
    """Write ``report`` into ``out``, merged: other benchmarks keep their own keys (bench/operator.py: "operator").

    A ``--jobs`` run (``partial``) replaces only its own figures and ratios, and keeps its meta (machine, load)
    under ``partial_runs`` by job list, so that the full run's meta still describes the other figures.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    existing: dict[str, Any] = {}
    if out.exists():
        with contextlib.suppress(ValueError):
            existing = json.loads(out.read_text())
    if partial:
        label = ",".join(sorted(k for k in report["figures"] if not k.startswith("baseline:")))
        report = {
            "figures": {**existing.get("figures", {}), **report["figures"]},
            "ratios": {**existing.get("ratios", {}), **report["ratios"]},
            "partial_runs": {**existing.get("partial_runs", {}), label: report["meta"]},
        }
    out.write_text(json.dumps({**existing, **report}, indent=1, sort_keys=True) + "\n")


def build_report(
    raw: dict[str, list[dict[str, Any]]],
    *,
    rounds: int,
    baseline: str | None,
    baseline_names: list[str] | tuple[str, ...] = BASELINE_JOBS,
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for key, results in raw.items():
        samples = [s for r in results for s in r["samples"]]
        entry: dict[str, Any] = {"samples": samples, **summarize(samples)}
        entry["round_medians"] = [statistics.median(r["samples"]) for r in results]
        if cpu := [s for r in results for s in r.get("cpu_samples", [])]:
            entry["cpu_ms"] = statistics.median(cpu)  # the client process's CPU, same unit as the samples
        for extra in (
            "round_trips_per_step",
            "transactions_per_step",
            "round_trips_per_iteration",
            "transactions_per_iteration",
        ):
            values = [v for r in results for v in r.get(extra, [])]
            if values:
                entry[extra] = statistics.median(values)
        if profiles := [r["imports"] for r in results if "imports" in r]:  # the cold start's, by round
            entry["imports_ms"] = {k: statistics.median(p.get(k, 0.0) for p in profiles) for k in profiles[0]}
        figures[key] = entry
    # The names for the message shapes.
    if "agentrun_step_ms_msg_h0" in figures:
        figures["agentrun_step_ms_msg"] = figures["agentrun_step_ms_msg_h0"]
    if "agentrun_step_ms_msg_h1000" in figures:
        figures["agentrun_step_ms_long_history"] = figures["agentrun_step_ms_msg_h1000"]
    if "langgraph_step_ms_msg_h1000" in figures:
        figures["langgraph_step_ms_long_history"] = figures["langgraph_step_ms_msg_h1000"]

    def ratio(a: str, b: str, samples: str = "samples") -> dict[str, Any] | None:
        """Median over rounds of a/b taken within each round (of ``samples``: wall, or ``cpu_samples``)."""
        if a not in raw or b not in raw or any(samples not in r for r in raw[a] + raw[b]):
            return None
        per_round = [
            statistics.median(x[samples]) / statistics.median(y[samples]) for x, y in zip(raw[a], raw[b], strict=False)
        ]
        return {"median": statistics.median(per_round), "per_round": per_round}

    pairs = {
        "agentrun_step_over_pg_commit": ("agentrun_step_ms", "pg_commit_ms"),
        "langgraph_step_over_agentrun_step": ("langgraph_step_ms", "agentrun_step_ms"),
        "agentrun_pure_step_over_pg_commit": ("agentrun_step_ms_pure", "pg_commit_ms"),
        "langgraph_step_over_agentrun_pure_step": ("langgraph_step_ms", "agentrun_step_ms_pure"),
        "langgraph_tool_iteration_over_agentrun": ("langgraph_tool_iteration_ms", "agentrun_tool_iteration_ms"),
        "agentrun_h1000_over_h0": ("agentrun_step_ms_msg_h1000", "agentrun_step_ms_msg_h0"),
        "agentrun_h10000_over_h0": ("agentrun_step_ms_msg_h10000", "agentrun_step_ms_msg_h0"),
        "agentrun_invoke_h10000_over_h0": ("agentrun_invoke_ms_msg_h10000", "agentrun_invoke_ms_msg_h0"),
        "langgraph_h1000_over_h0": ("langgraph_step_ms_msg_h1000", "langgraph_step_ms_msg_h0"),
        "langgraph_h10000_over_h0": ("langgraph_step_ms_msg_h10000", "langgraph_step_ms_msg_h0"),
        "langgraph_msg_over_agentrun_msg_h0": ("langgraph_step_ms_msg_h0", "agentrun_step_ms_msg_h0"),
        "langgraph_msg_over_agentrun_msg_h10000": ("langgraph_step_ms_msg_h10000", "agentrun_step_ms_msg_h10000"),
        "agentrun_big_state_over_step": ("agentrun_step_ms_big_state", "agentrun_step_ms"),
        "langgraph_big_state_over_agentrun": ("langgraph_step_ms_big_state", "agentrun_step_ms_big_state"),
    }
    if baseline:
        for name in baseline_names:
            pairs[f"before_over_after:{name}"] = (f"baseline:{name}", name)
    ratios = {k: v for k, (a, b) in pairs.items() if (v := ratio(a, b)) is not None}
    # The client's CPU alone (the message jobs' ``cpu_samples``): what a long thread adds in this process, which
    # a busy disk's commit latency hides in the wall-clock ratios.
    cpu_pairs = {
        "agentrun_invoke_cpu_h10000_over_h0": ("agentrun_invoke_ms_msg_h10000", "agentrun_invoke_ms_msg_h0"),
        "agentrun_step_cpu_h10000_over_h0": ("agentrun_step_ms_msg_h10000", "agentrun_step_ms_msg_h0"),
    }
    if baseline:
        for name in baseline_names:
            cpu_pairs[f"before_over_after_cpu:{name}"] = (f"baseline:{name}", name)
    ratios |= {k: v for k, (a, b) in cpu_pairs.items() if (v := ratio(a, b, "cpu_samples")) is not None}
    return {"figures": figures, "ratios": ratios}


def write_table(report: dict[str, Any], path: Path) -> None:
    figures = report["figures"]
    lines = [
        "| figure | median | min..max | n | round trips | transactions | before (baseline) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(k for k in figures if not k.startswith("baseline:")):
        f = figures[key]
        trips = f.get("round_trips_per_step", f.get("round_trips_per_iteration"))
        txns = f.get("transactions_per_step", f.get("transactions_per_iteration"))
        base = figures.get(f"baseline:{key}")
        base_trips = None if base is None else base.get("round_trips_per_step", base.get("round_trips_per_iteration"))
        lines.append(
            f"| `{key}` | {f['median']:.3f} | {f['min']:.3f}..{f['max']:.3f} | {f['n']} | "
            f"{'' if trips is None else f'{trips:.2f}'} | {'' if txns is None else f'{txns:.2f}'} | "
            + (
                ""
                if base is None
                else f"{base['median']:.3f}" + ("" if base_trips is None else f" ({base_trips:.2f} rt)")
            )
            + " |"
        )
    lines += ["", "| ratio (within each round, median) | value | per round |", "|---|---|---|"]
    for key, r in sorted(report["ratios"].items()):
        lines.append(f"| {key} | {r['median']:.2f} | {', '.join(f'{v:.2f}' for v in r['per_round'])} |")
    path.write_text("\n".join(lines) + "\n")


REPORT = ROOT / "bench" / "REPORT.md"
_BEGIN, _END = "<!-- figures: written by make bench -->", "<!-- /figures -->"


def update_report(table: str, report: dict[str, Any], path: Path = REPORT) -> None:
    """Put the run's table between the markers of ``bench/REPORT.md`` (the prose around it is written by hand)."""
    meta = report["meta"]
    block = "\n".join(
        [
            _BEGIN,
            f"Run of {meta['started']} ({meta['seconds']:.0f} s, {meta['rounds']} rounds, "
            f"PostgreSQL {meta['postgres']}, {meta['machine'].get('cpus')} CPUs, load "
            f"{' '.join(meta['machine'].get('loadavg_start', []))} at start; commit "
            f"{meta['versions'].get('agentrun_commit')}, baseline {meta['baseline_revision'] or '-'}). "
            "Milliseconds; round trips and transactions are per step (per iteration for tool iterations).",
            "",
            table.rstrip(),
            _END,
        ]
    )
    text = path.read_text() if path.exists() else f"# What durability costs\n\n{_BEGIN}\n{_END}\n"
    head, _, rest = text.partition(_BEGIN)
    _, _, tail = rest.partition(_END)
    path.write_text(head + block + tail)


def plot(report: dict[str, Any], directory: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = report["figures"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for runtime, label in (
        ("agentrun", "agentrun (PgCheckpointer)"),
        ("langgraph", "LangGraph (AsyncPostgresSaver, sync)"),
        ("baseline:agentrun", "agentrun before"),
    ):
        xs, ys = [], []
        for h in HISTORIES:
            f = figures.get(f"{runtime}_step_ms_msg_h{h}")
            if f is not None:
                xs.append(max(h, 1))
                ys.append(f["median"])
        if xs:
            ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("messages already in the thread (0 plotted at 1)")
    ax.set_ylabel("ms per step (append one ~200 B message)")
    ax.set_title("Step cost against history")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(directory / "history.png", dpi=110)
    plt.close(fig)

    keys = [
        k
        for k in (
            "pg_commit_ms",
            "agentrun_step_ms",
            "agentrun_step_ms_pure",
            "baseline:agentrun_step_ms",
            "langgraph_step_ms",
            "agentrun_step_ms_sqlite",
            "agentrun_step_ms_memory",
            "agentrun_tool_iteration_ms",
            "baseline:agentrun_tool_iteration_ms",
            "langgraph_tool_iteration_ms",
        )
        if k in figures
    ]
    fig, ax = plt.subplots(figsize=(8, 4))
    medians = [figures[k]["median"] for k in keys]
    lows = [figures[k]["median"] - figures[k]["min"] for k in keys]
    highs = [figures[k]["max"] - figures[k]["median"] for k in keys]
    ax.barh(keys, medians, xerr=[lows, highs], color="tab:blue", alpha=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("ms (median, min..max)")
    ax.set_title("Per step / per tool iteration")
    fig.tight_layout()
    fig.savefig(directory / "steps.png", dpi=110)
    plt.close(fig)


async def profile_step(out: Path, runs: int = 6) -> None:
    """pyinstrument over plain PostgreSQL steps: where a step's time goes (text and HTML)."""
    from pyinstrument import Profiler

    from .graphs import agentrun_plain

    async with agentrun_store("postgres") as store:
        app = agentrun_plain(store)
        await agentrun_run(app, {"items": []}, f"warm-{uuid.uuid4().hex}")
        profiler = Profiler(interval=0.0002, async_mode="enabled")
        with profiler:
            for _ in range(runs):
                await agentrun_run(app, {"items": []}, f"prof-{uuid.uuid4().hex}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_step.txt").write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    (out / "profile_step.html").write_text(profiler.output_html())
    split = {"undeclared": await step_split(runs), "pure": await step_split(runs, pure=True)}
    (out / "step_split.json").write_text(json.dumps(split, indent=2) + "\n")
    print(json.dumps(split))


async def step_split(runs: int, *, pure: bool = False) -> dict[str, float]:
    """A plain PostgreSQL step split without a profiler: wall, the client's CPU (user and kernel, from
    ``getrusage``), the server's time inside the checkpoint function per call (``pg_stat_user_functions``,
    with ``track_functions = pl`` on the bench database for the measurement), and a 1-row commit beside it."""
    import resource

    import asyncpg

    from .graphs import agentrun_plain

    database = dsn().rsplit("/", 1)[1].split("?")[0]
    admin = await asyncpg.connect(dsn())
    stats = "SELECT calls, total_time FROM pg_stat_user_functions WHERE funcname = 'agentrun_put_checkpoint'"
    try:
        await admin.execute(f"ALTER DATABASE \"{database}\" SET track_functions = 'pl'")
        async with agentrun_store("postgres") as store:  # connects after the setting: its sessions track
            app = agentrun_plain(store, pure=pure)
            await agentrun_run(app, {"items": []}, f"warm-{uuid.uuid4().hex}")
            before_stats = await admin.fetchrow(stats)
            before, started, steps = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
            for _ in range(runs):
                steps += (await agentrun_run(app, {"items": []}, f"split-{uuid.uuid4().hex}"))["steps"] + 1
            wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
        # The store's sessions report their function statistics as they exit (a live one at most once a second,
        # an idle one after 10 s): read once only this session is left on the database.
        others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        for _ in range(600):  # 30 s at most
            if not await admin.fetchval(others):
                break
            await asyncio.sleep(0.05)
        after_stats = await admin.fetchrow(stats)
        floor = statistics.mean(await commit_floor(admin, 300))
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" RESET track_functions')
        await admin.close()
    calls = after_stats["calls"] - (before_stats["calls"] if before_stats else 0)
    server = (after_stats["total_time"] - (before_stats["total_time"] if before_stats else 0)) / calls
    return {
        "steps": steps,
        "wall_ms_per_step": wall / steps * 1000.0,
        "client_user_cpu_ms_per_step": (after.ru_utime - before.ru_utime) / steps * 1000.0,
        "client_kernel_cpu_ms_per_step": (after.ru_stime - before.ru_stime) / steps * 1000.0,
        "server_function_ms_per_checkpoint": server,
        "pg_commit_ms": floor,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("job", help="run one job and print its samples as JSON (the driver's child)")
    one.add_argument("name")
    one.add_argument("--quick", action="store_true")
    prof = sub.add_parser("profile", help="pyinstrument over PostgreSQL steps into bench/results/")
    prof.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=1.0, help="seconds between jobs, after a CHECKPOINT")
    parser.add_argument("--baseline", help="also run the agentrun jobs on this git revision")
    parser.add_argument("--quick", action="store_true", help="the smoke: a few steps of each shape")
    parser.add_argument("--inprocess", action="store_true", help="run jobs in this process (faster, less isolated)")
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument(
        "--jobs",
        help="only these jobs, comma-separated (e.g. agentrun_invoke_ms_msg_h0,agentrun_invoke_ms_msg_h10000): their "
        "figures and ratios are merged into --out, REPORT.md's table and the plots are left alone",
    )
    args = parser.parse_args(argv)
    if args.command == "job":
        p = Params(args.quick)
        print(json.dumps(asyncio.run(jobs(p)[args.name](p))))
        return 0
    if args.command == "profile":
        asyncio.run(profile_step(args.out))
        return 0
    p = Params(args.quick)
    only = args.jobs.split(",") if args.jobs else None
    report = asyncio.run(
        drive(
            p,
            rounds=args.rounds,
            idle=args.idle,
            baseline=args.baseline,
            inprocess=args.inprocess,
            out=args.out,
            only=only,
        )
    )
    if only is not None:  # a few jobs: the full run's table and plots stay as they are
        write_table(report, args.out.with_name("table_jobs.md"))
        print(args.out.with_name("table_jobs.md").read_text())
        return 0
    write_table(report, args.out.with_name("table.md"))
    if not p.quick and args.out.parent == RESULTS:
        update_report(args.out.with_name("table.md").read_text(), report)
    if not args.no_plots:
        plot(report, args.out.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
