"""Everything the operator keeps of each run between events, in one ``RunRecord``, dropped by one ``forget``.

One record per run uid, shared by the parts that act on runs: the reconciler (its lock, the status it
last wrote, a held-back quiet patch, the pod start it measures), the handlers (which generation a
reconcile last saw), the wake-ups (its timers, retries and whether a reconcile is queued or running,
the store thread whose progress wakes it) and the store registry (the store it keeps open). ``Runs``
holds the records and the three lookups that go the other way (the runs on a store thread, the runs
on a store, the run waiting for a pod name), and keeps them in step with the records: a deleted run
is one ``forget`` (its timers cancelled, its lookups gone, its count off the gauges), never a call per
part. The gauges that count runs (``agentrun_operator_runs`` by phase and namespace,
``agentrun_operator_runs_reconciled``) are published from here, since only here are all runs seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from ..decide.reasons import Phase
from . import metrics

PodName = tuple[str, str]  # (namespace, pod)


@dataclass(eq=False, slots=True)  # one per run: no __dict__ each (10,000 runs)
class RunRecord:
    """What the operator keeps of one run between its events (``Runs.forget`` drops it whole)."""

    uid: str
    # -- the reconciler's (io/reconcile.py)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # .status as our last patch left it, compact JSON text (``reconcile.status_text``: a fifth of the decoded
    # dicts): newer than the watch's copy until the watch delivers it, then dropped (``Handlers.on_run``)
    written: str | None = None
    phase: str | None = None  # for the runs-by-phase gauge
    namespace: str = ""
    deferred: datetime | None = None  # when a held-back (quiet) status patch is due (decide.verdict)
    pod_created: float | None = None  # monotonic time its latest pod was created (pod start latency)
    reconciled: bool = False  # a reconcile of it finished in this process (the runs-reconciled gauge)
    # -- the handlers' (io/handlers.py): the generation last handed to a reconcile and whether it was being
    # deleted; a watch event that changes neither is the echo of a status patch, or a metadata change
    handled: tuple[int | None, bool] | None = None
    # -- the wake-ups' (io/wakeups.py)
    thread: str | None = None  # the store thread whose progress wakes it (None: at rest)
    timer: asyncio.TimerHandle | None = None  # its next deadline, resync or retry
    folding: asyncio.TimerHandle | None = None  # progress folded into one reconcile at the window's end
    last_progress: float | None = None  # loop time of the last reconcile progress started
    failures: int = 0  # reconciles that raised in a row (the retry's backoff)
    queued: bool = False
    running: bool = False
    again: bool = False  # kicked while running: once more afterwards
    # -- the store registry's (io/stores.py) and the pod names it waits for (a deleted run's terminating pod)
    store: str | None = None  # the DSN of the store it keeps open (None: it keeps none)
    waits_for: set[PodName] = field(default_factory=set)

    def cancel_timers(self) -> None:
        """Cancel its deadline (or resync, or retry) and its folded progress."""
        for handle in (self.timer, self.folding):
            if handle is not None:
                handle.cancel()
        self.timer = self.folding = None


class Runs:
    """The records of every run the operator knows, by uid, with the lookups by thread, store and pod name."""

    def __init__(self) -> None:
        self._records: dict[str, RunRecord] = {}
        self._threads: dict[str, set[str]] = {}  # store thread -> uids of the live runs on it
        self._stores: dict[str, set[str]] = {}  # store DSN -> uids of the live runs keeping it open
        self._name_waits: dict[PodName, str] = {}  # a pod name held by a deleted run's pod -> the run waiting
        self._namespaces: set[str] = set()  # every namespace a run was seen in (the runs-by-phase gauge)
        self.reconciled = 0  # how many runs a reconcile finished for (metrics.RUNS_RECONCILED)

    def get(self, uid: str) -> RunRecord | None:
        """The record of ``uid``, if the operator keeps one."""
        return self._records.get(uid)

    def record(self, uid: str) -> RunRecord:
        """The record of ``uid``, made empty if there is none."""
        record = self._records.get(uid)
        if record is None:
            record = self._records[uid] = RunRecord(uid)
        return record

    def __iter__(self) -> Iterator[RunRecord]:
        return iter(list(self._records.values()))

    def __len__(self) -> int:
        return len(self._records)

    def forget(self, uid: str) -> RunRecord | None:
        """The run is gone: drop everything kept of it (timers, lookups, its store, its count); its record."""
        record = self._records.pop(uid, None)
        if record is None:
            return None
        record.cancel_timers()
        self._unindex(self._threads, record.thread, uid)
        self._unindex(self._stores, record.store, uid)
        for key in record.waits_for:
            if self._name_waits.get(key) == uid:
                del self._name_waits[key]
        if record.reconciled:
            self.reconciled -= 1
            metrics.RUNS_RECONCILED.set(self.reconciled)
        self.publish_phases()
        return record

    @staticmethod
    def _unindex(index: dict[str, set[str]], key: str | None, uid: str) -> None:
        if key is None:
            return
        uids = index.get(key, set())
        uids.discard(uid)
        if not uids:
            index.pop(key, None)

    # -- which runs a store thread's progress wakes --------------------------------------------------

    def track(self, uid: str, thread: str | None) -> None:
        """Run ``uid``'s progress arrives on ``thread`` (None: it is at rest, nothing wakes it but deadlines)."""
        record = self.record(uid)
        if record.thread == thread:
            return
        self._unindex(self._threads, record.thread, uid)
        record.thread = thread
        if thread is not None:
            self._threads.setdefault(thread, set()).add(uid)

    def on_thread(self, thread: str) -> list[str]:
        """The live runs whose progress arrives on ``thread``."""
        return list(self._threads.get(thread, ()))

    # -- which runs keep a store open ----------------------------------------------------------------

    def use_store(self, uid: str, dsn: str | None) -> bool:
        """Run ``uid`` keeps store ``dsn`` open (None: none); True when the store it left has no run left."""
        record = self.record(uid) if dsn is not None else self.get(uid)
        if record is None or record.store == dsn:
            return False
        left, record.store = record.store, dsn
        self._unindex(self._stores, left, uid)
        if dsn is not None:
            self._stores.setdefault(dsn, set()).add(uid)
        return left is not None and left not in self._stores

    def store_users(self, dsn: str) -> set[str]:
        """The live runs that last used store ``dsn``."""
        return set(self._stores.get(dsn, ()))

    # -- pod names held by a deleted run's terminating pod --------------------------------------------

    def wait_for_name(self, uid: str, namespace: str, pod: str) -> None:
        """Run ``uid`` waits for pod name ``namespace/pod`` (a deleted run's pod still holds it)."""
        self._name_waits[(namespace, pod)] = uid
        self.record(uid).waits_for.add((namespace, pod))

    def name_freed(self, namespace: str, pod: str) -> str | None:
        """Pod ``namespace/pod`` is gone: the run that waited for its name, if any (no longer waiting)."""
        uid = self._name_waits.pop((namespace, pod), None)
        record = self.get(uid) if uid is not None else None
        if record is not None:
            record.waits_for.discard((namespace, pod))
        return uid

    # -- the gauges ------------------------------------------------------------------------------------

    def reconciled_once(self, record: RunRecord) -> None:
        """A reconcile of ``record``'s run finished: count it once (unless it was forgotten meanwhile)."""
        if not record.reconciled and self._records.get(record.uid) is record:
            record.reconciled = True
            self.reconciled += 1
            metrics.RUNS_RECONCILED.set(self.reconciled)

    def seen_in(self, namespace: str) -> None:
        """A run of ``namespace`` is reconciled: the namespace's series exist (at 0)."""
        self._namespaces.add(namespace)
        metrics.namespace_seen(namespace, tuple(Phase))

    def publish_phases(self) -> None:
        """Set ``agentrun_operator_runs`` from the records: the runs by phase and namespace."""
        counts: dict[tuple[str, str], int] = {}
        for record in self._records.values():
            if record.phase is not None:
                key = (record.phase, record.namespace)
                counts[key] = counts.get(key, 0) + 1
        for namespace in self._namespaces:
            for phase in Phase:
                metrics.RUNS.labels(phase=phase, namespace=namespace).set(counts.get((phase, namespace), 0))
