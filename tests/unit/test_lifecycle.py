"""The thread life cycle as a table: every status of the latest checkpoint x every kind of input.

The guarantee: input is never silently dropped (new input on an unfinished
run raises) and a paused run is never silently restarted (only the answer to
its interrupts resumes it); a crashed or failed run resumes with ``None``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentrun import Command, ThreadNotFoundError, ThreadStateError, assistant, tool_message, user
from agentrun.checkpoint.base import Checkpoint, RunStatus, Turn
from agentrun.lifecycle import AlreadyDone, AnswerInterrupts, Resume, StartTurn, decide, opening_update
from agentrun.messages import ToolCall

ONE = [{"id": "i1", "payload": None, "message": "", "node": "tools", "tool_call_id": None}]
TWO = [*ONE, {"id": "i2", "payload": None, "message": "", "node": "tools", "tool_call_id": None}]


def thread(status: RunStatus | None, interrupts: list[dict[str, Any]] | None = None) -> Checkpoint | None:
    if status is None:
        return None
    pending = interrupts if interrupts is not None else (ONE if status == "interrupted" else [])
    return Checkpoint("t", 3, {}, [], "tools", 2, status, {"interrupts": pending})


NEW = "hello"
NEW_TURN = "new turn"  # a StartTurn whose update carries the new user message

# status, input, expected action (or the error type and a fragment of its message)
TABLE: list[tuple[RunStatus | None, Any, Any]] = [
    (None, NEW, NEW_TURN),
    (None, None, (ThreadNotFoundError, "does not exist; start it with some input")),
    (None, Command("yes"), (ThreadStateError, "is not waiting on an interrupt (status: no thread)")),
    ("running", NEW, (ThreadStateError, "has an unfinished run (running at node 'tools', step 2)")),
    ("running", None, Resume()),
    ("running", Command("yes"), (ThreadStateError, "is not waiting on an interrupt (status: running)")),
    ("interrupted", NEW, (ThreadStateError, "has an unfinished run (interrupted at node 'tools'")),
    ("interrupted", None, (ThreadStateError, "is paused on interrupt(s) i1: resume it with Command")),
    ("interrupted", Command("yes"), AnswerInterrupts({"i1": "yes"})),
    ("completed", NEW, NEW_TURN),
    ("completed", None, (ThreadStateError, "has no unfinished run to resume (status: completed)")),
    ("completed", Command("yes"), (ThreadStateError, "is not waiting on an interrupt (status: completed)")),
    ("stopped", NEW, NEW_TURN),
    ("stopped", None, (ThreadStateError, "has no unfinished run to resume (status: stopped)")),
    ("stopped", Command("yes"), (ThreadStateError, "is not waiting on an interrupt (status: stopped)")),
    ("failed", NEW, NEW_TURN),
    ("failed", None, Resume()),
    ("failed", Command("yes"), (ThreadStateError, "is not waiting on an interrupt (status: failed)")),
]


@pytest.mark.parametrize(("status", "input", "expected"), TABLE, ids=[f"{s}-{i!r}" for s, i, _ in TABLE])
def test_life_cycle_table(status: RunStatus | None, input: Any, expected: Any) -> None:
    if isinstance(expected, tuple):
        error, fragment = expected
        with pytest.raises(error, match=re.escape(fragment)):
            decide(thread(status), input, thread_id="t")
        return
    action = decide(thread(status), input, thread_id="t")
    if expected == NEW_TURN:
        assert isinstance(action, StartTurn), f"new input on a {status} thread must start a turn, got {action}"
        assert [(m.role, m.content) for m in action.update["messages"]] == [("user", NEW)]
    else:
        assert action == expected


@pytest.mark.parametrize(
    ("input", "update"),
    [
        ({"messages": [user("hi")], "count": 1}, None),  # a dict is the update itself
        (user("hi"), None),
    ],
)
def test_new_input_kinds_become_the_update(input: Any, update: Any) -> None:
    action = decide(thread("completed"), input, thread_id="t")
    assert isinstance(action, StartTurn)
    assert action.update == (input if isinstance(input, dict) else {"messages": [input]})


def test_input_of_another_type_is_refused_after_the_status_check() -> None:
    with pytest.raises(ThreadStateError, match="input must be a dict of channel values, a message or a string"):
        decide(thread("completed"), 42, thread_id="t")
    with pytest.raises(ThreadStateError, match="has an unfinished run"):
        decide(thread("running"), 42, thread_id="t")


@pytest.mark.parametrize(
    ("resume", "expected"),
    [
        ({"i1": "a", "i2": "b"}, AnswerInterrupts({"i1": "a", "i2": "b"})),
        ({"i2": "b"}, AnswerInterrupts({"i2": "b"})),  # answers may come one interrupt at a time
        ("a", (ThreadStateError, "has 2 pending interrupts")),
        ({"other": "a"}, (ThreadStateError, "resume with a mapping")),
    ],
)
def test_several_pending_interrupts_need_a_mapping_by_id(resume: Any, expected: Any) -> None:
    paused = thread("interrupted", TWO)
    if isinstance(expected, tuple):
        with pytest.raises(expected[0], match=re.escape(expected[1])):
            decide(paused, Command(resume), thread_id="t")
    else:
        assert decide(paused, Command(resume), thread_id="t") == expected


def test_a_single_pending_interrupt_takes_a_mapping_value_as_is() -> None:
    """A dict that is not keyed by the pending id is the resume value itself."""
    assert decide(thread("interrupted"), Command({"result": 1}), thread_id="t") == AnswerInterrupts(
        {"i1": {"result": 1}}
    )


def test_a_new_turn_answers_tool_calls_left_without_a_result() -> None:
    request = assistant(tool_calls=[ToolCall(id="c1", name="lookup"), ToolCall(id="c2", name="charge")])
    update = opening_update({"messages": [user("go"), request]}, {"messages": user("next")})
    answers = update["messages"][:2]
    assert [(m.role, m.tool_call_id, m.is_error) for m in answers] == [("tool", "c1", True), ("tool", "c2", True)]
    assert update["messages"][2].content == "next"
    answered = [
        user("go"),
        request,
        tool_message("ok", tool_call_id="c1", name="lookup"),
        tool_message("ok", tool_call_id="c2", name="charge"),
    ]
    next_turn = {"messages": [user("next")]}
    assert opening_update({"messages": answered}, next_turn) is next_turn, "answered calls need no answer"
    assert opening_update({"messages": [user("go"), request]}, {"count": 1}) == {"count": 1}


# -- requests: new input with a request key ---------------------------------------------------------

KEY = "ns/run/abc"


def latest(status: RunStatus, key: str = KEY) -> Checkpoint:
    pending = ONE if status == "interrupted" else []
    return Checkpoint("t", 7, {}, [], "tools", 2, status, {"interrupts": pending, "request_key": key})


def earlier(status: RunStatus) -> Turn:
    return Turn("t", KEY, "uid-1", status, 4, 1.0, 2.0)


ALREADY = "already done"

# where the key's turn is (latest / an earlier one / none), its status, expected action or error
KEYED: list[tuple[str, RunStatus | None, Any]] = [
    ("latest", "running", Resume()),
    ("latest", "failed", Resume()),
    ("latest", "interrupted", (ThreadStateError, "has an unfinished run (interrupted at node 'tools'")),
    ("latest", "completed", AlreadyDone(KEY, "completed", 7)),
    ("latest", "stopped", AlreadyDone(KEY, "stopped", 7)),
    ("earlier", "completed", AlreadyDone(KEY, "completed", 4)),
    ("earlier", "stopped", AlreadyDone(KEY, "stopped", 4)),
    (
        "earlier",
        "failed",
        (ThreadStateError, f"request {KEY!r} on thread 't' is an earlier turn (failed at version 4)"),
    ),
    ("earlier", "running", (ThreadStateError, "is an earlier turn (running at version 4)")),
    ("earlier", "interrupted", (ThreadStateError, "is an earlier turn (interrupted at version 4)")),
    ("none", None, NEW_TURN),
]


@pytest.mark.parametrize(("where", "status", "expected"), KEYED, ids=[f"{w}-{s}" for w, s, _ in KEYED])
def test_request_key_table(where: str, status: RunStatus | None, expected: Any) -> None:
    """Repeating a request repeats its answer: a completed request never runs again, an unfinished one resumes."""
    if where == "latest":
        assert status is not None
        thread_, turn = latest(status), None
    elif where == "earlier":
        assert status is not None
        thread_, turn = latest("completed", key="another"), earlier(status)
    else:
        thread_, turn = latest("completed", key="another"), None
    if isinstance(expected, tuple):
        with pytest.raises(expected[0], match=re.escape(expected[1])):
            decide(thread_, NEW, thread_id="t", request_key=KEY, turn=turn)
        return
    action = decide(thread_, NEW, thread_id="t", request_key=KEY, turn=turn)
    if expected == NEW_TURN:
        assert isinstance(action, StartTurn), f"a request never seen on the thread must start a turn, got {action}"
    else:
        assert action == expected


def test_input_none_and_resume_commands_ignore_the_request_key() -> None:
    with pytest.raises(ThreadStateError, match="is not waiting on an interrupt"):
        decide(latest("completed"), Command("yes"), thread_id="t", request_key=KEY)
    with pytest.raises(ThreadStateError, match="has no unfinished run to resume"):
        decide(latest("completed"), None, thread_id="t", request_key=KEY)
    assert decide(latest("interrupted"), Command("yes"), thread_id="t", request_key=KEY) == AnswerInterrupts(
        {"i1": "yes"}
    )
    assert decide(latest("failed"), None, thread_id="t", request_key=KEY) == Resume()
