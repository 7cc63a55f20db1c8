"""Run a chain of pure nodes on PostgreSQL or SQLite in this process; ``test_pure_ahead_crash``'s child.

    python -m tests.postgres.drive_pure STORE THREAD_ID PROBE [--start] [--preempt-after NODE]
        [--redis URL --redis-prefix P]

``STORE`` is a PostgreSQL DSN (with ``--redis``: behind the Redis hot cache) or ``sqlite:PATH``.
``--start`` starts a turn (items empty); without it the thread's unfinished run resumes. Each node
``n<i>`` is declared ``agentrun.ahead.pure`` and appends ``i`` to the
``items`` channel; it also appends its name to ``PROBE`` (a test probe, the
one impurity: it counts how often each node was computed, ahead or not).
``--preempt-after NODE`` asks for a preemption when NODE's event arrives
(the consumer runs between the engine's steps: deterministic).

Prints ``STEP <node> <version>`` per step event as it arrives and ``FINAL
<json of the items>`` at the end. Exit codes: 0 completed, 6 preempted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
from typing import Annotated, Any, TypedDict

from agentrun import END, START, RunPreempted, StateGraph
from agentrun.ahead import pure
from agentrun.checkpoint import Checkpointer
from agentrun.checkpoint.cached import CachedStore
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.checkpoint.sqlite import SqliteCheckpointer
from agentrun.engine import CompiledGraph, Preemption

NODES = 8


class Items(TypedDict, total=False):
    items: Annotated[list[int], operator.add]


def node(i: int, probe: str) -> Any:
    @pure
    def run(state: dict[str, Any]) -> dict[str, Any]:
        fd = os.open(probe, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"n{i}\n".encode())  # in the kernel's page cache at once: a SIGKILL keeps it
        finally:
            os.close(fd)
        return {"items": [i]}

    return run


def graph(store: Checkpointer, probe: str) -> CompiledGraph:
    builder = StateGraph(Items)
    for i in range(NODES):
        builder.add_node(f"n{i}", node(i, probe))
        builder.add_edge(START if i == 0 else f"n{i - 1}", f"n{i}")
    builder.add_edge(f"n{NODES - 1}", END)
    return builder.compile(store)


def open_store(spec: str, *, redis: str | None = None, redis_prefix: str = "agentrun") -> Checkpointer:
    if spec.startswith("sqlite:"):
        return SqliteCheckpointer(spec.removeprefix("sqlite:"))
    store = PgCheckpointer(spec)
    return store if redis is None else CachedStore(store, redis_url=redis, redis_prefix=redis_prefix)


async def drive(args: argparse.Namespace) -> int:
    store = open_store(args.store, redis=args.redis, redis_prefix=args.redis_prefix)
    await store.setup()
    preemption = Preemption()
    app = graph(store, args.probe)
    try:
        async for event in app.astream(
            {"items": []} if args.start else None, {"thread_id": args.thread}, preemption=preemption
        ):
            if event.kind == "step":
                print(f"STEP {event.node} {event.version}", flush=True)
                if event.node == args.preempt_after:
                    preemption.requested = True
        snapshot = await app.aget_state(args.thread)
        assert snapshot is not None
        print(f"FINAL {json.dumps(snapshot.values['items'])}", flush=True)
        return 0
    except RunPreempted:
        return 6
    finally:
        await store.aclose()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("thread")
    parser.add_argument("probe")
    parser.add_argument("--start", action="store_true")
    parser.add_argument("--preempt-after")
    parser.add_argument("--redis")
    parser.add_argument("--redis-prefix", default="agentrun")
    return asyncio.run(drive(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
