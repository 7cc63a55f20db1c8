"""Run synchronous user code (sync nodes and tools) off the event loop, abandonably.

Why not ``asyncio.to_thread``: its pool threads are joined when the loop and
the interpreter shut down, so a sync tool stuck in a blocking call would keep
a stopped or timed-out run's process alive until the call returns. Here each
call runs on a daemon thread of its own while it runs: cancelling the awaiting
task abandons the thread (Python cannot kill it), and the process can still
exit at once. A thread whose call returned waits for the next call (at most
``IDLE_THREADS`` wait): starting a thread costs more than a small sync node.

Hazard: an abandoned thread keeps running until its call returns or the
process exits; whatever it does meanwhile still happens. Prefer async tools
for anything that may block for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Threads kept waiting for a call; more than this many idle at once end.
IDLE_THREADS = 8
_idle: list[_Worker] = []
_idle_lock = threading.Lock()


class _Worker:
    """A daemon thread running one call at a time, then waiting idle for the next."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="agentrun-sync", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.calls.get()()
            with _idle_lock:
                if len(_idle) >= IDLE_THREADS:
                    return
                _idle.append(self)


def _start(call: Callable[[], None]) -> None:
    with _idle_lock:
        worker = _idle.pop() if _idle else None
    (worker or _Worker()).calls.put(call)


async def run_sync(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run the blocking ``fn`` in a thread with the caller's context; cancelling the caller does not wait for it."""
    return await start_sync(contextvars.copy_context(), fn, *args, **kwargs)


def start_sync(context: contextvars.Context, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Start the blocking ``fn`` in a thread, in ``context``; the future settles when it returns or raises.

    Cancelling the future abandons the call. Awaiting the future directly (the supervisor does for a sync
    node) saves the task that would otherwise wrap the call: its creation and two turns of the loop.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return  # the caller gave up (cancelled); the result has nowhere to go
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as e:  # delivered to the awaiting task, whatever it is
            outcome: tuple[bool, Any] = (False, e)
        else:
            outcome = (True, result)
        # RuntimeError: the loop is closed, the run already ended.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    _start(target)
    return future
