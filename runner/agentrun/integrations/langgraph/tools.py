"""``LedgerToolNode``: LangGraph's ``ToolNode`` with agentrun's tool ledger, so a resumed run charges a card once.

Why: LangGraph saves a node's writes only when the whole node finishes. A
tool node that ran three calls of one assistant message and died after the
second (SIGKILL, eviction) runs all three again on resume: the card is
charged twice. Here each call is recorded in our ledger the moment it
returns (key ``<assistant message id>:<tool call id>``, scoped by thread),
and a replay answers recorded calls from the ledger instead of calling the
tool.

Per call, around LangGraph's own execution (``awrap_tool_call``):

1. the ledger lookup: a hit returns the recorded ``ToolMessage`` (a hit
   recorded by another tool name is a ``DeterminismError``); a malformed or
   unreadable entry is a miss, except ``StoreUnavailableError`` (the store is
   down past its retry bound: the attempt ends, exit 8, and a later one looks
   again rather than risk a duplicate). An entry (or intent) recorded with
   other arguments is another call's: this one was edited since, e.g. by
   ``update_state`` on a past checkpoint keeping the message and call ids
   (a fork); it is not a replay but a new call under its own key and
   idempotency key (``agentrun.ledger``: ``edited_key``);
2. a tool declared with side effects (``side_effects=``): if an intent was
   recorded but no result, the call is in doubt and its policy applies
   (``"retry"``: run again with the same idempotency key; ``"report"``: an
   error message to the model, not run; ``"interrupt"``, the default: LangGraph
   ``interrupt()`` for a human, who resumes with ``"retry"`` or a result).
   The lookup of an earlier intent and the record of this one (fenced, before
   the tool starts) are one statement (``intent_claim``). On PostgreSQL the
   message's ledger lookups and its side-effect calls' claims are ONE
   statement before any call starts (``_prefetch``), so the tools start, and
   finish, together; elsewhere the lookups and the claims of parallel calls
   each share a round trip, as in our own tool node;
3. the tool runs under its deadline (``timeouts=``, default
   ``tool_timeout``); the tool reads the call's stable idempotency key with
   ``current_idempotency_key()`` (LangGraph strips caller-supplied
   ``InjectedToolArg`` values, so it cannot be an argument);
4. a successful ``ToolMessage`` is recorded (first result wins), fenced; the
   results of parallel calls that finish together share one commit
   (``checkpoint.group``: a result waits at most the store's
   ``ledger_group_window``, 2 ms on PostgreSQL, for its siblings; async
   graphs; a sync graph records each call on its own).

When one call pauses in ``interrupt()`` (or fails the node), the node waits
for its siblings still running before the pause leaves it (``_calls_end``):
ToolNode's ``asyncio.gather`` would raise at once and leave them running, and
a charge that completed after the turn paused would be unrecorded, in doubt
on resume.

HAZARDS
- The window: a tool that returned but whose result was not yet recorded
  when the process died runs again on resume (with the same idempotency
  key). Give side-effect tools the key and let the downstream API deduplicate.
- Not recorded, so run again on a replay: error results (a raised tool
  error or ``status="error"``), timeouts, and tools that return a LangGraph
  ``Command`` (its updates may hold values that are not JSON).
- The graph must be compiled with ``AgentrunSaver``: the ledger lives in its
  store. Any other checkpointer raises ``TypeError`` at the first call.
- Sync graphs (``invoke``) use the ledger through agentrun's blocking loop; the
  per-tool deadline applies to async execution only.
- Ledger keys need the assistant message's id: ``add_messages`` gives every
  message one. A message without an id (a custom reducer) skips the ledger,
  with a warning, and the tool runs every time.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from langchain_core.messages import AIMessage, ToolMessage, message_to_dict, messages_from_dict
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from agentrun import blocking
from agentrun.checkpoint.base import PAUSED_SUFFIX, Checkpointer, Intent, LedgerEntry, LedgerRow
from agentrun.checkpoint.group import LedgerGroup
from agentrun.context import ToolCounts
from agentrun.errors import (
    DeterminismError,
    FencedError,
    NodeTimeoutError,
    StoreConfigError,
    StoreUnavailableError,
    ToolError,
)
from agentrun.faults import fault_point
from agentrun.ledger import (
    HeldByAnotherCall,
    MalformedEntry,
    args_digest,
    check_arguments,
    decode,
    edited_key,
    encode,
    idempotency_key,
    ledger_key,
)

from .rows import Claim, Fence, Prefetched
from .saver import AgentrunSaver

log = logging.getLogger("agentrun.integrations.langgraph")

InDoubtPolicy = Literal["retry", "report", "interrupt"]
DEFAULT_TOOL_TIMEOUT = 300.0
# The ledger key suffix marking a side-effect call that paused in interrupt() (not in doubt on resume);
# checkpoint.base owns it, so counting the ledger's results skips these markers.
PAUSED = PAUSED_SUFFIX
_CHECKPOINTER_KEY = "__pregel_checkpointer"  # langgraph._internal._constants.CONFIG_KEY_CHECKPOINTER
# Errors that must end the run whatever the node's handle_tool_errors says (a fenced attempt, a store down).
_FATAL = (FencedError, StoreUnavailableError, StoreConfigError, DeterminismError)
# The fatal errors of the current node execution: ToolNode may turn an exception of a wrapper into an
# error message (handle_tool_errors=True); the node re-raises what landed here after its calls finish.
_fatal: contextvars.ContextVar[list[BaseException] | None] = contextvars.ContextVar("agentrun_lg_fatal", default=None)
# The group commit of the current node execution's parallel calls (``LedgerToolNode._ledger_group``): each call
# runs in a task of its own with a copy of the node's context, so every sibling sees the one group.
_group: contextvars.ContextVar[LedgerGroup | None] = contextvars.ContextVar("agentrun_lg_group", default=None)
# The tasks of the current node execution's calls (ToolNode gathers them): when one call interrupts or fails,
# ``asyncio.gather`` raises at once and leaves the others running; the node waits for them (``_calls_end``).
_calls: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "agentrun_lg_calls", default=None
)
# The current node execution's ledger entries and intent claims, made in one statement before its calls start
# (``LedgerToolNode._prefetch``); a key it does not hold (an edited call's) goes to the store as before.
_prefetched: contextvars.ContextVar[Prefetched | None] = contextvars.ContextVar("agentrun_lg_prefetch", default=None)

# The idempotency key of the call being executed (``current_idempotency_key``). LangGraph's ToolNode strips
# every InjectedToolArg a caller supplies (so a model cannot forge one), so the key travels in a context
# variable: each parallel call runs in a task (or executor thread) of its own, with a copy of the context.
_idempotency_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentrun_lg_key", default=None)

AsyncExecute = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
SyncExecute = Callable[[ToolCallRequest], ToolMessage | Command[Any]]


@dataclass(frozen=True)
class _Call:
    """One tool call with its ledger identity."""

    request: ToolCallRequest
    store: Checkpointer
    fence: Fence
    thread_id: str
    key: str
    idempotency_key: str
    name: str
    call_id: str
    # The digest of the call's arguments, and whether ``key`` is already its edited key (``ledger.edited_key``).
    digest: str
    edited: bool = False

    def moved(self) -> _Call:
        """This call under its edited key: another call's arguments were recorded under ``key``."""
        key = edited_key(self.key, self.digest)
        idem = idempotency_key(self.thread_id, key)
        assert idem is not None
        return replace(self, key=key, idempotency_key=idem, edited=True)


