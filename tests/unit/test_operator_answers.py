"""An answer its attempt never checkpointed goes on to the next attempt, and never to another interrupt.

The rule of ``decide.answers`` (found by the fault campaign: an attempt SIGKILLed before its first
checkpoint lost the human's answer, and the run waited Interrupted for an answer it had been given).
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.checkpoint.base import Progress
from agentrun_operator.decide.answers import carried_answer

ANSWER = {"values": {"a1": {"approved": True}}}


def _progress(status: str, *ids: str) -> Progress:
    return Progress(
        thread_id="ns/t",
        version=5,
        current_node="tools",
        step=3,
        status=status,  # type: ignore[arg-type]
        updated_at=0.0,
        interrupts=[{"id": i, "message": "approve?"} for i in ids],
    )


@pytest.mark.parametrize(
    ("previous", "progress", "carried"),
    [
        # the attempt died before its first checkpoint: the thread still waits on the answered interrupt
        (ANSWER, _progress("interrupted", "a1"), ANSWER),
        # it checkpointed the answer (running, completed): nothing to carry
        (ANSWER, _progress("running"), None),
        (ANSWER, _progress("completed"), None),
        # the thread now waits on another interrupt: never answered with this one's value
        (ANSWER, _progress("interrupted", "b2"), None),
        (ANSWER, _progress("interrupted", "a1", "b2"), None),
        # no answer, a value without interrupt ids, no progress
        (None, _progress("interrupted", "a1"), None),
        ({"value": True}, _progress("interrupted", "a1"), None),
        (ANSWER, None, None),
    ],
    ids=["unanswered", "running", "completed", "other-interrupt", "more-pending", "none", "bare-value", "no-store"],
)
def test_an_answer_is_carried_only_to_the_interrupts_it_answers(
    previous: dict[str, Any] | None, progress: Progress | None, carried: dict[str, Any] | None
) -> None:
    assert carried_answer(previous, progress) == carried
