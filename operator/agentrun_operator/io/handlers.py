"""The kopf handlers: every one of them funnels into ``Reconciler.reconcile`` with kopf's own body.

Registered on an explicit registry (``register``) rather than at import, so
the operator process, the tests and any embedding build their own.

Two in-memory indexes, fed by kopf's watch of AgentRuns (no API call per
reconcile): ``agentrun_threads`` maps (namespace, threadId) to the runs on
that thread (the thread rule's input), ``agentrun_bodies`` maps a run's uid to
its latest body (so a pod event reconciles its run without reading it back).
When a run ends or is deleted, the runs waiting for its thread are
reconciled at once instead of at their next timer tick.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from ..decide.podspec import GROUP, MANAGED_BY, PLURAL, VERSION
from ..decide.reasons import TERMINAL
from ..decide.run import at_rest
from ..decide.thread import ThreadPeer
from ..settings import OperatorSettings
from .diffbase import DigestedDiffBaseStorage
from .expiry import expire
from .reconcile import Reconciler, thread_peer

log = logging.getLogger("agentrun_operator.handlers")

ThreadKey = tuple[str, str]
Threads = kopf.Index[ThreadKey, ThreadPeer]  # (namespace, threadId) -> the runs on that thread
Bodies = kopf.Index[str, dict[str, Any]]  # uid -> the run's latest body


def _thread_of(body: Mapping[str, Any]) -> ThreadKey | None:
    thread = (body.get("spec") or {}).get("threadId")
    return (str(body["metadata"]["namespace"]), str(thread)) if thread else None


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, settings: OperatorSettings) -> None:
    runs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL, "registry": registry}

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = "agentrun.dev/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="agentrun.dev")
        # Digests of spec.input/spec.resume, not the values: the annotation stays small (io/diffbase.py).
        settings.persistence.diffbase_storage = DigestedDiffBaseStorage(
            prefix="agentrun.dev", key="last-handled-configuration"
        )
        settings.posting.enabled = False  # we post our own Events, one per transition
        settings.peering.standalone = True  # leadership comes from our Lease, not kopf peering
        settings.networking.error_backoffs = [1, 2, 5, 10]

    @kopf.on.login(registry=registry)
    async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        # The operator's own credentials (io/kubeconfig.py): kopf's built-in logins run no exec plugin, merge
        # no KUBECONFIG list and assume https://kubernetes.default.svc in a pod.
        return await reconciler.kube.connection_info(trust_env=settings.networking.trust_env)

    @kopf.index(**runs, id="agentrun_threads")  # the id is the kwarg name handlers receive it by
    def agentrun_threads(body: kopf.Body, **_: Any) -> dict[ThreadKey, ThreadPeer]:
        key = _thread_of(body)
        return {key: thread_peer(body)} if key is not None else {}

    @kopf.index(**runs, id="agentrun_bodies")
    def agentrun_bodies(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        return {str(body.metadata.uid): copy.deepcopy(dict(body))}

    async def reconcile(body: Mapping[str, Any], threads: Threads, bodies: Bodies) -> None:
        key = _thread_of(body)
        before = reconciler.status_of(body)
        after = await reconciler.reconcile(body, peers=threads.get(key, ()) if key is not None else ())
        if key is not None and after.phase in TERMINAL and before.phase not in TERMINAL:
            await kick_waiters(key, str(body["metadata"]["uid"]), threads, bodies)

    async def kick_waiters(key: ThreadKey, freed_by: str, threads: Threads, bodies: Bodies) -> None:
        """Reconcile the runs that wait for ``key``'s thread now, rather than at their next timer tick."""
        for peer in list(threads.get(key, ())):
            waiting = reconciler.fresh(peer)
            if waiting.uid == freed_by or waiting.started or not waiting.live:
                continue
            for body in list(bodies.get(waiting.uid, ())):
                await reconciler.reconcile(body, peers=threads.get(key, ()))

    @kopf.on.create(**runs, backoff=2)
    @kopf.on.resume(**runs, backoff=2)
    @kopf.on.update(**runs, field="spec", backoff=2)
    async def on_change(body: kopf.Body, **kwargs: Any) -> None:
        await reconcile(body, kwargs["agentrun_threads"], kwargs["agentrun_bodies"])

    @kopf.timer(**runs, interval=settings.reconcile_interval_seconds)
    async def on_timer(body: kopf.Body, **kwargs: Any) -> None:
        # kopf's status may predate our last patch: the reconciler's view of it is the newest.
        status = reconciler.status_of(body)
        if at_rest(status, deleting=bool(body.metadata.get("deletionTimestamp"))):
            await expire(reconciler.kube, body, status)  # spec.ttlSecondsAfterFinished
            return
        await reconcile(body, kwargs["agentrun_threads"], kwargs["agentrun_bodies"])

    @kopf.on.event("", "v1", "pods", labels=dict(MANAGED_BY), registry=registry)
    async def on_pod(body: kopf.Body, **kwargs: Any) -> None:
        for owner in body.metadata.get("ownerReferences") or []:
            if owner.get("kind") == "AgentRun" and owner.get("controller"):
                # The run as the AgentRun watch last saw it; absent: not seen yet (its own create event will
                # reconcile it) or already gone (nothing to do for its pods).
                bodies: Bodies = kwargs["agentrun_bodies"]
                for run in list(bodies.get(str(owner["uid"]), ())):
                    await reconcile(run, kwargs["agentrun_threads"], bodies)

    @kopf.on.delete(**runs, backoff=2)
    async def on_delete(body: kopf.Body, **kwargs: Any) -> None:
        await reconciler.delete_pods(str(body.metadata.namespace), str(body.metadata.name))
        reconciler.forget(str(body.metadata.uid))
        log.info(
            "[%s/%s] deleted: its pods are removed, its thread data is kept",
            body.metadata.namespace,
            body.metadata.name,
        )
        key = _thread_of(body)
        if key is not None:
            await kick_waiters(key, str(body.metadata.uid), kwargs["agentrun_threads"], kwargs["agentrun_bodies"])
