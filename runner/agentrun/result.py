"""A completed turn's result (``Turn.result``, then the AgentRun's ``status.result``): one rule for both engines.

The rule (README "What a run answers"):

- a state with messages that holds an assistant message: the last one's text (``kind: "message"``);
- otherwise the final state's values other than ``messages``, as JSON with sorted keys (``kind: "state"``):
  a graph ``{name} -> {greeting}`` answers ``{"greeting": "Hello, Ada", "name": "Ada"}``;
- nothing (``None``) when the final state holds neither (an empty state).

``message`` keeps the first ``RESULT_MESSAGE_LIMIT`` (1024) characters, ``truncated`` says it was cut, and
``digest`` is ``sha256:<hex>`` of the whole text (UTF-8), so a copy can be checked without the database while
the AgentRun stays small. The text is computed once, when the turn completes: never on a step's path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from .checkpoint.base import RESULT_MESSAGE_LIMIT

__all__ = ["ResultKind", "final_result"]

ResultKind = Literal["message", "state"]


def final_result(
    answer: str | None, values: Mapping[str, Any], *, messages_key: str = "messages"
) -> dict[str, Any] | None:
    """``Turn.result`` of a completed turn: ``answer`` (its last assistant message's text, None without one),
    else the JSON of ``values`` without ``messages_key``; cut to 1024 characters with the digest of the whole."""
    kind: ResultKind = "message"
    if answer is None:
        kept = {str(k): v for k, v in values.items() if k != messages_key}
        if not kept:
            return None
        # default=str: a LangGraph state may hold objects JSON cannot (their str is what a reader can use).
        answer = json.dumps(kept, ensure_ascii=False, sort_keys=True, default=str)
        kind = "state"
    return {
        "message": answer[:RESULT_MESSAGE_LIMIT],
        "digest": "sha256:" + hashlib.sha256(answer.encode("utf-8", "surrogatepass")).hexdigest(),
        "truncated": len(answer) > RESULT_MESSAGE_LIMIT,
        "kind": kind,
    }
