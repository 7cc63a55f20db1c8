"""The same LangGraph graph on agentrun's saver and on LangGraph's own: ms per step, PostgreSQL work per step.

    python -m bench.langgraph_saver [--steps 40] [--runs 7]

A ``StateGraph(MessagesState)`` whose one node appends a 200-character
assistant message per step, looped ``--steps`` times, ``durability="sync"``
(every super-step durable before the next: what the runner uses). Each
saver gets a database of its own on the server at ``BENCH_DSN`` (default:
the local one), so ``pg_stat_database.xact_commit`` counts its commits
alone; agentrun's round trips are counted on the wire (``bench.counting``;
psycopg's cannot be, so LangGraph's saver shows transactions only). Prints a
Markdown table and writes ``bench/results/langgraph_saver.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from agentrun.checkpoint import SqliteCheckpointer
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.integrations.langgraph import AgentrunSaver
from bench.counting import Counter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "langgraph_saver.json"


def _dsn(database: str | None = None) -> str:
    dsn = os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    return dsn if database is None else urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def build(steps: int) -> StateGraph[MessagesState]:
    graph = StateGraph(MessagesState)
    graph.add_node("step", lambda state: {"messages": [AIMessage(content="x" * 200)]})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: END if len(state["messages"]) > steps else "step")
    return graph


async def _commits(database: str) -> int:
    conn = await asyncpg.connect(_dsn())
    try:
        return int(await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = $1", database))
    finally:
        await conn.close()


async def measure(saver: BaseCheckpointSaver[Any], steps: int, runs: int) -> list[float]:
    app = build(steps).compile(checkpointer=saver)
    per_step = []
    for _ in range(runs):
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 10 * steps}
        started = time.perf_counter()
        await app.ainvoke({"messages": [HumanMessage("go")]}, config, durability="sync")
        per_step.append((time.perf_counter() - started) / steps * 1000)
    return per_step


async def main(steps: int, runs: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    admin = await asyncpg.connect(_dsn())
    try:
        for name in ("agentrun", "langgraph"):
            database = f"lgbench_{name}_{uuid.uuid4().hex[:6]}"
            await admin.execute(f'CREATE DATABASE "{database}"')
            try:
                counter = Counter()
                if name == "agentrun":
                    # sslmode=disable: the wire counter reads a plain TCP transport (as bench.runtime does).
                    store = PgCheckpointer(_dsn(database) + "?sslmode=disable", pool_options={"init": counter.init})
                    saver: BaseCheckpointSaver[Any] = AgentrunSaver(store)
                    await store.setup()
                    await measure(saver, 3, 1)  # warm: pool, prepared statements
                    before_rt, before_tx = counter.round_trips, await _commits(database)
                    times = await measure(saver, steps, runs)
                    after_rt, after_tx = counter.round_trips, await _commits(database)
                    await store.aclose()
                    label = "LangGraph graph on AgentrunSaver (PostgreSQL, asyncpg)"
                    round_trips: float | None = (after_rt - before_rt) / (steps * runs)
                else:
                    async with AsyncPostgresSaver.from_conn_string(_dsn(database)) as lg_saver:
                        await lg_saver.setup()
                        await measure(lg_saver, 3, 1)
                        before_tx = await _commits(database)
                        times = await measure(lg_saver, steps, runs)
                        after_tx = await _commits(database)
                    label = "LangGraph graph on AsyncPostgresSaver (langgraph-checkpoint-postgres, psycopg)"
                    round_trips = None
                # pg_stat_database is updated when a backend reports; give it a moment.
                await asyncio.sleep(0.6)
                after_tx = max(after_tx, await _commits(database))
                rows.append(
                    {
                        "saver": label,
                        "ms_per_step": round(statistics.median(times), 2),
                        "round_trips_per_step": None if round_trips is None else round(round_trips, 2),
                        "commits_per_step": round((after_tx - before_tx) / (steps * runs), 2),
                    }
                )
            finally:
                await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await admin.close()
    with tempfile.TemporaryDirectory() as tmp:
        store_sqlite = SqliteCheckpointer(Path(tmp) / "agentrun.db")
        await store_sqlite.setup()
        times = await measure(AgentrunSaver(store_sqlite), steps, runs)
        await store_sqlite.aclose()
    rows.append(
        {
            "saver": "LangGraph graph on AgentrunSaver (SQLite, synchronous=FULL)",
            "ms_per_step": round(statistics.median(times), 2),
            "round_trips_per_step": None,
            "commits_per_step": None,
        }
    )
    return rows


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rows = asyncio.run(main(args.steps, args.runs))
    print(f"\n{args.steps}-step LangGraph graph, durability=sync, median of {args.runs} runs\n")
    print("| saver | ms/step | round trips/step | commits/step |\n|---|---|---|---|")
    for row in rows:
        cells = (row["ms_per_step"], row["round_trips_per_step"], row["commits_per_step"])
        print(f"| {row['saver']} | " + " | ".join(_cell(c) for c in cells) + " |")
    RESULTS.write_text(json.dumps({"steps": args.steps, "runs": args.runs, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    run()
