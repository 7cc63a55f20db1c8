"""The tool node: runs the tool calls of the last assistant message, through the ledger.

For each call: look the ledger up (a hit returns the recorded result and is
logged as a replay); otherwise validate the arguments, record an intent for
tools with side effects, run the tool under its deadline and record the
result the moment it returns, before any sibling or the rest of the node
continues. Several calls run concurrently; each gets a deep copy of the
state and only the fields it changed are merged back (a single call uses the
shared state). Every sibling is awaited; a failure becomes a tool error
message for the model, never a node failure. Failures (the tool raised or
timed out, bad arguments, an unknown tool) and calls found in doubt are
counted in the run's ``ToolCounts``, with the last failure's tool, code and
message (never the arguments); with ``fail_on_tool_error`` the engine then
fails the run (see ``engine``).

A side-effect call whose answer was lost (the tool raised
``ToolOutcomeUnknown``: the connection to its server broke after the request
went out) is in doubt at once, not failed: its in-doubt policy applies in the
same run (retry with the same idempotency key, report, interrupt), as on a
replay. A retry that again gets no answer leaves it in doubt; after
``LOST_RETRIES`` the run pauses for a human.

The node gets the run context (store, config, logger, resume values) as a
parameter from the engine (it is a ``nodes.ContextNode``) and hands each
call's interrupt scope on explicitly; only the tools themselves, user code,
find the scope in a context variable, for their own ``interrupt()``.

Each call's story is in the run's log, one line per event, all starting
``tool <event>:``: ``started`` (the call id, the tool, and the SHA-256 prefix
and size of the arguments' JSON text, never the arguments themselves: the
full digest is the one the run history shows), ``finished`` (executed, with
its duration, and whether it is being recorded), ``replayed`` (answered from
the ledger, not run), ``failed`` (with its duration, or why it never ran).

Limit: a tool that never returns control (a blocking C call in a sync tool
running in a thread) cannot be cancelled by a deadline or a stop; make
tools async, or keep their blocking calls short.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from . import ledger
from .checkpoint.base import Intent
from .checkpoint.group import LedgerGroup
from .constants import END
from .context import CallScope, RunContext, current_scope
from .decorator import tool
from .errors import DeterminismError, FencedError, GraphInterrupt, NodeTimeoutError, StoreUnavailableError, ToolError
from .faults import fault_point
from .interrupts import interrupt_in
from .messages import Message, ToolCall, tool_message, unicode_text
from .metrics import IN_DOUBT, TOOL_CALLS, TOOL_ERRORS, TOOL_TIMEOUTS
from .state import MESSAGES, Replace, changed_fields, copy_value, last_tool_request, snapshot_fields
from .tools import Tool, ToolArgumentError, ToolOutcomeUnknown

# Errors that must end the node rather than become a message for the model. A store that stayed
# unavailable past the retry bound ends the attempt before a tool starts (see ledger.py).
_FATAL = (DeterminismError, FencedError, StoreUnavailableError)
# A side-effect call that lost its answer, under policy "retry": how many more starts with the same key,
# and the pause before each (a stdio server restarts, an HTTP server comes back behind its address).
LOST_RETRIES = 2
LOST_RETRY_DELAY = 1.0


def tools_condition(state: dict[str, Any]) -> str:
    """Conditional edge helper: ``"tools"`` if the last message asks for tools, else ``END``."""
    return "tools" if last_tool_request(state) is not None else END


def _result_message(result: Any, call: ToolCall, tool_name: str, key: str | None) -> Message:
    # unicode_text: a result holding unpaired surrogates would fail every checkpoint of the run (the
    # ledger records it the same way, so a replay shows the same text).
    if isinstance(result, Message):
        update = {"role": "tool", "tool_call_id": call.id, "name": tool_name, "content": unicode_text(result.content)}
        return result.model_copy(update=update)
    content = result if isinstance(result, str) else json.dumps(result, default=str, ensure_ascii=False)
    message = tool_message(unicode_text(content), tool_call_id=call.id, name=tool_name)
    if key is not None:
        # The same id on every replay, so a replayed step produces the identical message.
        message.id = "msg_" + hashlib.sha256(f"result\x00{key}".encode()).hexdigest()[:32]
    return message


class _ToolFailed(Exception):
    """The tool raised or timed out; carries the error text and its code (never recorded in the ledger)."""

    def __init__(self, text: str, *, code: str, reason: str, answered: bool = True) -> None:
        super().__init__(text)
        self.text = text
        self.code = code
        self.reason = reason
        # False when no answer came: the call may have taken effect (lost answer, deadline), or it never
        # reached the tool (connection refused). For a retry of an in-doubt call it stays in doubt then.
        self.answered = answered


# The reason (a metric label) of a call whose answer was lost: ToolOutcomeUnknown.
_LOST = "outcome_unknown"

# The metric label for a tool name the model made up: labels must stay a bounded set.
UNKNOWN_TOOL_LABEL = "<unknown>"
# How much of the arguments' SHA-256 a log line shows: enough to match the run history's full digest.
ARGUMENTS_DIGEST_CHARS = 12


def arguments_digest(call: ToolCall) -> str:
    """``sha256:<prefix> (<n> bytes)`` of the arguments' JSON text as the model wrote it; never the text itself.

    The same text the run history digests (``agentrun.history``), so a log line finds its call there.
    """
    data = call.arguments.encode("utf-8", "surrogatepass")
    return f"sha256:{hashlib.sha256(data).hexdigest()[:ARGUMENTS_DIGEST_CHARS]} ({len(data)} bytes)"


def _error_message(call: ToolCall, text: str, reason: str, *, known: bool = True) -> Message:
    TOOL_ERRORS.labels(call.name if known else UNKNOWN_TOOL_LABEL, reason).inc()
    return tool_message(f"Error: {unicode_text(text)}", tool_call_id=call.id, name=call.name, is_error=True)


def _failed(ctx: RunContext, call: ToolCall, text: str, *, code: str, reason: str, known: bool = True) -> Message:
    """A failed call: counted (``ToolCounts.fail``, the last tool error) and told to the model as an error."""
    ctx.counts.fail(call.name, code, unicode_text(text))  # checkpointed: it must be storable text
    return _error_message(call, text, reason, known=known)


def _ledger_group(ctx: RunContext, calls: int) -> LedgerGroup | None:
    """The group commit of a message's parallel calls (``checkpoint.group``); ``None`` for a lone call or no window."""
    window = ctx.checkpointer.ledger_group_window
    if calls < 2 or window <= 0:
        return None
    return LedgerGroup(
        ctx.checkpointer,
        ctx.thread_id,
        siblings=calls,
        window=window,
        attempt=ctx.config.attempt,
        run_uid=ctx.config.run_uid,
    )