# The tool-call counts of the turns the runner runs in this process, by thread id (``track``): what the mirror
# of a LangGraph run checkpoints in meta ``tool_calls``, so the AgentRun status shows them.
_tracked: dict[str, ToolCounts] = {}


def track(thread_id: str, counts: ToolCounts | None) -> None:
    """Count ``thread_id``'s tool calls into ``counts`` from now on (``None``: stop counting)."""
    if counts is None:
        _tracked.pop(thread_id, None)
    else:
        _tracked[thread_id] = counts


def _count(call: _Call | None, outcome: str, result: Any = None) -> None:
    counts = None if call is None else _tracked.get(call.thread_id)
    if counts is None or call is None:
        return
    if outcome == "executed" and isinstance(result, ToolMessage) and result.status == "error":
        # Failed, not executed: our engine's tool node counts so, and the history derives both from the records.
        counts.fail(call.name, ToolError.RAISED, str(result.content))
        return
    setattr(counts, outcome, getattr(counts, outcome) + 1)


def _count_raised(call: _Call, error: Exception) -> None:
    """Count a call whose tool raised (the run fails unless the node turns it into a message): failed."""
    if (counts := _tracked.get(call.thread_id)) is None:
        return
    counts.fail(call.name, str(getattr(error, "code", ToolError.RAISED)), f"{type(error).__name__}: {error}")


