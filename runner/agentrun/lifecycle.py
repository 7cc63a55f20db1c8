"""The thread life cycle: from the status of the latest checkpoint and the input, what a call does.

A pure decision (no I/O), the table that ``tests/unit/test_lifecycle.py`` checks row by row
(NotFound: ``ThreadNotFoundError``, StateError: ``ThreadStateError``)::

    status        new input    None         Command(resume=...)
    no thread     StartTurn    NotFound     StateError
    running       StateError   Resume       StateError
    interrupted   StateError   StateError   AnswerInterrupts
    completed     StartTurn    StateError   StateError
    stopped       StartTurn    StateError   StateError
    failed        StartTurn    Resume       StateError

``running`` means a process died mid-run; ``failed`` is resumable. Anything
outside the table raises instead of guessing, so input is never silently
dropped and a paused run is never silently restarted.

With a request key (``RunConfig.request_key``) new input is a *request*, and
repeating a request repeats its answer, not its side effects. The key's turn
is either the thread's latest (its checkpoint's meta ``request_key``) or an
earlier one (``Turn``, from the store)::

    the key's turn     latest turn                 an earlier turn
    none               (the table above)           (the table above)
    running            Resume                      StateError
    interrupted        StateError (as above)       StateError
    completed          AlreadyDone                 AlreadyDone
    stopped            AlreadyDone                 AlreadyDone
    failed             Resume                      StateError

Input ``None`` and ``Command(resume=...)`` ignore the key (they name no new
request). Limit: the key is the identity, not the input: the same key with
different input is the same request, answered as recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checkpoint.base import Checkpoint, RunStatus, Turn
from .errors import ThreadNotFoundError, ThreadStateError
from .interrupts import Command
from .messages import Message, coerce_message, is_langchain_message, tool_message, user
from .state import MESSAGES, last_tool_request


@dataclass(frozen=True)
class StartTurn:
    """New input: apply ``update`` to the thread's state and start a new turn at the entry point."""

    update: dict[str, Any]


@dataclass(frozen=True)
class Resume:
    """Input ``None``: carry on at ``current_node`` of the unfinished run, writing nothing first."""


@dataclass(frozen=True)
class AnswerInterrupts:
    """``Command(resume=...)``: run the interrupted node again with these resume values, by interrupt id."""

    values: dict[str, Any]


@dataclass(frozen=True)
class AlreadyDone:
    """New input with a request key whose turn already ended (completed or stopped): run nothing."""

    request_key: str
    status: RunStatus
    # The state version at which that turn ended.
    version: int


Action = StartTurn | Resume | AnswerInterrupts | AlreadyDone


def decide(
    thread: Checkpoint | None,
    input: Any,
    *,
    thread_id: str,
    request_key: str | None = None,
    turn: Turn | None = None,
) -> Action:
    """What a call with ``input`` does to ``thread`` (its latest checkpoint, ``None`` if it has none).

    ``request_key``: the request this call serves; ``turn``: the store's
    record of that key when it is not the thread's latest turn (the caller
    reads it only then). Raises ``ThreadNotFoundError`` (resuming a thread
    that does not exist) or ``ThreadStateError`` (the input does not fit the
    status, or is not a dict, a message or a string).
    """
    status = thread.status if thread is not None else None
    if request_key and input is not None and not isinstance(input, Command):
        keyed = _decide_request(thread, request_key, turn, thread_id=thread_id)
        if keyed is not None:
            return keyed
    if isinstance(input, Command):
        if thread is None or status != "interrupted":
            raise ThreadStateError(
                f"thread {thread_id!r} is not waiting on an interrupt (status: {status or 'no thread'})"
            )
        return AnswerInterrupts(_resume_values(thread, input, thread_id))
    if input is None:
        if thread is None:
            raise ThreadNotFoundError(f"thread {thread_id!r} does not exist; start it with some input")
        if status == "interrupted":
            ids = ", ".join(i["id"] for i in thread.interrupts)
            raise ThreadStateError(
                f"thread {thread_id!r} is paused on interrupt(s) {ids}: resume it with Command(resume=...)"
            )
        if status in ("completed", "stopped"):
            raise ThreadStateError(
                f"thread {thread_id!r} has no unfinished run to resume (status: {status}); "
                "send new input to start the next turn"
            )
        return Resume()
    if thread is not None and status in ("running", "interrupted"):
        raise ThreadStateError(
            f"thread {thread_id!r} has an unfinished run ({status} at node {thread.current_node!r}, "
            f"step {thread.step}); resume it (input None, or Command(resume=...) when interrupted) "
            "before sending new input"
        )
    return StartTurn(_input_update(input))


