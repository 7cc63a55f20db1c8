"""Run the support example on PostgreSQL in this process, as a runner pod would; used by this tier's tests.

    python -m tests.postgres.drive_pg DSN THREAD_ID [--input TEXT | --auto TEXT] [--attempt N [--run-uid UID]]
        [--redis URL --redis-prefix P] [--stop-self-before-version V] [--request-key K]

Modes: ``--input`` starts a turn; neither flag resumes the thread's
unfinished run; ``--auto TEXT`` does what a restarted pod does: start with
TEXT if the thread has no checkpoint yet, resume it if it is unfinished, and
only report it if it already completed. With ``--attempt`` the process
registers that attempt first and writes under it (fencing); ``--run-uid``
makes it an attempt of that AgentRun (fencing across the runs of a thread).

``--stop-self-before-version V`` makes the process SIGSTOP itself just
before it writes state version V, so a test can freeze it at a precise
point, let another attempt run, and SIGCONT it. ``--request-key K`` runs the
input as request K (sent again, it resumes or answers instead of starting a turn).

Prints ``READY`` when the run starts, ``STEP <node> <version>`` per step and
the final state as ``FINAL <json>`` (the shared summary: roles, contents,
tool calls, no random ids). Exit codes: 0 completed, 3 interrupted,
4 stopped, 5 other agentrun error, 7 fenced, 8 stale state, 9 storage failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

from agentrun import RunStopped
from agentrun.checkpoint import Checkpointer
from agentrun.checkpoint.base import CheckpointWrite, Commit
from agentrun.checkpoint.cached import CachedStore
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.contract import Env
from agentrun.engine import CompiledGraph
from agentrun.errors import AgentRunError, FencedError, StaleStateError, StorageError
from tests.support.drive_support import summary

EXIT_FENCED, EXIT_STALE, EXIT_STORAGE = 7, 8, 9


class FreezingCheckpointer(PgCheckpointer):
    """Stops its own process (SIGSTOP) right before writing a chosen version; a test resumes it."""

    def __init__(self, *args: Any, freeze_before: int | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.freeze_before = freeze_before

    async def acommit(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> Commit:
        if self.freeze_before is not None and expected_version + 1 == self.freeze_before:
            print(f"FROZEN before version {self.freeze_before}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return await super().acommit(
            thread_id, write, expected_version=expected_version, attempt=attempt, run_uid=run_uid
        )


async def drive(args: argparse.Namespace) -> int:
    from examples.support_agent import graph

    # The runner's setting: how long an outage may last before calls raise StoreUnavailableError.
    retry_timeout = float(os.environ.get(Env.STORE_RETRY_SECONDS, "60"))
    checkpointer: Checkpointer = FreezingCheckpointer(
        args.dsn, freeze_before=args.stop_self_before_version, retry_timeout=retry_timeout
    )
    if args.redis:
        checkpointer = CachedStore(checkpointer, redis_url=args.redis, redis_prefix=args.redis_prefix)
    app = CompiledGraph(graph, checkpointer=checkpointer, name="support")
    config: dict[str, Any] = {"thread_id": args.thread_id}
    if args.request_key:
        config["request_key"] = args.request_key
    try:
        await checkpointer.setup()
        if args.attempt is not None:
            config.update(attempt=args.attempt, run_uid=args.run_uid)
            await checkpointer.register_attempt(args.thread_id, args.attempt, run_uid=args.run_uid)
        payload: str | None = args.input
        if args.auto is not None:
            existing = await checkpointer.aget(args.thread_id)
            if existing is None:
                payload = args.auto
            elif existing.status == "completed":
                snapshot = await app.aget_state(args.thread_id)
                assert snapshot is not None
                print("FINAL " + json.dumps(summary(snapshot.values)), flush=True)
                return 0
        print("READY", flush=True)
        values: dict[str, Any] = {}
        async for event in app.astream(payload, config):
            if event.kind == "step":
                print(f"STEP {event.node} {event.version}", flush=True)
            if event.values is not None:
                values = dict(event.values)
            if event.kind == "interrupt":
                values["__interrupt__"] = True
    finally:
        await checkpointer.aclose()
    print("FINAL " + json.dumps(summary(values)), flush=True)
    return 3 if "__interrupt__" in values else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("thread_id")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--input")
    mode.add_argument("--auto")
    parser.add_argument("--attempt", type=int)
    parser.add_argument("--run-uid")
    parser.add_argument("--redis")
    parser.add_argument("--redis-prefix", default="agentrun")
    parser.add_argument("--stop-self-before-version", type=int)
    parser.add_argument("--request-key")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(drive(args))
    except RunStopped:
        return 4
    except FencedError as e:
        print(f"drive_pg: fenced: {e}", file=sys.stderr)
        return EXIT_FENCED
    except StaleStateError as e:
        print(f"drive_pg: stale: {e}", file=sys.stderr)
        return EXIT_STALE
    except StorageError as e:
        print(f"drive_pg: storage: {e}", file=sys.stderr)
        return EXIT_STORAGE
    except AgentRunError as e:
        print(f"drive_pg: {e}", file=sys.stderr)
        return 5


if __name__ == "__main__":
    sys.exit(main())