async def _claim_intent(ctx: RunContext, t: Tool, intent_key: str, idem: str | None, digest: str) -> Intent | None:
    """The intent of an earlier start of the call (it is in doubt), else ``None`` with this start recorded.

    One round trip (``intent_claim``). A failure that is not fatal is logged: the call is taken as never
    started, its start recorded on its own if the store allows, and it runs anyway.
    """
    attempt, run_uid = ctx.config.attempt, ctx.config.run_uid
    try:
        return await ctx.checkpointer.intent_claim(
            ctx.thread_id, intent_key, t.name, idem, attempt=attempt, run_uid=run_uid, args_digest=digest
        )
    except (FencedError, StoreUnavailableError):
        raise
    except Exception as e:
        ctx.log.warning(
            "intent lookup failed for %s (%s); assuming the call never started and recording its start", intent_key, e
        )
    try:
        await ctx.checkpointer.intent_put(
            ctx.thread_id, intent_key, t.name, idem, attempt=attempt, run_uid=run_uid, args_digest=digest
        )
    except (FencedError, StoreUnavailableError):
        raise
    except Exception as e:
        ctx.log.error("could not record the intent of %s (%s): %s; running it anyway", intent_key, t.name, e)
    return None


def _validated(ctx: RunContext, t: Tool, call: ToolCall, parsed: dict[str, Any] | None) -> dict[str, Any] | Message:
    """The call's arguments as its tool takes them, or the error message the model gets instead."""
    try:
        return t.validate_arguments(call.parsed_arguments() if parsed is None else parsed)
    except (ValueError, ToolArgumentError) as e:
        # The reason may quote argument values: it goes to the model, not to the log.
        ctx.log.warning(
            "tool failed: call %s (%s) has invalid arguments, %s; not run, the model gets an error",
            call.id,
            t.name,
            arguments_digest(call),
        )
        return _failed(ctx, call, f"{call.name}: {e}", code=ToolError.ARGUMENTS, reason="invalid_arguments")


