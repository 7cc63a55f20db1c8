"""Reconcile one AgentRun: gather (run, pod, store progress), ``decide``, apply, write status.

Level-triggered and idempotent: called on every AgentRun change, every pod
event of its runs and on a timer (about once per second per active run,
which is also the status mirror's coalescing: at most one status patch per
second per run, plus one on every phase change). Creating a pod that already
exists is success, so a restarted operator never makes two pods for one
attempt; the status patch is written only after the pod exists.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from datetime import UTC, datetime
from typing import Any

from agentrun.checkpoint.base import Checkpointer, Progress

from . import metrics
from .decisions import TERMINAL, Decision, Limits, PodView, decide, iso, parse_time
from .kube import Conflict, KubeClient, NotFound, events_path, pod_path, run_path
from .podspec import RUN_LABEL, build_pod, label_value, pod_name, store_secret
from .settings import OperatorSettings
from .spec import AgentRunSpec, InvalidSpec, parse_spec, thread_key
from .store import StoreRegistry, StoreUnavailable

log = logging.getLogger("agentrun_operator")

PHASE_CONDITIONS = ("Running", "Interrupted", "Stopping", "Stopped", "Succeeded", "Failed")


def with_conditions(current: dict[str, Any], patch: dict[str, Any], now: datetime, generation: int) -> None:
    """On a phase change, make the new phase's condition True and the others False (Kubernetes conventions)."""
    phase = patch.get("phase")
    if not phase or phase == current.get("phase"):
        return
    conditions = {c["type"]: c for c in copy.deepcopy(current.get("conditions") or [])}
    for kind in PHASE_CONDITIONS:
        active = kind == phase or (kind == "Running" and phase == "Stopping")
        existing = conditions.get(kind)
        if existing is None and not active:
            continue
        status = "True" if active else "False"
        if existing is None or existing.get("status") != status or active:
            conditions[kind] = {
                "type": kind,
                "status": status,
                "reason": patch.get("reason") or phase,
                "message": (patch.get("message") or "")[:1024],
                "lastTransitionTime": iso(now)
                if existing is None or existing.get("status") != status
                else existing["lastTransitionTime"],
                "observedGeneration": generation,
            }
    patch["conditions"] = [conditions[k] for k in PHASE_CONDITIONS if k in conditions]


def changed(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in desired.items() if current.get(k) != v}


