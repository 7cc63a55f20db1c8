"""The AgentRun status as types: ``AgentRunStatus`` in, ``StatusPatch`` out.

``AgentRunStatus`` is what the operator reads (snake_case attributes, the
CRD's camelCase names as aliases); it is lenient on purpose: a field it
cannot read is absent, never an exception, because a status that does not
parse must not wedge the run. ``StatusPatch`` is what a decision writes: a
JSON merge patch of ``.status`` keyed by the CRD's names, where ``None``
removes a field. Both list the same fields (a unit test keeps them equal).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, NotRequired

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from typing_extensions import TypedDict

from .reasons import Phase, Reason
from .usage import ModelUsage


def iso(moment: datetime) -> str:
    """``moment`` as a Kubernetes timestamp (UTC, seconds, ``Z``)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """Kubernetes timestamps (``2026-12-02T15:04:05Z``, with or without fractional seconds); None if unset."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _lenient_phase(value: Any) -> Phase | None:
    try:
        return Phase(value) if value else None
    except ValueError:
        return None


Time = Annotated[datetime | None, BeforeValidator(parse_time)]


class ToolCalls(TypedDict):
    """``status.toolCalls``: the run's tool calls by outcome."""

    executed: int
    replayed: int
    failed: NotRequired[int]  # written only when non-zero, like a Job's counters
    inDoubt: NotRequired[int]
    unrecorded: NotRequired[int]  # completed but not recorded in the ledger (a replay would run them again)


class ResultInfo(TypedDict, total=False):
    """``status.result`` of a Succeeded run (``agentrun.result``): the final assistant message, or the final
    state's values as JSON for a graph without one (``kind``), cut to 1024 characters, and a digest of all of it."""

    message: str
    digest: str
    truncated: bool
    kind: str  # "message" or "state"


class AttemptRecord(TypedDict, total=False):
    """One entry of ``status.attempts`` (``decide.attempts``): an attempt's pod and how it ended."""

    attempt: int
    podName: str
    startTime: str
    endTime: str
    outcome: str  # Pending, Running, ... while open; Completed, Crashed, Disrupted, ... once it ended
    exitCode: int
    reason: str  # what happened (WaitingForResume, Crashed, ...: attempts.REASON_WORDS) or a more specific word
    message: str  # the runner's termination line, on one line, truncated


class InterruptInfo(TypedDict, total=False):
    """``status.interrupt``: what the run waits on a human for (id, message, payload)."""

    id: str | None
    message: str
    payload: Any
    ids: list[str | None]


class Condition(TypedDict, total=False):
    """One of ``status.conditions``, as Kubernetes conventions shape it."""

    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: int


class AgentRunStatus(BaseModel):
    """``.status`` of an AgentRun as read from the API (empty for a run the operator has not seen yet)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    phase: Annotated[Phase | None, BeforeValidator(_lenient_phase)] = None
    reason: str | None = None
    message: str | None = None
    attempt: int = 0
    restarts: int = 0
    disruptions: int = 0
    pod_name: str | None = Field(default=None, alias="podName")
    attempts: list[AttemptRecord] = []
    state_version: int | None = Field(default=None, alias="stateVersion")
    current_node: str | None = Field(default=None, alias="currentNode")
    step: int | None = None
    tool_calls: ToolCalls | None = Field(default=None, alias="toolCalls")
    tool_summary: str | None = Field(default=None, alias="toolSummary")
    model_usage: list[ModelUsage] | None = Field(default=None, alias="modelUsage")
    last_checkpoint_time: Time = Field(default=None, alias="lastCheckpointTime")
    interrupt: InterruptInfo | None = None
    waiting_for: str | None = Field(default=None, alias="waitingFor")
    conditions: list[Condition] = []
    observed_generation: int | None = Field(default=None, alias="observedGeneration")
    start_time: Time = Field(default=None, alias="startTime")
    completion_time: Time = Field(default=None, alias="completionTime")
    next_attempt_time: Time = Field(default=None, alias="nextAttemptTime")
    stop_requested_time: Time = Field(default=None, alias="stopRequestedTime")
    resume_digest: str | None = Field(default=None, alias="resumeDigest")
    lost_since: Time = Field(default=None, alias="lostSince")
    result: ResultInfo | None = None
    observed_retry: int = Field(default=0, alias="observedRetry")
    store_unavailable_since: Time = Field(default=None, alias="storeUnavailableSince")

    @classmethod
    def parse(cls, raw: Any) -> AgentRunStatus:
        """From the API's ``.status`` (absent, empty or partial); a field that does not parse reads as unset."""
        data = dict(raw or {})
        if data.get("phase") == Phase.PENDING and not data.get("reason"):
            # The CRD's default (every phase the operator writes comes with a reason): not seen yet.
            del data["phase"]
        while True:
            try:
                return cls.model_validate(data)
            except ValidationError as e:
                bad = {err["loc"][0] for err in e.errors() if err["loc"]}
                if not bad & data.keys():
                    return cls()
                for key in bad:
                    data.pop(str(key), None)

    @property
    def started(self) -> bool:
        """The run has had an attempt (a pod was created for it at least once)."""
        return self.attempt > 0

    def wire(self) -> dict[str, Any]:
        """The CRD-shaped dict, as the API holds it: camelCase names, timestamps as strings, unset fields absent."""
        out: dict[str, Any] = {}
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if name not in self.model_fields_set or value is None:
                continue
            out[info.alias or name] = iso(value) if isinstance(value, datetime) else value
        return out


class StatusPatch(TypedDict, total=False):
    """A merge patch of ``.status``: the keys a decision sets; ``None`` removes a field."""

    phase: Phase
    reason: Reason
    message: str
    attempt: int
    restarts: int
    disruptions: int
    podName: str
    attempts: list[AttemptRecord]
    stateVersion: int
    currentNode: str | None
    step: int
    toolCalls: ToolCalls
    toolSummary: str  # toolCalls in a few words, for the Tools column (``toolerrors.summary``)
    modelUsage: list[ModelUsage]
    lastCheckpointTime: str
    interrupt: InterruptInfo | None
    waitingFor: str | None  # the interrupt in a few words while Interrupted, for the Waiting column
    conditions: list[Condition]
    observedGeneration: int
    startTime: str
    completionTime: str
    nextAttemptTime: str | None
    stopRequestedTime: str
    resumeDigest: str
    lostSince: str | None
    result: ResultInfo | None
    observedRetry: int
    storeUnavailableSince: str | None
