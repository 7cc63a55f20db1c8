"""Node supervision: each node runs as a cancellable task under its deadline, watched for stop and preemption.

While a node runs, its supervisor wakes at least every
``RunConfig.stop_poll_interval`` (at most one second) and cancels the node
when its deadline passed (``NodeTimeoutError`` ``NODE_TIMEOUT_001``), when
the thread has a stop request (``StopRequested``; the store is asked when
the run's ``StopWatch`` says so: notified, or polling where the store cannot
notify) or when a preemption asks to end now (``Preempted``). Tool calls
that completed before the cancellation are already in the ledger, so
whoever resumes replays them.

A node that runs longer than ``heartbeat.HEARTBEAT_SECONDS`` gets a heartbeat line
in the run's log every ``HEARTBEAT_SECONDS`` while it runs (node, step,
elapsed, time left before its deadline): a timer on the event loop, no I/O
and nothing for a node that ends sooner. A node that blocks the event loop
(a blocking call in async code) holds its heartbeat back too.

Limit: cancellation is cooperative. A node that ignores it (a blocking call
in async code) is abandoned after ``CANCEL_GRACE_SECONDS`` and may keep
running in the background until the process exits.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .checkpoint.base import Checkpointer, StopWatch
from .context import CallScope, RunContext, RunLogger, current_run, current_scope
from .errors import NodeTimeoutError, Preempted, StopRequested
from .heartbeat import Heartbeat
from .metrics import NODE_TIMEOUTS
from .nodes import Node
from .state import node_input
from .sync import start_sync

if TYPE_CHECKING:
    from collections.abc import Callable

# How long a cancelled node may take to unwind before the engine stops waiting for it.
CANCEL_GRACE_SECONDS = 5.0


@dataclass
class Preemption:
    """Set from a SIGTERM handler to end a run at a safe point, keeping it resumable.

    ``requested``: start no further node (the current one may finish).
    ``cancel_now``: cancel the current node as well; its tool calls that
    completed are already in the ledger, so the next process replays them.
    """

    requested: bool = False
    cancel_now: bool = False


async def stop_reason(checkpointer: Checkpointer, thread_id: str, log: RunLogger) -> str | None:
    """The reason of a pending stop request for the thread, ``None`` if there is none or the store failed."""
    try:
        return await checkpointer.stop_requested(thread_id)
    except Exception as e:  # a failed poll must not end the run; the next poll tries again
        log.warning("could not check for a stop request: %s", e)
        return None


async def run_node(
    node: Node,
    state: dict[str, Any],
    ctx: RunContext,
    *,
    preemption: Preemption | None,
    stops: StopWatch | None = None,
) -> Any:
    """Run ``node`` on a copy of ``state`` and return its update.

    Raises what the node raised, ``NodeTimeoutError``, ``StopRequested`` or
    ``Preempted``; in each of the last three cases the node task has been
    cancelled (or abandoned after the grace period).
    """
    cfg, log = ctx.config, ctx.log
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    # For user code only (interrupt(), the model adapter's logger); a ContextNode gets ctx as a parameter.
    context.run(_enter, ctx, node.name)
    task = _start(node, node_input(state), ctx, context, loop)
    stops = stops or StopWatch()
    deadline = None if cfg.node_timeout is None else loop.time() + cfg.node_timeout
    # Armed once the node outlived its first wake (a fast node pays nothing for it): a notified stop
    # then wakes the supervisor at once instead of at its next wake.
    heard: asyncio.Future[None] | None = None

    def alive(elapsed: float, left: float | None) -> None:
        until = "" if left is None else f"; its deadline is in {left:.0f}s"
        log.info("node %s still running after %.0fs (step %d)%s", node.name, elapsed, ctx.step, until)

    heartbeat = Heartbeat(alive, loop, deadline)
    task_of_sync = not isinstance(task, asyncio.Task)
    try:
        while True:
            wait = cfg.stop_poll_interval
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - loop.time()))
            done, _ = await asyncio.wait(
                {task} if heard is None else {task, heard}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                result = task.result()
                if not (task_of_sync and inspect.isawaitable(result)):
                    return result
                # A sync function that returned an awaitable (a node's factory): awaited on the loop, supervised.
                task, task_of_sync = loop.create_task(_awaited(result), context=context), False
                continue
            if deadline is not None and loop.time() >= deadline:
                await cancel(task, log)
                NODE_TIMEOUTS.labels(node.name).inc()
                raise NodeTimeoutError(
                    f"node {node.name!r} did not finish within {cfg.node_timeout:g}s",
                    code=NodeTimeoutError.NODE,
                    timeout=cfg.node_timeout or 0,
                )
            if preemption is not None and preemption.cancel_now:
                log.info("preempted while node %s runs; cancelling it (completed tool calls are recorded)", node.name)
                await cancel(task, log)
                raise Preempted()
            due = stops.due(loop.time(), cfg.stop_poll_interval)
            if heard is None or heard.done():  # after due() took the notification, not before
                heard = asyncio.ensure_future(stops.heard())
            if not due:
                continue
            reason = await stop_reason(ctx.checkpointer, cfg.thread_id, log)
            if reason is not None:
                log.info("stop requested while node %s runs; cancelling it", node.name)
                await cancel(task, log)
                raise StopRequested(reason)
    finally:
        heartbeat.cancel()
        if heard is not None and not heard.done():
            heard.cancel()
            await asyncio.gather(heard, return_exceptions=True)
        if not task.done():
            await cancel(task, log)


def _enter(ctx: RunContext, node: str) -> None:
    current_run.set(ctx)
    current_scope.set(CallScope(name=node))


def _start(
    node: Node, state: dict[str, Any], ctx: RunContext, context: contextvars.Context, loop: asyncio.AbstractEventLoop
) -> asyncio.Future[Any]:
    """The node's call started in ``context``: a plain sync function as the future of its worker thread (no task
    around it: the supervisor awaits the thread's future directly), anything else as a task."""
    if not (node.context_node or node.is_async):
        fn = cast("Callable[..., Any]", node.fn)  # a string: no generic alias built per step
        return start_sync(context, fn, *((state, ctx.config) if node.wants_config else (state,)))
    return loop.create_task(node.call(state, ctx), name=f"agentrun:{ctx.config.thread_id}:{node.name}", context=context)


async def _awaited(result: Awaitable[Any]) -> Any:
    return await result


async def cancel(task: asyncio.Future[Any], log: RunLogger) -> None:
    """Cancel ``task`` (a node's task or its thread's future) and wait up to ``CANCEL_GRACE_SECONDS`` for it to
    unwind (a thread's future is abandoned at once: the thread runs on until its call returns)."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_SECONDS)
    if not done:
        name = task.get_name() if isinstance(task, asyncio.Task) else "?"
        log.error("node task %s ignored cancellation for %.0fs; abandoning it", name, CANCEL_GRACE_SECONDS)
    elif not task.cancelled() and task.exception() is not None:
        log.debug("node task ended with %r while being cancelled", task.exception())
