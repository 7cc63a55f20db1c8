"""The one event loop behind the blocking API (``invoke``, ``stream``, ``get_state``, ...).

Why one loop for the process: stores bind their connections to the loop
that opened them (an asyncpg pool belongs to one loop). With a new loop per
call (``asyncio.run``), the second blocking call finds the pool bound to a
closed loop. So a daemon thread runs one loop for the life of the process,
started on first use; every blocking call, from any thread, runs its
coroutine there and waits for it. Calls from several threads run
concurrently on that loop, as ``asyncio.gather`` of the async calls would.

Hazards: a store used through the blocking API belongs to this loop; using
the same store object from another loop too (``asyncio.run(app.ainvoke())``
after ``app.invoke()``) fails for loop-bound backends (PostgreSQL). A
blocking call inside a running event loop would block that loop (or deadlock
this one), so it raises ``RuntimeError`` instead. At interpreter exit the
loop's remaining tasks are cancelled and the loop is closed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

# How long interpreter exit waits for the loop's remaining tasks to unwind.
SHUTDOWN_GRACE_SECONDS = 5.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def run(call: Callable[[], Coroutine[Any, Any, T]], *, caller: str) -> T:
    """Run the coroutine ``call()`` on the blocking API's loop; return its result or raise its exception.

    ``caller`` names the blocking method for the ``RuntimeError`` raised
    inside a running event loop (before ``call`` is called). If the calling
    thread is interrupted while waiting (``KeyboardInterrupt``), the
    coroutine is cancelled.
    """
    _refuse_inside_a_loop(caller)
    return _wait(call())


def iterate(open_stream: Callable[[], AsyncGenerator[T, None]], *, caller: str) -> Generator[T, None, None]:
    """Iterate the async generator ``open_stream()`` on the blocking API's loop.

    Nothing happens until the first ``next()``; closing the iterator closes
    the generator on the loop.
    """
    _refuse_inside_a_loop(caller)
    stream = open_stream()
    try:
        while True:
            try:
                yield _wait(_anext(stream))
            except StopAsyncIteration:
                return
    finally:
        _wait(stream.aclose())


async def _anext(stream: AsyncGenerator[T, None]) -> T:
    return await stream.__anext__()  # run_coroutine_threadsafe takes coroutines only


def _wait(coro: Coroutine[Any, Any, T]) -> T:
    future = asyncio.run_coroutine_threadsafe(coro, _the_loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()  # a no-op when the coroutine itself raised
        raise


def _refuse_inside_a_loop(caller: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{caller}() blocks, so it cannot be called inside a running event loop; use `await a{caller}(...)` there"
    )


def _the_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="agentrun-blocking-api", daemon=True)
            thread.start()
            atexit.register(_shutdown, loop, thread)
            _loop = loop
        return _loop


def _shutdown(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel what still runs on the loop, stop it and close it (at interpreter exit)."""

    async def drain() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
        await loop.shutdown_asyncgens()

    with contextlib.suppress(TimeoutError, RuntimeError):  # exit goes on whatever the loop does
        asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout=SHUTDOWN_GRACE_SECONDS * 2)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=SHUTDOWN_GRACE_SECONDS)
    if not thread.is_alive():
        loop.close()
