"""The progress notifications' throttle (``checkpoint/pg_progress.ProgressNotifier``) on loop time (looptime).

Its promise (a thread notifies at most once per ``interval``: at once after a quiet spell, once more at
the end of the interval when it committed meanwhile, a final checkpoint at once) is a matter of time,
so it is asserted here on a clock the test controls, exactly; the PostgreSQL tier checks the same
notifications arrive end to end (``postgres/test_progress_notify.py``) without timing them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrun.checkpoint.pg_progress import ProgressNotifier

pytestmark = pytest.mark.looptime


class Sent:
    """The notifications a notifier sent, with the loop time of each."""

    def __init__(self) -> None:
        self.at: list[tuple[float, str]] = []

    async def __call__(self, thread_id: str) -> None:
        self.at.append((asyncio.get_running_loop().time(), thread_id))

    def since(self, start: float) -> list[tuple[float, str]]:
        return [(round(at - start, 3), thread) for at, thread in self.at]


async def test_a_burst_notifies_at_its_start_and_once_more_at_the_end_of_the_interval(looptime: Any) -> None:
    sent = Sent()
    notifier = ProgressNotifier(sent, interval=1.0)
    start = asyncio.get_running_loop().time()
    for _ in range(20):  # 20 steps within 0.2 s
        notifier.committed("ns/burst", final=False)
        await asyncio.sleep(0.01)
    await asyncio.sleep(5)
    assert sent.since(start) == [(0.0, "ns/burst"), (1.0, "ns/burst")], "the leading edge, then the trailing one"
    await notifier.aclose()


async def test_a_long_burst_notifies_once_per_interval(looptime: Any) -> None:
    sent = Sent()
    notifier = ProgressNotifier(sent, interval=1.0)
    start = asyncio.get_running_loop().time()
    for _ in range(35):  # a step every 0.1 s for 3.5 s
        notifier.committed("ns/long", final=False)
        await asyncio.sleep(0.1)
    await asyncio.sleep(5)
    assert [at for at, _ in sent.since(start)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    await notifier.aclose()


async def test_threads_are_throttled_apart_and_a_final_checkpoint_notifies_at_once(looptime: Any) -> None:
    sent = Sent()
    notifier = ProgressNotifier(sent, interval=1.0)
    start = asyncio.get_running_loop().time()
    notifier.committed("ns/a", final=False)
    notifier.committed("ns/b", final=False)
    await asyncio.sleep(0.3)
    notifier.committed("ns/a", final=True)  # the run ended: not held back to the end of a's interval
    await asyncio.sleep(5)
    assert sent.since(start) == [(0.0, "ns/a"), (0.0, "ns/b"), (0.3, "ns/a")]
    await notifier.aclose()


async def test_closing_sends_the_notification_still_due_at_once(looptime: Any) -> None:
    sent = Sent()
    notifier = ProgressNotifier(sent, interval=1.0)
    start = asyncio.get_running_loop().time()
    notifier.committed("ns/t", final=False)
    await asyncio.sleep(0.2)
    notifier.committed("ns/t", final=False)  # due at 1.0
    await notifier.aclose()
    assert sent.since(start) == [(0.0, "ns/t"), (0.2, "ns/t")], "a closing store must not drop its last step"
