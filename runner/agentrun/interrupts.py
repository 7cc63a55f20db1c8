"""``interrupt()``: pause the run for a human, resume with ``Command(resume=...)``.

On resume the interrupted node runs again from its start. Inside it, each
``interrupt()`` call is identified by (run, step, node, tool call, position),
so the same call site gets the same id on the re-run and returns its resume
value instead of pausing. Tool calls that finished before the pause come from
the ledger, so only the paused call really continues.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .context import CallScope, RunContext, current_scope, get_run_context
from .errors import GraphInterrupt


@dataclass(frozen=True)
class Interrupt:
    """A pause for a human: its id (stable across the node's re-run), payload, message and node."""

    id: str
    payload: Any
    message: str
    node: str
    tool_call_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The interrupt as stored in a checkpoint's meta."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Interrupt:
        """An interrupt from its stored form (``to_json``)."""
        return cls(**data)


@dataclass(frozen=True)
class Command:
    """Input that resumes an interrupted thread.

    ``resume`` is either one value (when exactly one interrupt is pending) or a
    mapping ``{interrupt_id: value}`` answering each pending interrupt.
    """

    resume: Any


def interrupt(payload: Any = None, *, message: str = "") -> Any:
    """Pause the run and wait for a human; returns the resume value once resumed.

    ``payload`` must be JSON-serializable (it is persisted and shown in the
    AgentRun status). Code before the call runs again on resume, so keep side
    effects after it or in a separate tool.
    """
    # User code (a node or a tool) has no channel to the run but these context variables, which the
    # engine and the tool node set around it; our own code calls ``interrupt_in`` with explicit arguments.
    ctx = get_run_context()
    scope = current_scope.get()
    if scope is None:
        scope = CallScope(name=ctx.node)
        current_scope.set(scope)
    return interrupt_in(ctx, scope, payload, message=message)


def interrupt_in(ctx: RunContext, scope: CallScope, payload: Any, *, message: str) -> Any:
    """``interrupt()`` at an explicit place: the resume value for the scope's next interrupt id, or pause."""
    interrupt_id = scope.next_interrupt_id(ctx)
    if interrupt_id in ctx.resume:
        return ctx.resume[interrupt_id]
    raise GraphInterrupt([Interrupt(interrupt_id, payload, message, node=ctx.node, tool_call_id=scope.tool_call_id)])
