"""One reconcile's whole verdict (pure): everything the operator knows about a run in, one ``Decision`` out.

``io.reconcile`` gathers ``Inputs`` (the run's view and status, its spec as parsed, its pod, the store's
answers, the access checks, the clock) and applies the returned ``Decision``; it decides nothing. The
rules, in the order they apply:

1. a run that ended (and ``spec.retry`` does not re-open it) or is being deleted is at rest; one that
   finished longer than ``spec.ttlSecondsAfterFinished`` ago is deleted;
2. a spec the operator refuses ends the run Failed ``InvalidSpec`` (``run.rejected``), so does a store
   Secret the run may not use, before its first attempt (``access.store_secret_problem``);
3. ``run.decide``: the run's next step from its status, pod, progress and thread;
4. ``outage.guard``: the operator's own view of the store (no pod while it does not answer);
5. a pod about to be created for a run whose Secrets or image are refused: Failed ``InvalidSpec`` instead;
6. a stop the store cannot take now (it did not answer the progress read): shown as Stopping at once with
   the store's condition, asked again soon, the stop grace not started;
7. a pod created gets its name in ``status.podName``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentrun.checkpoint.base import Progress

from . import jobparity, outage
from .classify import Outcome, PodView, classify
from .decision import Decision, Limits, StoreProblem
from .identity import RecordedTurn
from .podspec import pod_name
from .run import at_rest, decide, rejected
from .spec import AgentRunSpec, InvalidSpec
from .status import AgentRunStatus
from .thread import OrphanedTurn, ThreadPeer

# A stop the store could not take is asked again this often.
STOP_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class Inputs:
    """What one reconcile knows. ``spec`` None: ``spec_error`` says why the raw spec was refused.

    Fields after ``now`` are gathered only for a run that is not at rest and whose spec parsed; the store
    facts only when the run may use its store (``store_access`` None).
    """

    run: ThreadPeer  # this run as its thread sees it (name, uid, creation, phase, attempt)
    raw_spec: dict[str, Any]
    spec: AgentRunSpec | None
    spec_error: InvalidSpec | None
    status: AgentRunStatus
    deleting: bool
    now: datetime
    limits: Limits = field(default_factory=Limits)
    peers: tuple[ThreadPeer, ...] = ()
    store_access: str | None = None  # why the run may not use its store Secret (checked before its first attempt)
    access: str | None = None  # why the run may not get a pod (Secrets, image)
    store_problem: StoreProblem | None = None  # the store cannot be opened (configuration)
    store_down: str | None = None  # the store did not answer the operator's progress read (why)
    pod: PodView | None = None  # the current attempt's pod
    progress: Progress | None = None  # the thread's progress, once this run has an attempt
    turn: RecordedTurn | None = None  # the run's request in the store, before its first pod
    request_key: str = ""
    orphan: OrphanedTurn | None = None

    @property
    def at_rest(self) -> bool:
        """Whether the run needs nothing (finished, not being deleted, no retry asked)."""
        return at_rest(self.status, deleting=self.deleting, retry=jobparity.retry_of(self.raw_spec))


def verdict(i: Inputs) -> Decision:
    """Every decision of one reconcile (the module docstring's rules)."""
    if i.at_rest:
        ttl = jobparity.ttl_of(i.raw_spec)
        return Decision(at_rest=True, expire=not i.deleting and jobparity.expired(ttl, i.status, now=i.now))
    if i.spec is None:
        return rejected(i.spec_error or InvalidSpec("spec: not a valid AgentRun spec"))
    spec = i.spec
    if i.store_access is not None and not i.status.attempt:
        return rejected(InvalidSpec(i.store_access))
    d = decide(
        spec=spec,
        status=i.status,
        pod=i.pod,
        progress=i.progress,
        now=i.now,
        limits=i.limits,
        store_problem=i.store_problem,
        run=i.run,
        peers=i.peers,
        request_key=i.request_key,
        turn=i.turn,
        store_down=i.store_down is not None,
        orphan=i.orphan,
    )
    d = outage.guard(
        d,
        status=i.status,
        timeout=spec.restartPolicy.storeUnavailableTimeoutSeconds,
        store_down=i.store_down,
        pod_running=i.pod is not None and classify(i.pod) is Outcome.RUNNING,
        now=i.now,
    )
    if d.create_attempt is not None and i.access is not None:
        return rejected(InvalidSpec(i.access))  # before any pod of this attempt exists
    if d.request_stop and i.store_down is not None:
        _stop_undelivered(d, i.store_down)
    if d.create_attempt is not None:
        d.status["podName"] = pod_name(i.run.name, d.create_attempt)
    return d


def _stop_undelivered(d: Decision, why: str) -> None:
    """The store cannot take the stop request now: Stopping all the same, the request made again soon.

    No ``stopRequestedTime`` yet, so the stop grace (then the forced stop) counts from the delivery.
    """
    d.request_stop = False
    d.retry_after = STOP_RETRY_SECONDS
    d.status.pop("stopRequestedTime", None)
    d.status["message"] = (
        "spec.stop is true; the store is unavailable, so the runner is asked to stop as soon as it answers"
    )
    d.condition(outage.CONDITION, False, outage.DOWN_REASON, why)
