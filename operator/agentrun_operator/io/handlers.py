"""The kopf handlers: every one of them funnels into ``Reconciler.reconcile`` with kopf's own body.

Registered on an explicit registry (``register``) rather than at import, so
the operator process, the tests and any embedding build their own.

Event-driven, as a Job controller is: a run is reconciled when it is first
seen (created, or listed after a restart), when its spec changes (a new
generation), when one of its pods changes (the pod
watch), when its store commits a step (``io/notify.py``: LISTEN/NOTIFY, Redis
pub/sub), when one of its deadlines is due, and by a slow jittered resync
(``io/wakeups.py``). No timer visits every run every second.

Three in-memory indexes fed by kopf's watches (no API call per reconcile):
``agentrun_threads`` maps (namespace, threadId) to the runs on that thread
(the thread rule's input), ``agentrun_bodies`` maps a run's uid to what a reconcile reads of its latest
body (so a pod event or a wake-up reconciles its run without reading it back),
``agentrun_pods`` holds the operator's pods (the reconcile's pod cache). The
Secret watch keeps the Secrets runs use current (``io/caches.py``). When a run
ends or is deleted, the runs waiting for its thread are reconciled at once.
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
from ..decide.run import at_rest
from ..decide.thread import ThreadPeer
from ..settings import OperatorSettings
from .caches import PodKey
from .expiry import expire
from .notify import Listeners
from .reconcile import Reconciler, controller_uid, run_view, thread_peer
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


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, settings: OperatorSettings) -> None:
    runs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL, "registry": registry}

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # we post our own Events, one per transition
        settings.peering.standalone = True  # leadership comes from our Lease, not kopf peering
        settings.networking.error_backoffs = [1, 2, 5, 10]

    @kopf.on.login(registry=registry)
    async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        # The operator's own credentials (io/kubeconfig.py): kopf's built-in logins run no exec plugin, merge
        # no KUBECONFIG list and assume https://kubernetes.default.svc in a pod.
        return await reconciler.kube.connection_info(trust_env=settings.networking.trust_env)

    # The indexes are async: kopf runs a sync handler in a thread, a hop per watch event for nothing here.
    @kopf.index(**runs, id="agentrun_threads")  # the id is the kwarg name handlers receive it by
    async def agentrun_threads(body: kopf.Body, **_: Any) -> dict[ThreadKey, ThreadPeer]:
        key = _thread_of(body)
        return {key: thread_peer(body)} if key is not None else {}

    # Only what a reconcile reads (reconcile.run_view), sharing kopf's decoded spec and status rather than
    # copying them: kopf never changes a body it decoded, and the reconcile works on its own deep copy.
    @kopf.index(**runs, id="agentrun_bodies")
    async def agentrun_bodies(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        return {str(body.metadata.uid): run_view(body)}

    # The reconcile's pod cache (io/caches.py): kopf starts no handler before this index holds its first
    # listing, so a pod that exists is never taken for a missing one after a restart or a leader change.
    @kopf.index("", "v1", "pods", labels=dict(MANAGED_BY), registry=registry, id="agentrun_pods")
    async def agentrun_pods(body: kopf.Body, **_: Any) -> dict[PodKey, PodView]:
        return {(str(body.metadata.namespace), str(body.metadata.name)): PodView.from_manifest(dict(body))}

    indices: dict[str, Any] = {}  # kopf's index objects (live views), for the reconciles started by wakeups

    def bind(kwargs: Mapping[str, Any]) -> tuple[Threads, Bodies]:
        if not indices:
            indices.update(threads=kwargs["agentrun_threads"], bodies=kwargs["agentrun_bodies"])
            reconciler.pods.bind(kwargs["agentrun_pods"])
        return kwargs["agentrun_threads"], kwargs["agentrun_bodies"]

    async def reconcile(body: Mapping[str, Any], threads: Threads, bodies: Bodies) -> None:
        key = _thread_of(body)
        before = reconciler.status_of(body)
        after = await reconciler.reconcile(body, peers=threads.get(key, ()) if key is not None else ())
        if key is not None and after.phase in TERMINAL and before.phase not in TERMINAL:
            await kick_waiters(key, str(body["metadata"]["uid"]), threads, bodies)

    async def kick_waiters(key: ThreadKey, freed_by: str, threads: Threads, bodies: Bodies) -> None:
        """Reconcile the runs that wait for ``key``'s thread now, rather than at their next resync."""
        for peer in list(threads.get(key, ())):
            waiting = reconciler.fresh(peer)
            if waiting.uid == freed_by or waiting.started or not waiting.live:
                continue
            for body in list(bodies.get(waiting.uid, ())):
                await reconciler.reconcile(body, peers=threads.get(key, ()))

    async def wake(uid: str) -> None:
        """A reconcile that no watch event started: progress, a due deadline, the resync, a retry."""
        if not indices:
            return
        threads: Threads = indices["threads"]
        bodies: Bodies = indices["bodies"]
        for body in list(bodies.get(uid, ())):  # absent: deleted meanwhile (on_delete forgets it)
            # kopf's status may predate our last patch: the reconciler's view of it is the newest.
            status = reconciler.status_of(body)
            if at_rest(status, deleting=bool(body["metadata"].get("deletionTimestamp"))) and await expire(
                reconciler.kube, body, status
            ):  # spec.ttlSecondsAfterFinished
                return
            await reconcile(body, threads, bodies)

    wakeups = Wakeups(resync=settings.resync_interval_seconds, coalesce=settings.progress_coalesce_seconds, run=wake)
    reconciler.wakeups = wakeups
    reconciler.stores.listeners = Listeners(
        on_progress=wakeups.progress, on_resync=lambda dsn: wakeups.resync(reconciler.stores.users_of(dsn))
    )
    sweeping: list[asyncio.Task[None]] = []

    async def sweep() -> None:
        while True:
            await asyncio.sleep(max(1.0, min(60.0, settings.store_idle_seconds / 2)))
            try:
                await reconciler.stores.sweep()
            except Exception as e:
                log.warning("closing idle store pools failed: %s", e)

    @kopf.on.startup(registry=registry)
    async def start_sweeping(**_: Any) -> None:
        sweeping.append(asyncio.create_task(sweep(), name="agentrun-store-sweep"))

    @kopf.on.cleanup(registry=registry)
    async def stop_waking(**_: Any) -> None:
        # Everything this registry started ends here, before kopf returns: kopf waits up to 5 s for any task
        # still alive after its own shutdown (the store listeners' LISTEN loops would be).
        for task in sweeping:
            task.cancel()
        await wakeups.aclose()
        await reconciler.stores.close()

    # Which generation of each run was last handed to a reconcile (and whether it was being deleted): a
    # watch event that changes neither is the echo of a status patch, or a metadata change.
    handled: dict[str, tuple[int | None, bool]] = {}

    # Every AgentRun event, rather than kopf's create/update/resume/delete handlers: those need kopf's
    # finalizer and its annotations (progress, last-handled-configuration), two metadata writes per run
    # that `kubectl get ar -w` printed as rows without a change, and a finalizer that holds every AgentRun
    # hostage once the operator is uninstalled. Deletion needs no finalizer: the runner pods are owned
    # (garbage collected), the thread data is kept, and a missed DELETED leaves nothing to clean up here.
    @kopf.on.event(**runs)
    async def on_run(body: kopf.Body, type: str | None, **kwargs: Any) -> None:  # kopf's kwarg name
        threads, bodies = bind(kwargs)
        uid = str(body.metadata.uid)
        if type == "DELETED":
            handled.pop(uid, None)
            await detached(deleted(body, threads, bodies))
            return
        seen = (body.metadata.get("generation"), bool(body.metadata.get("deletionTimestamp")))
        if handled.get(uid) == seen:
            return
        handled[uid] = seen  # first seen (created, or listed after a restart), or its spec changed
        await detached(wakeups.now(uid))  # the body the index holds now; retried by wakeups if it fails

    @kopf.on.event("", "v1", "pods", labels=dict(MANAGED_BY), registry=registry)
    async def on_pod(body: kopf.Body, type: str | None, **kwargs: Any) -> None:  # kopf's kwarg name
        _, bodies = bind(kwargs)
        if type == "DELETED":
            waiting = reconciler.name_waiters.pop((str(body.metadata.namespace), str(body.metadata.name)), None)
            if waiting is not None and waiting in bodies:  # its pod name is free now
                wakeups.kick(waiting)
        # Only a run the AgentRun watch has seen; not seen yet: its own event reconciles it, already gone:
        # nothing to do for its pods. Retried by wakeups if it fails.
        owner = controller_uid(body)
        if owner is not None and owner in bodies:
            await detached(wakeups.now(owner))

    @kopf.on.event("", "v1", "secrets", registry=registry)
    def on_secret(body: kopf.Body, type: str | None, **_: Any) -> None:  # kopf's kwarg name
        # Keeps the Secrets runs use current (io/caches.py); any other Secret is ignored, nothing is kept of it.
        reconciler.stores.secrets.observe(type, body)

    async def deleted(body: kopf.Body, threads: Threads, bodies: Bodies) -> None:
        await reconciler.delete_pods(str(body.metadata.namespace), str(body.metadata.name), str(body.metadata.uid))
        reconciler.forget(str(body.metadata.uid))
        log.info(
            "[%s/%s] deleted: its pods are removed, its thread data is kept",
            body.metadata.namespace,
            body.metadata.name,
        )
        key = _thread_of(body)
        if key is not None:
            await kick_waiters(key, str(body.metadata.uid), threads, bodies)
