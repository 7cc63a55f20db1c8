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
from agentrun.checkpoint.base import Checkpoint, RunStatus
from agentrun.lifecycle import AnswerInterrupts, Resume, StartTurn, decide, opening_update
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