def current_idempotency_key() -> str | None:
    """The stable idempotency key of the tool call running now under a ``LedgerToolNode`` or ``LedgerMiddleware``
    (``None`` outside one).

    The same on every replay of the call (derived from the thread id and the ledger key): pass it to the
    downstream API (``Idempotency-Key`` header, a charge's key) so a call repeated in the window between a
    tool's return and its ledger record is applied once.
    """
    return _idempotency_key.get()


def _moved(call: _Call) -> _Call:
    """The call under its edited key, said in the log: its key holds another call's arguments."""
    moved = call.moved()
    log.warning(
        "tool call %s (%s): the ledger holds this call with other arguments, so it was edited since (e.g. "
        "update_state on a past checkpoint: a fork); not a replay: it runs as a new call keyed %s, with its own "
        "idempotency key",
        call.key,
        call.name,
        moved.key,
    )
    return moved


def _messages(state: Any, messages_key: str) -> Sequence[Any]:
    if isinstance(state, list):
        return state
    if isinstance(state, Mapping):
        return list(state.get(messages_key) or [])
    return list(getattr(state, messages_key, None) or [])


def _origin_id(state: Any, call_id: str, messages_key: str) -> str | None:
    """The id of the assistant message that asked for ``call_id``."""
    for message in reversed(_messages(state, messages_key)):
        if isinstance(message, AIMessage) and any(c.get("id") == call_id for c in message.tool_calls):
            return message.id
    return None


