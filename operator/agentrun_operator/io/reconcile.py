"""Reconcile one AgentRun: gather (run, pod, store progress, its thread's other runs), ``decide``, apply, write.

Level-triggered and idempotent: called on every AgentRun change, every pod
event of its runs, on its store's progress (``io/notify.py``, folded to at
most one reconcile per ``progress_coalesce_seconds``: the status mirror's
coalescing), when a deadline of the run is due or its slow resync comes
(``io/wakeups.py``), and when a run on the same thread ends. It makes no API
call to read: the pod comes from the watch-fed index and the store Secret
from the watch-fed cache (``io/caches.py``); the only reads are the store's
progress (one query) and, before the first pod, the request's turn. Writes
happen only when something changed. Creating a pod that already exists is
success, so a restarted operator never makes two pods for one attempt; the
status patch is written only after the pod exists.

Which copy of the run is used. The caller hands in the run as the watch-fed index
keeps it (``PackedRun``: the JSON text of what a reconcile reads, decoded once through the gate into the
reconcile's own copy); it is never re-read from the API. Its spec and metadata are as new as the last
watch event indexed, and reconciles of one run are serialised by a FIFO lock in call order, so a
reconcile never sees an older spec than the one before it. At most
``max_concurrent_reconciles`` run at once (a FIFO gate taken under the run's
lock): a new leader's first pass over thousands of runs is a queue, not a flood. Its *status*,
though, may predate our own last status patch (the watch event for that patch
may not have arrived yet), and deciding on an old status would repeat a
transition (a second pod for the same attempt is harmless, a second restart
counted is not). The operator is the only writer of status and a single
leader, so the status returned by our last patch is the newest there is:
it replaces the body's status whenever we have one (``RunRecord.written``, io/runs.py, kept as compact JSON
text), until the watch delivers that very status: the run's event handler drops it as it indexes the echo
(``Handlers.on_run``), so a run waiting for a human keeps one copy of its status, not two. That is safe because
a reconcile takes the index's latest copy of the run once it holds the run's lock (``latest``), never the one it
was queued with, and its result is the status it wrote, not one re-read after its awaits. After an operator
restart there is none, and the freshly listed body is current.
The same record freshens the thread index, so a run that just ended frees its
thread at once for a waiter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from agentrun.checkpoint.base import ControlStore, Progress
from agentrun.contract import API_VERSION, KIND

from ..decide.decision import Decision, Limits, StoreProblem
from ..decide.identity import RecordedTurn
from ..decide.podspec import RUN_LABEL, RunRef, build_pod, label_value, pod_name, run_request_key, store_secret
from ..decide.reasons import TERMINAL, Phase
from ..decide.spec import AgentRunSpec, InvalidSpec, parse_spec, thread_key
from ..decide.status import AgentRunStatus, StatusPatch, iso, parse_time
from ..decide.thread import OrphanedTurn, ThreadPeer, orphaned_turn
from ..decide.verdict import Inputs, after_apply, at_rest_after, verdict
from ..settings import OperatorSettings
from . import metrics
from .access import AccessChecker
from .caches import PodCache, SecretCache
from .expiry import expire
from .kube import Conflict, KubeClient, events_path, pod_path, run_path
from .runs import RunRecord, Runs
from .stores import StoreRegistry, StoreUnavailable

log = logging.getLogger("agentrun_operator")


# What a reconcile reads of a run's metadata. Not its annotations (kubectl's last-applied copy of the manifest,
# other tools' annotations), finalizers, managedFields or resourceVersion: together larger than the rest of the body.
RUN_METADATA = ("name", "namespace", "uid", "generation", "creationTimestamp", "deletionTimestamp")


def run_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a reconcile reads of a run's body: its identity, spec and status (not copied: read-only here)."""
    meta = body["metadata"]
    view = {key: body[key] for key in ("apiVersion", "kind", "spec", "status") if key in body}
    view["metadata"] = {key: meta[key] for key in RUN_METADATA if key in meta}
    return view