def _answered_interrupts(ctx: RunContext, scope_name: str) -> int:
    """How many of the scope's ``interrupt()`` calls, in order, already have a resume value."""
    probe = CallScope(name=scope_name)
    answered = 0
    while probe.next_interrupt_id(ctx) in ctx.resume:
        answered += 1
    return answered


class ToolNode:
    """A node that executes tool calls; ``graph.add_node("tools", ToolNode([...]))``.

    The engine calls ``run_with_context``; a ``ToolNode`` is not a plain function of the state.
    """

    def __init__(self, tools: Sequence[Tool | Callable[..., Any]], *, name: str = "tools") -> None:
        self.name = name
        self.tools: dict[str, Tool] = {}
        for item in tools:
            t = item if isinstance(item, Tool) else tool(item)
            self.tools[t.name] = t

    async def run_with_context(self, state: dict[str, Any], ctx: RunContext) -> dict[str, Any] | None:
        """Run the calls of the last assistant message; the update holds their result messages."""
        request = last_tool_request(state)
        if request is None:
            return None
        calls = request.tool_calls
        baseline = snapshot_fields(state)
        if len(calls) == 1:
            branches = [state]
        else:
            branches = [{**copy_value(baseline), MESSAGES: list(state.get(MESSAGES, []))} for _ in calls]
        # A call id that repeats within one message cannot key the ledger: it would hand one call's
        # result to the other (and give their result messages one id). Such calls run without it.
        repeated = {i for i, n in Counter(c.id for c in calls if c.id).items() if n > 1}
        group = _ledger_group(ctx, len(calls))
        outcomes = await asyncio.gather(
            *(
                self._run_sibling(
                    ctx,
                    request.id,
                    call,
                    branch,
                    baseline,
                    position=position,
                    ambiguous=call.id in repeated,
                    group=group,
                )
                for position, (call, branch) in enumerate(zip(calls, branches, strict=True))
            ),
            return_exceptions=True,
        )
        messages: list[Message] = []
        interrupts: list[Any] = []
        for call, outcome in zip(calls, outcomes, strict=True):
            if isinstance(outcome, GraphInterrupt):
                interrupts.extend(outcome.interrupts)
            elif isinstance(outcome, _FATAL):
                raise outcome
            elif isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancellation or stop: the node is ending
                # _run_call turns every tool failure into a message; this is a bug in the tool node itself.
                ctx.log.exception("tool node failed on call %s", call.id, exc_info=outcome)
                text = f"{type(outcome).__name__}: {outcome}"
                known = call.name in self.tools
                messages.append(_failed(ctx, call, text, code=ToolError.RAISED, reason="internal", known=known))
            else:
                messages.append(outcome)
        if interrupts:
            # Siblings that finished are already in the ledger; on resume they replay.
            raise GraphInterrupt(interrupts)
        update: dict[str, Any] = {MESSAGES: messages}
        for branch in branches:
            for key, value in changed_fields(baseline, branch).items():
                if key in update and not isinstance(update[key], Replace):
                    continue
                if key in update:
                    ctx.log.warning("parallel tool calls both changed %r; the later call's value wins", key)
                update[key] = Replace(value)
        return update

    async def _run_sibling(
        self,
        ctx: RunContext,
        origin_id: str | None,
        call: ToolCall,
        state: dict[str, Any],
        baseline: dict[str, Any],
        *,
        position: int,
        ambiguous: bool,
        group: LedgerGroup | None,
    ) -> Message:
        """``_run_call``, then tell the group the call ended (however it ended): its batch waits no more for it."""
        try:
            return await self._run_call(
                ctx, origin_id, call, state, baseline, position=position, ambiguous=ambiguous, group=group
            )
        finally:
            if group is not None:
                group.leave()

    async def _run_call(
        self,
        ctx: RunContext,
        origin_id: str | None,
        call: ToolCall,
        state: dict[str, Any],
        baseline: dict[str, Any],
        *,
        position: int,
        ambiguous: bool = False,
        group: LedgerGroup | None = None,
    ) -> Message:
        key = None if ambiguous else ledger.ledger_key(origin_id, call.id)
        # The interrupt scope must be unique per call and stable across re-runs: without a key, the
        # call's position in the message tells calls apart.
        scope = CallScope(
            name=f"tool:{key}" if key else f"tool:{position}:{call.id or call.name}", tool_call_id=call.id
        )
        t = self.tools.get(call.name)
        if t is None:
            known = ", ".join(sorted(self.tools)) or "none"
            text = f"unknown tool {call.name!r} (available: {known})"
            ctx.log.warning(
                "tool failed: call %s asks for unknown tool %r; not run, the model gets an error", call.id, call.name
            )
            return _failed(ctx, call, text, code=ToolError.UNKNOWN, reason="unknown_tool", known=False)
        try:
            parsed: dict[str, Any] | None = call.parsed_arguments()
        except ValueError:
            parsed = None  # the call is answered with the reason below, once the ledger had its say
        # What tells this call from an edited one under the same key (``ledger``); no key, no ledger, no digest.
        digest = "" if key is None else ledger.args_digest(call.arguments if parsed is None else parsed)

        async def run(key: str | None, *, edited: bool) -> Message:
            return await self._run_keyed(
                ctx,
                t,
                call=call,
                parsed=parsed,
                key=key,
                digest=digest,
                edited=edited,
                origin_id=origin_id,
                ambiguous=ambiguous,
                scope=scope,
                state=state,
                baseline=baseline,
                group=group,
            )

        try:
            return await run(key, edited=False)
        except ledger.HeldByAnotherCall:
            assert key is not None  # raised only by the ledger, which a call without a key skips
            own = ledger.edited_key(key, digest)
            ctx.log.warning(
                "tool call %s (%s): the ledger holds this call with other arguments, so it was edited since (a "
                "changed message in the thread's history); not a replay: it runs as a new call keyed %s, with its "
                "own idempotency key",
                key,
                t.name,
                own,
            )
            return await run(own, edited=True)

    async def _run_keyed(
        self,
        ctx: RunContext,
        t: Tool,
        *,
        call: ToolCall,
        parsed: dict[str, Any] | None,
        key: str | None,
        digest: str,
        edited: bool,
        origin_id: str | None,
        ambiguous: bool,
        scope: CallScope,
        state: dict[str, Any],
        baseline: dict[str, Any],
        group: LedgerGroup | None,
    ) -> Message:
        """The call under ledger key ``key``; ``HeldByAnotherCall``, before anything starts, if it is not its key."""
        replayed = await self._replayed(
            ctx,
            t,
            call=call,
            key=key,
            digest=digest,
            edited=edited,
            origin_id=origin_id,
            ambiguous=ambiguous,
            state=state,
        )
        if replayed is not None:
            return replayed
        arguments = _validated(ctx, t, call, parsed)
        if isinstance(arguments, Message):
            return arguments
        idem = ledger.idempotency_key(ctx.thread_id, key)
        if t.side_effects and key is not None:
            decided = await self._check_intent(
                ctx, scope, t, key=key, idem=idem, digest=digest, edited=edited, call=call, arguments=arguments
            )
            if decided is not None:
                return decided
        fault_point("before_tool", t.name)
        started = time.perf_counter()
        try:
            result = await self._invoke(ctx, scope, t, call=call, arguments=arguments, state=state, idem=idem)
        except _ToolFailed as failed:
            if failed.reason == _LOST and t.side_effects and key is not None:
                return await self._lost(
                    ctx,
                    scope,
                    t,
                    key=key,
                    idem=idem,
                    digest=digest,
                    call=call,
                    arguments=arguments,
                    state=state,
                    baseline=baseline,
                    lost=failed,
                    group=group,
                )
            return _failed(ctx, call, failed.text, code=failed.code, reason=failed.reason)
        return await self._completed(
            ctx,
            t,
            call=call,
            key=key,
            digest=digest,
            result=result,
            state=state,
            baseline=baseline,
            started=started,
            group=group,
        )

    async def _replayed(
        self,
        ctx: RunContext,
        t: Tool,
        *,
        call: ToolCall,
        key: str | None,
        digest: str,
        edited: bool,
        origin_id: str | None,
        ambiguous: bool,
        state: dict[str, Any],
    ) -> Message | None:
        """The call's recorded result from the ledger, or ``None``: not recorded, or no key (said in the log).

        Raises ``HeldByAnotherCall`` when the key's entry was recorded with other arguments (see ``ledger``).
        """
        if key is None:
            if ambiguous:
                ctx.log.warning(
                    "tool call %s: its call id %r appears more than once in the message; the ledger cannot tell "
                    "these calls apart, so it is skipped and the tool runs",
                    call.name,
                    call.id,
                )
            else:
                ctx.log.warning(
                    "tool call %s has no %s; the ledger is skipped and the tool runs",
                    call.name,
                    "message id" if not origin_id else "call id",
                )
            return None
        recorded = await ledger.lookup(ctx, key, t, args=digest, edited=edited)
        if not isinstance(recorded, ledger.Recorded):
            return None
        ctx.counts.replayed += 1
        TOOL_CALLS.labels(t.name, "replayed").inc()
        ctx.log.info("tool replayed: %s (%s) from the ledger; not executed again", key, t.name)
        state.update(copy_value(recorded.state))  # the channels the call changed, as it changed them
        return _result_message(recorded.result, call, t.name, key)

    async def _completed(
        self,
        ctx: RunContext,
        t: Tool,
        *,
        call: ToolCall,
        key: str | None,
        digest: str,
        result: Any,
        state: dict[str, Any],
        baseline: dict[str, Any],
        started: float,
        group: LedgerGroup | None = None,
    ) -> Message:
        """A call that returned: counted, logged, recorded in the ledger before anything else continues.

        With ``group``, the record shares a commit with siblings that finish within its window.
        """
        ctx.counts.executed += 1
        TOOL_CALLS.labels(t.name, "executed").inc()
        ctx.log.info(
            "tool finished: executed %s (%s) in %.3fs%s",
            key or f"call {call.id}",
            t.name,
            time.perf_counter() - started,
            "; recording it in the ledger" if key is not None else "; no ledger key, a replay would run it again",
        )
        fault_point("after_tool", t.name)
        if key is not None:
            await ledger.record(ctx, key, t.name, result, changed_fields(baseline, state), args=digest, group=group)
            fault_point("after_ledger_record", t.name)
        return _result_message(result, call, t.name, key)

    async def _lost(
        self,
        ctx: RunContext,
        scope: CallScope,
        t: Tool,
        *,
        key: str,
        idem: str | None,
        digest: str,
        call: ToolCall,
        arguments: dict[str, Any],
        state: dict[str, Any],
        baseline: dict[str, Any],
        lost: _ToolFailed,
        group: LedgerGroup | None = None,
    ) -> Message:
        """A side-effect call that lost its answer: in doubt now, under its policy (see the module docstring).

        Its intent is recorded, so a crash from here on finds it in doubt on replay just the same.
        """
        IN_DOUBT.labels(t.name, t.in_doubt).inc()
        ctx.counts.in_doubt += 1
        resumes = _answered_interrupts(ctx, scope.name)
        intent_key = key if resumes == 0 else f"{key}#resume{resumes}"
        if t.in_doubt == "report":
            ctx.log.warning("%s (%s) is in doubt (%s); not retried, reported to the model", key, t.name, lost.text)
            return _error_message(
                call,
                f"{t.name} was sent but its outcome is unknown ({lost.text}); it was not retried. "
                f"Idempotency key: {idem}",
                "in_doubt",
            )
        if t.in_doubt == "retry":
            for attempt in range(1, LOST_RETRIES + 1):
                ctx.log.warning(
                    "%s (%s) is in doubt (%s); retrying with the same idempotency key in %gs (%d of %d)",
                    key,
                    t.name,
                    lost.text,
                    LOST_RETRY_DELAY,
                    attempt,
                    LOST_RETRIES,
                )
                await asyncio.sleep(LOST_RETRY_DELAY)
                started = time.perf_counter()
                try:
                    result = await self._invoke(ctx, scope, t, call=call, arguments=arguments, state=state, idem=idem)
                except _ToolFailed as again:
                    if again.answered:  # the tool answered this time, with an error: that is its outcome
                        return _failed(ctx, call, again.text, code=again.code, reason=again.reason)
                    lost = again
                    continue
                return await self._completed(
                    ctx,
                    t,
                    call=call,
                    key=key,
                    digest=digest,
                    result=result,
                    state=state,
                    baseline=baseline,
                    started=started,
                    group=group,
                )
            ctx.log.warning(
                "%s (%s) is still in doubt after %d retries; pausing the run for a human", key, t.name, LOST_RETRIES
            )
        # The in-doubt scope of _check_intent, past the answers it already has: the resumed node finds the
        # intent, and _check_intent takes this pause's answer (the latest) as its decision.
        name = f"in-doubt:{intent_key}"
        interrupt_in(
            ctx,
            CallScope(name=name, counter=_answered_interrupts(ctx, name), tool_call_id=call.id),
            {"reason": "in_doubt", "tool": t.name, "arguments": arguments, "idempotency_key": idem, "error": lost.text},
            message=f'{t.name} was sent but its outcome is unknown; resume with "retry" or {{"result": ...}}',
        )
        raise AssertionError("an in-doubt pause past every answer cannot have an answer")

    async def _check_intent(
        self,
        ctx: RunContext,
        scope: CallScope,
        t: Tool,
        *,
        key: str,
        idem: str | None,
        digest: str,
        edited: bool,
        call: ToolCall,
        arguments: dict[str, Any],
    ) -> Message | None:
        """Apply the in-doubt policy if a previous start of this call has no outcome; else record the intent.

        Each start of a call has its own intent: the first one, and one after
        each resume of an ``interrupt()`` inside the tool. A start that paused
        at the tool's own ``interrupt()`` stopped at a known point (code before
        ``interrupt()`` must have no side effects), so it is not in doubt; a
        start that began after a resume and left no result is.
        """
        resumes = _answered_interrupts(ctx, scope.name)
        intent_key = key if resumes == 0 else f"{key}#resume{resumes}"
        earlier = await _claim_intent(ctx, t, intent_key, idem, digest)
        if earlier is None:
            return None
        # A start with other arguments is another call's: HeldByAnotherCall, before this one starts.
        ledger.check_arguments(
            earlier.args_digest, digest, key=intent_key, tool_name=t.name, edited=edited, what="intent"
        )
        IN_DOUBT.labels(t.name, t.in_doubt).inc()
        ctx.counts.in_doubt += 1
        # The run may have paused on this call before (policy interrupt, or retries that got no answer in
        # _lost): a human's answer, the latest if there are several, decides whatever the policy.
        doubt = f"in-doubt:{intent_key}"
        answered = _answered_interrupts(ctx, doubt)
        if t.in_doubt == "retry" and not answered:
            ctx.log.warning(
                "%s (%s) started before but its outcome was not recorded; retrying with the same idempotency key",
                key,
                t.name,
            )
            return None
        if t.in_doubt == "report" and not answered:
            ctx.log.warning("%s (%s) is in doubt; not retried, reported to the model", key, t.name)
            return _error_message(
                call,
                f"{t.name} was started earlier but its outcome is unknown (the process stopped before the "
                f"result was recorded); it was not retried. Idempotency key: {idem}",
                "in_doubt",
            )
        # A scope of its own: the decision must never take the answer meant for an interrupt() of the tool.
        decision = interrupt_in(
            ctx,
            CallScope(name=doubt, counter=max(answered - 1, 0), tool_call_id=call.id),
            {"reason": "in_doubt", "tool": t.name, "arguments": arguments, "idempotency_key": idem},
            message=f'{t.name} started but its outcome is unknown; resume with "retry" or {{"result": ...}}',
        )
        if decision == "retry":
            return None
        if isinstance(decision, dict) and "result" in decision:
            ctx.log.info("%s (%s) resolved by a human; recording the given result", key, t.name)
            await ledger.record(ctx, key, t.name, decision["result"], args=digest)
            return _result_message(decision["result"], call, t.name, key)
        return _error_message(
            call, f"in-doubt call {t.name} was not resolved (resume value {decision!r} is not understood)", "in_doubt"
        )

    async def _invoke(
        self,
        ctx: RunContext,
        scope: CallScope,
        t: Tool,
        *,
        call: ToolCall,
        arguments: dict[str, Any],
        state: dict[str, Any],
        idem: str | None,
    ) -> Any:
        """Start the tool once under its deadline: its result, or ``_ToolFailed``; logs the start and any failure."""
        timeout = ctx.config.tool_timeout if t.timeout is None else (t.timeout if t.timeout > 0 else None)
        deadline = asyncio.timeout(timeout)
        if ctx.log.isEnabledFor(logging.INFO):  # the digest reads the whole arguments text: only when it is shown
            ctx.log.info("tool started: call %s (%s), arguments %s", call.id, t.name, arguments_digest(call))
        started = time.perf_counter()
        # The tool is user code: its own interrupt() finds the call's scope only in the context variable.
        token = current_scope.set(scope)
        try:
            async with deadline:
                return await t.ainvoke(arguments, state=state, idempotency_key=idem)
        except TimeoutError as e:
            if not deadline.expired():  # the tool's own TimeoutError (e.g. an HTTP client's): a tool error
                _log_failed(ctx, t, call, e, started)
                raise _ToolFailed(f"{type(e).__name__}: {e}", code=ToolError.RAISED, reason="exception") from e
            TOOL_TIMEOUTS.labels(t.name).inc()
            err = NodeTimeoutError(
                f"tool {t.name} did not finish within {timeout:g}s", code=NodeTimeoutError.TOOL, timeout=timeout or 0
            )
            ctx.log.warning("tool failed: call %s (%s) after %.3fs: %s", call.id, t.name, _since(started), err)
            raise _ToolFailed(str(err), code=NodeTimeoutError.TOOL, reason="timeout", answered=False) from None
        except GraphInterrupt:
            ctx.log.info(
                "tool paused: call %s (%s) asked a human after %.3fs; it starts again when the run is resumed",
                call.id,
                t.name,
                _since(started),
            )
            raise
        except asyncio.CancelledError:
            ctx.log.info("tool cancelled: call %s (%s) after %.3fs, with its node", call.id, t.name, _since(started))
            raise
        except ToolOutcomeUnknown as e:
            _log_failed(ctx, t, call, e, started, verb="lost its answer")
            text = f"{type(e).__name__}: {e}"
            raise _ToolFailed(text, code=ToolError.RAISED, reason=_LOST, answered=False) from e
        except ConnectionError as e:  # it never reached its server: no outcome, nothing happened there
            _log_failed(ctx, t, call, e, started)
            text = f"{type(e).__name__}: {e}"
            raise _ToolFailed(text, code=ToolError.RAISED, reason="exception", answered=False) from e
        except Exception as e:
            _log_failed(ctx, t, call, e, started)
            raise _ToolFailed(f"{type(e).__name__}: {e}", code=ToolError.RAISED, reason="exception") from e
        finally:
            current_scope.reset(token)


# A tool's exception text may quote what it was given: a log line keeps this much of it.
LOGGED_ERROR_CHARS = 500


def _since(started: float) -> float:
    return time.perf_counter() - started


def _log_failed(
    ctx: RunContext, t: Tool, call: ToolCall, error: BaseException, started: float, *, verb: str = "raised"
) -> None:
    text = str(error)
    if len(text) > LOGGED_ERROR_CHARS:
        text = text[:LOGGED_ERROR_CHARS] + "…"
    ctx.log.warning(
        "tool failed: call %s (%s) %s %s after %.3fs: %s",
        call.id,
        t.name,
        verb,
        type(error).__name__,
        _since(started),
        text,
    )
