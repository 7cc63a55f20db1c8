"""LangChain's ``HumanInTheLoopMiddleware`` reviews: the pending tool calls and the decisions they allow.

A ``create_agent`` graph with ``HumanInTheLoopMiddleware`` (its default, batched mode) pauses with one
interrupt whose payload is a ``HITLRequest``: ``action_requests`` (``name``, ``args``, ``description``)
and ``review_configs`` (``action_name``, ``allowed_decisions``), one per gated tool call, in order. It
resumes with ``{"decisions": [...]}``, one decision per action, same order: ``{"type": "approve"}``,
``{"type": "edit", "edited_action": {"name", "args"}}``, ``{"type": "reject", "message"?}`` or
``{"type": "respond", "message"}``. The middleware raises inside the graph on anything else (a bare
``true``, a decision it does not allow, one decision too few), which fails the run; the run's page and
``kubectl agentrun approve`` check the answer here first and say what to send instead.

An edit keeps the tool's name: the middleware would run another tool under an edit that names one, so an
edit of ``charge_card`` could run a tool no reviewer was asked about (LangChain's per-call mode pins the
name the same way). Shared by the history server and the kubectl plugin (no I/O here).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DECISIONS = ("approve", "edit", "reject", "respond")
SHAPE = (
    '{"decisions": [DECISION, ...]}, one per pending tool call in order, each {"type": "approve"}, '
    '{"type": "edit", "edited_action": {"name": TOOL, "args": {...}}}, {"type": "reject", "message": "why"} '
    '(message optional) or {"type": "respond", "message": "..."}, as its allowed decisions permit'
)


@dataclass(frozen=True)
class Action:
    """One pending tool call of a review: what the model asked to run and what a reviewer may answer."""

    name: str
    args: dict[str, Any]
    description: str
    allowed: tuple[str, ...]


def actions(payload: Any) -> list[Action] | None:
    """The pending tool calls when ``payload`` is a ``HITLRequest``, else None (another interrupt, or a payload
    the status truncated to text)."""
    if not isinstance(payload, dict):
        return None
    requests, configs = payload.get("action_requests"), payload.get("review_configs")
    if not isinstance(requests, list) or not isinstance(configs, list) or not requests:
        return None
    allowed = {c.get("action_name"): c.get("allowed_decisions") for c in configs if isinstance(c, dict)}
    found = []
    for request in requests:
        if not isinstance(request, dict) or not isinstance(request.get("name"), str):
            return None
        decisions = allowed.get(request["name"])
        args = request.get("args")
        found.append(
            Action(
                name=request["name"],
                args=args if isinstance(args, dict) else {},
                description=str(request.get("description") or ""),
                allowed=tuple(d for d in decisions or () if d in DECISIONS),
            )
        )
    return found


def problem(pending: list[Action], value: Any) -> str | None:
    """Why ``value`` is not an answer ``pending`` allows (None: it is one), naming what to send."""
    decisions = value.get("decisions") if isinstance(value, dict) else None
    if not isinstance(decisions, list):
        return f"this interrupt is a tool call review (LangChain HumanInTheLoopMiddleware): send {SHAPE}"
    if len(decisions) != len(pending):
        return (
            f"{len(pending)} tool call(s) wait for review ({', '.join(a.name for a in pending)}) and the answer has "
            f"{len(decisions)} decision(s): send one per call, in order"
        )
    for i, (action, decision) in enumerate(zip(pending, decisions, strict=True), 1):
        kind = decision.get("type") if isinstance(decision, dict) else None
        where = f"decision {i} (tool call {action.name})"
        if kind not in action.allowed:
            return f"{where}: {json.dumps(kind)} is not allowed; {action.name} allows {', '.join(action.allowed)}"
        assert isinstance(decision, dict)
        if kind == "edit":
            edited = decision.get("edited_action")
            if not isinstance(edited, dict) or not isinstance(edited.get("args"), dict):
                return f'{where}: an edit sends "edited_action": {{"name": "{action.name}", "args": {{...}}}}'
            if edited.get("name") != action.name:
                return f'{where}: an edit keeps the tool ("name": "{action.name}"); change only its arguments'
        if kind in ("reject", "respond") and not isinstance(decision.get("message", ""), str):
            return f'{where}: "message" is text'
        if kind == "respond" and not decision.get("message"):
            return f'{where}: a respond decision carries the tool\'s answer as "message"'
    return None


def every(pending: list[Action], kind: str) -> dict[str, Any]:
    """The answer giving every pending call the decision ``kind`` (ValueError naming a call that does not allow
    it)."""
    refused = [a.name for a in pending if kind not in a.allowed]
    if refused:
        raise ValueError(f"{', '.join(refused)} does not allow {kind} (allowed: {allowed_words(pending)})")
    return {"decisions": [{"type": kind} for _ in pending]}


def edit(pending: list[Action], args: Any) -> dict[str, Any]:
    """The answer running the single pending call with ``args`` instead (ValueError saying why it cannot)."""
    if len(pending) != 1:
        raise ValueError(
            f"{len(pending)} tool calls wait for review ({', '.join(a.name for a in pending)}): an edit of one "
            f"needs the whole answer, {SHAPE}"
        )
    if not isinstance(args, dict):
        raise ValueError(f'the edited arguments are a JSON object, e.g. {{"order_id": "4821"}}, not {json.dumps(args)}')
    if "edit" not in pending[0].allowed:
        raise ValueError(f"{pending[0].name} does not allow an edit (allowed: {', '.join(pending[0].allowed)})")
    return {"decisions": [{"type": "edit", "edited_action": {"name": pending[0].name, "args": args}}]}


def allowed_words(pending: list[Action]) -> str:
    """What each pending call allows, for an error message."""
    return "; ".join(f"{a.name}: {', '.join(a.allowed) or 'nothing'}" for a in pending)