@dataclass(frozen=True, slots=True)
class PackedRun:
    """What the operator keeps of a run's latest body between its reconciles (the runs index's value).

    Its identity, and ``run_view`` as compact JSON text: about 1.3 KB a run where the decoded dicts take about
    7 KB (10,000 runs waiting for approval: 13 MB instead of 70). ``unpack`` decodes it into a new dict each
    time, the reconcile's own copy (it used to deep-copy the shared decoded view: same cost, same isolation).
    """

    uid: str
    namespace: str
    name: str
    thread: str | None  # spec.threadId, if any
    text: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> PackedRun:
        """Pack ``body`` (an AgentRun as the watch delivered it)."""
        view = run_view(body)
        meta = view["metadata"]
        thread = (view.get("spec") or {}).get("threadId")
        return cls(
            uid=str(meta["uid"]),
            namespace=str(meta["namespace"]),
            name=str(meta["name"]),
            thread=str(thread) if thread else None,
            text=json.dumps(view, separators=(",", ":"), ensure_ascii=False),
        )

    def unpack(self) -> dict[str, Any]:
        """A fresh copy of ``run_view`` of the packed body (nothing else holds it)."""
        return dict(json.loads(self.text))


def status_text(status: Mapping[str, Any] | None) -> str:
    """A status as ``RunRecord.written`` keeps it: compact JSON, keys sorted (the patch's answer and the watch's
    copy compare equal as text)."""
    return json.dumps(status or {}, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def thread_peer(body: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> ThreadPeer:
    """This AgentRun as its thread's other runs see it (``status`` overrides the body's)."""
    meta = body["metadata"]
    seen = AgentRunStatus.parse(body.get("status") if status is None else status)
    return ThreadPeer(
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        created=parse_time(meta.get("creationTimestamp")),
        phase=seen.phase,
        attempt=seen.attempt,
        deleting=bool(meta.get("deletionTimestamp")),
    )


class PodNameTaken(RuntimeError):
    """The attempt's pod name is held by a pod of another run (a deleted one of the same name); retried."""


def controller_uid(pod: Mapping[str, Any] | None) -> str | None:
    """The uid of the AgentRun that controls ``pod`` (its controller ownerReference), if any."""
    for owner in ((pod or {}).get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == KIND and owner.get("controller"):
            return str(owner.get("uid"))
    return None


@dataclass(frozen=True)
class Pass:
    """What one reconcile leaves for its caller: the status after it and when the run wants waking.

    ``thread``: the store thread whose progress should wake the run (None: the run is at rest, only its
    deadline may wake it); ``live``: the slow resync applies (``waiting``: its slower variant, for a run
    waiting for a human, ``decide.wake.waits_for_a_human``).
    """

    status: AgentRunStatus
    wake: datetime | None = None
    live: bool = False
    thread: str | None = None
    waiting: bool = False
    before: AgentRunStatus | None = None  # the status it started from (set by ``Reconciler.reconcile``)


class Reconciler:
    """Reconciles runs (each under its own lock): gathers the verdict's inputs, calls ``decide``, applies it."""

    def __init__(
        self,
        kube: KubeClient,
        settings: OperatorSettings,
        stores: StoreRegistry,
        *,
        runs: Runs | None = None,
        pods: PodCache | None = None,
        secrets: SecretCache | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.stores = stores
        self.runs = runs if runs is not None else stores.runs  # what is kept of each run (io/runs.py)
        self.pods = pods if pods is not None else PodCache(kube)
        self.access = AccessChecker(secrets if secrets is not None else stores.secrets, settings)
        self.limits = Limits(
            stop_grace=settings.stop_grace_seconds,
            lost_node_timeout=settings.lost_node_timeout_seconds,
            max_disruptions=settings.max_disruptions,
            max_backoff=settings.max_backoff_seconds,
        )
        self.gate = asyncio.Semaphore(max(1, settings.max_concurrent_reconciles))

    def status_of(self, body: Mapping[str, Any]) -> AgentRunStatus:
        """The run's newest status: ours if we wrote one, else the body's (see the module docstring)."""
        record = self.runs.get(str(body["metadata"]["uid"]))
        raw = record.written if record is not None else None
        if record is not None and raw is not None and status_text(body.get("status")) == raw:
            record.written = raw = None  # the watch delivered our last write: the body's copy is as new
        return AgentRunStatus.parse(body.get("status") if raw is None else json.loads(raw))

    def fresh(self, peer: ThreadPeer) -> ThreadPeer:
        """A thread index entry with the status of our own last write, which the index may not have seen."""
        record = self.runs.get(peer.uid)
        raw = record.written if record is not None else None
        if raw is None:
            return peer
        seen = AgentRunStatus.parse(json.loads(raw))
        return ThreadPeer(
            name=peer.name,
            uid=peer.uid,
            created=peer.created,
            phase=seen.phase,
            attempt=seen.attempt,
            deleting=peer.deleting,
        )

    async def reconcile(
        self,
        packed: PackedRun,
        *,
        peers: Iterable[ThreadPeer] = (),
        latest: Callable[[], PackedRun | None] | None = None,
    ) -> Pass:
        """Reconcile the run ``packed``; ``peers``: the runs on its thread (read under the run's lock).

        ``latest``: the index's copy of the run now, taken once the lock is held (None: gone, ``packed`` is
        used): the echo of our last write may have been indexed, and ``written`` dropped, while this waited.
        Returns the run's status before and after (so the caller can tell whether it ended) and when to wake it.
        """
        record = self.runs.record(packed.uid)
        async with record.lock, self.gate:
            packed = (latest() if latest is not None else None) or packed
            run = packed.unpack()  # once through the gate: a queued reconcile holds no copy
            started = time.perf_counter()
            try:
                status = self.status_of(run)
                done = await self._reconcile(run, record, status, [self.fresh(p) for p in peers])
                done = replace(done, before=status)
            except Exception as e:
                metrics.RECONCILE_ERRORS.labels(type(e).__name__).inc()
                raise
            finally:
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
            self.runs.reconciled_once(record)
            return done

    async def _reconcile(
        self, run: dict[str, Any], record: RunRecord, status: AgentRunStatus, peers: list[ThreadPeer]
    ) -> Pass:
        """Gather ``verdict.Inputs``, take the verdict, apply it: nothing is decided here."""
        ref = RunRef.from_body(run)
        record.phase = status.phase or Phase.PENDING
        record.namespace = ref.namespace
        self.runs.seen_in(ref.namespace)
        now = datetime.now(UTC)
        inputs, store = await self._gather(run, status, record, peers, now)
        decision = verdict(inputs)
        if decision.wants_earlier_answer and inputs.spec is not None and decision.create_attempt is not None:
            answer = await self._earlier_answer(ref, store, inputs.spec, decision.create_attempt)
            inputs = replace(inputs, earlier_answer=answer, earlier_answer_read=True)
            decision = verdict(inputs)
        after = status
        if decision.at_rest:
            if decision.expire and await expire(self.kube, run, status):
                return Pass(status)  # its DELETED event forgets it
            self.runs.publish_phases()
        else:
            for waited in decision.waits_for_pods:  # its deletion reconciles this run at once (io/handlers.py)
                self.runs.wait_for_name(ref.uid, ref.namespace, waited)
            if inputs.spec is not None:
                await self._apply(ref, record, inputs.spec, decision, store)
            after = await self._write(run, record, status, decision, now)
        pod = inputs.pod
        changed = decision.create_attempt is not None or decision.delete_pod is not None
        if changed and not at_rest_after(inputs, decision, after):
            pod = await self.pods.get(ref.namespace, pod_name(ref.name, after.attempt)) if after.attempt else None
        following = after_apply(inputs, decision, status=after, pod=pod)
        if not following.live:
            self.stores.release(ref.uid)  # the run needs nothing more than its ttl (if any): no store, no resync
            return Pass(after, wake=following.wake, waiting=following.waiting)
        thread = thread_key(ref.namespace, inputs.spec.threadId) if inputs.spec is not None else None
        return Pass(after, wake=following.wake, live=True, thread=thread, waiting=following.waiting)

    async def _gather(
        self, run: dict[str, Any], status: AgentRunStatus, record: RunRecord, peers: list[ThreadPeer], now: datetime
    ) -> tuple[Inputs, ControlStore | None]:
        """What the verdict needs, and the run's store (to apply it with). Reads only what can matter: nothing
        for a run at rest or with a refused spec, and no store a run may not use (its DSN is not opened)."""
        meta = run["metadata"]
        raw = run.get("spec") or {}
        base = Inputs(
            run=thread_peer(run, status.wire()),
            raw_spec=raw,
            spec=None,
            spec_error=None,
            status=status,
            deleting=bool(meta.get("deletionTimestamp")),
            now=now,
            limits=self.limits,
            peers=tuple(peers),
            generation=int(meta.get("generation", 1)),
            deferred=record.deferred,
        )
        if base.at_rest:
            return base, None
        try:
            spec = parse_spec(raw)
        except InvalidSpec as e:
            return replace(base, spec_error=e), None
        ref = RunRef.from_body(run)
        if not status.attempt and (refused := await self.access.store_problem(ref, spec)):
            return replace(base, spec=spec, store_access=refused), None  # before that database is opened
        thread = thread_key(ref.namespace, spec.threadId)
        secret = store_secret(spec, self.settings)
        store: ControlStore | None = None
        problem: StoreProblem | None = None
        try:
            store = await self.stores.get(ref.namespace, secret, user=ref.uid)
        except StoreUnavailable as e:
            problem = e.problem
        pod = await self.pods.get(ref.namespace, pod_name(ref.name, status.attempt)) if status.attempt else None
        store_down: str | None = None  # why the store did not answer the operator (outage.guard)
        seen: Progress | None = None  # the thread's progress, whichever run wrote it
        if store is not None:
            # Read on every reconcile, also before the first pod: it is the operator's view of the store.
            try:
                seen = await store.aget_progress(thread)
            except Exception as e:  # the mirror can wait; decisions on pods must not
                explained = self.stores.explain(ref.namespace, secret, e)
                if isinstance(explained, StoreProblem):
                    problem = explained
                else:
                    store_down = explained
                why = explained.message if isinstance(explained, StoreProblem) else explained
                log.warning("[%s/%s] cannot read progress of %s: %s", ref.namespace, ref.name, thread, why)
        key = run_request_key(ref, spec)
        orphan: OrphanedTurn | None = None
        gone = orphaned_turn(seen, me=ref.uid, request_key=key, peers=peers) if not spec.stop else None
        if gone is not None:
            orphan = OrphanedTurn(gone, tuple(self.pods.of_owner(ref.namespace, gone)))
        inputs = replace(
            base,
            spec=spec,
            access=await self.access.problem(ref, spec),
            store_problem=problem,
            store_down=store_down,
            pod=pod,
            progress=seen if status.attempt else None,  # before its first pod, not this run's progress
            turn=await self._turn(ref, store, thread, key) if not status.started and not spec.stop else None,
            request_key=key,
            orphan=orphan,
        )
        return inputs, store

    async def _turn(self, ref: RunRef, store: ControlStore | None, thread: str, key: str) -> RecordedTurn | None:
        """The request key's turn, read before the first pod (``decide.identity``); None if unknown."""
        if store is None:
            return None
        try:
            found = await store.aget_turn(thread, key)
        except Exception as e:  # the runner applies the same rule when it starts: go on without the answer
            log.warning("[%s/%s] cannot read the turn of request %s: %s", ref.namespace, ref.name, key, e)
            return None
        return RecordedTurn.of(found) if found is not None else None

    async def _apply(
        self, ref: RunRef, record: RunRecord, spec: AgentRunSpec, decision: Decision, store: ControlStore | None
    ) -> None:
        namespace, name = ref.namespace, ref.name
        thread = thread_key(namespace, spec.threadId)
        if decision.request_stop and store is not None:
            await store.request_stop(thread, "spec.stop")
            log.info("[%s/%s] stop requested in the store for thread %s", namespace, name, thread)
        if decision.clear_stop and store is not None:
            await store.clear_stop(thread)
            log.info("[%s/%s] withdrew its unacknowledged stop request for thread %s", namespace, name, thread)
        if decision.delete_pod:
            await self.kube.delete(pod_path(namespace, decision.delete_pod), grace_seconds=decision.delete_grace)
            log.info("[%s/%s] deleted pod %s", namespace, name, decision.delete_pod)
        if decision.create_attempt:
            if store is None:
                raise RuntimeError(f"no store to write the inputs of attempt {decision.create_attempt} to")
            resume = decision.resume
            if decision.carried:
                log.warning(
                    "[%s/%s] attempt %d ended before checkpointing its answer to the interrupt; "
                    "attempt %d resumes with the same answer",
                    namespace,
                    name,
                    decision.create_attempt - 1,
                    decision.create_attempt,
                )
            # Before the pod exists, so the runner always finds them; an upsert, so a retried reconcile is fine.
            await store.put_run_inputs(
                thread, run_uid=ref.uid, attempt=decision.create_attempt, input=spec.input, resume=resume
            )
            manifest = build_pod(
                ref,
                spec,
                attempt=decision.create_attempt,
                settings=self.settings,
                resume=resume,
                inputs_in_store=True,
                take_over_from=decision.take_over_from,
            )
            pod = manifest["metadata"]["name"]
            try:
                created = await self.kube.create(pod_path(namespace), manifest)
                log.info("[%s/%s] created pod %s", namespace, name, pod)
            except Conflict:
                created = await self.kube.get(pod_path(namespace, pod))
                owner = controller_uid(created)
                if owner != ref.uid:
                    self.runs.wait_for_name(ref.uid, namespace, pod)
                    # A deleted AgentRun of the same name whose pod is still terminating: retried (wakeups)
                    # until the name is free, never adopted (its runner is another run's, draining).
                    raise PodNameTaken(
                        f"pod {pod} still belongs to an earlier AgentRun {name} (uid {owner}), which was deleted;"
                        f" attempt {decision.create_attempt} starts once that pod is gone"
                    ) from None
                log.info("[%s/%s] pod %s already exists; adopting it", namespace, name, pod)  # a retried create
            # Until the pod watch reports it: the next reconcile must not take it for a missing pod.
            self.pods.assume(namespace, created or manifest)
            record.pod_created = time.monotonic()
            if decision.reschedule_reason is not None:
                metrics.RESCHEDULES.labels(reason=decision.reschedule_reason, namespace=namespace).inc()

    async def _earlier_answer(
        self, ref: RunRef, store: ControlStore | None, spec: AgentRunSpec, attempt: int
    ) -> dict[str, Any] | None:
        """The resume value of the newest run inputs record of ``attempt`` or the one before it.

        ``Inputs.earlier_answer``: the verdict carries it on if no checkpoint holds it (``decide.answers``).

        Read before this attempt's inputs are written, which drops the older attempts' records; a retried
        reconcile finds the answer in this attempt's own record instead.
        """
        if store is None:
            return None
        thread = thread_key(ref.namespace, spec.threadId)
        try:
            for source in (attempt, attempt - 1):
                record = await store.aget_run_inputs(thread, run_uid=ref.uid, attempt=source)
                if record is not None:
                    return record.resume or None
        except Exception as e:  # the store is down: the attempt starts without it, as before
            log.warning("[%s/%s] cannot read the previous attempt's answer: %s", ref.namespace, ref.name, e)
        return None

    async def _write(
        self, run: dict[str, Any], record: RunRecord, status: AgentRunStatus, decision: Decision, now: datetime
    ) -> AgentRunStatus:
        """Write the verdict's status patch (``Decision.write``; held back: ``deferred``), then its metrics.

        Returns the run's status after it: the one written, else ``status`` (not ``status_of`` again: the echo
        of the write may be indexed and ``written`` dropped during the awaits that follow)."""
        ref = RunRef.from_body(run)
        patch = decision.write
        record.deferred = decision.deferred
        if "phase" in patch:
            self._observe_transition(record, status, patch, now)
        if not patch:
            return status
        written = await self.kube.merge_patch(run_path(ref.namespace, ref.name, status=True), {"status": patch})
        raw = written.get("status") or {}
        record.written = status_text(raw)
        after = AgentRunStatus.parse(raw)
        for tool, count in decision.tool_failures.items():  # once written, so a retried reconcile never recounts
            metrics.tool_failed(tool, count)
        metrics.count_tool_calls(ref.namespace, decision.tool_growth)
        if decision.model_growth is not None:
            metrics.count_model_usage(ref.namespace, decision.model_growth)
        if "phase" in patch:
            log.info(
                "[%s/%s] %s -> %s (%s): %s",
                ref.namespace,
                ref.name,
                status.phase or "-",
                patch["phase"],
                patch.get("reason"),
                patch.get("message"),
            )
            record.phase = patch["phase"]
            self.runs.publish_phases()
        for event in decision.events:
            await self._event(run, event.type, event.reason, event.message, now=now)
        return after

    @staticmethod
    def _observe_transition(record: RunRecord, current: AgentRunStatus, patch: StatusPatch, now: datetime) -> None:
        metrics.TRANSITIONS.labels(patch["phase"]).inc()
        started = current.start_time
        if patch["phase"] in TERMINAL and current.phase not in TERMINAL and started is not None:
            metrics.RUN_DURATION.labels(namespace=record.namespace, phase=patch["phase"]).observe(
                max(0.0, (now - started).total_seconds())
            )
        requested = current.stop_requested_time
        if patch["phase"] == Phase.STOPPED and requested is not None:
            metrics.STOP_LATENCY.observe(max(0.0, (now - requested).total_seconds()))
        # Kept across the Pending (PodCreated) transition written with the pod itself: measured at Running.
        if patch["phase"] == Phase.RUNNING and (created := record.pod_created) is not None:
            record.pod_created = None
            metrics.POD_START_LATENCY.observe(time.monotonic() - created)
        elif patch["phase"] in TERMINAL:
            record.pod_created = None

    async def _event(self, run: dict[str, Any], kind: str, reason: str, message: str, *, now: datetime) -> None:
        meta = run["metadata"]
        stamp = iso(now)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": run.get("apiVersion", API_VERSION),
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": str(reason),
            "message": message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": "agentrun-operator"},
            "reportingComponent": "agentrun-operator",
        }
        try:
            await self.kube.create(events_path(meta["namespace"]), event)
        except Exception as e:  # events are best effort (status is the record), but a refusal must show
            log.warning("[%s/%s] event %s not posted: %s", meta["namespace"], meta["name"], reason, e)

    async def delete_pods(self, namespace: str, name: str, uid: str) -> None:
        """On AgentRun deletion: remove its pods now (owner references would, eventually); keep thread data.

        Only the pods of that run (by owner uid): a run re-applied under the same name may have pods already.
        """
        selector = {"labelSelector": f"{RUN_LABEL}={label_value(name)}"}
        listing = await self.kube.request("GET", pod_path(namespace), params=selector)
        for pod in listing.get("items") or []:
            if controller_uid(pod) != uid:
                continue
            path = pod_path(namespace, pod["metadata"]["name"])
            await self.kube.delete(path, grace_seconds=self.settings.pod_grace_seconds)
