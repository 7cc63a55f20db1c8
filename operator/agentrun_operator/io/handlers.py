"""The operator's event handlers: every one of them funnels into ``Reconciler.reconcile`` with the run's view.

``Handlers`` is built with its collaborators (the reconciler, the settings, the ``Wakeups``, the run
records), all made by ``io/assemble.py``, and ``register`` puts its lifecycle and Secret handlers on an
explicit kopf registry, so the operator process, the tests and any embedding build their own.

Event-driven, as a Job controller is: a run is reconciled when it is first
seen (created, or listed after a restart), when its spec changes (a new
generation), when one of its pods changes (the pod
watch), when its store commits a step (``io/notify.py``: LISTEN/NOTIFY, Redis
pub/sub), when one of its deadlines is due (its ttl among them: the verdict
deletes an expired run), and by a slow jittered resync (``io/wakeups.py``).
No timer visits every run every second.

Three in-memory indexes, fed by the operator's own list-then-watch of AgentRuns and of its pods
(``io/informer.py``; no API call per reconcile): ``RunIndex.threads`` maps (namespace, threadId) to the runs
on that thread (the thread rule's input), ``RunIndex.bodies`` maps a run's uid to what a reconcile reads of
its latest body, packed (``reconcile.PackedRun``: so a pod event or a wake-up reconciles its run without
reading it back), and the reconciler's ``PodCache`` holds the operator's pods. kopf watches only the Secrets
(``io/caches.py``). When a run ends or is deleted, the runs waiting for its thread are reconciled at once.

Completeness (the restart and take-over guarantees: a run never gets a second runner pod, a thread never two
active runs): no reconcile starts before every informer has handed over one complete listing (``ready``):
until then a wake-up does nothing, and at that moment every listed run is queued once. A run deleted while
the operator was not watching is pruned by the listing itself (a list is a snapshot, the watch continues
from its version: ``io/informer.py``).

Memory (bench/REPORT.md, the operator at 10,000 runs). kopf's own indexes kept, for every listed object, a
worker, its frames, queue, ``Body`` wrapper and loggers until the last object was indexed (about 20 KB an
object: a new leader's peak, whose pages the process kept). The informers decode one page at a time and the
indexes keep only the packed views; the run events only queue the reconcile (``Wakeups.kick``).

Departure from kopf's usual shape: no ``@kopf.on.create/update/delete`` (they need kopf's finalizer and
its annotations, two metadata writes per run that ``kubectl get ar -w`` printed as rows without a change,
and a finalizer that holds every AgentRun hostage once the operator is uninstalled), so no kopf retry state
in annotations: retries are in memory (``Wakeups``), and after an operator restart every run is
reconciled once anyway.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

import kopf

from agentrun.contract import API_VERSION, KIND

from ..decide.classify import PodView
from ..decide.podspec import MANAGED_BY
from ..decide.reasons import TERMINAL
from ..decide.thread import ThreadPeer
from ..settings import OperatorSettings
from .informer import Informer
from .kube import pod_path, run_path
from .reconcile import PackedRun, Reconciler, controller_uid, status_text, thread_peer
from .runs import Runs
from .wakeups import Wakeups

log = logging.getLogger("agentrun_operator.handlers")

ThreadKey = tuple[str, str]


class RunIndex:
    """The runs as the watch last showed them: each one's packed view by uid, and the runs on each thread."""

    def __init__(self) -> None:
        self.bodies: dict[str, PackedRun] = {}
        self.threads: dict[ThreadKey, dict[str, ThreadPeer]] = {}

    def put(self, body: Mapping[str, Any]) -> PackedRun:
        """Index ``body`` (an AgentRun as the list or the watch showed it) in place of what was kept of it."""
        packed = PackedRun.of(body)
        self.drop(packed.uid)
        self.bodies[packed.uid] = packed
        if packed.thread:
            self.threads.setdefault((packed.namespace, packed.thread), {})[packed.uid] = thread_peer(body)
        return packed

    def drop(self, uid: str) -> PackedRun | None:
        """Forget run ``uid``; what was kept of it."""
        packed = self.bodies.pop(uid, None)
        if packed is not None and packed.thread:
            key = (packed.namespace, packed.thread)
            peers = self.threads.get(key)
            if peers is not None:
                peers.pop(uid, None)
                if not peers:
                    del self.threads[key]
        return packed

    def peers(self, key: ThreadKey) -> list[ThreadPeer]:
        """The runs on thread ``key`` now."""
        return list(self.threads.get(key, {}).values())


