"""A LangChain ``HumanInTheLoopMiddleware`` review (pure): read from the interrupt's payload, the answers it allows
checked before they reach the run, and the run's page offering only the decisions the graph allows.

The cluster tier runs the same review end to end (tests/cluster/test_tool_call_review.py); here each refusal
the middleware would otherwise raise inside the graph (failing the run) is pinned with the words it says.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

from agentrun.checkpoint.pg_history import ThreadRows
from agentrun.history import build
from agentrun_history import hitl, pages

pytestmark = pytest.mark.unit


def review(*calls: tuple[str, dict[str, Any], list[str]]) -> dict[str, Any]:
    """A HITLRequest as the middleware raises it."""
    return {
        "action_requests": [{"name": n, "args": args, "description": f"run {n}?"} for n, args, _ in calls],
        "review_configs": [{"action_name": n, "allowed_decisions": allowed} for n, _, allowed in calls],
    }


CHARGE = ("charge_card", {"order_id": "4812"}, ["approve", "edit", "reject"])
EMAIL = ("send_receipt", {"order_id": "4812"}, ["approve", "reject"])


def test_a_review_is_read_from_its_payload_and_nothing_else_is_taken_for_one() -> None:
    pending = hitl.actions(review(CHARGE))
    assert pending == [
        hitl.Action("charge_card", {"order_id": "4812"}, "run charge_card?", ("approve", "edit", "reject"))
    ]
    # Another interrupt's payload, one the status truncated to text, none, an empty review.
    others: list[Any] = [{"amount": "49.99"}, '{"action_requests": [{"name"…(truncated)', None, True]
    for other in [*others, {"action_requests": [], "review_configs": []}]:
        assert hitl.actions(other) is None, other


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (True, 'this interrupt is a tool call review (LangChain HumanInTheLoopMiddleware): send {"decisions"'),
        ({"decisions": [{"type": "approve"}]}, "2 tool call(s) wait for review (charge_card, send_receipt)"),
        (
            {
                "decisions": [
                    {"type": "approve"},
                    {"type": "edit", "edited_action": {"name": "send_receipt", "args": {}}},
                ]
            },
            'decision 2 (tool call send_receipt): "edit" is not allowed; send_receipt allows approve, reject',
        ),
        (
            {
                "decisions": [
                    {"type": "edit", "edited_action": {"name": "refund_payment", "args": {}}},
                    {"type": "approve"},
                ]
            },
            'an edit keeps the tool ("name": "charge_card")',
        ),
        ({"decisions": [{"type": "edit", "edited_action": {"name": "charge_card"}}, {"type": "approve"}]}, '"args"'),
        ({"decisions": [{"type": "reject", "message": 7}, {"type": "approve"}]}, '"message" is text'),
    ],
)
def test_an_answer_the_middleware_would_fail_the_run_on_is_named(value: Any, says: str) -> None:
    pending = hitl.actions(review(CHARGE, EMAIL))
    assert pending is not None
    why = hitl.problem(pending, value)
    assert why is not None and says in why, why


def test_the_answers_the_review_allows_pass_and_the_cli_builds_them() -> None:
    pending = hitl.actions(review(CHARGE, EMAIL))
    assert pending is not None
    edit = {"type": "edit", "edited_action": {"name": "charge_card", "args": {"order_id": "4821"}}}
    for value in (
        {"decisions": [edit, {"type": "reject", "message": "no receipt"}]},
        {"decisions": [{"type": "reject"}, {"type": "approve"}]},
        hitl.every(pending, "approve"),
    ):
        assert hitl.problem(pending, value) is None, value
    with pytest.raises(ValueError, match="send_receipt does not allow edit"):
        hitl.every(pending, "edit")
    with pytest.raises(ValueError, match="2 tool calls wait for review"):
        hitl.edit(pending, {"order_id": "4821"})
    one = hitl.actions(review(CHARGE))
    assert one is not None and hitl.edit(one, {"order_id": "4821"}) == {"decisions": [edit]}
    only_approve = hitl.actions(review(("charge_card", {}, ["approve"])))
    assert only_approve is not None
    with pytest.raises(ValueError, match="charge_card does not allow an edit"):
        hitl.edit(only_approve, {})


def page_of(payload: dict[str, Any]) -> str:
    """The run's page fragment (as served: escaped) for a run waiting on ``payload``."""
    history = build(ThreadRows(states=[]), namespace="shop", name="r", thread_id="t")
    history.phase = "Interrupted"
    interrupt = {"id": "i-1", "ids": ["i-1"], "message": "", "payload": payload}
    return pages.timeline(history, {"status": {"phase": "Interrupted", "interrupt": interrupt}, "spec": {}})


def test_the_page_shows_the_pending_call_and_only_the_decisions_the_graph_allows() -> None:
    served = page_of(review(CHARGE))
    shown = html.unescape(served)
    assert "<code class=tool>charge_card</code> <span class=allowed>allowed: approve, edit, reject</span>" in shown
    args = re.search(r"<textarea id=edit-args[^>]*>(.*?)</textarea>", shown, re.S)
    assert args and json.loads(args.group(1)) == {"order_id": "4812"}, "Edit starts from the call's own arguments"
    buttons = re.findall(r'<button class="act (\w+)"[^>]*data-hitl="(\w+)"', served)
    assert buttons == [("approve", "approve"), ("edit", "edit"), ("reject", "reject")], buttons
    approve = re.search(r'<button class="act approve"[^>]*data-default="([^"]*)"', served)
    assert approve and json.loads(html.unescape(approve.group(1))) == {"decisions": [{"type": "approve"}]}

    shown = html.unescape(page_of(review(("charge_card", {"order_id": "4812"}, ["approve", "reject"]))))
    assert "edit-args" not in shown and 'class="act edit"' not in shown, "the graph allows no edit: none offered"
    several = html.unescape(page_of(review(CHARGE, EMAIL)))
    field = re.search(r"<textarea id=answer-value[^>]*>(.*?)</textarea>", several, re.S)
    assert field and json.loads(field.group(1)) == {"decisions": [{"type": "approve"}, {"type": "approve"}]}
    assert "allowed: approve, reject" in several and 'class="act edit"' not in several
