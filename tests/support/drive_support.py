"""Run the support example once, in this process, through a chosen entry point; used by crash tests.

    python -m tests.support.drive_support STORE_URL THREAD_ID [--input TEXT] [--mode invoke|ainvoke|stream|astream]
        [--request-key K]

Without --input it resumes the thread's unfinished run; with --request-key the
input is that request (sent again, it resumes or answers). Exit codes follow the
pod contract: 0 completed, 3 interrupted, 4 stopped, 5 failed. The final
state is printed as one JSON line prefixed ``FINAL `` (roles, contents and
tool names, without random ids) so tests can compare runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from agentrun import RunStopped
from agentrun.checkpoint import from_url
from agentrun.engine import CompiledGraph
from agentrun.errors import AgentRunError


def summary(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "role": m.role,
            "content": m.content,
            "name": m.name,
            "tool_calls": [(c.id, c.name, c.arguments) for c in m.tool_calls],
            "tool_call_id": m.tool_call_id,
        }
        for m in values.get("messages", [])
    ]


async def drive(store: str, thread_id: str, text: str | None, mode: str, request_key: str | None = None) -> int:
    from examples.support_agent import graph

    checkpointer = from_url(store)
    app = CompiledGraph(graph, checkpointer=checkpointer, name="support")
    config = {"thread_id": thread_id, **({"request_key": request_key} if request_key else {})}
    try:
        if mode == "ainvoke":
            values = await app.ainvoke(text, config)
        elif mode == "astream":
            values = {}
            async for event in app.astream(text, config):
                if event.values is not None:
                    values = event.values
        else:
            raise AssertionError(mode)
    finally:
        await checkpointer.aclose()
    print("FINAL " + json.dumps(summary(values)), flush=True)
    return 3 if "__interrupt__" in values else 0


def drive_sync(store: str, thread_id: str, text: str | None, mode: str, request_key: str | None = None) -> int:
    """The blocking wrappers, which must share the async engine."""
    from examples.support_agent import graph

    checkpointer = from_url(store)
    app = CompiledGraph(graph, checkpointer=checkpointer, name="support")
    config = {"thread_id": thread_id, **({"request_key": request_key} if request_key else {})}
    if mode == "invoke":
        values = app.invoke(text, config)
    else:
        values = {}
        for event in app.stream(text, config):
            if event.values is not None:
                values = event.values
    print("FINAL " + json.dumps(summary(values)), flush=True)
    return 3 if "__interrupt__" in values else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("thread_id")
    parser.add_argument("--input")
    parser.add_argument("--mode", default="astream", choices=["invoke", "ainvoke", "stream", "astream"])
    parser.add_argument("--request-key")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.mode in ("invoke", "stream"):
            return drive_sync(args.store, args.thread_id, args.input, args.mode, args.request_key)
        return asyncio.run(drive(args.store, args.thread_id, args.input, args.mode, args.request_key))
    except RunStopped:
        return 4
    except AgentRunError as e:
        print(f"drive_support: {e}", file=sys.stderr)
        return 5


if __name__ == "__main__":
    sys.exit(main())
