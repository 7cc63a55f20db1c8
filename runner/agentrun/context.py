"""The per-run context: the store, the config, the logger and the resume values of one node run.

Our own code gets it as a parameter (the engine hands it to a
``nodes.ContextNode`` such as the tool node, which passes it on to the
ledger). User code has no such channel, so the engine also puts it in the
``current_run``/``current_scope`` context variables, where ``interrupt()``
and the model adapter's logger find it. Each node runs in a context of its
own (a copy taken by the supervisor: its task's, or its worker thread's for a
sync node), so concurrent runs in one process never see each other's context.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from .checkpoint.base import PAUSED_SUFFIX, TOOL_ERROR_MESSAGE_LIMIT, Checkpointer
from .config import RunConfig
from .usage import ModelUsage

log = logging.getLogger("agentrun.ledger")


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every line with the thread and attempt, so interleaved runs stay readable."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        """Prefix the message with the run's thread and attempt, and pass both on as record fields."""
        extra = self.extra or {}
        # Also as record attributes, so JSON lines carry them as fields (agentrun.logs.JsonFormatter).
        kwargs["extra"] = {**extra, **(kwargs.get("extra") or {})}
        return f"[thread={extra.get('thread_id')} attempt={extra.get('attempt')}] {msg}", kwargs


def run_logger(name: str, thread_id: str, attempt: int) -> RunLogger:
    """A logger whose lines name ``thread_id`` and ``attempt`` (every runner log line does)."""
    return RunLogger(logging.getLogger(name), {"thread_id": thread_id, "attempt": attempt})


@dataclass
class ToolCounts:
    """A turn's tool calls: executed, replayed from the ledger, failed, found in doubt; and the last failure.

    Checkpointed in meta ``tool_calls`` (the counts) and ``last_tool_error``
    (``{"tool", "code", "message"}``, the message cut to 512 characters; never
    the call's arguments, which may hold secrets).
    """

    executed: int = 0
    replayed: int = 0
    failed: int = 0
    in_doubt: int = 0
    # Calls that COMPLETED but whose ledger record failed (a replay would run them again); the operator
    # exports it (agentrun_operator_tool_calls_total{outcome="unrecorded"}), so it outlives the pod.
    unrecorded: int = 0
    last_error: dict[str, str] | None = None

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ToolCounts:
        """The counts a checkpoint's meta carries (``tool_calls``), zero where absent."""
        counts = meta.get("tool_calls") or {}
        return cls(
            **{k: int(counts.get(k, 0)) for k in ("executed", "replayed", "failed", "in_doubt", "unrecorded")},
            last_error=meta.get("last_tool_error"),
        )

    def as_dict(self) -> dict[str, int]:
        """The counts as the checkpoint's meta and the status record them."""
        counts = {
            "executed": self.executed,
            "replayed": self.replayed,
            "failed": self.failed,
            "in_doubt": self.in_doubt,
        }
        if self.unrecorded:  # additive and only when it happened: older readers and checkpoints stay as they were
            counts["unrecorded"] = self.unrecorded
        return counts

    def fail(self, tool: str, code: str, message: str) -> None:
        """Count a failed call and remember it as the last tool error."""
        self.failed += 1
        self.last_error = {"tool": tool[:253], "code": code, "message": message[:TOOL_ERROR_MESSAGE_LIMIT]}


async def executed_since(store: Checkpointer, thread_id: str, since: float) -> int:
    """How many results were recorded after the checkpoint written at ``since``: calls no checkpoint counted.

    A tool's result is recorded as soon as it returns, its count is checkpointed with the step, so a
    process that dies in between takes the count with it while the record stays. An attempt that resumes
    from that checkpoint adds these to its ``executed`` (the operator's progress read applies the same rule
    to the latest checkpoint, ``checkpoint.postgres._PROGRESS``), so the calls of every attempt count once.

    Reads the thread's ledger once per resume. A failed read counts nothing: counts report, they never
    fail a run. LIMIT: a result a human gave for an in-doubt call counts here as executed.
    """
    try:
        entries = await store.ledger_list(thread_id)
    except Exception as e:
        log.warning("thread %s: cannot read the ledger to count the calls of the previous attempt: %s", thread_id, e)
        return 0
    return sum(1 for e in entries if e.created_at > since and not e.key.endswith(PAUSED_SUFFIX))


@dataclass
class RunContext:
    """What a node and its tools see of the run they are in (``get_run_context``): config, store, step, logger."""

    config: RunConfig
    checkpointer: Checkpointer
    run_id: str
    node: str
    step: int
    log: RunLogger
    # Resume values by interrupt id, from Command(resume=...); survives a crash in the checkpoint.
    resume: dict[str, Any] = field(default_factory=dict)
    counts: ToolCounts = field(default_factory=ToolCounts)
    # The turn's model usage: the model adapters add to it (agentrun.models.metering), the engine checkpoints it.
    usage: ModelUsage = field(default_factory=ModelUsage)

    @property
    def thread_id(self) -> str:
        """The run's thread id."""
        return self.config.thread_id


@dataclass
class CallScope:
    """Where an ``interrupt()`` happens: a node, or one tool call inside the tool node."""

    name: str
    counter: int = 0
    tool_call_id: str | None = None

    def next_interrupt_id(self, ctx: RunContext) -> str:
        # Stable across the re-run of the node after resume: same run, step, node, call, position.
        """The next interrupt id in this scope: the same on the re-run of the node after a resume."""
        raw = f"{ctx.thread_id}|{ctx.run_id}|{ctx.step}|{ctx.node}|{self.name}|{self.counter}"
        self.counter += 1
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


current_run: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("agentrun_run", default=None)
current_scope: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("agentrun_scope", default=None)


def get_run_context() -> RunContext:
    """The run the calling node or tool is in; raises ``RuntimeError`` outside a run."""
    ctx = current_run.get()
    if ctx is None:
        raise RuntimeError("no agentrun run is active here: call this from inside a node or a tool")
    return ctx
