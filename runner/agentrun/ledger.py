"""The tool ledger policy: keys, envelopes, and what a failure of the store means.

Key: ``<origin message id>:<tool call id>``, scoped by thread in the store.
Tool call ids restart at ``call_1`` on every model turn with many providers,
so the id of the assistant message that asked for the call is part of the
key; if either part is missing there is no safe key and the ledger is
skipped (the tool runs every time).

Failure policy, chosen so a broken ledger can cost a duplicate call but
never a lost or wrong result:
- a malformed or unreadable entry is a miss: the call proceeds as if never
  recorded. A tool without side effects runs again; one with side effects
  whose start was recorded (an intent) is in doubt and gets its in-doubt
  policy (retry, report, or the default: pause the run for a human);
- once the call has a fresh result (the tool ran again, or a human gave
  one), it replaces the malformed entry by compare-and-swap on the entry's
  exact text, so later replays hit; the first WELL-FORMED result stays
  authoritative and of two repairers exactly one wins;
- a read failure is logged and is a miss, except ``StoreUnavailableError``:
  the store already stayed down past the runner's retry bound, so the result
  could not be recorded either, and running the tool now would leave a side
  effect that the next attempt repeats. The attempt ends instead (exit 8)
  and a later one does the lookup again;
- a write failure is logged at ERROR saying the call COMPLETED but was not
  recorded (a human may need to reconcile it), the result still goes to the
  model and the run continues.

Arguments: an entry and an intent also record the digest of the call's
arguments (``args_digest``). An entry recorded under the call's key by a
DIFFERENT tool is a determinism error (DESIGN §2); one recorded by the same
tool with other arguments belongs to another call: this one was edited since
(a fork of a LangGraph thread by ``update_state`` that keeps the message id and
call id, as LangGraph's docs edit a tool call), so it is not a replay. It
runs as a new call under its own key (``edited_key``) with its own idempotency
key, and a replay of it is answered from there; the original call keeps its
entry (a replay of the original branch is still answered from the ledger).
Entries and intents recorded before digests existed have none and replay as
they always did.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .checkpoint.base import LedgerEntry, LedgerRow
from .checkpoint.group import LedgerGroup
from .context import RunContext
from .errors import DeterminismError, FencedError, StoreUnavailableError
from .messages import Message, unicode_text
from .metrics import LEDGER_HITS, LEDGER_READ_FAILURES, LEDGER_RECORD_FAILURES
from .tools import Tool

MESSAGE = "message"
RAW = "raw"
# How much of the arguments digest an edited call's key carries: enough to keep a thread's edits of one call apart.
EDITED_KEY_DIGEST_CHARS = 16


class MalformedEntry(ValueError):
    """A ledger row that is not a well-formed envelope: treated as a miss (the tool runs)."""


def ledger_key(origin_message_id: str | None, tool_call_id: str | None) -> str | None:
    """A tool call's ledger key, ``"<origin message id>:<tool call id>"``; ``None`` (no ledger) if one is missing."""
    if not origin_message_id or not tool_call_id:
        return None
    return f"{origin_message_id}:{tool_call_id}"


def idempotency_key(thread_id: str, key: str | None) -> str | None:
    """Stable per thread and call, opaque to downstream APIs, the same on every replay."""
    if key is None:
        return None
    return "ar-" + hashlib.sha256(f"{thread_id}\x00{key}".encode()).hexdigest()[:40]


def args_digest(arguments: Any) -> str:
    """SHA-256 (hex) of ``arguments`` as canonical JSON (sorted keys, no spaces): equal arguments, equal digest.

    ``arguments``: the parsed arguments, or the raw text when it does not parse (then the text is compared).
    """
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def edited_key(key: str, digest: str) -> str:
    """The ledger key of a call whose key holds another call's arguments (see the module docstring)."""
    return f"{key}#args-{digest[:EDITED_KEY_DIGEST_CHARS]}"


_EDITED = re.compile(rf"(.+)#args-[0-9a-f]{{{EDITED_KEY_DIGEST_CHARS}}}")


