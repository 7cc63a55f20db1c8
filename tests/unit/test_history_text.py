"""Bidi and invisible characters in what a run wrote are shown as escapes: the web view and ``kubectl agentrun``.

The attack (issue 31): an interrupt question "Refund to IBAN \\u202e1234 5678 9000 00DE\\u202c - approve?"
with the amount "\\u202e00.0001\\u202c" is drawn by a browser or a terminal as "... IBAN ED00 0009 8765 4321"
and "1000.00". HTML escaping keeps the bidi controls; only showing them as escapes takes their effect away.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import unicodedata
from datetime import UTC, datetime
from typing import Any

import pytest

from agentrun.history import Digest, InterruptRecord, RunHistory, ToolCallRecord
from agentrun_history import pages, text
from agentrun_operator import kubectl_plugin
from agentrun_operator.decide.status import AgentRunStatus

pytestmark = pytest.mark.unit

QUESTION = "Refund to IBAN \u202e1234 5678 9000 00DE\u202c - approve?"
AMOUNT = "\u202e00.0001\u202c"
SMUGGLED = "ok\u200b\U000e0049\U000e0047\U000e004e"  # a zero-width space, then "IGN" in Unicode tag characters
DRAWN = re.compile("[\u202a-\u202e\u2066-\u2069\u200b-\u200f\U000e0000-\U000e007f]")


def test_every_control_format_and_separator_character_is_hidden_and_ordinary_text_is_not() -> None:
    should = [
        chr(point)
        for point in range(sys.maxunicode + 1)
        if unicodedata.category(chr(point)) in ("Cc", "Cf", "Zl", "Zp", "Cs") and chr(point) not in "\t\n"
    ]
    caught = set(text.HIDDEN.findall(" ".join(should)))  # each after a space: no selector run can hide one
    missed = [f"U+{ord(char):04X}" for char in should if char not in caught]
    assert missed == [], f"GUARANTEE BROKEN: hidden characters shown as they are: {missed[:20]}"
    plain = "Grüße, 東京 — refund $1,000,000? שלום\t\n 👍 ❤\ufe0f 👨‍"[:-1]
    assert text.visible(plain) == plain and text.hidden(plain) == []
    # A variation selector right after a character is how it is written; a run of them carries data.
    assert text.visible("❤\ufe0f\ufe01\ufe02") == "❤\ufe0f\\ufe01\\ufe02"
    assert text.visible(QUESTION) == "Refund to IBAN \\u202e1234 5678 9000 00DE\\u202c - approve?"
    assert text.visible(SMUGGLED) == "ok\\u200b\\U000e0049\\U000e0047\\U000e004e"


def test_json_output_escapes_them_and_stays_the_same_json_value() -> None:
    value = {"question": QUESTION, "amount": AMOUNT, "note": SMUGGLED, "nul": "a\x00b", "ok": "Grüße ❤\ufe0f"}
    shown = text.visible_json(json.dumps(value, ensure_ascii=False, indent=2))
    assert not DRAWN.search(shown) and "Grüße ❤\ufe0f" in shown
    assert json.loads(shown) == value, "the escapes are JSON's own: a script reads the same value"


def digest(value: str) -> Digest:
    return Digest(sha256=hashlib.sha256(value.encode()).hexdigest(), bytes=len(value.encode()), preview=value)


def interrupted_run() -> tuple[RunHistory, dict[str, Any]]:
    """A run waiting on the spoofing question, whose tool result hides tag characters."""
    asked = InterruptRecord(
        ids=["r-1"], message=QUESTION, payload=digest(json.dumps({"amount": AMOUNT})), version=3, attempt=1, at=3.0
    )
    fetched = ToolCallRecord(
        name="fetch_page",
        call_id="c1",
        ledger_key="m-ai:c1",
        idempotency_key="ar-1",
        outcome="executed",
        attempt=1,
        arguments=digest("{}"),
        result=digest(SMUGGLED),
    )
    interrupt = {"id": "r-1", "ids": ["r-1"], "message": QUESTION, "payload": {"amount": AMOUNT}}
    status = {"phase": "Interrupted", "interrupt": interrupt}
    history = RunHistory(
        namespace="default",
        name="refund",
        thread_id="default/refund",
        phase="Interrupted",
        status="interrupted",
        tool_calls=[fetched],
        interrupts=[asked],
    )
    return history, {"metadata": {"namespace": "default", "name": "refund"}, "spec": {}, "status": status}


def test_the_web_view_shows_bidi_and_invisible_characters_as_marked_escapes_and_says_so() -> None:
    history, run = interrupted_run()
    html = pages.run_page(history, run, live=True)
    drawn = sorted({f"U+{ord(c):04X}" for c in DRAWN.findall(html)})
    assert drawn == [], f"GUARANTEE BROKEN: the page hands the browser characters it draws invisibly: {drawn}"
    assert "1234 5678 9000 00DE" in html and "00.0001" in html
    marked = '<span class=ctl title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</span>'
    assert marked + "1234 5678 9000 00DE" in html, "the question shows where the override is"
    assert marked + "00.0001" in html, "the payload's amount shows it too"
    assert '<span class=ctl title="U+E0049 TAG LATIN CAPITAL LETTER I">\\U000e0049</span>' in html
    notice = re.search(r"<p class=hidden-chars>(.*?)</p>", html)
    assert (
        notice and "U+202E RIGHT-TO-LEFT OVERRIDE" in notice.group(1) and "U+200B ZERO WIDTH SPACE" in notice.group(1)
    )
    # The approve button carries the question it answers: the id and the digest of what the page shows.
    digest = pages.interrupt_digest(run["status"]["interrupt"])
    assert f'data-interrupt="r-1" data-digest="{digest}"' in html
    question = re.search(r"<p class=question>(.*?)</p>", html)
    assert question and marked + "1234 5678" in question.group(1)


def test_a_clean_page_has_no_notice_and_attributes_never_get_markup() -> None:
    history, run = interrupted_run()
    clean = history.model_copy(update={"interrupts": [], "tool_calls": []})
    run = {**run, "status": {"phase": "Running"}}
    assert "hidden-chars" not in pages.timeline(clean, run)
    listing = pages.run_list([], namespace="a\u202eb", phase=None, now=datetime.now(UTC))
    assert 'value="a\\u202eb"' in listing and not DRAWN.search(listing)


def status_of(message_text: str, payload: Any) -> AgentRunStatus:
    interrupt = {"id": "r-1", "ids": ["r-1"], "message": message_text, "payload": payload}
    return AgentRunStatus.parse({"phase": "Interrupted", "interrupt": interrupt})


def test_kubectl_agentrun_prints_them_as_escapes_and_notes_it_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    kubectl_plugin.say(kubectl_plugin.table([["WAITING"], [kubectl_plugin.waiting_for(status_of(QUESTION, None))]]))
    kubectl_plugin.say(f"answered {kubectl_plugin._question(status_of(QUESTION, {'amount': AMOUNT}))}")
    found = {"namespace": "default", "interrupts": [{"message": QUESTION, "answer": {"preview": SMUGGLED}}]}
    kubectl_plugin.say_json(found)
    kubectl_plugin.note_hidden()
    out, err = capsys.readouterr()
    assert not DRAWN.search(out), f"GUARANTEE BROKEN: the terminal was handed {DRAWN.findall(out)}"
    assert "Refund to IBAN \\u202e1234 5678 9000 00DE\\u202c" in out and '"amount": "\\u202e00.0001\\u202c"' in out
    assert json.loads(out[out.index("{\n") :]) == found, "-o json stays the same JSON value"
    assert err.startswith("note: Values here contained invisible") and "U+202E RIGHT-TO-LEFT OVERRIDE" in err


def test_the_plugins_history_table_keeps_its_columns_aligned_around_escapes() -> None:
    found = {"interrupts": [{"at": 1.0, "attempt": 1, "message": QUESTION, "answer": None}]}
    rows = kubectl_plugin._history_interrupt_rows(found)
    lines = kubectl_plugin.table(rows).splitlines()
    assert lines[1].index("waiting") == lines[0].index("ANSWER"), lines


def test_an_answer_on_the_command_line_names_the_question_when_it_is_not_the_one_waiting() -> None:
    args = argparse.Namespace(id="r-0", all=False)
    with pytest.raises(kubectl_plugin.PluginError) as refused:
        kubectl_plugin._chosen("refund", status_of(QUESTION, {"amount": AMOUNT}), args, "approve")
    said = str(refused.value)
    assert "waits on interrupt(s) r-1, not r-0" in said and QUESTION in said and "nothing was answered" in said


# A row the store could not read, named by its key: the key holds a message id a run wrote (here a hostile one).
UNREADABLE = f"tool_executions row tool_call_id='<img src=x onerror=alert(1)>{AMOUNT}:c1': DataError: bad"


def test_rows_the_store_could_not_read_are_named_in_a_warning_on_the_page_escaped() -> None:
    history, run = interrupted_run()
    html = pages.timeline(history.model_copy(update={"unreadable": [UNREADABLE, "states row version=1: X"]}), run)
    warning = re.search(r"<div class=unreadable role=alert>(.*?)</div>", html)
    assert warning, "GUARANTEE BROKEN: the page does not say that rows of the run could not be read"
    assert "could not read 2 rows" in warning.group(1)
    items = re.findall(r"<li><code>(.*?)</code></li>", warning.group(1))
    marked = '<span class=ctl title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</span>'
    assert items == [
        f"tool_executions row tool_call_id=&#x27;&lt;img src=x onerror=alert(1)&gt;{marked}00.0001"
        '<span class=ctl title="U+202C POP DIRECTIONAL FORMATTING">\\u202c</span>:c1&#x27;: DataError: bad',
        "states row version=1: X",
    ], items
    assert "<img" not in html and not DRAWN.search(html)
    assert html.index("class=unreadable") < html.index("<table class=kv>"), "the warning comes before the summary"
    assert "class=unreadable" not in pages.timeline(history, run), "a history read whole has no warning"


def test_kubectl_agentrun_history_names_the_rows_the_store_could_not_read(capsys: pytest.CaptureFixture[str]) -> None:
    history, _ = interrupted_run()
    found = history.model_copy(update={"unreadable": [UNREADABLE, "messages row idx=7: DataError:\nline 2"]})
    kubectl_plugin.print_history(found.model_dump(mode="json"))
    kubectl_plugin.note_hidden()
    out, err = capsys.readouterr()
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("WARNING:"))
    assert "could not read 2 row(s)" in lines[start] and lines[start] == lines[2], out
    assert lines[start + 1 : start + 3] == [
        "  - tool_executions row tool_call_id='<img src=x onerror=alert(1)>\\u202e00.0001\\u202c:c1': DataError: bad",
        "  - messages row idx=7: DataError: line 2",
    ], out
    assert not DRAWN.search(out) and "U+202E RIGHT-TO-LEFT OVERRIDE" in err
    kubectl_plugin.print_history(history.model_dump(mode="json"))
    assert "WARNING" not in capsys.readouterr().out, "a history read whole has no warning"
