"""Run a graph with a large unchanged channel on PostgreSQL in this process; used by ``test_state_deltas``.

    python -m tests.postgres.drive_deltas DSN THREAD_ID [--snapshot-every N]

Starts the run if the thread has no checkpoint, resumes it if unfinished,
reports it if completed (what a restarted pod does). The graph: ``init`` sets ``big`` (about 100 KB, never
changed again), then ``step`` runs ``STEPS`` times, each bumping ``n`` and
every third step appending to ``log`` (an appending reducer): most state
rows are deltas. Prints ``READY``, then ``FINAL <json>`` (the values, with
``big`` as its length and digest). Exit 0 when completed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import operator
import os
import sys
from typing import Annotated, Any, TypedDict

from agentrun import END, START, StateGraph
from agentrun.checkpoint.postgres import PgCheckpointer

STEPS = 40
BIG = "".join(f"{i:06d}" for i in range(17_000))  # ~100 KB


class State(TypedDict, total=False):
    big: str
    n: int
    log: Annotated[list[int], operator.add]


async def init(state: State) -> dict[str, Any]:
    return {"big": BIG, "n": 0, "log": []}


async def step(state: State) -> dict[str, Any]:
    await asyncio.sleep(float(os.environ.get("DELTAS_STEP_DELAY", "0.005")))
    n = state["n"] + 1
    return {"n": n, "log": [n]} if n % 3 == 0 else {"n": n}


def route(state: dict[str, Any]) -> str:
    return END if state["n"] >= STEPS else "step"


def graph() -> StateGraph:
    g = StateGraph(State)
    g.add_node("init", init)
    g.add_node("step", step)
    g.add_edge(START, "init")
    g.add_edge("init", "step")
    g.add_conditional_edges("step", route)
    return g


def summary(values: dict[str, Any]) -> dict[str, Any]:
    big = values.get("big", "")
    return {
        "big": [len(big), hashlib.sha256(big.encode()).hexdigest()],
        "n": values.get("n"),
        "log": values.get("log"),
    }


async def main(dsn: str, thread_id: str, snapshot_every: int) -> int:
    checkpointer = PgCheckpointer(dsn, snapshot_every=snapshot_every)
    try:
        app = graph().compile(checkpointer)
        existing = await checkpointer.aget(thread_id)
        print("READY", flush=True)
        if existing is not None and existing.status == "completed":
            values = existing.values
        else:
            values = await app.ainvoke({"n": 0} if existing is None else None, {"thread_id": thread_id})
        print("FINAL " + json.dumps(summary(values)), flush=True)
        return 0
    finally:
        await checkpointer.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("thread_id")
    parser.add_argument("--snapshot-every", type=int, default=8)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.dsn, args.thread_id, args.snapshot_every)))
