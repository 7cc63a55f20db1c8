"""The typed output of a decision: what to write to status, what to do, which Events to post."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

from .growth import ModelGrowth
from .reasons import DisruptionReason, Phase, Reason
from .status import StatusPatch

EventType = Literal["Normal", "Warning"]


class Event(NamedTuple):
    """A Kubernetes Event to post about the run: type, reason (a ``Reason``, or the cluster's own), message."""

    type: EventType
    reason: Reason | DisruptionReason | str  # str: the cluster's own disruption reason, passed through
    message: str


@dataclass(frozen=True)
class Limits:
    """The operator's bounds a decision applies: the stop grace, the lost-node timeout, disruptions, backoff."""

    stop_grace: float = 30.0
    lost_node_timeout: float = 60.0
    max_disruptions: int = 50
    max_backoff: float = 300.0


@dataclass(frozen=True)
class StoreProblem:
    """The run's store cannot be opened (its Secret is missing or unusable)."""

    reason: Reason
    message: str


@dataclass
class Decision:
    """One reconcile's verdict. ``status`` is the desired status (a merge patch: ``None`` removes a field)."""

    status: StatusPatch = field(default_factory=lambda: StatusPatch())
    create_attempt: int | None = None
    resume: dict[str, Any] | None = None  # the runner's AGENTRUN_RESUME for the attempt created
    # The deleted AgentRun whose unfinished turn the attempt created closes first (``thread.orphaned_turn``).
    take_over_from: str | None = None
    # Pods of a deleted AgentRun this run waits for (the reconcile is woken when each is deleted).
    waits_for_pods: tuple[str, ...] = ()
    # Nothing to decide: the run ended (or is being deleted); only its ttl may wake it.
    at_rest: bool = False
    # Delete the AgentRun: it finished longer than spec.ttlSecondsAfterFinished ago (Job parity).
    expire: bool = False
    # Reconcile again within this many seconds (something could not be done yet), whatever else is due.
    retry_after: float | None = None
    delete_pod: str | None = None
    delete_grace: int | None = None
    request_stop: bool = False
    clear_stop: bool = False  # withdraw this run's unacknowledged stop request from the store
    events: list[Event] = field(default_factory=list)
    # Why ``create_attempt`` follows an earlier attempt (a metric label): a Reason or a disruption's reason.
    reschedule_reason: str | None = None
    # Conditions besides the phase's own (``StoreAvailable``, ...): type -> (status, reason, message).
    conditions: dict[str, tuple[bool, str, str]] = field(default_factory=dict)
    # Failed tool calls newly seen this reconcile, by tool (the metric's input; see ``toolerrors``).
    tool_failures: dict[str, int] = field(default_factory=dict)
    # ``status.toolCalls`` copies a turn another run recorded (``AlreadyCompleted``): that run's operator
    # counted its calls, so the metrics must not count them again for this run.
    recorded_counts: bool = False
    # ``resume`` is the previous attempt's answer, carried on (``answers.carried_answer``): logged as such.
    carried: bool = False
    # The attempt created needs the answer its predecessor started with (``Inputs.earlier_answer``), not read
    # yet: io reads it and asks again (the verdict is pure: the same inputs give the same decision).
    wants_earlier_answer: bool = False
    # What io writes and counts (``verdict.plan_write``): the status patch to write now (empty: nothing, or
    # held back), when a held-back quiet patch is due (io keeps it for the next verdict), and the counters'
    # growth once it is written (``growth``; None: the status carries no model usage).
    write: StatusPatch = field(default_factory=lambda: StatusPatch())
    deferred: datetime | None = None
    tool_growth: dict[str, int] = field(default_factory=dict)
    model_growth: list[ModelGrowth] | None = None

    def phase(self, phase: Phase, reason: Reason, message: str, *, warning: bool = False) -> Decision:
        """Set the phase with its reason and message, and the Event that announces it."""
        self.status["phase"] = phase
        self.status["reason"] = reason
        self.status["message"] = message
        self.events.append(Event("Warning" if warning else "Normal", reason, message))
        return self

    def condition(self, kind: str, status: bool, reason: str, message: str) -> None:
        """Set condition ``kind`` (not a phase condition); ``lastTransitionTime`` moves only when it flips."""
        self.conditions[kind] = (status, reason, message)

    def event(self, reason: Reason | DisruptionReason | str, message: str, *, warning: bool = True) -> None:
        """Post an Event about the run (a Warning unless ``warning`` is false)."""
        self.events.append(Event("Warning" if warning else "Normal", reason, message))