def edited_from(key: str) -> str | None:
    """The key of the call that ``key`` (an ``edited_key``) is an edited re-run of; ``None`` for any other key."""
    found = _EDITED.fullmatch(key)
    return found.group(1) if found else None


class HeldByAnotherCall(Exception):
    """The key's entry or intent was recorded with other arguments: this call was edited, it is a new call.

    Raised before anything of the call is recorded or started; the caller runs it again under ``edited_key``.
    """


def check_arguments(recorded: str | None, digest: str, *, key: str, tool_name: str, edited: bool, what: str) -> None:
    """Whether an entry or intent (``what``) recorded with digest ``recorded`` is this call's (``digest``).

    ``None`` (recorded before digests) is taken as this call's. Otherwise a mismatch raises
    ``HeldByAnotherCall``, or, at an edited key already (``edited``), ``DeterminismError``: two different
    arguments behind one digest prefix is not an edit the ledger can tell apart.
    """
    if recorded is None or recorded == digest:
        return
    if edited:
        raise DeterminismError(
            f"ledger {what} {key} of {tool_name!r} was recorded with other arguments than the call being made, "
            "at a key that already tells edited calls apart; refusing to hand one call's result to another"
        )
    raise HeldByAnotherCall(key)


@dataclass(frozen=True)
class Recorded:
    """A ledger hit: the tool's result, the state channels the call changed, its arguments digest (if recorded)."""

    result: Any
    state: dict[str, Any] = field(default_factory=dict)
    args: str | None = None


def encode(result: Any, state: dict[str, Any] | None = None, *, args: str | None = None) -> dict[str, Any]:
    """The stored envelope; raises ``TypeError``/``ValueError`` if it is not JSON-serializable.

    Text that is not Unicode (unpaired surrogates) is stored with U+FFFD in its place.

    Beyond DESIGN's ``{"__kind__", "value"}``: an optional ``"state"`` holds the
    channels the call changed (tools may mutate ``state``), so a replay restores
    them too instead of answering with the result alone; ``"args"`` holds the
    digest of the call's arguments (``args_digest``), so an edited call is not
    answered with the original one's result.
    """
    if isinstance(result, Message):
        envelope: dict[str, Any] = {"__kind__": MESSAGE, "value": result.to_json()}
    else:
        envelope = {"__kind__": RAW, "value": result}
    if state:
        envelope["state"] = state
    if args is not None:
        envelope["args"] = args
    text = json.dumps(envelope, allow_nan=False, ensure_ascii=False)
    if (valid := unicode_text(text)) is not text:
        # Unpaired surrogates (see ``unicode_text``): no store takes them, so the record holds U+FFFD in
        # their place, as the tool's result message does; a replay then shows the model what it saw.
        envelope = json.loads(valid)
    return envelope


_ENVELOPE_FIELDS = {"__kind__", "value", "state", "args"}


def decode(envelope: Any) -> Recorded:
    """The recorded call; ``MalformedEntry`` if it is not an envelope."""
    if not isinstance(envelope, dict) or not {"__kind__", "value"} <= set(envelope) <= _ENVELOPE_FIELDS:
        raise MalformedEntry(f"not an envelope: {str(envelope)[:120]}")
    state = envelope.get("state", {})
    if not isinstance(state, dict):
        raise MalformedEntry(f"recorded state changes are not an object: {str(state)[:120]}")
    args = envelope.get("args")
    if args is not None and not isinstance(args, str):
        raise MalformedEntry(f"recorded arguments digest is not text: {str(args)[:120]}")
    kind = envelope["__kind__"]
    if kind == RAW:
        return Recorded(envelope["value"], state, args)
    if kind == MESSAGE:
        try:
            return Recorded(Message.from_json(envelope["value"]), state, args)
        except ValueError as e:
            raise MalformedEntry(f"recorded message does not parse: {e}") from e
    raise MalformedEntry(f"unknown envelope kind {kind!r}")


_MISS = object()


def _malformed(entry: LedgerEntry) -> bool:
    try:
        decode(entry.result)
    except MalformedEntry:
        return True
    return False


