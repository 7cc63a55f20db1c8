"""The kopf handlers: every one of them funnels into ``Reconciler.reconcile`` with kopf's own body.

``Handlers`` is built with its collaborators (the reconciler, the settings, the ``Wakeups``, the run
records), all made by ``io/assemble.py``, and ``register`` puts its methods on an explicit kopf registry,
so the operator process, the tests and any embedding build their own.

Event-driven, as a Job controller is: a run is reconciled when it is first
seen (created, or listed after a restart), when its spec changes (a new
generation), when one of its pods changes (the pod
watch), when its store commits a step (``io/notify.py``: LISTEN/NOTIFY, Redis
pub/sub), when one of its deadlines is due (its ttl among them: the verdict
deletes an expired run), and by a slow jittered resync (``io/wakeups.py``).
No timer visits every run every second.

Three in-memory indexes fed by kopf's watches (no API call per reconcile):
``agentrun_threads`` maps (namespace, threadId) to the runs on that thread
(the thread rule's input), ``agentrun_bodies`` maps a run's uid to what a reconcile reads of its latest
body (so a pod event or a wake-up reconciles its run without reading it back),
``agentrun_pods`` holds the operator's pods (the reconcile's pod cache). The
Secret watch keeps the Secrets runs use current (``io/caches.py``). When a run
ends or is deleted, the runs waiting for its thread are reconciled at once.

Departure from kopf's usual shape: no ``@kopf.on.create/update/delete`` (they need kopf's finalizer and
its annotations, two metadata writes per run that ``kubectl get ar -w`` printed as rows without a change,
and a finalizer that holds every AgentRun hostage once the operator is uninstalled), so no kopf retry state
in annotations: retries are in memory (``Wakeups``), and after an operator restart every run is
reconciled once anyway.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine, Mapping
from typing import Any

import kopf

from ..decide.classify import PodView
from ..decide.podspec import GROUP, MANAGED_BY, PLURAL, VERSION
from ..decide.reasons import TERMINAL
from ..decide.thread import ThreadPeer
from ..settings import OperatorSettings
from .caches import PodKey
from .reconcile import Reconciler, controller_uid, run_view, thread_peer
from .runs import Runs
from .wakeups import Wakeups

log = logging.getLogger("agentrun_operator.handlers")

ThreadKey = tuple[str, str]
Threads = kopf.Index[ThreadKey, ThreadPeer]  # (namespace, threadId) -> the runs on that thread
Bodies = kopf.Index[str, dict[str, Any]]  # uid -> the run's latest body, as reconcile.run_view keeps it


def _thread_of(body: Mapping[str, Any]) -> ThreadKey | None:
    thread = (body.get("spec") or {}).get("threadId")
    return (str(body["metadata"]["namespace"]), str(thread)) if thread else None


async def detached(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` in an empty context and wait for it (its errors and cancellation are the caller's).

    Not in the kopf handler's context: that holds kopf's cause (the watch event and the whole body), and
    every timer and connection the reconcile starts copies it (the kube client's 30 s request timeout stays
    in the loop's heap after its request, cancelled), keeping hundreds of bodies alive while runs start in
    bulk: a peak of memory the process never gives back.
    """
    await asyncio.create_task(work, context=contextvars.Context())


