"""The LangGraph support agent run as an AgentRun's turn (``run_turn``), once, in this process (a crash test's child).

    python -m tests.support.drive_langgraph_turn STORE THREAD_ID ATTEMPT

What the runner does for ``spec.graph: examples.langgraph_support_agent:app``,
without the pod around it: attempt 1 starts the turn with the charge request,
a later attempt continues it from the store (LangGraph's checkpoint, our
progress row). The windows of the saver's hold and of the progress row are
5 s, so every row rides in the next super-step's statement whatever the
machine's load (the fault point ``after_progress_ride`` then fires where the
test expects). Prints ``DONE <status>``.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from agentrun.checkpoint import open_store
from agentrun.config import RunConfig
from agentrun.integrations.langgraph import hold
from agentrun.integrations.langgraph import run as lg_run
from examples.langgraph_support_agent import app

CHARGE = {"messages": [{"role": "user", "content": "charge my saved card for order 4821 and email me the receipt"}]}


@dataclass
class _NoPreemption:
    requested: bool = False
    cancel_now: bool = False


async def main(store_url: str, thread_id: str, attempt: int) -> None:
    hold.WRITE_HOLD_WINDOW = 5.0
    lg_run.MIRROR_WINDOW = 5.0
    store = open_store(store_url)
    await store.setup()
    try:
        await store.register_attempt(thread_id, attempt, run_uid="uid-1")
        existing = await store.aget(thread_id)
        status, _ = await lg_run.run_turn(
            lg_run.prepare(app, "examples.langgraph_support_agent:app"),
            store=store,
            cfg=RunConfig.from_any({"thread_id": thread_id, "run_uid": "uid-1", "attempt": attempt}),
            payload=CHARGE if existing is None else None,
            existing=existing,
            preemption=_NoPreemption(),
        )
    finally:
        await store.aclose()
    print(f"DONE {status}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