def _decide_request(
    thread: Checkpoint | None, key: str, turn: Turn | None, *, thread_id: str
) -> Resume | AlreadyDone | None:
    """The request-key rows of the table; ``None`` where the plain table decides."""
    if thread is not None and thread.meta.get("request_key") == key:
        if thread.status in ("completed", "stopped"):
            return AlreadyDone(key, thread.status, thread.version)
        if thread.status in ("running", "failed"):
            return Resume()
        return None  # interrupted: new input is refused, as for any paused run
    if turn is None:
        return None
    if turn.status in ("completed", "stopped"):
        return AlreadyDone(key, turn.status, turn.version)
    raise ThreadStateError(
        f"request {key!r} on thread {thread_id!r} is an earlier turn ({turn.status} at version {turn.version}) "
        "and the thread has moved on since, so it cannot be resumed; send it again with a new request id"
    )


def opening_update(state: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """The first update of a new turn: ``update``, preceded by answers to tool calls left without one.

    The previous turn may have stopped or failed between a model's tool
    request and its results; chat APIs reject a tool call without a result,
    so the new turn starts by saying why there is none.
    """
    request = last_tool_request(state)
    if request is None or MESSAGES not in update:
        return update
    unanswered = [
        tool_message(
            "Error: not executed: the previous run ended before this call completed",
            tool_call_id=call.id,
            name=call.name,
            is_error=True,
        )
        for call in request.tool_calls
    ]
    return {**update, MESSAGES: [*unanswered, *_as_list(update[MESSAGES])]}


def _resume_values(thread: Checkpoint, command: Command, thread_id: str) -> dict[str, Any]:
    pending = [i["id"] for i in thread.interrupts]
    value = command.resume
    if isinstance(value, dict) and value and set(value) <= set(pending):
        return dict(value)
    if len(pending) == 1:
        return {pending[0]: value}
    raise ThreadStateError(
        f"thread {thread_id!r} has {len(pending)} pending interrupts ({', '.join(pending)}): "
        "resume with a mapping {interrupt_id: value}"
    )


def _input_update(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {MESSAGES: [user(value)]}
    if isinstance(value, Message):
        return {MESSAGES: [value]}
    if isinstance(value, dict):
        return value
    if is_langchain_message(value):  # a graph ported from LangGraph is often called with a HumanMessage
        return {MESSAGES: [coerce_message(value)]}
    raise ThreadStateError(f"input must be a dict of channel values, a message or a string, not {type(value).__name__}")


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


ENDED: tuple[RunStatus, ...] = ("completed", "stopped", "failed")


def check_stoppable(status: RunStatus | None, *, thread_id: str) -> None:
    """Raise unless the thread's latest turn (``status``; None: no thread) is one a stop can belong to.

    A stop request stays in the store until a run acknowledges it: kept for a thread whose turn has
    ended, it would end the thread's NEXT turn at its first node, silently.
    """
    if status is None:
        raise ThreadNotFoundError(f"thread {thread_id!r} does not exist; there is nothing to stop")
    if status in ENDED:
        raise ThreadStateError(
            f"thread {thread_id!r} has no run in progress (status {status}); nothing to stop "
            "(a stop kept for it would end its next turn)"
        )
