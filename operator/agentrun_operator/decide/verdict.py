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
7. a pod created gets its name in ``status.podName``;
8. an attempt after the first resumes with its predecessor's answer to an interrupt that no checkpoint
   holds yet (``answers.carried_answer``; ``Inputs.earlier_answer``, which io reads only when the
   verdict asks for it: ``Decision.wants_earlier_answer``);
9. the status patch: what changed (``conditions.status_patch``), held back while it changes only quiet
   fields (``conditions.deferrable``) until ``Decision.deferred``, and the counters' growth once written
   (``growth``).

After io applied it, ``after_apply`` (the verdict's second half, on what the API answered: the status
written, the pod created) says when to wake the run next and whether it is live (its store kept open,
its progress followed) or at rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agentrun.checkpoint.base import Progress

from . import answers, jobparity, outage
from .classify import Outcome, PodView, classify
from .conditions import QUIET_SECONDS, deferrable, status_patch
from .decision import Decision, Limits, StoreProblem
from .growth import model_usage_growth, tool_call_growth
from .identity import RecordedTurn
from .podspec import pod_name
from .reasons import TERMINAL
from .run import at_rest, decide, rejected
from .spec import AgentRunSpec, InvalidSpec
from .status import AgentRunStatus
from .thread import OrphanedTurn, ThreadPeer
from .wake import next_wake, waits_for_a_human

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
    generation: int = 1  # metadata.generation (the status' observedGeneration)
    deferred: datetime | None = None  # a quiet status patch held back by an earlier verdict is due then
    # The resume value of the newest run inputs record of the attempt created or the one before it
    # (``earlier_answer_read``: io read it, on the verdict's ``wants_earlier_answer``).
    earlier_answer: dict[str, Any] | None = None
    earlier_answer_read: bool = False

    @property
    def at_rest(self) -> bool:
        """Whether the run needs nothing (finished, not being deleted, no retry asked)."""
        return at_rest(self.status, deleting=self.deleting, retry=jobparity.retry_of(self.raw_spec))


def verdict(i: Inputs) -> Decision:
    """Every decision of one reconcile (the module docstring's rules)."""
    d = _step(i)
    if d.at_rest:
        d.deferred = i.deferred
        return d
    _carry_answer(d, i)
    plan_write(d, i)
    return d


def _step(i: Inputs) -> Decision:
    """Rules 1 to 7: the run's next step."""
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


def _carry_answer(d: Decision, i: Inputs) -> None:
    """Rule 8: the attempt created resumes with its predecessor's answer if no checkpoint holds it yet."""
    if d.create_attempt is None or d.create_attempt < 2 or d.resume is not None:
        return
    if not i.earlier_answer_read:
        d.wants_earlier_answer = True
        return
    d.resume = answers.carried_answer(i.earlier_answer, i.progress)
    d.carried = d.resume is not None


def plan_write(d: Decision, i: Inputs) -> None:
    """Rule 9: ``d.write`` (now, or held back until ``d.deferred``) and the counters' growth once written.

    A patch of quiet fields alone waits (``conditions.deferrable``) unless the decision posts Events (they
    go out with the write); it is due ``QUIET_SECONDS`` after the checkpoint the status mirrors, so a run
    that goes quiet still gets it written. Nothing to write leaves an earlier held-back patch's time as is.
    """
    patch = status_patch(i.status, d.status, now=i.now, generation=i.generation, conditions=d.conditions)
    d.deferred = i.deferred
    if not patch:
        return
    if not d.events and deferrable(i.status, patch, now=i.now):
        if i.status.last_checkpoint_time is not None:
            d.deferred = i.status.last_checkpoint_time + timedelta(seconds=QUIET_SECONDS)
        return
    d.deferred = None
    d.write = patch
    if (calls := d.status.get("toolCalls")) is not None and not d.recorded_counts:
        d.tool_growth = tool_call_growth(dict(i.status.tool_calls or {}), dict(calls))
    if (usage := d.status.get("modelUsage")) is not None:  # the same baseline rule (decide.usage)
        d.model_growth = model_usage_growth(list(i.status.model_usage or []), list(usage))


@dataclass(frozen=True)
class Next:
    """What follows a reconcile: when to wake the run, whether it is live, whether it waits for a human.

    ``live``: its store stays open, its thread's progress wakes it and the resync applies; else it is at
    rest and only ``wake`` (its ttl) may wake it. ``waiting``: the slower resync (``wake.waits_for_a_human``).
    """

    wake: datetime | None
    live: bool
    waiting: bool


def at_rest_after(i: Inputs, d: Decision, status: AgentRunStatus) -> bool:
    """Whether the run needs nothing more after the verdict was applied (``status``: as the API left it)."""
    return d.at_rest or status.phase in TERMINAL or i.spec is None


def after_apply(i: Inputs, d: Decision, *, status: AgentRunStatus, pod: PodView | None) -> Next:
    """The verdict's second half, once io applied ``d``: ``status`` as the API left it, ``pod`` the attempt's.

    At rest: no wake but its ttl's (none while it is being deleted). Live: the earliest of the deadlines
    ``wake.next_wake`` finds, the retry the decision asked for (``retry_after``) and a held-back status
    patch's due time (``deferred``).
    """
    waiting = waits_for_a_human(status)
    if at_rest_after(i, d, status):
        ttl = jobparity.ttl_of(i.raw_spec)
        rest = (
            None if i.deleting else next_wake(spec=None, status=status, pod=None, limits=i.limits, now=i.now, ttl=ttl)
        )
        return Next(rest, live=False, waiting=waiting)
    due = [next_wake(spec=i.spec, status=status, pod=pod, limits=i.limits, now=i.now)]
    if d.retry_after is not None:
        due.append(i.now + timedelta(seconds=d.retry_after))
    if d.deferred is not None and d.deferred > i.now:
        due.append(d.deferred)
    found = [moment for moment in due if moment is not None]
    return Next(min(found) if found else None, live=True, waiting=waiting)
