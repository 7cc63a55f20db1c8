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
body, packed (``reconcile.PackedRun``: so a pod event or a wake-up reconciles its run without reading it
back), ``agentrun_pods`` holds the operator's pods (the reconcile's pod cache). The
Secret watch keeps the Secrets runs use current (``io/caches.py``). When a run
ends or is deleted, the runs waiting for its thread are reconciled at once.

Memory (bench/REPORT.md, the operator at 10,000 runs). kopf starts no handler before every index holds
its initial listing, so a new leader holds every listed object's decoded body at once until the last one
is indexed: the peak the process kept afterwards (about 20 KB a run). Once indexed, nothing needs more of
a body than its metadata, so the last index handler of each kind empties kopf's copy of it (``release``),
and the event handlers only queue the reconcile (``Wakeups.kick``) rather than wait for it with the event.

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
from .reconcile import PackedRun, Reconciler, controller_uid, status_text, thread_peer
from .runs import Runs
from .wakeups import Wakeups

log = logging.getLogger("agentrun_operator.handlers")

ThreadKey = tuple[str, str]
Threads = kopf.Index[ThreadKey, ThreadPeer]  # (namespace, threadId) -> the runs on that thread
Bodies = kopf.Index[str, PackedRun]  # uid -> the run's latest body, as a reconcile reads it

# What kopf's copy of a body keeps once it is indexed (``release``): its metadata, which kopf and the event
# handlers read, less managedFields and annotations (kubectl's last-applied copy of the whole manifest).
RELEASED_METADATA = ("managedFields", "annotations")


def _thread_of(body: Mapping[str, Any]) -> ThreadKey | None:
    thread = (body.get("spec") or {}).get("threadId")
    return (str(body["metadata"]["namespace"]), str(thread)) if thread else None


def _latest(bodies: Bodies, uid: str) -> PackedRun | None:
    """The index's copy of run ``uid`` now (None: deleted)."""
    return next(iter(bodies.get(uid, ())), None)


