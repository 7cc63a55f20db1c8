"""The operator's parts, built once and in one place, each handed what it calls (no wiring after the fact).

The loop they form: kopf's events and the wake-ups reconcile runs (``Handlers.wake``), a reconcile opens
stores (``Reconciler`` -> ``StoreRegistry``), an open store is listened to (``Listeners``), and what the
listeners hear wakes runs (``Wakeups``), which reconcile them again. ``assemble`` builds them in that order
and passes the one callback that closes the loop (the wake-ups' ``run``) in at construction. All of them
share one ``Runs``: what is kept of each run (``io/runs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import OperatorSettings
from .caches import SecretCache
from .handlers import Handlers
from .kube import KubeClient
from .notify import Listeners
from .reconcile import Reconciler
from .runs import Runs
from .stores import StoreRegistry
from .wakeups import Wakeups


@dataclass(frozen=True)
class Operator:
    """The operator's parts (``assemble``); ``handlers.register`` puts them on a kopf registry."""

    runs: Runs
    wakeups: Wakeups
    listeners: Listeners
    stores: StoreRegistry
    reconciler: Reconciler
    handlers: Handlers


def assemble(kube: KubeClient, settings: OperatorSettings, *, secrets: SecretCache | None = None) -> Operator:
    """Build the wake-ups, the listeners, the store registry, the reconciler and the handlers over ``kube``."""
    runs = Runs()
    handlers: Handlers | None = None

    async def wake(uid: str) -> None:
        # The wake-ups' reconcile: the handlers' (built below, before any event or timer can call this).
        assert handlers is not None
        await handlers.wake(uid)

    wakeups = Wakeups(
        resync=settings.resync_interval_seconds,
        waiting_resync=settings.waiting_resync_interval_seconds,
        coalesce=settings.progress_coalesce_seconds,
        run=wake,
        runs=runs,
    )
    listeners = Listeners(
        on_progress=wakeups.progress,
        on_resync=lambda dsn: wakeups.resync(runs.store_users(dsn)),
    )
    stores = StoreRegistry(
        secrets if secrets is not None else SecretCache(kube),
        idle_seconds=settings.store_idle_seconds,
        listeners=listeners,
        runs=runs,
        local_stores=settings.local_stores,
    )
    reconciler = Reconciler(kube, settings, stores, runs=runs)
    handlers = Handlers(reconciler, settings, wakeups=wakeups, runs=runs)
    return Operator(runs, wakeups, listeners, stores, reconciler, handlers)
