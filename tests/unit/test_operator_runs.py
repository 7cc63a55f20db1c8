"""One record per run and one ``forget`` (io/runs.py); the operator's parts assembled once (io/assemble.py).

Guarantees: a deleted run leaves nothing behind in one call (no timer fires for it, its thread's progress
and its store's resync wake nothing, its store's pool closes once idle, its pod-name wait is gone, its
count leaves the gauges); the parts share that record, and the loop listeners -> wake-ups -> handlers
is closed at construction: a store's progress reaches the handlers' reconcile with no attribute set later.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from agentrun_operator.io import metrics
from agentrun_operator.io.assemble import assemble
from agentrun_operator.io.caches import SecretCache
from agentrun_operator.io.runs import Runs
from agentrun_operator.io.stores import StoreRegistry
from agentrun_operator.io.wakeups import Wakeups
from agentrun_operator.settings import OperatorSettings

DSN = "postgresql://agentrun@db:5432/runs"  # never connected to: a pool opens lazily


class _Api:
    """The API as the Secret cache reads it: one store Secret."""

    async def get(self, path: str) -> dict[str, Any]:
        return {
            "metadata": {"namespace": "shop", "name": "store", "resourceVersion": "1"},
            "data": {"postgresDsn": base64.b64encode(DSN.encode()).decode()},
        }


@pytest.mark.looptime
async def test_forgetting_a_run_drops_everything_kept_of_it_in_one_call() -> None:
    runs = Runs()
    woken: list[str] = []

    async def run(uid: str) -> None:
        woken.append(uid)

    wakeups = Wakeups(resync=30, coalesce=1.0, run=run, runs=runs)
    stores = StoreRegistry(SecretCache(_Api()), idle_seconds=0.0, runs=runs)  # type: ignore[arg-type]
    try:
        await stores.get("shop", "store", user="u1")
        wakeups.track("u1", "shop/t")
        wakeups.after("u1", wake=None, live=True)  # its resync timer
        wakeups.progress("shop/t")
        wakeups.progress("shop/t")  # folded: a second timer
        await asyncio.sleep(0)
        runs.wait_for_name("u1", "shop", "old-pod-2")
        record = runs.get("u1")
        assert record is not None and record.timer is not None and record.folding is not None
        record.handled = (1, False)
        runs.reconciled_once(record)
        counted = runs.reconciled
        woken.clear()

        assert runs.forget("u1") is record
        assert runs.get("u1") is None and len(runs) == 0
        assert runs.reconciled == counted - 1 and metrics.RUNS_RECONCILED._value.get() == runs.reconciled
        assert runs.on_thread("shop/t") == [] and stores.users_of(DSN) == set()
        assert runs.name_freed("shop", "old-pod-2") is None, "a forgotten run still waited for a pod name"
        wakeups.progress("shop/t")
        await asyncio.sleep(120)
        assert woken == [], "a forgotten run was woken (a timer, its folded progress or its thread)"
        assert await stores.sweep() == 1, "the pool only the forgotten run used was not closed once idle"
        assert len(runs) == 0, "waking, tracking or sweeping made its record again"
    finally:
        await wakeups.aclose()
        await stores.close()


@pytest.mark.looptime
async def test_the_assembled_parts_share_the_records_and_a_stores_progress_reaches_the_handlers() -> None:
    parts = assemble(object(), OperatorSettings(resync_interval_seconds=3600))  # type: ignore[arg-type]
    runs = parts.runs
    assert parts.stores.listeners is parts.listeners and parts.handlers.wakeups is parts.wakeups
    assert parts.reconciler.runs is runs and parts.wakeups.runs is runs and parts.stores.runs is runs
    assert parts.handlers.runs is runs and parts.reconciler.stores is parts.stores
    parts.handlers.ready = True  # every listing handed over, and it was empty
    runs.track("gone", "shop/t")
    runs.use_store("gone-too", DSN)
    parts.listeners.on_progress("shop/t")  # what a store's LISTEN hands over
    parts.listeners.on_resync(DSN)  # and a listener back after an outage
    await asyncio.sleep(5)
    # Both reached Handlers.wake, which found neither run in the index (deleted) and forgot it.
    assert parts.wakeups.reconciles == 2 and len(runs) == 0
    await parts.wakeups.aclose()
