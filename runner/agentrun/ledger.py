"""The tool ledger policy: keys, envelopes, and what a failure of the store means.

Key: ``<origin message id>:<tool call id>``, scoped by thread in the store.
Tool call ids restart at ``call_1`` on every model turn with many providers,
so the id of the assistant message that asked for the call is part of the
key; if either part is missing there is no safe key and the ledger is
skipped (the tool runs every time).

Failure policy, chosen so a broken ledger can cost a duplicate call but
never a lost or wrong result:
- a malformed or unreadable entry is a miss: the tool runs again;
- a read failure is logged and is a miss;
- a write failure is logged at ERROR saying the call COMPLETED but was not
  recorded (a human may need to reconcile it), the result still goes to the
  model and the run continues.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .context import RunContext
from .errors import DeterminismError, FencedError
from .messages import Message
from .metrics import LEDGER_HITS, LEDGER_READ_FAILURES, LEDGER_RECORD_FAILURES

MESSAGE = "message"
RAW = "raw"


class MalformedEntry(ValueError):
    pass


def ledger_key(origin_message_id: str | None, tool_call_id: str | None) -> str | None:
    if not origin_message_id or not tool_call_id:
        return None
    return f"{origin_message_id}:{tool_call_id}"


def idempotency_key(thread_id: str, key: str | None) -> str | None:
    """Stable per thread and call, opaque to downstream APIs, the same on every replay."""
    if key is None:
        return None
    return "ar-" + hashlib.sha256(f"{thread_id}\x00{key}".encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Recorded:
    """A ledger hit: the tool's result and the state channels the call changed."""

    result: Any
    state: dict[str, Any] = field(default_factory=dict)


def encode(result: Any, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stored envelope; raises ``TypeError``/``ValueError`` if it is not JSON-serializable.

    Beyond DESIGN's ``{"__kind__", "value"}``: an optional ``"state"`` holds the
    channels the call changed (tools may mutate ``state``), so a replay restores
    them too instead of answering with the result alone.
    """
    if isinstance(result, Message):
        envelope: dict[str, Any] = {"__kind__": MESSAGE, "value": result.to_json()}
    else:
        envelope = {"__kind__": RAW, "value": result}
    if state:
        envelope["state"] = state
    json.dumps(envelope, allow_nan=False)
    return envelope


def decode(envelope: Any) -> Recorded:
    """The recorded call; ``MalformedEntry`` if it is not an envelope."""
    if not isinstance(envelope, dict) or not {"__kind__", "value"} <= set(envelope) <= {"__kind__", "value", "state"}:
        raise MalformedEntry(f"not an envelope: {str(envelope)[:120]}")
    state = envelope.get("state", {})
    if not isinstance(state, dict):
        raise MalformedEntry(f"recorded state changes are not an object: {str(state)[:120]}")
    kind = envelope["__kind__"]
    if kind == RAW:
        return Recorded(envelope["value"], state)
    if kind == MESSAGE:
        try:
            return Recorded(Message.from_json(envelope["value"]), state)
        except ValueError as e:
            raise MalformedEntry(f"recorded message does not parse: {e}") from e
    raise MalformedEntry(f"unknown envelope kind {kind!r}")


_MISS = object()


async def lookup(ctx: RunContext, key: str, tool_name: str) -> Recorded | object:
    """The recorded call for ``key``, or ``MISS``. Raises ``DeterminismError`` on a name mismatch."""
    try:
        entry = await ctx.checkpointer.ledger_get(ctx.thread_id, key)
    except Exception as e:  # any store failure is a miss: better a duplicate call than a stuck run
        LEDGER_READ_FAILURES.labels("read_error").inc()
        ctx.log.warning("ledger read failed for %s (%s); treating as not recorded, the tool will run", key, e)
        return _MISS
    if entry is None:
        return _MISS
    if entry.tool_name != tool_name:
        raise DeterminismError(
            f"ledger entry {key} was recorded by tool {entry.tool_name!r} but the replay calls {tool_name!r}; "
            "the graph or model changed between runs of this thread, refusing to hand one tool's result to another"
        )
    try:
        result = decode(entry.result)
    except MalformedEntry as e:
        LEDGER_READ_FAILURES.labels("malformed").inc()
        ctx.log.warning("ledger entry %s for %s is malformed (%s); the tool will run again", key, tool_name, e)
        return _MISS
    LEDGER_HITS.labels(tool_name).inc()
    return result


async def record(ctx: RunContext, key: str, tool_name: str, result: Any, state: dict[str, Any] | None = None) -> bool:
    """Record a completed call; ``False`` if it was not recorded. Never raises except ``FencedError``."""
    try:
        envelope = encode(result, state)
        if not await ctx.checkpointer.ledger_put(ctx.thread_id, key, tool_name, envelope, attempt=ctx.config.attempt):
            # First write wins: an entry that was unreadable (malformed) or written meanwhile by another
            # process stays authoritative, so this result reaches the model but a replay will not see it.
            ctx.log.warning(
                "tool call %s (%s) COMPLETED but the ledger already holds an entry for it, which stays "
                "authoritative; this result goes to the model only",
                key,
                tool_name,
            )
            return False
        return True
    except FencedError:
        raise
    except Exception as e:
        LEDGER_RECORD_FAILURES.labels(tool_name).inc()
        ctx.log.error(
            "tool call %s (%s) COMPLETED but could not be recorded in the ledger: %s; "
            "the result goes to the model and the run continues, but a replay of this step would call it again",
            key,
            tool_name,
            e,
        )
        return False
