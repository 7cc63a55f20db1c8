"""Pure decisions: an AgentRun's status, its current pod, the store's progress and its thread in; actions out.

Nothing here does I/O or reads a clock; ``io.reconcile`` gathers the inputs
and applies the ``Decision``. The rules (DESIGN.md sections 3 and 4):

- exit 0/3/4/5 -> Succeeded / Interrupted / Stopped / Failed, exit 0 only with the turn completed in
  the store (else it is a crash: "exited 0 before the run completed"); exit 7 of the
  current pod -> Failed ``Superseded`` (another AgentRun claimed the thread);
- a disruption (eviction or the ``DisruptionTarget`` condition, exit 6, the
  pod deleted by someone else, a node lost past a timeout) reschedules at
  once and counts in ``disruptions`` (capped, so nothing loops forever);
- any other ending (exit 1, 137, OOMKilled) is a crash: rescheduled with
  exponential backoff until ``restartPolicy.maxRestarts``, then Failed with
  ``BackoffLimitExceeded``;
- ``spec.stop`` asks the runner through the store (phase Stopping); a runner
  that has not exited after the stop grace has its pod deleted (``ForcedStop``);
  a pod still waiting for a node or its image has no runner to ask: it is
  deleted and the run is Stopped at once (``StoppedBeforeStart``);
- ``spec.resume`` answers an interrupt by starting the next attempt once per
  distinct answer;
- a run whose store Secret is unusable ends Failed at once, unless it is
  being stopped (a stop needs no store to end the run);
- a run that has not started waits while another live AgentRun holds its
  thread (``thread.blocker``: the newer waits, reason ``ThreadBusy``), and while
  the pods of a deleted AgentRun whose turn it will close are alive
  (``thread.orphaned_turn``);
- before its first pod, a run whose request already has an outcome in the
  store takes that outcome and gets no pod (``identity``: ``AlreadyCompleted``);
- ``spec.retry`` re-opens a Failed run, ``spec.activeDeadlineSeconds`` ends
  a run that outlived it (``jobparity``); tool failures become counters, a
  condition and an Event (``toolerrors``).

A rescheduled attempt never overlaps its predecessor by design (it starts
only once the old pod ended or is gone), and the store fences off an older
attempt's writes anyway, so a zombie pod on a lost node cannot corrupt the run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from agentrun.checkpoint.base import Progress
from agentrun.errors import StoreUnavailableError

from . import attempts, identity, jobparity, outage
from .answers import waiting_words
from .classify import LIVE, Outcome, PodView, classify
from .decision import Decision, Limits, StoreProblem
from .identity import RecordedTurn
from .messages import human, reason_for
from .podstart import IMAGE_PULL, image_pull_timed_out, start_error
from .reasons import CONFIG_ERRORS, TERMINAL, DisruptionReason, Phase, Reason, RescheduleReason
from .spec import AgentRunSpec, InvalidSpec
from .status import AgentRunStatus, InterruptInfo, StatusPatch, iso, parse_time
from .thread import OrphanedTurn, ThreadPeer, blocker

PAYLOAD_LIMIT = 1024
# A pod's waiting reasons that say nothing worth a status write (and a row of kubectl get ar -w).
ROUTINE_WAITS = frozenset({"ContainerCreating", "PodInitializing"})


def _cannot_start(pod: PodView) -> str | None:
    """What a pending pod waits for that keeps its runner from starting (a node, its image), or None."""
    if pod.unschedulable:
        return "a node (Unschedulable)"
    if pod.waiting_reason in IMAGE_PULL:
        return f"its image ({pod.waiting_reason})"
    return None


def backoff(restarts: int, base: float, cap: float) -> float:
    """Exponential: base, 2*base, 4*base, ... capped; ``restarts`` counts from 1."""
    return float(min(cap, base * (2 ** max(0, restarts - 1))))


def truncate_payload(payload: Any) -> Any:
    """``payload`` as it is, or its JSON cut at ``PAYLOAD_LIMIT`` characters (the status must stay small)."""
    text = json.dumps(payload, default=str)
    if len(text) <= PAYLOAD_LIMIT:
        return payload
    return text[:PAYLOAD_LIMIT] + "…(truncated)"


def mirror(progress: Progress | None) -> StatusPatch:
    """Where the thread is, copied from the store (its turn's counters: ``identity.mirror_turn``)."""
    if progress is None:
        return StatusPatch()
    return StatusPatch(
        stateVersion=progress.version,
        currentNode=progress.current_node,
        step=progress.step,
        lastCheckpointTime=iso(datetime.fromtimestamp(progress.updated_at, UTC)),
    )


def _interrupt_status(progress: Progress | None) -> InterruptInfo | None:
    if progress is None or not progress.interrupts:
        return None
    first = progress.interrupts[0]
    # Truncated like the payload: the message is the graph's text, as large as it likes, and it also
    # becomes status.message and the conditions' messages; an object over the API server's request
    # limit could never be patched again (413), leaving the run Running for good.
    message = str(first.get("message") or "")
    return {
        "id": first.get("id"),
        "message": message if len(message) <= PAYLOAD_LIMIT else message[:PAYLOAD_LIMIT] + "…(truncated)",
        "payload": truncate_payload(first.get("payload")),
        "ids": [i.get("id") for i in progress.interrupts],
    }


def turn_completed(progress: Progress | None, request_key: str) -> bool:
    """The store says this run's turn completed: an exit 0 alone is not trusted (DESIGN.md section 3)."""
    if progress is None or progress.status != "completed":
        return False
    return not (progress.request_key and request_key and progress.request_key != request_key)


def exited_early(progress: Progress | None) -> str:
    """Why an exit 0 without a completed turn is a crash, with what the store holds instead."""
    if progress is None:
        seen = "no progress at all"
    elif progress.status == "completed":
        seen = "another request's turn as the thread's latest"
    else:
        seen = f"status {progress.status}" + (f" at node {progress.current_node}" if progress.current_node else "")
    return f"exited 0 before the run completed; the store has {seen}"


def at_rest(status: AgentRunStatus, *, deleting: bool, retry: int = 0) -> bool:
    """Nothing left to decide: the run ended (and ``spec.retry`` does not re-open it), or it is being deleted."""
    return deleting or (status.phase in TERMINAL and not jobparity.retry_requested(retry, status))


def rejected(error: InvalidSpec) -> Decision:
    """A spec the operator refuses ends the run Failed ``InvalidSpec`` (no pod, no retry)."""
    return Decision().phase(Phase.FAILED, Reason.INVALID_SPEC, str(error), warning=True)


def decide(
    *,
    spec: AgentRunSpec,
    status: AgentRunStatus,
    pod: PodView | None,
    progress: Progress | None,
    now: datetime,
    limits: Limits,
    store_problem: StoreProblem | None = None,
    run: ThreadPeer | None = None,
    peers: Sequence[ThreadPeer] = (),
    request_key: str = "",
    turn: RecordedTurn | None = None,
    store_down: bool = False,
    orphan: OrphanedTurn | None = None,
) -> Decision:
    """The next step for one AgentRun.

    ``status`` is its current ``.status`` (possibly empty); ``pod`` the current attempt's pod (None when
    there is none); ``store_problem`` set when its store cannot be opened; ``run`` this run on its thread
    and ``peers`` the other AgentRuns on the same thread (``run`` None: the thread rule is not applied);
    ``request_key`` this run's request key and ``turn`` its turn in the store, read before the first pod
    (``identity``: a request already answered is not run again); ``store_down``: the operator's read of the
    progress failed (``progress`` is then None without meaning "no progress"); ``orphan``: the thread's latest
    turn is a deleted AgentRun's, unfinished (``thread.orphaned_turn``). The decision also carries the attempt
    history (``attempts.track``).
    """
    outcome = classify(pod) if status.attempt else Outcome.GONE
    early_exit = None
    if outcome is Outcome.COMPLETED and not store_down and not turn_completed(progress, request_key):
        # Exit 0 without the store's completed turn is a crash, and it must be one in EVERY rule that
        # reads the outcome: the backoff wait (else each wake-up counted the same crash again and the
        # next pod never came), the deadline, and the attempt history (outcome Crashed, not Completed).
        outcome, early_exit = Outcome.CRASHED, exited_early(progress)
    ctx = _Run(
        spec=spec,
        status=status,
        pod=pod,
        outcome=outcome,
        early_exit=early_exit,
        progress=progress,
        now=now,
        limits=limits,
        store_problem=store_problem,
        on_thread=run,
        peers=peers,
        request_key=request_key,
        turn=turn,
        store_down=store_down,
        orphan=orphan,
    )
    d = _decide(ctx)
    if status.phase not in TERMINAL or d.status or d.create_attempt is not None:  # an ended run stays as it is
        attempts.track(
            d,
            status=status,
            pod=pod,
            outcome=ctx.outcome,
            now=now,
            run_name=run.name if run is not None else None,
            crash_message=early_exit,
        )
    return d


def _decide(ctx: _Run) -> Decision:
    """The rules, each ending in an early return; ``decide`` adds the attempt history to whichever returned."""
    spec, status, progress, now, run = ctx.spec, ctx.status, ctx.progress, ctx.now, ctx.on_thread
    retrying = jobparity.retry_requested(spec.retry, status) and not spec.stop
    if status.phase in TERMINAL and not retrying:
        return Decision()
    if ctx.store_problem is not None and not spec.stop:
        return Decision().phase(Phase.FAILED, ctx.store_problem.reason, ctx.store_problem.message, warning=True)
    d = Decision(status=mirror(progress))
    identity.mirror_turn(d, status=status, progress=progress, request_key=ctx.request_key)

    if retrying:
        ctx.reopen(d)
        if status.started:
            return ctx.start(d, status.attempt + 1, retry=True)

    if spec.stop:
        return ctx.stop(d)

    if late := jobparity.deadline_exceeded(spec, status, ctx.outcome, now=now):
        return ctx.deadline_exceeded(d, late)

    if not status.phase or not status.started:
        answered = identity.recorded_outcome(
            ctx.turn, run_uid=run.uid if run is not None else "", retried=spec.retry > 0, now=now
        )
        if answered is not None:
            # The thread's position only: the recorded turn's counters and result come with ``answered``,
            # and the latest turn's usage and failures (maybe that same turn's) are the earlier run's.
            answered.status = cast(StatusPatch, {**mirror(progress), **answered.status})
            return answered
        waits_for = blocker(run, ctx.peers) if run is not None else None
        if waits_for is not None:
            return d.phase(
                Phase.PENDING,
                Reason.THREAD_BUSY,
                f"waiting for AgentRun {waits_for.name}, which holds thread {spec.threadId}; "
                "this run starts when that one ends",
            )
        if ctx.orphan is not None and ctx.orphan.pods:
            d.waits_for_pods = ctx.orphan.pods
            return d.phase(
                Phase.PENDING,
                Reason.THREAD_BUSY,
                f"waiting for pod {', '.join(ctx.orphan.pods)} of a deleted AgentRun (uid {ctx.orphan.run_uid}) "
                f"to end; this run then closes that run's unfinished turn on thread {spec.threadId} and starts",
            )
        return ctx.start(d, 1, first=True)

    if status.phase == Phase.INTERRUPTED:
        return ctx.resume(d)

    if status.next_attempt_time is not None and ctx.outcome in (
        Outcome.GONE,
        Outcome.CRASHED,
        Outcome.STORE_UNAVAILABLE,
    ):
        if now >= status.next_attempt_time:
            d.status["nextAttemptTime"] = None
            d.reschedule_reason = Reason.BACK_OFF
            return ctx.start(d, status.attempt + 1)
        return d

    return ctx.pod_outcome(d)


@dataclass(frozen=True)
class _Run:
    """The inputs of one ``decide`` call, so each rule reads them by name (``on_thread``: its ``run``)."""

    spec: AgentRunSpec
    status: AgentRunStatus
    pod: PodView | None
    outcome: Outcome
    early_exit: str | None  # why an exit 0 is a crash (``exited_early``); None for any other outcome
    progress: Progress | None
    now: datetime
    limits: Limits
    store_problem: StoreProblem | None
    on_thread: ThreadPeer | None
    peers: Sequence[ThreadPeer]
    request_key: str
    turn: RecordedTurn | None
    store_down: bool
    orphan: OrphanedTurn | None

    @property
    def attempt(self) -> int:
        return self.status.attempt

    def start(
        self,
        d: Decision,
        attempt: int,
        *,
        first: bool = False,
        resume: dict[str, Any] | None = None,
        retry: bool = False,
    ) -> Decision:
        d.create_attempt = attempt
        d.resume = resume
        if self.orphan is not None and not self.orphan.pods:
            d.take_over_from = self.orphan.run_uid
        d.status["attempt"] = attempt
        d.status["lostSince"] = None
        if first:
            d.status["startTime"] = iso(self.now)
            d.status["restarts"] = 0
            d.status["disruptions"] = 0
        if retry:
            d.reschedule_reason = RescheduleReason.RETRY
            message = f"spec.retry {self.spec.retry}: attempt {attempt} resumes the failed turn; runner pod created"
            return d.phase(Phase.PENDING, Reason.POD_CREATED, message)
        return d.phase(Phase.PENDING, Reason.POD_CREATED, f"attempt {attempt}: runner pod created")

    def reopen(self, d: Decision) -> None:
        """``spec.retry`` re-opens a Failed run (``jobparity``): restarts and the deadline's clock start over."""
        d.status["observedRetry"] = self.spec.retry
        d.status["restarts"] = 0
        if self.status.started:
            d.status["startTime"] = iso(self.now)
        cleared = ("completionTime", "nextAttemptTime", "lostSince", "storeUnavailableSince", "result")
        d.status.update(cast(StatusPatch, dict.fromkeys(cleared)))

    def deadline_exceeded(self, d: Decision, message: str) -> Decision:
        if self.pod is not None and self.outcome in LIVE:
            d.delete_pod = self.pod.name  # gracefully: the runner checkpoints on SIGTERM
        return self.finish(d, Phase.FAILED, Reason.DEADLINE_EXCEEDED, message, warning=True)

    def finish(self, d: Decision, phase: Phase, reason: Reason, message: str, *, warning: bool = False) -> Decision:
        d.status["completionTime"] = iso(self.now)
        d.status["nextAttemptTime"] = None
        d.status["lostSince"] = None
        d.status["waitingFor"] = None  # a run that ended (stopped or failed while it waited) waits for nothing
        # A stop this run asked for and its runner never acknowledged (it completed first, failed, or was
        # force-stopped) would otherwise stay in the store and end the thread's NEXT turn at once.
        d.clear_stop = self.status.stop_requested_time is not None
        return d.phase(phase, reason, message, warning=warning)

    def resume(self, d: Decision) -> Decision:
        interrupt = self.status.interrupt
        if not interrupt and (interrupt := _interrupt_status(self.progress)):
            # The store could not be read when the pod exited 3: fill the interrupt in now, or it would
            # stay missing from status for good and a resume by interrupt id could never match.
            d.status["interrupt"] = interrupt
        if interrupt and self.status.waiting_for is None:  # also a run that waited before the field existed
            d.status["waitingFor"] = waiting_words(interrupt)
        answer_spec = self.spec.resume
        if answer_spec is None or answer_spec.digest() == self.status.resume_digest:
            return d
        pending = [i for i in (interrupt or {}).get("ids") or [] if i is not None]
        if answer_spec.values is not None:
            unknown = sorted(set(answer_spec.values) - set(pending))
            if unknown:
                d.status["message"] = f"spec.resume.values names unknown interrupt ids {unknown}; pending: {pending}"
                return d
            answer: dict[str, Any] = {"values": answer_spec.values}
        else:
            if len(pending) > 1:
                d.status["message"] = (
                    f"{len(pending)} interrupts are pending ({', '.join(pending)}): answer each in spec.resume.values"
                )
                return d
            answer = {"values": {pending[0]: answer_spec.value}} if pending else {"value": answer_spec.value}
        d.status["resumeDigest"] = answer_spec.digest()
        d.status["interrupt"] = None
        d.status["waitingFor"] = None
        d.reschedule_reason = RescheduleReason.RESUME
        return self.start(d, self.attempt + 1, resume=answer)

    def stop(self, d: Decision) -> Decision:
        if self.outcome is Outcome.COMPLETED and self.store_down:
            return d  # exit 0 needs the store's word: the next reconcile decides
        if self.outcome not in LIVE:
            if self.outcome is Outcome.COMPLETED:  # with the store's completed turn (else it is CRASHED)
                return self.finish(
                    d, Phase.SUCCEEDED, Reason.COMPLETED, "the run completed before it saw the stop request"
                )
            if self.outcome is Outcome.FAILED:
                return self.failed(d)
            if self.outcome is Outcome.SUPERSEDED:
                return self.superseded(d)
            started = self.status.phase and self.status.started
            reason = Reason.STOPPED if started else Reason.STOPPED_BEFORE_START
            return self.finish(d, Phase.STOPPED, reason, "stopped by spec.stop")
        pod = self.pod
        if self.outcome is Outcome.PENDING and pod is not None and (waited := _cannot_start(pod)):
            # No runner to ask: it cannot start before it has a node and its image, and waiting out the
            # stop grace would end in a ForcedStop that blames a runner which never ran. A graceful
            # delete, in case it starts meanwhile (the runner then drains on SIGTERM).
            d.delete_pod = pod.name
            return self.finish(
                d,
                Phase.STOPPED,
                Reason.STOPPED_BEFORE_START,
                f"stopped by spec.stop while pod {pod.name} waited for {waited}; the pod was deleted",
            )
        requested = self.status.stop_requested_time
        if requested is None:
            d.request_stop = True
            d.status["stopRequestedTime"] = iso(self.now)
            return d.phase(Phase.STOPPING, Reason.STOP_REQUESTED, "spec.stop is true; asked the runner to stop")
        if (self.now - requested).total_seconds() >= self.limits.stop_grace:
            assert self.pod is not None
            d.delete_pod, d.delete_grace = self.pod.name, 0
            return self.finish(
                d,
                Phase.STOPPED,
                Reason.FORCED_STOP,
                f"the runner did not stop within {self.limits.stop_grace:g}s; its pod was deleted",
                warning=True,
            )
        return d

    def pod_outcome(self, d: Decision) -> Decision:  # noqa: C901 -- one branch per pod outcome, each a row of the table test
        pod, outcome, attempt, limits = self.pod, self.outcome, self.attempt, self.limits
        if outcome is Outcome.PENDING:
            assert pod is not None
            timeout = self.spec.restartPolicy.imagePullTimeoutSeconds
            if pulled := image_pull_timed_out(pod, now=self.now, timeout=timeout):
                d.delete_pod = pod.name
                return self.finish(d, Phase.FAILED, *pulled, warning=True)
            if self.runner_reported():
                return self.running(d)
            if pod.waiting_reason and pod.waiting_reason not in ROUTINE_WAITS:
                d.status["message"] = f"{pod.waiting_reason}: {pod.waiting_message or ''}".strip()
            return d
        if outcome is Outcome.RUNNING:
            return self.running(d)
        if outcome is Outcome.TERMINATING:
            # Wait until the old pod is gone before the next attempt starts, but not forever: a pod whose
            # node died keeps "terminating" with no kubelet to confirm it (real clusters leave it phase
            # Running); past its deadline plus the lost-node timeout it is force-deleted and replaced.
            assert pod is not None
            deadline = pod.deletion_deadline
            if deadline is None or (self.now - deadline).total_seconds() < limits.lost_node_timeout:
                return d
            d.delete_pod, d.delete_grace = pod.name, 0
            return self.disrupted(
                d,
                DisruptionReason.NODE_LOST,
                f"pod {pod.name} did not finish terminating {limits.lost_node_timeout:g}s after its grace period",
            )
        if outcome is Outcome.COMPLETED:
            if self.store_down:
                return d  # exit 0 needs the store's word: the next reconcile decides (outage.guard marks it)
            # The store's completed turn is checked in ``decide``: without it, this exit 0 is CRASHED.
            return self.finish(d, Phase.SUCCEEDED, Reason.COMPLETED, "the run completed")
        if outcome is Outcome.INTERRUPTED:
            interrupt = _interrupt_status(self.progress)
            d.status["interrupt"] = interrupt
            d.status["waitingFor"] = waiting_words(interrupt)
            message = (interrupt or {}).get("message") or "waiting for spec.resume"
            return d.phase(Phase.INTERRUPTED, Reason.INTERRUPTED, message)
        if outcome is Outcome.STOPPED:
            return self.finish(d, Phase.STOPPED, Reason.STOPPED, "the runner stopped on a stop request")
        if outcome is Outcome.FAILED:
            return self.failed(d)
        if outcome is Outcome.SUPERSEDED:
            return self.superseded(d)
        if outcome is Outcome.CONFIG_ERROR:
            assert pod is not None
            d.delete_pod = pod.name
            reason = Reason(pod.waiting_reason) if pod.waiting_reason in CONFIG_ERRORS else None
            reason = reason or Reason.CREATE_CONTAINER_CONFIG_ERROR
            message = f"{reason}: {pod.waiting_message or 'the runner container could not be created'}"
            return self.finish(d, Phase.FAILED, reason, " ".join(message.split()), warning=True)
        if outcome is Outcome.START_ERROR:
            assert pod is not None
            reason, message = start_error(pod) or (Reason.START_ERROR, "StartError")
            return self.finish(d, Phase.FAILED, reason, message, warning=True)
        if outcome is Outcome.STORE_UNAVAILABLE:
            return self.store_unavailable(d)
        if outcome is Outcome.LOST:
            lost = self.status.lost_since
            if lost is None:
                d.status["lostSince"] = iso(self.now)
                return d
            if (self.now - lost).total_seconds() < limits.lost_node_timeout:
                return d
            assert pod is not None
            d.delete_pod, d.delete_grace = pod.name, 0
            return self.disrupted(
                d, DisruptionReason.NODE_LOST, f"pod {pod.name} was unreachable for {limits.lost_node_timeout:g}s"
            )
        if outcome is Outcome.DISRUPTED:
            assert pod is not None
            why = pod.disruption or DisruptionReason.PREEMPTED
            return self.disrupted(d, why, f"pod {pod.name} was disrupted ({why})")
        if outcome is Outcome.GONE:
            return self.disrupted(d, DisruptionReason.POD_DELETED, f"pod of attempt {attempt} was deleted")
        return self.crashed(d, why=self.early_exit)

    def running(self, d: Decision) -> Decision:
        d.status["lostSince"] = None
        if self.status.phase != Phase.RUNNING:
            d.phase(Phase.RUNNING, Reason.RUNNING, f"attempt {self.attempt} is running")
        return d

    def runner_reported(self) -> bool:
        """This attempt's runner has written to the store, though its pod is not seen running yet.

        The pod's own status may lag behind (the kubelet's report, the operator's watch): ``kubectl get ar``
        must not show a run Pending at node ``tools``. The store names the attempt that owns the thread
        where it tracks owners; otherwise a checkpoint written after the attempt's pod was created is its.
        """
        progress = self.progress
        if progress is None or progress.status != "running":
            return False
        if progress.attempt is not None:
            return progress.attempt == self.attempt
        started = next((e.get("startTime") for e in self.status.attempts if e.get("attempt") == self.attempt), None)
        since = parse_time(started) or (self.pod.created if self.pod is not None else None)
        return since is not None and progress.updated_at >= since.timestamp()

    def crashed(self, d: Decision, *, why: str | None = None) -> Decision:
        pod, attempt, policy = self.pod, self.attempt, self.spec.restartPolicy
        assert pod is not None
        restarts = self.status.restarts + 1
        if why is None:
            why = f"exit {pod.exit_code}" + (f" ({pod.terminated_reason})" if pod.terminated_reason else "")
        if restarts > policy.maxRestarts:
            return self.finish(
                d,
                Phase.FAILED,
                Reason.BACKOFF_LIMIT_EXCEEDED,
                f"attempt {attempt} crashed ({why}); {policy.maxRestarts} restarts allowed",
                warning=True,
            )
        d.status["restarts"] = restarts  # counts restarts made, so it never exceeds maxRestarts
        delay = backoff(restarts, policy.backoffSeconds, self.limits.max_backoff)
        if delay <= 0:
            d.event(Reason.BACK_OFF, f"attempt {attempt} crashed ({why}); restarting now")
            d.reschedule_reason = Reason.BACK_OFF
            return self.start(d, attempt + 1)
        d.status["nextAttemptTime"] = iso(self.now + timedelta(seconds=delay))
        return d.phase(
            Phase.PENDING,
            Reason.BACK_OFF,
            f"attempt {attempt} crashed ({why}); restarting in {delay:g}s",
            warning=True,
        )

    def disrupted(self, d: Decision, why: str, message: str) -> Decision:
        disruptions = self.status.disruptions + 1
        d.status["disruptions"] = disruptions
        if disruptions > self.limits.max_disruptions:
            return self.finish(
                d,
                Phase.FAILED,
                Reason.DISRUPTION_LIMIT_EXCEEDED,
                f"{message}; {self.limits.max_disruptions} disruptions allowed",
                warning=True,
            )
        d.event(why, f"{message}; rescheduling as attempt {self.attempt + 1}")
        d.reschedule_reason = why
        return self.start(d, self.attempt + 1)

    def store_unavailable(self, d: Decision) -> Decision:
        """Exit 8: rescheduled with backoff as a disruption; Failed only past the outage timeout."""
        policy = self.spec.restartPolicy
        cause = (human(self.pod.termination_message) if self.pod is not None else "") or (
            f"{StoreUnavailableError.code}: the runner could not reach the store"
        )
        down = outage.Outage.of(self.status, now=self.now, timeout=policy.storeUnavailableTimeoutSeconds)
        outage.mark_down(d, down, cause)
        if down.expired:
            return self.finish(d, Phase.FAILED, Reason.STORE_UNAVAILABLE, down.gave_up(cause), warning=True)
        disruptions = self.status.disruptions + 1
        d.status["disruptions"] = disruptions
        if disruptions > self.limits.max_disruptions:
            return self.finish(
                d,
                Phase.FAILED,
                Reason.DISRUPTION_LIMIT_EXCEEDED,
                f"attempt {self.attempt}: {cause}; {self.limits.max_disruptions} disruptions allowed",
                warning=True,
            )
        delay = down.retry_delay(base=policy.backoffSeconds, cap=self.limits.max_backoff)
        d.status["nextAttemptTime"] = iso(self.now + timedelta(seconds=delay))
        return d.phase(
            Phase.PENDING,
            Reason.STORE_UNAVAILABLE,
            f"attempt {self.attempt}: {cause}; retrying in {delay:g}s "
            f"(unavailable for {down.elapsed:.0f}s of {policy.storeUnavailableTimeoutSeconds:g}s allowed)",
            warning=True,
        )

    def failed(self, d: Decision) -> Decision:
        message = human(self.pod.termination_message) if self.pod is not None else ""
        error = self.progress.error if self.progress is not None else None
        if not message and error:
            message = human(f"{error.get('code')}: {error.get('message')}")
        return self.finish(
            d,
            Phase.FAILED,
            reason_for(message),
            message or "the runner failed permanently (exit 5)",
            warning=True,
        )

    def superseded(self, d: Decision) -> Decision:
        # The current attempt is this run's newest, so a fence means another AgentRun registered on the
        # thread after this one: retrying would be fenced again. The runner's line names the other run.
        message = (human(self.pod.termination_message) if self.pod is not None else "") or (
            "another AgentRun owns this run's thread"
        )
        return self.finish(d, Phase.FAILED, Reason.SUPERSEDED, message, warning=True)