class Handlers:
    """The operator's kopf handlers over one ``Reconciler``; ``register`` attaches them to a registry."""

    def __init__(self, reconciler: Reconciler, settings: OperatorSettings, *, wakeups: Wakeups, runs: Runs) -> None:
        self.reconciler = reconciler
        self.settings = settings
        self.wakeups = wakeups  # its reconciles call ``wake`` (io/assemble.py passes it in)
        self.runs = runs
        self.threads: Threads | None = None  # kopf's index objects (live views), bound by the first event
        self.bodies: Bodies | None = None
        self.sweeping: list[asyncio.Task[None]] = []

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """Attach the handlers to ``registry``: startup, login, cleanup, indexes, AgentRun, pod and Secret events."""
        runs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL, "registry": registry}
        pods: dict[str, Any] = {"labels": dict(MANAGED_BY), "registry": registry}
        kopf.on.startup(registry=registry)(self.configure)
        kopf.on.startup(registry=registry)(self.start_sweeping)
        kopf.on.login(registry=registry)(self.login)
        kopf.on.cleanup(registry=registry)(self.stop_waking)
        # The indexes are async: kopf runs a sync handler in a thread, a hop per watch event for nothing here.
        # Their ids are the kwarg names handlers receive them by.
        kopf.index(**runs, id="agentrun_threads")(self.agentrun_threads)
        kopf.index(**runs, id="agentrun_bodies")(self.agentrun_bodies)
        kopf.index("", "v1", "pods", **pods, id="agentrun_pods")(self.agentrun_pods)
        kopf.on.event(**runs)(self.on_run)
        kopf.on.event("", "v1", "pods", **pods)(self.on_pod)
        kopf.on.event("", "v1", "secrets", registry=registry)(self.on_secret)

    # -- lifecycle -------------------------------------------------------------------------------

    @staticmethod
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        """kopf's settings: no Events of its own (we post one per transition), no kopf peering (our Lease leads)."""
        settings.posting.enabled = False  # we post our own Events, one per transition
        settings.peering.standalone = True  # leadership comes from our Lease, not kopf peering
        settings.networking.error_backoffs = [1, 2, 5, 10]

    async def login(self, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        # The operator's own credentials (io/kubeconfig.py): kopf's built-in logins run no exec plugin, merge
        # no KUBECONFIG list and assume https://kubernetes.default.svc in a pod.
        """kopf's API credentials: the operator's own (``io/kubeconfig.py``)."""
        return await self.reconciler.kube.connection_info(trust_env=settings.networking.trust_env)

    async def start_sweeping(self, **_: Any) -> None:
        """Close idle store pools in the background."""
        self.sweeping.append(asyncio.create_task(self._sweep(), name="agentrun-store-sweep"))

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, min(60.0, self.settings.store_idle_seconds / 2)))
            try:
                await self.reconciler.stores.sweep()
            except Exception as e:
                log.warning("closing idle store pools failed: %s", e)

    async def stop_waking(self, **_: Any) -> None:
        # Everything started here ends here, before kopf returns: kopf waits up to 5 s for any task still
        # alive after its own shutdown (the store listeners' LISTEN loops would be).
        """Stop everything started here (the sweep, the wake-ups, the stores' listeners) before kopf returns."""
        for task in self.sweeping:
            task.cancel()
        await self.wakeups.aclose()
        await self.reconciler.stores.close()

    # -- indexes ---------------------------------------------------------------------------------

    @staticmethod
    async def agentrun_threads(body: kopf.Body, **_: Any) -> dict[ThreadKey, ThreadPeer]:
        """kopf index: the runs on each thread (``decide.thread`` reads it)."""
        key = _thread_of(body)
        return {key: thread_peer(body)} if key is not None else {}

    @staticmethod
    async def agentrun_bodies(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        # Only what a reconcile reads (reconcile.run_view), sharing kopf's decoded spec and status rather than
        # copying them: kopf never changes a body it decoded, and the reconcile works on its own deep copy.
        """kopf index: each run's view by uid, what a reconcile reads."""
        return {str(body.metadata.uid): run_view(body)}

    @staticmethod
    async def agentrun_pods(body: kopf.Body, **_: Any) -> dict[PodKey, PodView]:
        # The reconcile's pod cache (io/caches.py): kopf starts no handler before this index holds its first
        # listing, so a pod that exists is never taken for a missing one after a restart or a leader change.
        """kopf index: the operator's pods, the reconcile's pod cache."""
        return {(str(body.metadata.namespace), str(body.metadata.name)): PodView.from_manifest(dict(body))}

    def _bind(self, kwargs: Mapping[str, Any]) -> tuple[Threads, Bodies]:
        if self.threads is None or self.bodies is None:
            self.threads, self.bodies = kwargs["agentrun_threads"], kwargs["agentrun_bodies"]
            self.reconciler.pods.bind(kwargs["agentrun_pods"])
        return self.threads, self.bodies

    # -- events ----------------------------------------------------------------------------------

    async def on_run(self, body: kopf.Body, type: str | None, **kwargs: Any) -> None:  # kopf's kwarg name
        """An AgentRun watch event: keep its thread tracked and reconcile it (a status echo is skipped)."""
        threads, bodies = self._bind(kwargs)
        uid = str(body.metadata.uid)
        if type == "DELETED":
            if (gone := self.runs.get(uid)) is not None:
                gone.handled = None
            await detached(self._deleted(body, threads, bodies))
            return
        # The generation last handed to a reconcile, and whether it was being deleted: an event that changes
        # neither is the echo of a status patch, or a metadata change.
        seen = (body.metadata.get("generation"), bool(body.metadata.get("deletionTimestamp")))
        record = self.runs.record(uid)
        if record.handled == seen:
            return
        record.handled = seen  # first seen (created, or listed after a restart), or its spec changed
        await detached(self.wakeups.now(uid))  # the body the index holds now; retried by wakeups if it fails

    async def on_pod(self, body: kopf.Body, type: str | None, **kwargs: Any) -> None:  # kopf's kwarg name
        """A watch event of a pod the operator made: reconcile its run."""
        _, bodies = self._bind(kwargs)
        if type == "DELETED":
            waiting = self.runs.name_freed(str(body.metadata.namespace), str(body.metadata.name))
            if waiting is not None and waiting in bodies:  # its pod name is free now
                self.wakeups.kick(waiting)
        # Only a run the AgentRun watch has seen; not seen yet: its own event reconciles it, already gone:
        # nothing to do for its pods. Retried by wakeups if it fails.
        owner = controller_uid(body)
        if owner is not None and owner in bodies:
            await detached(self.wakeups.now(owner))

    def on_secret(self, body: kopf.Body, type: str | None, **_: Any) -> None:  # kopf's kwarg name
        # Keeps the Secrets runs use current (io/caches.py); any other Secret is ignored, nothing is kept of it.
        """A Secret watch event: keeps the Secrets runs use current."""
        self.reconciler.stores.secrets.observe(type, body)

    async def _deleted(self, body: kopf.Body, threads: Threads, bodies: Bodies) -> None:
        uid = str(body.metadata.uid)
        await self.reconciler.delete_pods(str(body.metadata.namespace), str(body.metadata.name), uid)
        self.runs.forget(uid)  # everything kept of it: timers, thread, store, name waits, gauges
        log.info(
            "[%s/%s] deleted: its pods are removed, its thread data is kept",
            body.metadata.namespace,
            body.metadata.name,
        )
        key = _thread_of(body)
        if key is not None:
            await self._kick_waiters(key, uid, threads, bodies)

    # -- reconciles --------------------------------------------------------------------------------

    async def wake(self, uid: str) -> None:
        """A reconcile that no watch event started: progress, a due deadline (the ttl too), the resync, a retry."""
        if self.threads is None or self.bodies is None:
            return
        if uid not in self.bodies:  # deleted meanwhile (_deleted forgot it): drop what this wake-up made again
            self.runs.forget(uid)
            return
        for body in list(self.bodies.get(uid, ())):
            await self._reconcile(body, self.threads, self.bodies)

    async def _reconcile(self, body: Mapping[str, Any], threads: Threads, bodies: Bodies) -> None:
        key = _thread_of(body)
        uid = str(body["metadata"]["uid"])
        before = self.reconciler.status_of(body)
        done = await self.reconciler.reconcile(body, peers=threads.get(key, ()) if key is not None else ())
        if uid not in bodies:  # deleted during the reconcile: drop what it kept again, nothing to wake
            self.runs.forget(uid)
            return
        if done.thread is not None:
            self.wakeups.track(uid, done.thread)
        else:
            self.wakeups.untrack(uid)
        self.wakeups.after(uid, wake=done.wake, live=done.live, waiting=done.waiting)
        if key is not None and done.status.phase in TERMINAL and before.phase not in TERMINAL:
            await self._kick_waiters(key, uid, threads, bodies)

    async def _kick_waiters(self, key: ThreadKey, freed_by: str, threads: Threads, bodies: Bodies) -> None:
        """Reconcile the runs that wait for ``key``'s thread now, rather than at their next resync."""
        for peer in list(threads.get(key, ())):
            waiting = self.reconciler.fresh(peer)
            if waiting.uid == freed_by or waiting.started or not waiting.live:
                continue
            for body in list(bodies.get(waiting.uid, ())):
                await self._reconcile(body, threads, bodies)