class Reconciler:
    def __init__(self, kube: KubeClient, settings: OperatorSettings, stores: StoreRegistry) -> None:
        self.kube = kube
        self.settings = settings
        self.stores = stores
        self.limits = Limits(
            stop_grace=settings.stop_grace_seconds,
            lost_node_timeout=settings.lost_node_timeout_seconds,
            max_disruptions=settings.max_disruptions,
            max_backoff=settings.max_backoff_seconds,
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self.phases: dict[str, str] = {}
        self._pod_created: dict[str, float] = {}

    def forget(self, uid: str) -> None:
        self._locks.pop(uid, None)
        self.phases.pop(uid, None)
        self._pod_created.pop(uid, None)
        self._publish_phases()

    def _publish_phases(self) -> None:
        counts: dict[str, int] = {}
        for phase in self.phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase in ("Pending", "Running", "Interrupted", "Stopping", "Stopped", "Succeeded", "Failed"):
            metrics.RUNS.labels(phase).set(counts.get(phase, 0))

    async def reconcile(self, run: dict[str, Any]) -> None:
        uid = run["metadata"]["uid"]
        lock = self._locks.setdefault(uid, asyncio.Lock())
        async with lock:
            started = time.perf_counter()
            try:
                fresh = await self._fresh(run)
                if fresh is not None:
                    await self._reconcile(fresh)
            except Exception as e:
                metrics.RECONCILE_ERRORS.labels(type(e).__name__).inc()
                raise
            finally:
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def _fresh(self, run: dict[str, Any]) -> dict[str, Any] | None:
        """Re-read the run under its lock: the caller's copy may predate our own last status patch."""
        meta = run["metadata"]
        try:
            return await self.kube.get(run_path(meta["namespace"], meta["name"]))
        except NotFound:
            return None

    async def _reconcile(self, run: dict[str, Any]) -> None:
        meta = run["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        status: dict[str, Any] = run.get("status") or {}
        self.phases[uid] = status.get("phase") or "Pending"
        if meta.get("deletionTimestamp") or status.get("phase") in TERMINAL:
            self._publish_phases()
            return
        now = datetime.now(UTC)
        try:
            spec = parse_spec(run.get("spec") or {})
        except InvalidSpec as e:
            await self._write(run, Decision().phase("Failed", "InvalidSpec", str(e), warning=True), now)
            return
        attempt = int(status.get("attempt") or 0)
        store: Checkpointer | None = None
        progress: Progress | None = None
        thread = thread_key(namespace, spec.threadId)
        try:
            store = await self.stores.get(namespace, store_secret(spec, self.settings))
        except StoreUnavailable as e:
            if not spec.stop:
                await self._write(run, Decision().phase("Failed", e.reason, str(e), warning=True), now)
                return
        pod: PodView | None = None
        if attempt:
            try:
                pod = PodView.from_manifest(await self.kube.get(pod_path(namespace, pod_name(name, attempt))))
            except NotFound:
                pod = None
            if store is not None:
                try:
                    progress = await store.aget_progress(thread)
                except Exception as e:  # the mirror can wait; decisions on pods must not
                    log.warning("[%s/%s] cannot read progress of %s: %s", namespace, name, thread, e)
        decision = decide(spec, status, pod, progress, now, self.limits)
        await self._apply(run, spec, decision, store, thread)
        await self._write(run, decision, now)

    async def _apply(
        self, run: dict[str, Any], spec: AgentRunSpec, decision: Decision, store: Checkpointer | None, thread: str
    ) -> None:
        meta = run["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if decision.request_stop and store is not None:
            await store.request_stop(thread, "spec.stop")
            log.info("[%s/%s] stop requested in the store for thread %s", namespace, name, thread)
        if decision.delete_pod:
            await self.kube.delete(pod_path(namespace, decision.delete_pod), grace_seconds=decision.delete_grace)
            log.info("[%s/%s] deleted pod %s", namespace, name, decision.delete_pod)
        if decision.create_attempt:
            manifest = build_pod(run, spec, decision.create_attempt, self.settings, resume=decision.resume)
            try:
                await self.kube.create(pod_path(namespace), manifest)
                log.info("[%s/%s] created pod %s", namespace, name, manifest["metadata"]["name"])
            except Conflict:
                log.info("[%s/%s] pod %s already exists; adopting it", namespace, name, manifest["metadata"]["name"])
            decision.status["podName"] = manifest["metadata"]["name"]
            self._pod_created[meta["uid"]] = time.monotonic()
            if decision.create_attempt > 1:
                reason = next((r for t, r, _ in decision.events if t == "Warning"), "Resume")
                metrics.RESCHEDULES.labels(reason).inc()

    async def _write(self, run: dict[str, Any], decision: Decision, now: datetime) -> None:
        meta = run["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        current: dict[str, Any] = run.get("status") or {}
        desired = dict(decision.status)
        desired["observedGeneration"] = meta.get("generation", 1)
        patch = changed(current, desired)
        if "phase" in patch:
            with_conditions(current, patch, now, meta.get("generation", 1))
            self._observe_transition(meta["uid"], current, patch, now)
        if not patch:
            return
        await self.kube.merge_patch(run_path(namespace, name, status=True), {"status": patch})
        if "phase" in patch:
            log.info(
                "[%s/%s] %s -> %s (%s): %s",
                namespace,
                name,
                current.get("phase") or "-",
                patch["phase"],
                patch.get("reason"),
                patch.get("message"),
            )
            self.phases[meta["uid"]] = patch["phase"]
            self._publish_phases()
        for kind, reason, message in decision.events:
            await self._event(run, kind, reason, message, now)

    def _observe_transition(self, uid: str, current: dict[str, Any], patch: dict[str, Any], now: datetime) -> None:
        metrics.TRANSITIONS.labels(patch["phase"]).inc()
        requested = parse_time(current.get("stopRequestedTime"))
        if patch["phase"] == "Stopped" and requested is not None:
            metrics.STOP_LATENCY.observe(max(0.0, (now - requested).total_seconds()))
        created = self._pod_created.pop(uid, None)
        if patch["phase"] == "Running" and created is not None:
            metrics.POD_START_LATENCY.observe(time.monotonic() - created)

    async def _event(self, run: dict[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        meta = run["metadata"]
        stamp = iso(now)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": run.get("apiVersion", "agentrun.dev/v1alpha1"),
                "kind": "AgentRun",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": "agentrun-operator"},
            "reportingComponent": "agentrun-operator",
        }
        try:
            await self.kube.create(events_path(meta["namespace"]), event)
        except Exception as e:  # events are best effort; status is the record
            log.debug("event %s for %s not posted: %s", reason, meta["name"], e)

    async def delete_pods(self, namespace: str, name: str) -> None:
        """On AgentRun deletion: remove its pods now (owner references would, eventually); keep thread data."""
        selector = {"labelSelector": f"{RUN_LABEL}={label_value(name)}"}
        listing = await self.kube.request("GET", pod_path(namespace), params=selector)
        for pod in listing.get("items") or []:
            path = pod_path(namespace, pod["metadata"]["name"])
            await self.kube.delete(path, grace_seconds=self.settings.pod_grace_seconds)