class _Ledger:
    """The ledger around each call of one ``LedgerToolNode`` (or ``LedgerMiddleware``: ``owner``)."""

    def __init__(
        self,
        *,
        side_effects: Collection[str],
        in_doubt: Mapping[str, InDoubtPolicy],
        timeouts: Mapping[str, float | None],
        tool_timeout: float | None,
        messages_key: str,
        owner: str = "LedgerToolNode",
    ) -> None:
        self.side_effects = frozenset(side_effects)
        self.in_doubt = dict(in_doubt)
        self.timeouts = dict(timeouts)
        self.tool_timeout = tool_timeout
        self.messages_key = messages_key
        self.owner = owner  # the class the user wrote, named in the errors they get

    def _identify(self, request: ToolCallRequest) -> _Call | None:
        call = request.tool_call
        name, call_id = call["name"], call.get("id")
        config = request.runtime.config if request.runtime is not None else {}
        configurable = config.get("configurable") or {}
        saver = configurable.get(_CHECKPOINTER_KEY)
        if not isinstance(saver, AgentrunSaver):
            raise TypeError(
                f"{self.owner} records tool calls in agentrun's store: compile the graph with "
                f"checkpointer=AgentrunSaver(store), not {type(saver).__name__}"
            )
        thread_id = str(configurable.get("thread_id"))
        key = ledger_key(_origin_id(request.state, call_id or "", self.messages_key), call_id)
        if key is None:
            log.warning(
                "tool call %s (%s) has no assistant message id or call id: no ledger for it, it runs on every replay",
                call_id,
                name,
            )
            return None
        idem = idempotency_key(thread_id, key)
        assert idem is not None
        digest = args_digest(call.get("args") or {})
        return _Call(request, saver.store, saver.fence, thread_id, key, idem, name, call_id or "", digest)

    @staticmethod
    async def _entry(call: _Call, key: str) -> LedgerEntry | None:
        """The ledger entry of ``key``: from the message's prefetch when it looked the key up, else the store."""
        prefetched = _prefetched.get()
        if prefetched is not None and key in prefetched.keys:
            return prefetched.entries.get(key)
        return await call.store.ledger_get(call.thread_id, key)

    async def _lookup(self, call: _Call) -> ToolMessage | None:
        try:
            entry = await self._entry(call, call.key)
        except StoreUnavailableError:
            raise
        except Exception as e:
            log.warning("ledger read failed for %s (%s); treating it as not recorded: %s", call.key, call.name, e)
            return None
        if entry is None:
            return None
        if entry.tool_name != call.name:
            raise DeterminismError(
                f"ledger entry {call.key} was recorded by tool {entry.tool_name!r} but the replay calls "
                f"{call.name!r}; the graph or model changed between runs of this thread"
            )
        try:
            recorded = decode(entry.result)
            message = messages_from_dict([recorded.result])[0]
        except (MalformedEntry, KeyError, TypeError, ValueError, IndexError) as e:
            log.warning("ledger entry %s (%s) is malformed (%s); treating it as not recorded", call.key, call.name, e)
            return None
        if not isinstance(message, ToolMessage):
            log.warning("ledger entry %s (%s) is not a tool message; treating it as not recorded", call.key, call.name)
            return None
        check_arguments(recorded.args, call.digest, key=call.key, tool_name=call.name, edited=call.edited, what="entry")
        log.info("tool call %s (%s) replayed from ledger; the tool is not called again", call.key, call.name)
        _count(call, "replayed")
        return message

    async def _claim(self, call: _Call) -> bool:
        """Record a side-effect call's start (its intent); whether an earlier start left it in doubt.

        One statement (``intent_claim``: the recorded intent, or this one recorded now), which the
        side-effect calls of one message that start together share. In doubt: an earlier start and no
        result, unless that start paused in ``interrupt()`` (``_mark_paused``: resumed, not in doubt).
        An earlier start with other arguments is another call's: ``HeldByAnotherCall``, nothing recorded.
        """
        if call.name not in self.side_effects:
            return False
        prefetched = _prefetched.get()
        if prefetched is not None and call.key in prefetched.claimed:
            return await self._in_doubt(call, prefetched.claimed[call.key])
        fence = call.fence
        try:
            intent = await call.store.intent_claim(
                call.thread_id,
                call.key,
                call.name,
                call.idempotency_key,
                attempt=fence.attempt,
                run_uid=fence.run_uid,
                args_digest=call.digest,
            )
        except (FencedError, StoreUnavailableError):
            raise
        except Exception as e:
            log.warning(
                "intent claim failed for %s (%s); treating the call as never started and recording its start: %s",
                call.key,
                call.name,
                e,
            )
            await call.store.intent_put(
                call.thread_id,
                call.key,
                call.name,
                call.idempotency_key,
                attempt=fence.attempt,
                run_uid=fence.run_uid,
                args_digest=call.digest,
            )
            return False
        return await self._in_doubt(call, intent)

    async def _in_doubt(self, call: _Call, intent: Intent | None) -> bool:
        """Whether the intent a claim found (``None``: recorded now) leaves the call in doubt."""
        if intent is None:
            return False  # recorded now: the first start
        check_arguments(
            intent.args_digest, call.digest, key=call.key, tool_name=call.name, edited=call.edited, what="intent"
        )
        try:
            paused = await self._entry(call, call.key + PAUSED) is not None
        except StoreUnavailableError:
            raise
        except Exception as e:
            log.warning(
                "pause marker read failed for %s (%s); treating the call as in doubt: %s", call.key, call.name, e
            )
            paused = False
        return not paused

    async def _mark_paused(self, call: _Call) -> None:
        """Record that the call paused in LangGraph ``interrupt()`` (a human answers; on resume it runs on).

        Its intent stays (intents are insert-only), so without this mark the resumed call would look in doubt.
        """
        if call.name not in self.side_effects:
            return
        try:
            await call.store.ledger_put(
                call.thread_id,
                call.key + PAUSED,
                call.name,
                encode({"paused": True}),
                attempt=call.fence.attempt,
                run_uid=call.fence.run_uid,
            )
        except FencedError:
            raise
        except Exception as e:
            log.error(
                "tool call %s (%s) paused for a human but the pause could not be recorded: %s; on resume it is in "
                "doubt and its in-doubt policy applies",
                call.key,
                call.name,
                e,
            )

    def _decide_in_doubt(self, call: _Call) -> ToolMessage | None:
        """The in-doubt policy: ``None`` to run the call again, else the answer to give instead."""
        _count(call, "in_doubt")
        policy = self.in_doubt.get(call.name, "interrupt")
        what = (
            f"tool call {call.key} ({call.name}) started before the previous attempt ended and its outcome is "
            f"unknown (idempotency key {call.idempotency_key})"
        )
        if policy == "retry":
            log.warning("%s; running it again with the same idempotency key (in_doubt='retry')", what)
            return None
        if policy == "report":
            log.warning("%s; reporting it to the model as in doubt, not running it again (in_doubt='report')", what)
            return ToolMessage(
                content=f"In doubt: {what}. It was not run again; check before retrying.",
                name=call.name,
                tool_call_id=call.call_id,
                status="error",
            )
        log.warning("%s; pausing for a human: resume with 'retry' or the call's result (in_doubt='interrupt')", what)
        answer = interrupt(
            {
                "kind": "tool_in_doubt",
                "tool": call.name,
                "tool_call_id": call.call_id,
                "idempotency_key": call.idempotency_key,
                "message": what,
            }
        )
        if answer == "retry":
            return None
        content = answer if isinstance(answer, str) else str(answer)
        return ToolMessage(content=content, name=call.name, tool_call_id=call.call_id)

    async def _record(self, call: _Call, result: ToolMessage | Command[Any]) -> None:
        if not isinstance(result, ToolMessage) or result.status == "error":
            if isinstance(result, Command):
                log.warning(
                    "tool call %s (%s) returned a Command: not recorded, a replay runs it again", call.key, call.name
                )
            return
        try:
            envelope = encode(message_to_dict(result), args=call.digest)
            group = _group.get()
            if group is not None and group.store is call.store and group.thread_id == call.thread_id:
                # Siblings that finish together share one commit (checkpoint.group), fenced the same way.
                recorded = await group.put(LedgerRow(call.key, call.name, envelope))
            else:
                recorded = await call.store.ledger_put(
                    call.thread_id,
                    call.key,
                    call.name,
                    envelope,
                    attempt=call.fence.attempt,
                    run_uid=call.fence.run_uid,
                )
        except FencedError:
            raise
        except Exception as e:
            log.error(
                "tool call %s (%s) COMPLETED but could not be recorded in the ledger: %s; the result goes to the "
                "model and the run continues, but a replay of this step would call it again",
                call.key,
                call.name,
                e,
            )
            _count(call, "unrecorded")
            return
        if not recorded:
            log.warning(
                "tool call %s (%s) COMPLETED but the ledger already held a result, which stays", call.key, call.name
            )
        fault_point("after_ledger_record", call.name)

    def _timeout(self, name: str) -> float | None:
        timeout = self.timeouts.get(name, self.tool_timeout)
        return timeout if timeout is not None and timeout > 0 else None

    def _timed_out(self, call: _Call | None, request: ToolCallRequest, timeout: float) -> ToolMessage:
        name = request.tool_call["name"]
        log.warning("tool %s timed out after %.0fs; the model gets an error message", name, timeout)
        error = NodeTimeoutError(
            f"tool {name} timed out after {timeout:g}s", code=NodeTimeoutError.TOOL, timeout=timeout
        )
        return ToolMessage(
            content=str(error), name=name, tool_call_id=request.tool_call.get("id") or "", status="error"
        )

    # -- the wrappers LangGraph calls ---------------------------------------------------------------

    async def awrap(self, request: ToolCallRequest, execute: AsyncExecute) -> ToolMessage | Command[Any]:
        try:
            return await self._awrap(request, execute)
        except _FATAL as e:
            if (fatal := _fatal.get()) is not None:
                fatal.append(e)
            raise
        finally:
            if (group := _group.get()) is not None:
                group.leave()  # this call records nothing more: its siblings' batch waits no more for it

    async def _awrap(self, request: ToolCallRequest, execute: AsyncExecute) -> ToolMessage | Command[Any]:
        call = self._identify(request)
        deadline = self._timeout(request.tool_call["name"])
        if call is None:
            return await self._run(request, execute, deadline, None)
        try:
            return await self._awrap_call(call, request, execute, deadline)
        except HeldByAnotherCall:
            return await self._awrap_call(_moved(call), request, execute, deadline)

    async def _awrap_call(
        self, call: _Call, request: ToolCallRequest, execute: AsyncExecute, deadline: float | None
    ) -> ToolMessage | Command[Any]:
        """The call under ``call.key``; ``HeldByAnotherCall``, before anything starts, if that key is not its own."""
        if (recorded := await self._lookup(call)) is not None:
            return recorded
        if await self._claim(call) and (answer := self._decide_in_doubt(call)) is not None:
            await self._record(call, answer)
            return answer
        fault_point("before_tool", call.name)
        try:
            result = await self._run(request, execute, deadline, call)
        except GraphInterrupt:
            await self._mark_paused(call)
            raise
        except GraphBubbleUp:
            raise
        except Exception as e:
            _count_raised(call, e)  # not recorded: the next attempt runs it again
            raise
        fault_point("after_tool", call.name)
        _count(call, "executed", result)
        await self._record(call, result)
        return result

    async def _run(
        self, request: ToolCallRequest, execute: AsyncExecute, deadline: float | None, call: _Call | None
    ) -> ToolMessage | Command[Any]:
        token = _idempotency_key.set(None if call is None else call.idempotency_key)
        try:
            async with asyncio.timeout(deadline):
                return await execute(request)
        except TimeoutError:
            assert deadline is not None  # asyncio.timeout(None) never expires
            return self._timed_out(call, request, deadline)
        finally:
            _idempotency_key.reset(token)

    def wrap(self, request: ToolCallRequest, execute: SyncExecute) -> ToolMessage | Command[Any]:
        try:
            return self._wrap(request, execute)
        except _FATAL as e:
            if (fatal := _fatal.get()) is not None:
                fatal.append(e)
            raise

    def _wrap(self, request: ToolCallRequest, execute: SyncExecute) -> ToolMessage | Command[Any]:
        call = self._identify(request)
        if call is None:
            return execute(request)
        try:
            return self._wrap_call(call, request, execute)
        except HeldByAnotherCall:
            return self._wrap_call(_moved(call), request, execute)

    def _wrap_call(self, call: _Call, request: ToolCallRequest, execute: SyncExecute) -> ToolMessage | Command[Any]:
        """``_awrap_call`` for sync graphs: the store on agentrun's blocking loop."""
        if (recorded := blocking.run(lambda: self._lookup(call), caller="ledger lookup")) is not None:
            return recorded
        if (
            blocking.run(lambda: self._claim(call), caller="intent claim")
            and (answer := self._decide_in_doubt(call)) is not None
        ):
            blocking.run(lambda: self._record(call, answer), caller="ledger record")
            return answer
        fault_point("before_tool", call.name)
        token = _idempotency_key.set(call.idempotency_key)
        try:
            result = execute(request)
        except GraphInterrupt:
            blocking.run(lambda: self._mark_paused(call), caller="ledger record")
            raise
        except GraphBubbleUp:
            raise
        except Exception as e:
            _count_raised(call, e)
            raise
        finally:
            _idempotency_key.reset(token)
        fault_point("after_tool", call.name)
        _count(call, "executed", result)
        blocking.run(lambda: self._record(call, result), caller="ledger record")
        return result


