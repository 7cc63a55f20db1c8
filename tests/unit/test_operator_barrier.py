"""kopf's index barrier without the thundering herd (``io/barrier.py``).

The guarantees: ``QuietToggleSet`` keeps kopf's ``ToggleSet`` contract (waiters return once the set is in
the state they wait for: toggles made, dropped or turned), each waiter is woken once rather than on every
change (so 10,000 listed runs cost O(N), not O(N²)), and ``install`` puts it where kopf's orchestrator makes
its barrier.
"""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.reactor import orchestration

from agentrun_operator.io import barrier
from agentrun_operator.io.barrier import QuietToggleSet

pytestmark = pytest.mark.timeout(10)


async def test_waiters_return_once_every_toggle_is_dropped_as_with_kopfs_own_set() -> None:
    indexed = QuietToggleSet(all)
    toggles = [await indexed.make_toggle(name=f"object {i}") for i in range(3)]
    waiter = asyncio.create_task(indexed.wait_for(True))
    for toggle in toggles[:-1]:
        await indexed.drop_toggle(toggle)
        await asyncio.sleep(0)
        assert not waiter.done(), "a waiter returned while an object was still being indexed"
    await indexed.drop_toggle(toggles[-1])
    await asyncio.wait_for(waiter, 1)
    await asyncio.wait_for(indexed.wait_for(True), 1)  # already on: at once


async def test_a_toggle_turned_on_or_off_wakes_the_waiters_of_that_state() -> None:
    paused = QuietToggleSet(any)
    toggle = await paused.make_toggle(False, name="peering")
    waiter = asyncio.create_task(paused.wait_for(True))
    await asyncio.sleep(0)
    assert not waiter.done(), "an any() set with every toggle off reported on"
    await toggle.turn_to(True)
    await asyncio.wait_for(waiter, 1)
    back_off = asyncio.create_task(paused.wait_for(False))
    await asyncio.sleep(0)
    assert not back_off.done()
    await toggle.turn_to(False)
    await asyncio.wait_for(back_off, 1)


async def test_ten_thousand_objects_listed_with_their_workers_waiting_take_well_under_a_second() -> None:
    indexed = QuietToggleSet(all)
    blocker = await indexed.make_toggle(name="listing")
    toggles = [await indexed.make_toggle(name=f"object {i}") for i in range(10_000)]
    waiters = [asyncio.create_task(indexed.wait_for(True)) for _ in range(10_000)]
    loop = asyncio.get_running_loop()
    started = loop.time()
    for toggle in toggles:
        await indexed.drop_toggle(toggle)
    await indexed.drop_toggle(blocker)
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert loop.time() - started < 1.0, "the barrier woke its waiters on every change (the O(N²) herd)"


def test_install_makes_kopfs_orchestrator_build_the_quiet_set() -> None:
    assert barrier.install(), "kopf's barrier moved: io/barrier.py no longer fits this kopf"
    assert barrier.install(), "a second install must be harmless"
    assert orchestration.aiotoggles.ToggleSet is QuietToggleSet
    assert aiotoggles.ToggleSet is not QuietToggleSet, "kopf's own module must be left as it is"