def release(body: kopf.Body) -> None:
    """Empty kopf's decoded copy of an indexed body but for its metadata (the module docstring's Memory).

    kopf keeps that dict alive until every object of the listing is indexed, then hands it to the event
    handlers, which read only its metadata. Only the last index handler of a kind may call it (kopf runs
    them in registration order); a DELETED event runs none, so the handlers still see that body whole.
    HAZARD: kopf's private ``_src`` (the raw dict a ``Body`` views); if a kopf upgrade renames it, this does
    nothing (memory as before).
    """
    raw = getattr(body, "_src", None)
    if not isinstance(raw, dict):
        return
    for key in [key for key in raw if key not in ("apiVersion", "kind", "metadata")]:
        del raw[key]
    meta = raw.get("metadata")
    if isinstance(meta, dict):
        for key in RELEASED_METADATA:
            meta.pop(key, None)


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
        # Their ids are the kwarg names handlers receive them by. agentrun_bodies is the runs' last (it releases
        # kopf's copy of the body: ``release``).
        kopf.index(**runs, id="agentrun_threads")(self.agentrun_threads)
        kopf.index(**runs, id="agentrun_bodies")(self.agentrun_bodies)
        kopf.index("", "v1", "pods", **pods, id="agentrun_pods")(self.agentrun_pods)
        kopf.on.event(**runs)(self.on_run)
        kopf.on.event("", "v1", "pods", **pods)(self.on_pod)
        kopf.on.event("", "v1", "secrets", registry=registry)(self.on_secret)

    # -- lifecycle -------------------------------------------------------------------------------

    def configure(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        """kopf's settings: no Events of its own (we post one per transition), no kopf peering (our Lease leads),
        the initial listings in pages."""
        settings.posting.enabled = False  # we post our own Events, one per transition
        settings.peering.standalone = True  # leadership comes from our Lease, not kopf peering
        settings.networking.error_backoffs = [1, 2, 5, 10]
        # The initial listing in pages (the API's limit/continue): one page's response decoded at a time rather
        # than every object in one answer (the memory a new leader touches, bench/REPORT.md).
        settings.watching.chunk_size = max(1, self.settings.list_page_size)

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

    async def agentrun_bodies(self, body: kopf.Body, **_: Any) -> dict[str, PackedRun]:
        """kopf index: each run's view by uid, what a reconcile reads, packed; then kopf's copy is released.

        The echo of our own last status write (``RunRecord.written``) is marked (``echo``), not dropped: kopf
        stores this handler's answer in the index only after it returns, and a reconcile reading the index in
        between would find the older copy and no write of ours. ``on_run`` drops it, after kopf stored the echo.
        """
        packed = PackedRun.of(body)
        record = self.runs.get(packed.uid)
        if record is not None and record.written is not None:
            echoed = status_text(body.get("status")) == record.written
            record.echo = record.written if echoed else None
        release(body)  # registered after agentrun_threads: every index of runs has read it
        return {packed.uid: packed}

    @staticmethod
    async def agentrun_pods(body: kopf.Body, **_: Any) -> dict[PodKey, PodView]:
        # The reconcile's pod cache (io/caches.py): kopf starts no handler before this index holds its first
        # listing, so a pod that exists is never taken for a missing one after a restart or a leader change.
        """kopf index: the operator's pods, the reconcile's pod cache; then kopf's copy is released."""
        view = PodView.from_manifest(dict(body))
        key = (str(body.metadata.namespace), str(body.metadata.name))
        release(body)  # the pods' only index
        return {key: view}

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
        if (echoed := self.runs.get(uid)) is not None and echoed.echo is not None:
            # kopf indexed the echo of our last write (agentrun_bodies) before calling this: the index's copy is
            # as new as ours now (a reconcile takes it under the run's lock: Reconciler.reconcile's ``latest``)
            if echoed.echo is echoed.written:  # not a newer write made since
                echoed.written = None
            echoed.echo = None
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
        # Queued, not awaited here: a new leader's first pass queues every run at once behind the gate
        # (max_concurrent_reconciles), and a handler waiting there would hold kopf's event and worker. It
        # reconciles the body the index holds then (this one or newer); retried by wakeups if it fails.
        self.wakeups.kick(uid)

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
            self.wakeups.kick(owner)  # queued, as a run's own event (on_run)

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
        for packed in list(self.bodies.get(uid, ())):
            await self._reconcile(packed, self.threads, self.bodies)

    async def _reconcile(self, packed: PackedRun, threads: Threads, bodies: Bodies) -> None:
        key = (packed.namespace, packed.thread) if packed.thread else None
        uid = packed.uid
        done = await self.reconciler.reconcile(
            packed, peers=threads.get(key, ()) if key is not None else (), latest=lambda: _latest(bodies, uid)
        )
        if uid not in bodies:  # deleted during the reconcile: drop what it kept again, nothing to wake
            self.runs.forget(uid)
            return
        if done.thread is not None:
            self.wakeups.track(uid, done.thread)
        else:
            self.wakeups.untrack(uid)
        self.wakeups.after(uid, wake=done.wake, live=done.live, waiting=done.waiting)
        before = done.before.phase if done.before is not None else None
        if key is not None and done.status.phase in TERMINAL and before not in TERMINAL:
            await self._kick_waiters(key, uid, threads, bodies)

    async def _kick_waiters(self, key: ThreadKey, freed_by: str, threads: Threads, bodies: Bodies) -> None:
        """Reconcile the runs that wait for ``key``'s thread now, rather than at their next resync."""
        for peer in list(threads.get(key, ())):
            waiting = self.reconciler.fresh(peer)
            if waiting.uid == freed_by or waiting.started or not waiting.live:
                continue
            for packed in list(bodies.get(waiting.uid, ())):
                await self._reconcile(packed, threads, bodies)