class LedgerToolNode(ToolNode):
    """``ToolNode(tools)`` whose completed calls are recorded in agentrun's ledger and replayed from it.

    ``side_effects``: names of tools with side effects (an intent is recorded
    before each call; ``in_doubt`` — a policy per tool name, default
    ``"interrupt"`` — applies when one started but never returned).
    ``timeouts``: seconds per tool name (``None`` or <= 0: none), default
    ``tool_timeout`` (300). Other arguments are ``ToolNode``'s; a
    ``wrap_tool_call``/``awrap_tool_call`` of yours runs inside the ledger
    (a replayed call does not reach it).
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        side_effects: Collection[str] = (),
        in_doubt: Mapping[str, InDoubtPolicy] | None = None,
        timeouts: Mapping[str, float | None] | None = None,
        tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT,
        messages_key: str = "messages",
        **kwargs: Any,
    ) -> None:
        ledger = _Ledger(
            side_effects=side_effects,
            in_doubt=in_doubt or {},
            timeouts=timeouts or {},
            tool_timeout=tool_timeout,
            messages_key=messages_key,
        )
        inner_async = kwargs.pop("awrap_tool_call", None)
        inner_sync = kwargs.pop("wrap_tool_call", None)

        async def awrap(request: ToolCallRequest, execute: AsyncExecute) -> ToolMessage | Command[Any]:
            if (calls := _calls.get()) is not None and (task := asyncio.current_task()) is not None:
                calls.add(task)
            if inner_async is not None:
                return await ledger.awrap(request, lambda r: inner_async(r, execute))
            return await ledger.awrap(request, execute)

        def wrap(request: ToolCallRequest, execute: SyncExecute) -> ToolMessage | Command[Any]:
            if inner_sync is not None:
                return ledger.wrap(request, lambda r: inner_sync(r, execute))
            return ledger.wrap(request, execute)

        super().__init__(tools, messages_key=messages_key, wrap_tool_call=wrap, awrap_tool_call=awrap, **kwargs)
        self.ledger = ledger

    def _ledger_group(self, input: Any, config: RunnableConfig) -> LedgerGroup | None:
        """The group commit of this execution's parallel calls (``checkpoint.group``), as our tool node's.

        ``None`` for a lone call, a store without a window, or another checkpointer (``_identify`` says so).
        Async only: a sync graph runs each call in a thread of its own, and a group belongs to one loop.
        """
        configurable = config.get("configurable") or {}
        saver = configurable.get(_CHECKPOINTER_KEY)
        if not isinstance(saver, AgentrunSaver):
            return None
        try:
            calls = len(self._parse_input(input)[0])
        except Exception:  # ToolNode reports bad input itself
            return None
        window = saver.store.ledger_group_window
        if calls < 2 or window <= 0:
            return None
        fence = saver.fence
        thread_id = str(configurable.get("thread_id"))
        return LedgerGroup(
            saver.store, thread_id, siblings=calls, window=window, attempt=fence.attempt, run_uid=fence.run_uid
        )

    async def _before_calls(self, input: Any, config: RunnableConfig) -> Prefetched | None:
        """The prefetch, and beside it (run as an AgentRun) the run's progress row naming this node.

        The row may be waiting to ride in the next super-step's statement (``run._Mirror``); a tool node
        stores it now, at no wait (the two statements run side by side), so a crash during a side effect
        finds the progress at the node that did it.
        """
        configurable = config.get("configurable") or {}
        saver = configurable.get(_CHECKPOINTER_KEY)
        progress_now = saver.progress_now if isinstance(saver, AgentrunSaver) else None
        if progress_now is None:
            return await self._prefetch(input, config)
        prefetched, _ = await asyncio.gather(
            self._prefetch(input, config), progress_now(str(configurable.get("thread_id")))
        )
        return prefetched

    async def _prefetch(self, input: Any, config: RunnableConfig) -> Prefetched | None:
        """The message's lookups, and its side-effect calls' intent claims, in one round trip before they start.

        What each call would do first on its own (``_lookup``, then ``_claim``), for all of them at once, so
        every tool starts (and finishes) together: one statement instead of a lookup and then a claim. ``None``
        (each call goes to the store itself) without side-effect calls, on a store without it (SQLite), for
        repeated call ids, or when it failed for a reason other than fencing or an outage.
        """
        configurable = config.get("configurable") or {}
        saver = configurable.get(_CHECKPOINTER_KEY)
        lookup_and_claim = getattr(saver.rows, "lookup_and_claim", None) if isinstance(saver, AgentrunSaver) else None
        if saver is None or lookup_and_claim is None:
            return None
        try:
            calls = self._parse_input(input)[0]
        except Exception:  # ToolNode reports bad input itself
            return None
        thread_id = str(configurable.get("thread_id"))
        keys: list[str] = []
        claims: list[Claim] = []
        for c in calls:
            key = ledger_key(_origin_id(input, c.get("id") or "", self.ledger.messages_key), c.get("id"))
            if key is None:
                continue
            keys.append(key)
            if c["name"] in self.ledger.side_effects and c["name"] in self.tools_by_name:
                keys.append(key + PAUSED)
                claims.append(Claim(key, c["name"], idempotency_key(thread_id, key), args_digest(c.get("args") or {})))
        if not claims or len(set(keys)) != len(keys):
            return None
        try:
            prefetched: Prefetched = await lookup_and_claim(thread_id, keys, claims, fence=saver.fence)
        except (FencedError, StoreUnavailableError):
            raise
        except Exception as e:
            log.warning("ledger lookup and intent claim of the message failed (%s); each call asks on its own", e)
            return None
        return prefetched

    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        fatal: list[BaseException] = []
        token = _fatal.set(fatal)
        try:
            result = super()._func(input, config, runtime)
        finally:
            _fatal.reset(token)
        if fatal:
            raise fatal[0]
        return result

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        fatal: list[BaseException] = []
        token = _fatal.set(fatal)
        grouped = _group.set(self._ledger_group(input, config))
        calls: set[asyncio.Task[Any]] = set()
        running = _calls.set(calls)
        try:
            fetched = _prefetched.set(await self._before_calls(input, config))
            try:
                result = await super()._afunc(input, config, runtime)
            except (GraphBubbleUp, Exception):
                await _calls_end(calls)
                raise
            finally:
                _prefetched.reset(fetched)
        finally:
            _calls.reset(running)
            _group.reset(grouped)
            _fatal.reset(token)
        if fatal:
            raise fatal[0]
        return result


async def _calls_end(calls: set[asyncio.Task[Any]]) -> None:
    """Wait for the node's calls still running: one call's interrupt (or error) must not leave them behind.

    Why: ToolNode gathers its calls, and ``asyncio.gather`` raises the first call's ``GraphInterrupt`` while its
    siblings still run. The node's interrupt would then end the turn (the runner exits) with a sibling that
    returned but whose result was not yet recorded: on resume that call looked in doubt (a side effect that
    had in fact completed), or ran again. Waiting lets each record its result first; each is bounded by its
    own deadline. A cancellation (a stop) does not wait: it cancels them.
    """
    others = {task for task in calls if not task.done() and task is not asyncio.current_task()}
    if others:
        await asyncio.wait(others)


__all__ = ["InDoubtPolicy", "LedgerToolNode", "current_idempotency_key", "track"]