def _after_a_miss(tool: Tool) -> str:
    """What happens to a call whose ledger entry could not be used: the log line's "what next"."""
    if not tool.side_effects:
        return "the tool will run again"
    policy = {
        "retry": "it runs again with the same idempotency key",
        "report": "it is reported to the model as in doubt and not run again",
        "interrupt": 'the run pauses with an in-doubt interrupt for a human to resume with "retry" or a result',
    }[tool.in_doubt]
    return f"the tool has side effects: if its start was recorded, {policy}; if not, the tool will run again"


async def lookup(ctx: RunContext, key: str, tool: Tool, *, args: str, edited: bool = False) -> Recorded | object:
    """The recorded call for ``key``, or ``MISS``.

    Raises ``DeterminismError`` on a name mismatch, and what ``check_arguments`` raises when the entry
    was recorded with other arguments than ``args`` (the call's digest; ``edited``: ``key`` is an edited key).
    """
    tool_name = tool.name
    try:
        entry = await ctx.checkpointer.ledger_get(ctx.thread_id, key)
    except StoreUnavailableError:
        raise
    except Exception as e:  # any other store failure is a miss: better a duplicate call than a stuck run
        LEDGER_READ_FAILURES.labels("read_error").inc()
        ctx.log.warning("ledger read failed for %s (%s); treating it as not recorded: %s", key, e, _after_a_miss(tool))
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
        ctx.log.warning(
            "ledger entry %s for %s is malformed (%s); treating it as not recorded: %s, and the fresh result "
            "will replace the entry",
            key,
            tool_name,
            e,
            _after_a_miss(tool),
        )
        return _MISS
    check_arguments(result.args, args, key=key, tool_name=tool_name, edited=edited, what="entry")
    LEDGER_HITS.labels(tool_name).inc()
    return result


async def record(
    ctx: RunContext,
    key: str,
    tool_name: str,
    result: Any,
    state: dict[str, Any] | None = None,
    *,
    args: str | None,
    group: LedgerGroup | None = None,
) -> bool:
    """Record a completed call; ``False`` if it was not recorded. Never raises except ``FencedError``.

    ``args``: the digest of the call's arguments, recorded with it. ``group``: the call's parallel
    siblings, to share their commit (``checkpoint.group``); this policy applies to each call of a batch alike.
    """
    attempt, run_uid = ctx.config.attempt, ctx.config.run_uid
    try:
        envelope = encode(result, state, args=args)
        if group is not None:
            recorded = await group.put(LedgerRow(key, tool_name, envelope))
        else:
            recorded = await ctx.checkpointer.ledger_put(
                ctx.thread_id, key, tool_name, envelope, attempt=attempt, run_uid=run_uid
            )
        if recorded:
            return True
        # First WELL-FORMED write wins: a malformed entry is replaced, one written meanwhile by another
        # process stays authoritative (this result reaches the model, a replay will not see it).
        existing = await ctx.checkpointer.ledger_get(ctx.thread_id, key)
        if (
            existing is not None
            and _malformed(existing)
            and existing.text is not None
            and await ctx.checkpointer.ledger_replace(
                ctx.thread_id, key, tool_name, envelope, expected_text=existing.text, attempt=attempt, run_uid=run_uid
            )
        ):
            ctx.log.info("tool call %s (%s): its malformed ledger entry was replaced by this result", key, tool_name)
            return True
        ctx.log.warning(
            "tool call %s (%s) COMPLETED but the ledger already holds an entry for it, which stays "
            "authoritative; this result goes to the model only",
            key,
            tool_name,
        )
        return False
    except FencedError:
        raise
    except Exception as e:
        LEDGER_RECORD_FAILURES.labels(tool_name).inc()
        ctx.counts.unrecorded += 1  # checkpointed with the step: the operator's metric outlives this pod
        ctx.log.error(
            "tool call %s (%s) COMPLETED but could not be recorded in the ledger: %s; "
            "the result goes to the model and the run continues, but a replay of this step would call it again",
            key,
            tool_name,
            e,
        )
        return False
