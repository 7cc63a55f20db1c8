"""The run inspector's parts of the web view and the CLI (pure): where attempt logs are, a step's diff, escaping."""

from __future__ import annotations

import json
import re

import pytest

from agentrun.checkpoint.pg_history import ThreadRows
from agentrun.history import build, digest
from agentrun.inspector import step
from agentrun_history import pages
from agentrun_operator.kubectl_plugin import print_history

pytestmark = pytest.mark.unit


def _state(version: int, attempt: int) -> dict[str, object]:
    row: dict[str, object] = {"version": version, "current_node": "model", "step": version - 1, "status": "running"}
    row.update(attempt=attempt, run_uid="u", at=float(version))
    row.update(error=None, result=None, stop_reason=None, interrupts=None, resume=None, resume_all=None)
    return row


def test_each_attempts_log_is_named_by_the_command_that_reads_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The store keeps no log: the page and the CLI say where each attempt's is (its pod's)."""
    history = build(ThreadRows(states=[_state(1, 1), _state(2, 2)]), namespace="team-a", name="r", thread_id="t")
    html = pages.timeline(history, {"status": {"phase": "Running"}, "spec": {}})
    assert re.findall(r"<code class=logs>([^<]*)</code>", html) == [
        "kubectl agentrun logs -n team-a r --attempt 1",
        "kubectl agentrun logs -n team-a r --attempt 2",
    ]
    history.deleted = True
    html = pages.timeline(history, {"status": {}, "spec": {}})
    assert "<code class=logs>" not in html and "went with the deleted AgentRun" in html
    history.deleted = False
    print_history(json.loads(history.model_dump_json()))
    assert "logs of attempt N (while its pod exists): kubectl agentrun logs r --attempt N" in capsys.readouterr().out


def test_a_steps_detail_shows_keys_added_changed_and_removed_escaped() -> None:
    def shown(value: object) -> str:
        return digest(value if isinstance(value, str) else json.dumps(value)).model_dump_json()

    row = {"step": 3, "current_node": "tools", "status": "running", "attempt": 1, "at": 5.0}
    found = {
        "rows": {3: row, 4: {**row, "step": 4}},
        "state": {3: {"a": shown("<b>old</b>"), "gone": shown(1)}, 4: {"a": shown("<b>new</b>"), "n": shown(2)}},
        "messages": [],
        "appended": 0,
    }
    detail = step(found, 4)
    assert [(c.key, c.change) for c in detail.changes] == [("a", "changed"), ("gone", "removed"), ("n", "added")]
    html = pages.step_detail(detail)
    assert "&lt;b&gt;new&lt;/b&gt;" in html and "<b>new" not in html, "values are text"
    assert [m for m in re.findall(r"<tr class=change-(\w+)>", html)] == ["changed", "removed", "added"]
    assert "No key of the state changed" in pages.step_detail(step({**found, "state": {3: {}, 4: {}}}, 4))


def test_status_result_says_which_kind_of_answer_it_holds() -> None:
    """``status.result.kind`` (the CRD's enum: message, state) from the turn's result; nothing else passes."""
    from agentrun_operator.decide.identity import result_status

    state = {"message": '{"greeting": "Hello"}', "digest": "sha256:ab", "truncated": False, "kind": "state"}
    assert result_status(state) == {"message": '{"greeting": "Hello"}', "digest": "sha256:ab", "kind": "state"}
    older = result_status({"message": "Done", "digest": "sha256:cd"})
    assert older == {"message": "Done", "digest": "sha256:cd"}, "an older runner's result: no kind"
    odd = result_status({"message": "x", "digest": "sha256:ef", "kind": "<script>"})
    assert odd is not None and "kind" not in odd, "only the CRD's values reach the status (else the patch fails)"
