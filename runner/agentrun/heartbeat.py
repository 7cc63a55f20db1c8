"""A line in the log while a step runs long: every ``HEARTBEAT_SECONDS``, from a loop timer (no task, no I/O).

Used by both engines' supervisors (``supervisor`` for ours, ``integrations.langgraph.run`` for LangGraph's), so
a step that outlives a period says it is alive, with what it is doing, and a step that ends sooner costs one
timer. A step that blocks the event loop (a blocking call in async code) holds its heartbeat back too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# A step running longer than this says so in the log, again after each further period.
HEARTBEAT_SECONDS = 10.0


class Heartbeat:
    """Calls ``say(elapsed, left)`` every ``HEARTBEAT_SECONDS`` of a step, from a loop timer (no task, no I/O).

    ``left``: seconds before ``deadline`` (loop time), ``None`` without one. ``restart()`` begins a new step
    (LangGraph's engine runs its steps inside one task: ``integrations.langgraph.run``).
    """

    def __init__(
        self, say: Callable[[float, float | None], None], loop: asyncio.AbstractEventLoop, deadline: float | None
    ) -> None:
        self.say, self.loop, self.deadline = say, loop, deadline
        self.started = loop.time()
        self.handle: asyncio.TimerHandle = loop.call_at(self.started + HEARTBEAT_SECONDS, self.beat)

    def beat(self) -> None:
        """Say the node is still running; the next beat falls on the next multiple of the period since the start."""
        now = self.loop.time()
        self.say(now - self.started, None if self.deadline is None else max(0.0, self.deadline - now))
        # On the next multiple of the period since the start: a late beat (a blocked loop) neither pushes
        # the next ones back nor is followed by a burst of the ones it missed.
        periods = (now - self.started) // HEARTBEAT_SECONDS + 1
        self.handle = self.loop.call_at(self.started + periods * HEARTBEAT_SECONDS, self.beat)

    def restart(self) -> None:
        """Start counting again (a new node or step began): the next beat is a full period away."""
        self.handle.cancel()
        self.started = self.loop.time()
        self.handle = self.loop.call_at(self.started + HEARTBEAT_SECONDS, self.beat)

    def cancel(self) -> None:
        """No more beats (the node or step ended)."""
        self.handle.cancel()
