"""Store outages (pure): a store that does not answer is a disruption of the run, not a fault of it.

Evidence comes from two places: the runner exits 8 (``ExitCode.STORE_UNAVAILABLE``) once the store
stayed down past its own bounded retries, and the operator's own read of the run's progress fails.
Either one:

- turns the ``StoreAvailable`` condition False with the cause (True again once the store answers
  the operator and no runner exit 8 is pending);
- starts the outage clock ``status.storeUnavailableSince`` (kept while the outage lasts; cleared once
  a pod runs and the store answers);
- holds back the next pod: the operator writes the attempt's inputs to the store before it creates
  the pod, and a pod that cannot reach its store would only exit 8 again.

A runner exit 8 is rescheduled with backoff (the base is ``restartPolicy.backoffSeconds``, the delay
grows with the outage's length up to the operator's maximum backoff) and counted as a disruption,
never against ``maxRestarts``. The run fails ``StoreUnavailable`` only once the outage has lasted
``restartPolicy.storeUnavailableTimeoutSeconds``.

HAZARD: the clock restarts when a later attempt runs while the operator reads the store fine; a
store that only the runner cannot reach (its network path, not the operator's) is bounded by the
disruption limit instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .decision import Decision
from .reasons import TERMINAL, Phase, Reason
from .status import AgentRunStatus, StatusPatch, iso

CONDITION = "StoreAvailable"
UP_REASON = "StoreAnswered"  # the condition's reason when True
DOWN_REASON = "StoreUnavailable"


@dataclass(frozen=True)
class Outage:
    """A store outage as the run's status records it: since when, now, and how long it may last."""

    since: datetime
    now: datetime
    timeout: float

    @classmethod
    def of(cls, status: AgentRunStatus, *, now: datetime, timeout: float) -> Outage:
        """The run's outage (starting ``now`` if the status records none yet)."""
        return cls(since=status.store_unavailable_since or now, now=now, timeout=timeout)

    @property
    def elapsed(self) -> float:
        """Seconds the store has been unavailable."""
        return max(0.0, (self.now - self.since).total_seconds())

    @property
    def expired(self) -> bool:
        """Whether the outage lasted past ``storeUnavailableTimeoutSeconds``."""
        return self.elapsed >= self.timeout

    def retry_delay(self, *, base: float, cap: float) -> float:
        """Grows with the outage (about doubling per retry), within [base, cap], never past the deadline."""
        delay = min(cap, max(base, self.elapsed))
        return max(0.0, min(delay, self.timeout - self.elapsed))

    def gave_up(self, cause: str) -> str:
        """The message of a run failed by the outage: how long, the bound, the last cause."""
        return (
            f"the store has been unavailable for {self.elapsed:.0f}s "
            f"(spec.restartPolicy.storeUnavailableTimeoutSeconds is {self.timeout:g}); last: {cause}"
        )


def condition_status(status: AgentRunStatus) -> str | None:
    """The ``StoreAvailable`` condition's status (``"True"``/``"False"``), or ``None`` if the run has none."""
    for condition in status.conditions:
        if condition.get("type") == CONDITION:
            return condition.get("status")
    return None


def mark_down(d: Decision, outage: Outage, cause: str) -> None:
    """Record the outage in the decision: the condition false with ``cause``, and since when."""
    d.condition(CONDITION, False, DOWN_REASON, cause)
    d.status["storeUnavailableSince"] = iso(outage.since)


def mark_up(d: Decision, status: AgentRunStatus, *, pod_running: bool) -> None:
    """The store answered the operator: the condition turns True again; a running pod ends the outage clock."""
    if condition_status(status) == "False":
        d.condition(CONDITION, True, UP_REASON, "the store answers")
    if pod_running and status.store_unavailable_since is not None:
        d.status["storeUnavailableSince"] = None


def guard(
    d: Decision,
    *,
    status: AgentRunStatus,
    timeout: float,
    store_down: str | None,
    pod_running: bool,
    now: datetime,
) -> Decision:
    """``d`` adjusted for the operator's own view of the store (``store_down``: why its read failed).

    The store answered: ``StoreAvailable`` turns True again. It did not: the condition turns False and
    a pod about to be created is held back (the operator cannot write the attempt's inputs, and the
    pod would only exit 8); past the outage timeout the run fails ``StoreUnavailable`` instead.
    """
    if status.phase in TERMINAL:
        return d
    if store_down is None:  # also when this decision ends the run: its last status says the store is back
        if CONDITION not in d.conditions:
            mark_up(d, status, pod_running=pod_running)
        return d
    if d.status.get("phase") in TERMINAL:
        return d
    down = Outage.of(status, now=now, timeout=timeout)
    if d.create_attempt is None:
        if CONDITION not in d.conditions:
            mark_down(d, down, store_down)
        return d
    # Nothing of ``d`` happens (no pod, no counter moves, no Event): the next reconcile decides again.
    held = Decision(status=StatusPatch())
    mark_down(held, down, store_down)
    if down.expired:
        held.status["completionTime"] = iso(now)
        held.status["nextAttemptTime"] = None
        return held.phase(Phase.FAILED, Reason.STORE_UNAVAILABLE, down.gave_up(store_down), warning=True)
    waiting = f"waiting for the store before attempt {d.create_attempt}: {store_down}"
    if not status.phase:
        return held.phase(Phase.PENDING, Reason.STORE_UNAVAILABLE, waiting)
    held.status["message"] = waiting
    return held
