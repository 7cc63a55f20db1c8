"""The same LangGraph graphs on agentrun's saver and on LangGraph's own, side by side: per step and per tool iteration.

    python -m bench.langgraph_saver [--steps 40] [--iterations 10] [--rounds 7] [--runs 2] [--quick]

Two workloads, ``durability="sync"`` (every super-step durable before the
next: what the runner uses):

- **step**: a ``StateGraph(MessagesState)`` whose one node appends a
  200-character assistant message, looped ``--steps`` times; ms per step;
- **tool iteration**: a scripted model asks for three tools in one assistant
  message (``lookup``, ``score``, ``notify``; ``notify`` has side effects),
  a tool node runs them in parallel, ``--iterations`` times; ms per iteration
  (the model's super-step and the tools' one). Ours: ``LedgerToolNode``
  (every call in the ledger, an intent before ``notify``); theirs: LangGraph's
  plain ``ToolNode``.

Ours is ``AgentrunSaver`` on ``PgCheckpointer`` (asyncpg); theirs
``AsyncPostgresSaver`` (langgraph-checkpoint-postgres, psycopg); and the
floor, LangGraph's ``InMemorySaver`` (no store at all): theirs / floor is
the most any saver could gain on LangGraph's own loop (the ceiling). Each
(saver, workload) has a database of its own on the server at ``BENCH_DSN``,
so ``pg_stat_database.xact_commit`` counts its commits alone (read once its
sessions ended, over the rounds and the warm-up run); our round trips
and transactions are also counted on the wire (``bench.counting``; psycopg's
cannot be), and this process's CPU per unit (which load does not inflate as
much as wall time). Each side goes first in turn; the ratio (theirs / ours)
is taken within each round and its median reported, with the load average.
Prints a Markdown table, writes ``langgraph_saver.json`` beside ``--out``
(``bench/results/latest.json``) and merges it into that file under ``langgraph_saver``.
``--profile WORKLOAD`` runs ours under pyinstrument instead and prints where
the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.config import RunConfig
from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode
from agentrun.integrations.langgraph.run import prepare, run_turn
from bench.counting import Counter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORKLOADS = ("step", "tools")
# memory: LangGraph's InMemorySaver, no store at all (the floor); run: ours as the runner runs an AgentRun's graph
# (``run_turn``: the progress mirror, the metering callback and the stop supervisor included)
SIDES = ("agentrun", "langgraph", "memory", "run")


def _dsn(database: str | None = None) -> str:
    dsn = os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    return dsn if database is None else urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def step_graph(steps: int) -> StateGraph[MessagesState]:
    graph = StateGraph(MessagesState)
    graph.add_node("step", lambda state: {"messages": [AIMessage(content="x" * 200)]})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: END if len(state["messages"]) > steps else "step")
    return graph


@lc_tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@lc_tool
async def score(key: str) -> int:
    """Score a key."""
    return len(key)


@lc_tool
async def notify(key: str) -> str:
    """Notify about a key (a side effect)."""
    return f"notified {key}"


def tools_graph(side: str, iterations: int) -> StateGraph[MessagesState]:
    def model(state: MessagesState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if m.type == "ai")
        if done >= iterations:
            return {"messages": [AIMessage("done")]}
        calls = [
            {"id": f"c{done}_{name}", "name": name, "args": {"key": f"k{done}"}}
            for name in ("lookup", "score", "notify")
        ]
        return {"messages": [AIMessage("", tool_calls=calls)]}

    tools = [lookup, score, notify]
    node = LedgerToolNode(tools, side_effects={"notify"}) if side == "agentrun" else ToolNode(tools)  # plain: no ledger
    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


@dataclass
class Params:
    steps: int = 40
    iterations: int = 10
    rounds: int = 7
    runs: int = 2  # runs per side, workload and round (the round's figure is their median)

    def units(self, workload: str) -> int:
        return self.steps if workload == "step" else self.iterations


@dataclass
class Side:
    """One saver on one workload: its database, app and what was measured."""

    side: str
    workload: str
    database: str
    app: Any = None
    counter: Counter | None = None
    ms: list[float] = field(default_factory=list)  # per round
    cpu_ms: list[float] = field(default_factory=list)  # this process's CPU per unit, per round (load-proof)
    round_trips: int = 0
    transactions: int = 0
    units: int = 0
    warm_units: int = 0  # the warm-up run's: its commits are counted with the rounds' (sessions must end first)
    store: PgCheckpointer | None = None  # the run side's store (run_turn takes the store, not a saver)


async def _flushed_commits(admin: asyncpg.Connection, databases: list[str]) -> dict[str, int]:
    """Each database's commits once no session is left on it.

    A session reports its counts to ``pg_stat_database`` at most once a second while busy and only 10 s into
    idleness (PostgreSQL 15), but always as it exits: read while its sessions live, a count could miss their
    last second (a quick run's could read 0).
    """
    deadline = time.monotonic() + 30
    while await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = ANY($1::text[])", databases):
        if time.monotonic() > deadline:
            raise RuntimeError(f"sessions on {databases} outlived their stores by 30 s")
        await asyncio.sleep(0.05)
    rows = await admin.fetch(
        "SELECT datname, xact_commit FROM pg_stat_database WHERE datname = ANY($1::text[])", databases
    )
    return {row["datname"]: int(row["xact_commit"]) for row in rows}


@dataclass
class _NoPreemption:
    requested: bool = False
    cancel_now: bool = False


async def run_once(app: Any, workload: str, p: Params, store: PgCheckpointer | None = None) -> float:
    """One run on a fresh thread: ms per step or per tool iteration (``store``: as an AgentRun, ``run_turn``)."""
    config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 10 * p.steps + 10}
    started = time.perf_counter()
    if store is None:
        await app.ainvoke({"messages": [HumanMessage("go")]}, config, durability="sync")
    else:
        cfg = RunConfig.from_any(
            {"thread_id": uuid.uuid4().hex, "run_uid": "bench", "recursion_limit": 10 * p.steps + 10}
        )
        payload = {"messages": [{"role": "user", "content": "go"}]}
        await run_turn(app, store=store, cfg=cfg, payload=payload, existing=None, preemption=_NoPreemption())
    return (time.perf_counter() - started) / p.units(workload) * 1000


@contextlib.asynccontextmanager
async def saver_for(one: Side) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    if one.side in ("agentrun", "run"):
        one.counter = Counter()
        # sslmode=disable: the wire counter reads a plain TCP transport (as bench.runtime does).
        dsn = _dsn(one.database) + "?sslmode=disable"
        store = PgCheckpointer(dsn, pool_options={"init": one.counter.init})
        await store.setup()
        one.store = store if one.side == "run" else None
        try:
            yield AgentrunSaver(store)
        finally:
            await store.aclose()
        return
    if one.side == "memory":
        yield InMemorySaver()
        return
    async with AsyncPostgresSaver.from_conn_string(_dsn(one.database)) as theirs:
        await theirs.setup()
        yield theirs


def _build(one: Side, saver: BaseCheckpointSaver[Any], p: Params) -> Any:
    side = "agentrun" if one.side == "run" else one.side
    graph = step_graph(p.steps) if one.workload == "step" else tools_graph(side, p.iterations)
    if one.side == "run":
        return prepare(graph.compile(), "bench")  # run_turn gives it AgentrunSaver on the run's store
    return graph.compile(checkpointer=saver)


async def _measure_round(one: Side, p: Params) -> None:
    before = one.counter.snapshot() if one.counter else (0, 0)
    cpu = time.process_time()
    times = [await run_once(one.app, one.workload, p, one.store) for _ in range(p.runs)]
    one.cpu_ms.append((time.process_time() - cpu) / (p.runs * p.units(one.workload)) * 1000)
    if one.counter:
        one.round_trips += one.counter.round_trips - before[0]
        one.transactions += one.counter.transactions - before[1]
    one.units += p.runs * p.units(one.workload)
    one.ms.append(statistics.median(times))


async def measure(p: Params) -> dict[str, Any]:
    """Every (side, workload) on its own database, rounds alternated; the figures and per-round ratios."""
    admin = await asyncpg.connect(_dsn())
    sides = [Side(s, w, f"lgbench_{s}_{w}_{uuid.uuid4().hex[:6]}") for w in WORKLOADS for s in SIDES]
    stored = [one for one in sides if one.side != "memory"]
    databases = [one.database for one in stored]
    load_before = os.getloadavg()
    try:
        for one in stored:
            await admin.execute(f'CREATE DATABASE "{one.database}"')
            async with saver_for(one):  # its schema, in sessions that end before the count starts
                pass
        before = await _flushed_commits(admin, databases)
        async with contextlib.AsyncExitStack() as stack:
            for one in sides:
                saver = await stack.enter_async_context(saver_for(one))
                one.app = _build(one, saver, p)
                await run_once(one.app, one.workload, p, one.store)  # warm: pool, prepared statements
                one.warm_units = p.units(one.workload)
            for r in range(p.rounds):
                for workload in WORKLOADS:
                    trio = [one for one in sides if one.workload == workload]
                    for one in trio[r % len(trio) :] + trio[: r % len(trio)]:  # each side goes first in turn
                        await _measure_round(one, p)
        after = await _flushed_commits(admin, databases)
        commits = {id(one): after[one.database] - before[one.database] for one in stored}
    finally:
        for one in stored:
            await admin.execute(f'DROP DATABASE IF EXISTS "{one.database}" WITH (FORCE)')
        await admin.close()
    return _summary(sides, commits, p, load_before)


def _summary(sides: list[Side], commits: dict[int, int], p: Params, load_before: tuple[float, ...]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for workload in WORKLOADS:
        ours, theirs, floor, run = (next(o for o in sides if o.workload == workload and o.side == s) for s in SIDES)
        ratios = [t / o for t, o in zip(theirs.ms, ours.ms, strict=True)]
        # The most any store could give: LangGraph's time with no store at all against its time on its own saver.
        ceiling = [t / f for t, f in zip(theirs.ms, floor.ms, strict=True)]
        rows[workload] = {
            "unit": "step" if workload == "step" else "tool iteration",
            "agentrun_ms": round(statistics.median(ours.ms), 3),
            "langgraph_ms": round(statistics.median(theirs.ms), 3),
            "langgraph_over_agentrun": round(statistics.median(ratios), 2),
            "ratios_per_round": [round(x, 2) for x in ratios],
            "memory_ms": round(statistics.median(floor.ms), 3),
            "memory_cpu_ms": round(statistics.median(floor.cpu_ms), 3),
            "ceiling_langgraph_over_memory": round(statistics.median(ceiling), 2),
            "agentrun_cpu_ms": round(statistics.median(ours.cpu_ms), 3),
            "langgraph_cpu_ms": round(statistics.median(theirs.cpu_ms), 3),
            "langgraph_over_agentrun_cpu": round(
                statistics.median(t / o for t, o in zip(theirs.cpu_ms, ours.cpu_ms, strict=True)), 2
            ),
            "agentrun_round_trips": round(ours.round_trips / ours.units, 2),
            "agentrun_transactions_wire": round(ours.transactions / ours.units, 2),
            "agentrun_commits": round(commits[id(ours)] / (ours.units + ours.warm_units), 2),
            "langgraph_commits": round(commits[id(theirs)] / (theirs.units + theirs.warm_units), 2),
            "run_ms": round(statistics.median(run.ms), 3),
            "langgraph_over_run": round(statistics.median(t / r for t, r in zip(theirs.ms, run.ms, strict=True)), 2),
            "run_cpu_ms": round(statistics.median(run.cpu_ms), 3),
            "run_round_trips": round(run.round_trips / run.units, 2),
            "run_commits": round(commits[id(run)] / (run.units + run.warm_units), 2),
            "agentrun_ms_per_round": [round(x, 3) for x in ours.ms],
            "langgraph_ms_per_round": [round(x, 3) for x in theirs.ms],
        }
    return {
        "params": {"steps": p.steps, "iterations": p.iterations, "rounds": p.rounds, "runs_per_round": p.runs},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workloads": rows,
    }


def merge(out: Path, section: dict[str, Any]) -> None:
    """Write ``section`` as ``langgraph_saver`` into ``out``, keeping every other key."""
    existing: dict[str, Any] = {}
    if out.exists():
        with contextlib.suppress(ValueError):
            existing = json.loads(out.read_text())
    existing["langgraph_saver"] = section
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(existing, indent=1, sort_keys=True) + "\n")


def table(report: dict[str, Any]) -> str:
    lines = [
        "| per | AgentrunSaver ms | AsyncPostgresSaver ms | theirs / ours (median of rounds) | client CPU ms, ours"
        " / theirs (ratio) | ours: round trips | ours: commits | theirs: commits | no store (InMemorySaver) ms:"
        " the ceiling of theirs / ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["workloads"].values():
        lines.append(
            f"| {row['unit']} | {row['agentrun_ms']} | {row['langgraph_ms']} | {row['langgraph_over_agentrun']}x "
            f"| {row['agentrun_cpu_ms']} / {row['langgraph_cpu_ms']} ({row['langgraph_over_agentrun_cpu']}x) "
            f"| {row['agentrun_round_trips']} | {row['agentrun_commits']} | {row['langgraph_commits']} "
            f"| {row['memory_ms']}: {row['ceiling_langgraph_over_memory']}x |"
        )
    lines += [
        "",
        "As an AgentRun (``run_turn``: the same graph as the runner runs it, our progress row and metering included):",
        "",
        "| per | ms | theirs / it | client CPU ms | round trips | commits |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["workloads"].values():
        lines.append(
            f"| {row['unit']} | {row['run_ms']} | {row['langgraph_over_run']}x | {row['run_cpu_ms']} "
            f"| {row['run_round_trips']} | {row['run_commits']} |"
        )
    load = report["load_average"]
    return "\n".join(lines) + f"\n\nload average (1, 5, 15 min) before {load['before']}, after {load['after']}"


async def profile(workload: str, p: Params) -> None:
    """Ours alone under pyinstrument: where a step's (or an iteration's) time goes."""
    from pyinstrument import Profiler

    admin = await asyncpg.connect(_dsn())
    one = Side("agentrun", workload, f"lgbench_profile_{uuid.uuid4().hex[:6]}")
    await admin.execute(f'CREATE DATABASE "{one.database}"')
    try:
        async with saver_for(one) as saver:
            one.app = _build(one, saver, p)
            await run_once(one.app, workload, p)
            profiler = Profiler(interval=0.0002, async_mode="enabled")
            with profiler:
                for _ in range(p.rounds * p.runs):
                    await run_once(one.app, workload, p)
            print(profiler.output_text(unicode=False, color=False, show_all=False))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{one.database}" WITH (FORCE)')
        await admin.close()


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=Params.steps)
    parser.add_argument("--iterations", type=int, default=Params.iterations)
    parser.add_argument("--rounds", type=int, default=Params.rounds)
    parser.add_argument("--runs", type=int, default=Params.runs)
    parser.add_argument("--quick", action="store_true", help="the smoke: 2 rounds of short runs")
    parser.add_argument("--profile", choices=WORKLOADS, help="profile ours on this workload instead")
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args()
    p = Params(args.steps, args.iterations, args.rounds, args.runs)
    if args.quick:
        p = Params(steps=5, iterations=2, rounds=2, runs=1)
    if args.profile:
        asyncio.run(profile(args.profile, p))
        return
    report = asyncio.run(measure(p))
    print(f"\nLangGraph on AgentrunSaver vs AsyncPostgresSaver, durability=sync, {p.rounds} alternating rounds\n")
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    (args.out.parent / "langgraph_saver.json").write_text(json.dumps(report, indent=2) + "\n")
    merge(args.out, report)


if __name__ == "__main__":
    run()