class _Peers:
    """A thread's runs, read when iterated (under the reconciled run's lock), not when the reconcile is queued."""

    def __init__(self, index: RunIndex, key: ThreadKey | None) -> None:
        self.index, self.key = index, key

    def __iter__(self) -> Iterator[ThreadPeer]:
        return iter(self.index.peers(self.key) if self.key is not None else ())


class _Feed:
    """One informer's feed (``informer.Feed``): what its current listing showed, so the rest can be pruned."""

    def __init__(self, event: Callable[[str | None, dict[str, Any]], None], listed: Callable[[set[str]], None]) -> None:
        self._event, self._listed = event, listed
        self.seen: set[str] | None = None  # the keys the listing under way showed (None: watching)
        self.complete = False  # one listing was handed over whole

    def listing(self) -> None:
        self.seen = set()

    def event(self, type: str | None, body: dict[str, Any]) -> None:  # the API's name
        if self.seen is not None:
            meta = body["metadata"]
            self.seen.add(f"{meta.get('namespace')}/{meta.get('name')}/{meta.get('uid')}")
        self._event(type, body)

    def listed(self) -> None:
        seen, self.seen = self.seen or set(), None
        self.complete = True
        self._listed(seen)


async def detached(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` in an empty context and wait for it (its errors and cancellation are the caller's).

    Not in a kopf handler's context: that holds kopf's cause (the watch event and the whole body), and
    every timer and connection the reconcile starts copies it (the kube client's 30 s request timeout stays
    in the loop's heap after its request, cancelled), keeping hundreds of bodies alive while runs start in
    bulk: a peak of memory the process never gives back.
    """
    await asyncio.create_task(work, context=contextvars.Context())


class Handlers:
    """The operator's handlers over one ``Reconciler``; ``register`` attaches them to a kopf registry."""

    def __init__(self, reconciler: Reconciler, settings: OperatorSettings, *, wakeups: Wakeups, runs: Runs) -> None:
        self.reconciler = reconciler
        self.settings = settings
        self.wakeups = wakeups  # its reconciles call ``wake`` (io/assemble.py passes it in)
        self.runs = runs
        self.index = RunIndex()
        self.pods = reconciler.pods
        self.ready = False  # every informer handed over one complete listing: reconciles may start
        self.feeds: list[_Feed] = []
        self.sweeping: list[asyncio.Task[None]] = []
        self.watching: list[asyncio.Task[None]] = []
        self._detached: set[asyncio.Task[None]] = set()

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """Attach the handlers to ``registry``: startup (the informers too), login, cleanup and Secret events."""
        kopf.on.startup(registry=registry)(self.configure)
        kopf.on.startup(registry=registry)(self.start_sweeping)
        kopf.on.startup(registry=registry)(self.start_watching)
        kopf.on.login(registry=registry)(self.login)
        kopf.on.cleanup(registry=registry)(self.stop_waking)
        kopf.on.event("", "v1", "secrets", registry=registry)(self.on_secret)

    # -- lifecycle -------------------------------------------------------------------------------

    def configure(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        """kopf's settings: no Events of its own (we post one per transition), no kopf peering (our Lease leads),
        the initial listings in pages."""
        settings.posting.enabled = False  # we post our own Events, one per transition
        settings.peering.standalone = True  # leadership comes from our Lease, not kopf peering
        settings.networking.error_backoffs = [1, 2, 5, 10]
        settings.watching.chunk_size = max(1, self.settings.list_page_size)  # the Secrets' listing, in pages

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

    def informers(self) -> list[Informer]:
        """A list-then-watch of AgentRuns and one of the operator's pods per watched scope (one feed each)."""
        made: list[Informer] = []
        selector = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())
        page = self.settings.list_page_size
        scopes: list[str | None] = [*self.settings.namespaces] or [None]
        for namespace in scopes:
            runs = _Feed(self.on_run, functools.partial(self._runs_listed, namespace))
            pods = _Feed(self.on_pod, functools.partial(self._pods_listed, namespace))
            made.append(
                Informer(
                    self.reconciler.kube, run_path(namespace), runs, api_version=API_VERSION, kind=KIND, page_size=page
                )
            )
            made.append(
                Informer(
                    self.reconciler.kube,
                    pod_path(namespace),
                    pods,
                    api_version="v1",
                    kind="Pod",
                    page_size=page,
                    label_selector=selector,
                )
            )
            self.feeds += [runs, pods]
        return made

    async def start_watching(self, **_: Any) -> None:
        """Start the informers (the reconciles start once each has listed: ``ready``)."""
        for informer in self.informers():
            self.watching.append(asyncio.create_task(informer.run(), name=f"agentrun-watch {informer.path}"))

    async def stop_waking(self, **_: Any) -> None:
        # Everything started here ends here, before kopf returns: kopf waits up to 5 s for any task still
        # alive after its own shutdown (the store listeners' LISTEN loops would be).
        """Stop everything started here (the informers, the sweep, the wake-ups, the stores' listeners)."""
        for task in [*self.watching, *self.sweeping]:
            task.cancel()
        await self.wakeups.aclose()
        await self.reconciler.stores.close()

    def _check_ready(self) -> None:
        if self.ready or not all(feed.complete for feed in self.feeds):
            return
        self.ready = True
        log.info("listed %d runs and %d pods: reconciling", len(self.index.bodies), len(self.pods.index))
        for uid in list(self.index.bodies):  # the first pass: every run once
            self.wakeups.kick(uid)

    # -- events ----------------------------------------------------------------------------------

    def on_run(self, type: str | None, body: Mapping[str, Any]) -> None:  # the API's name
        """An AgentRun listed or watched: index it and reconcile it (a status echo is only indexed)."""
        meta = body["metadata"]
        uid = str(meta["uid"])
        if type == "DELETED":
            if (packed := self.index.drop(uid)) is not None:
                self._gone(packed)
            return
        self.index.put(body)
        record = self.runs.get(uid)
        if record is not None and record.written is not None and status_text(body.get("status")) == record.written:
            # The echo of our last write, indexed in the same step: the index's copy is as new as ours (a
            # reconcile takes it under the run's lock: Reconciler.reconcile's ``latest``)
            record.written = None
        # The generation last handed to a reconcile, and whether it was being deleted: an event that changes
        # neither is the echo of a status patch, or a metadata change.
        seen = (meta.get("generation"), bool(meta.get("deletionTimestamp")))
        record = self.runs.record(uid)
        if record.handled == seen:
            return
        record.handled = seen  # first seen (created, or listed after a restart), or its spec changed
        # Queued, not awaited: a new leader's first pass queues every run at once behind the gate
        # (max_concurrent_reconciles). It reconciles the body the index holds then (this one or newer).
        if self.ready:
            self.wakeups.kick(uid)

    def _gone(self, packed: PackedRun) -> None:
        if (record := self.runs.get(packed.uid)) is not None:
            record.handled = None
        task = asyncio.create_task(detached(self._deleted(packed)), name=f"agentrun-deleted-{packed.uid}")
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    def _runs_listed(self, namespace: str | None, seen: set[str]) -> None:
        """A listing is complete: a run it did not show was deleted unseen (while the watch's version expired)."""
        shown = {key.rsplit("/", 1)[1] for key in seen}
        for uid, packed in list(self.index.bodies.items()):
            if uid not in shown and namespace in (None, packed.namespace):
                self.index.drop(uid)
                self._gone(packed)
        self._check_ready()

    def on_pod(self, type: str | None, body: Mapping[str, Any]) -> None:  # the API's name
        """A pod the operator made, listed or watched: index it and reconcile its run."""
        namespace, name = str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
        if type == "DELETED":
            self.pods.drop(namespace, name)
            self.pods.ended(namespace, PodView.from_manifest(dict(body)))
            self._pod_gone(namespace, name)
        else:
            self.pods.put(namespace, PodView.from_manifest(dict(body)))
        # Only a run the index holds; not there yet: its own event reconciles it, already gone: nothing to do
        # for its pods. Retried by wakeups if it fails.
        owner = controller_uid(body)
        if self.ready and owner is not None and owner in self.index.bodies:
            self.wakeups.kick(owner)  # queued, as a run's own event (on_run)

    def _pod_gone(self, namespace: str, name: str) -> None:
        waiting = self.runs.name_freed(namespace, name)
        if self.ready and waiting is not None and waiting in self.index.bodies:  # its pod name is free now
            self.wakeups.kick(waiting)

    def _pods_listed(self, namespace: str | None, seen: set[str]) -> None:
        shown = {tuple(key.split("/")[:2]) for key in seen}
        for key, view in list(self.pods.index.items()):
            if key not in shown and namespace in (None, key[0]):
                self.pods.drop(*key)
                self._pod_gone(*key)
                if self.ready and view.owner_uid is not None and view.owner_uid in self.index.bodies:
                    self.wakeups.kick(view.owner_uid)
        self._check_ready()

    def on_secret(self, body: kopf.Body, type: str | None, **_: Any) -> None:  # kopf's kwarg name
        # Keeps the Secrets runs use current (io/caches.py); any other Secret is ignored, nothing is kept of it.
        """A Secret watch event: keeps the Secrets runs use current."""
        self.reconciler.stores.secrets.observe(type, body)

    async def _deleted(self, packed: PackedRun) -> None:
        await self.reconciler.delete_pods(packed.namespace, packed.name, packed.uid)
        self.runs.forget(packed.uid)  # everything kept of it: timers, thread, store, name waits, gauges
        log.info("[%s/%s] deleted: its pods are removed, its thread data is kept", packed.namespace, packed.name)
        if packed.thread:
            await self._kick_waiters((packed.namespace, packed.thread), packed.uid)

    # -- reconciles --------------------------------------------------------------------------------

    async def wake(self, uid: str) -> None:
        """A reconcile that no watch event started: progress, a due deadline (the ttl too), the resync, a retry."""
        if not self.ready:
            return  # not before every listing is complete; then every run is queued (``_check_ready``)
        packed = self.index.bodies.get(uid)
        if packed is None:  # deleted meanwhile (_deleted forgot it): drop what this wake-up made again
            self.runs.forget(uid)
            return
        await self._reconcile(packed)

    async def _reconcile(self, packed: PackedRun) -> None:
        key = (packed.namespace, packed.thread) if packed.thread else None
        uid = packed.uid
        done = await self.reconciler.reconcile(
            packed, peers=_Peers(self.index, key), latest=lambda: self.index.bodies.get(uid)
        )
        if uid not in self.index.bodies:  # deleted during the reconcile: drop what it kept again, nothing to wake
            self.runs.forget(uid)
            return
        if done.thread is not None:
            self.wakeups.track(uid, done.thread)
        else:
            self.wakeups.untrack(uid)
        self.wakeups.after(uid, wake=done.wake, live=done.live, waiting=done.waiting)
        before = done.before.phase if done.before is not None else None
        if key is not None and done.status.phase in TERMINAL and before not in TERMINAL:
            await self._kick_waiters(key, uid)

    async def _kick_waiters(self, key: ThreadKey, freed_by: str) -> None:
        """Reconcile the runs that wait for ``key``'s thread now, rather than at their next resync."""
        for peer in self.index.peers(key):
            waiting = self.reconciler.fresh(peer)
            if waiting.uid == freed_by or waiting.started or not waiting.live:
                continue
            if (packed := self.index.bodies.get(waiting.uid)) is not None:
                await self._reconcile(packed)
