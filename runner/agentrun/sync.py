"""Run synchronous user code (sync nodes and tools) off the event loop, abandonably.

Why not ``asyncio.to_thread``: its pool threads are joined when the loop and
the interpreter shut down, so a sync tool stuck in a blocking call would keep
a stopped or timed-out run's process alive until the call returns. Here each
call gets its own daemon thread: cancelling the awaiting task abandons the
thread (Python cannot kill it), and the process can still exit at once.

Hazard: an abandoned thread keeps running until its call returns or the
process exits; whatever it does meanwhile still happens. Prefer async tools
for anything that may block for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_sync(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

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

    threading.Thread(target=target, name=f"agentrun-sync:{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await future
