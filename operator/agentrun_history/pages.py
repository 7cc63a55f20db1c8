"""The web view, rendered on the server: every value that came from a graph, a tool or a user is escaped.

Nothing here is trusted HTML but the literal markup of this module: tool
arguments and results, interrupt payloads, messages, names and reasons all
go through ``e()`` (``html.escape`` with quotes), so ``<script>`` in a tool's
output shows as text. The pages load one script (``/static/app.js``, no
inline script: the Content-Security-Policy forbids it) that follows the
server-sent events and posts the buttons.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from agentrun.history import Digest, RunHistory, ToolCallRecord
from agentrun.inspector import ChatMessage, Conversation, GraphShape, StepDetail
from agentrun_operator.decide import jobparity, toolerrors
from agentrun_operator.decide.reasons import TERMINAL as TERMINAL  # re-exported: server.py asks pages.TERMINAL
from agentrun_operator.decide.reasons import Phase
from agentrun_operator.decide.status import AgentRunStatus

from . import hitl, listing, text

# The operator's phases (decide/reasons.py), offered by the list's filter in their order.
PHASES = tuple(Phase)
SHORT_BYTES = 120


def e(value: Any) -> str:
    """``value`` escaped for HTML text (``None`` as nothing); each hidden character (``text.HIDDEN``: bidi
    controls, zero-width and control characters) shown as its escape in a ``<span class=ctl>`` naming it."""
    raw = "" if value is None else str(value)
    out, at = [], 0
    for match in text.HIDDEN.finditer(raw):
        char = match.group()
        out.append(html.escape(raw[at : match.start()], quote=True))
        out.append(f'<span class=ctl title="{html.escape(text.describe(char))}">{text.escape(char)}</span>')
        at = match.end()
    out.append(html.escape(raw[at:], quote=True))
    return "".join(out)


def a(value: Any) -> str:
    """``value`` escaped for an HTML attribute (``None`` as nothing); hidden characters as plain escapes."""
    return html.escape(text.visible("" if value is None else str(value)), quote=True)


CTL = re.compile(r'<span class=ctl title="([^"]*)">')


def flagged(markup: str) -> str:
    """``markup`` after a notice naming the hidden characters ``e()`` marked in it (unchanged when none).

    Only ``e()`` writes ``<span class=ctl``: a value's own ``<`` is escaped, so the marks are found reliably."""
    names = list(dict.fromkeys(CTL.findall(markup)))
    if not names:
        return markup
    listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return (
        f"<p class=hidden-chars>Values on this page contained invisible or bidirectional control characters "
        f"({listed}). Each is shown as its escape, <span class=ctl>marked like this</span>: read those values as "
        f"written, not as a browser would draw them.</p>{markup}"
    )


def when(moment: float | None) -> str:
    """A Unix time as UTC ``YYYY-MM-DD HH:MM:SS``, or ``-``."""
    if moment is None:
        return "-"
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    """A duration in ms below a second, in seconds above, or ``-``."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def run_url(namespace: str, name: str, suffix: str = "") -> str:
    """The web view's URL of a run (``suffix``: one of its sub-pages)."""
    return f"/runs/{quote(namespace, safe='')}/{quote(name, safe='')}{suffix}"


def page(title: str, body: str, *, user_hint: str = "") -> str:
    """A whole HTML page: the shared head (the static styles and script), ``body``, the signed-in hint."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{a(title)} · agentrun</title>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        '<link rel=stylesheet href="/static/app.css"><script src="/static/app.js" defer></script></head>'
        f'<body><header><a class=brand href="/runs">agentrun</a><span class=sub>run history</span>'
        f"<span class=who>{e(user_hint)}</span></header><main>{body}</main></body></html>"
    )


def error_page(status: int, title: str, detail: str) -> str:
    """The page of an error the caller sees (no stack trace, no store detail beyond ``detail``)."""
    return page(title, f'<section class="error"><h1>{status} · {e(title)}</h1><p>{e(detail)}</p></section>')


def login_page(message: str = "") -> str:
    """The token sign-in form (``--token-login``), with ``message`` after a failed attempt."""
    note = f"<p class=error>{e(message)}</p>" if message else ""
    return page(
        "Sign in",
        "<section class=login><h1>Sign in with a Kubernetes token</h1>"
        "<p>Paste a bearer token the API server accepts (e.g. <code>kubectl create token NAME</code>); "
        "it stays in an HttpOnly cookie and every request is authorized as that identity.</p>"
        f"{note}<form method=post action=/login><input type=password name=token autocomplete=off required>"
        "<button type=submit>Sign in</button></form></section>",
    )


def badge(phase: str | None) -> str:
    """A run's phase as a coloured badge."""
    phase = phase or "Pending"
    return f'<span class="badge phase-{a(phase.lower())}">{e(phase)}</span>'


def phase_badge(phase: str | None, calls: dict[str, Any] | None) -> str:
    """The phase badge and, when tool calls failed, a warning beside it: "Succeeded" "with 3 failed tool calls".

    A warning, not another phase: the model got each error and the run finished (``toolerrors``)."""
    failures = toolerrors.failure_words(calls)
    if not failures:
        return badge(phase)
    why = "the model got each error and the run went on; spec.config.failOnToolError: true fails such a run"
    return f'{badge(phase)} <span class="badge warn" title="{a(why)}">with {e(failures)}</span>'


def run_list(
    items: Sequence[dict[str, Any]],
    *,
    namespace: str | None,
    phase: str | None,
    search: str | None = None,
    within: str | None = None,
    page_at: tuple[int, int, int] | None = None,
    note: str = "",
    now: datetime,
) -> str:
    """The list: ``items`` (``listing`` entries, one page of them), the filters that chose them, the pager.

    ``page_at``: (page, pages, total) of the whole choice; without it ``items`` is all of it."""
    options = "".join(
        f'<option value="{a(p)}"{" selected" if p == phase else ""}>{e(p)}</option>'
        for p in ("", *PHASES, listing.DELETED)
    )
    form = (
        '<form class=filters method=get action="/runs">'
        f'<label>Namespace <input name=namespace value="{a(namespace or "")}" placeholder="all namespaces"></label>'
        f'<label>Search <input name=q value="{a(search or "")}" placeholder="name, graph or thread"></label>'
        f"<label>Phase <select name=phase>{options}</select></label>"
        f"<label>Created <select name=within>{_within_options(within)}</select></label>"
        "<button type=submit>Filter</button></form>"
    )
    rows = "".join(_list_row(item, now) for item in items)
    table = (
        "<table class=runs><thead><tr><th>Namespace</th><th>Name</th><th>Phase</th><th>Node</th><th>Version</th>"
        "<th>Attempt</th><th>Tool calls</th><th>Graph</th><th>Thread</th><th>Age</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if rows
        else "<p class=empty>No AgentRuns here that you may see"
        + (" match these filters." if search or phase or within else ".")
        + "</p>"
    )
    at, pages, total = page_at or (1, 1, len(items))
    filters = {"namespace": namespace, "q": search, "phase": phase, "within": within}
    pager = _pager(filters, at, pages, total, len(items))
    notice = f"<p class=note>{e(note)}</p>" if note else ""
    # The live list: app.js follows /runs/events and swaps this part for the same part of the page read again.
    events = "/runs/events" + query(namespace=namespace)
    return page(
        "Runs",
        f'<h1>AgentRuns</h1>{form}<div id=runs-table data-events="{a(events)}">{notice}{pager}{flagged(table)}</div>',
    )


def _list_row(item: dict[str, Any], now: datetime) -> str:
    """One run of the list; a deleted one marked, with what the store last recorded of its turn."""
    link = f'<a class=run href="{a(run_url(item["namespace"], item["name"]))}">{e(item["name"])}</a>'
    if item["deleted"]:
        why = "the AgentRun was deleted: its history stays in the store"
        phase = f'<span class="badge phase-deleted" title="{a(why)}">Deleted</span> {e(item["storeStatus"] or "")}'
    else:
        phase = phase_badge(item["phase"], item["toolCalls"])
    cells = (
        e(item["currentNode"] or "-"),
        e("-" if item["stateVersion"] is None else item["stateVersion"]),
        e("-" if item["attempt"] is None else item["attempt"]),
    )
    return (
        f'<tr class="{"deleted" if item["deleted"] else "run"}"><td>{e(item["namespace"])}</td><td>{link}</td>'
        f"<td>{phase}</td>" + "".join(f"<td>{c}</td>" for c in cells) + f"<td class=tools>"
        f"{e(item['tools'] if item['toolCalls'] else '-')}</td><td>{e(item['graph'] or '-')}</td>"
        f"<td>{e(item['threadId'] or '-')}</td><td>{e(_age(item['created'], now))}</td></tr>"
    )


def _within_options(within: str | None) -> str:
    words = {"": "any time", "1h": "last hour", "24h": "last day", "7d": "last week", "30d": "last 30 days"}
    return "".join(
        f'<option value="{a(key)}"{" selected" if key == (within or "") else ""}>{e(word)}</option>'
        for key, word in words.items()
    )


def _pager(filters: dict[str, str | None], at: int, pages: int, total: int, shown: int) -> str:
    """ "Runs 51-100 of 120, newest first" with links to the newer and older pages (the filters kept)."""
    if total == 0:
        return ""
    first = (at - 1) * listing.PAGE_SIZE + 1
    links = []
    for label, to in (("← newer", at - 1), ("older →", at + 1)):
        if 1 <= to <= pages:
            href = "/runs" + query(**filters, page=str(to))
            links.append(f'<a class=page href="{a(href)}">{e(label)}</a>')
    return (
        f"<p class=pager>Runs {first}-{first + shown - 1} of {total}, newest first"
        + (f" · page {at} of {pages} · " + " ".join(links) if pages > 1 else "")
        + "</p>"
    )


def _age(stamp: str | None, now: datetime) -> str:
    if not stamp:
        return "-"
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    secs = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _digest(value: Digest | None, *, label: str) -> str:
    if value is None:
        return "-"
    if value.bytes <= SHORT_BYTES and "\n" not in value.preview:  # short: shown as is
        return f'<code class="{a(label)}" title="sha256 {a(value.sha256)}">{e(value.preview)}</code>'
    cut = " (preview cut)" if value.truncated else ""
    return (
        f"<details><summary><code>{e(value.sha256[:12])}</code> {e(value.bytes)} B{e(cut)}</summary>"
        f'<pre class="{a(label)}">{e(value.preview)}</pre></details>'
    )


def run_page(history: RunHistory, run: dict[str, Any], *, live: bool, talk: Conversation | None = None) -> str:
    """One run's page: status, attempts, tool calls, interrupts (with answer and stop buttons when ``live``), the
    conversation (``talk``), steps (each opened on demand: its state and what it changed)."""
    title = f"{history.namespace}/{history.name}"
    body = (
        f'<div id=run data-events="{a(run_url(history.namespace, history.name, "/events"))}" '
        f'data-timeline="{a(run_url(history.namespace, history.name, "/timeline"))}" '
        f'data-live="{"1" if live else "0"}">'
        f"{timeline(history, run, talk=talk)}</div>"
    )
    return page(title, f'<p><a href="/runs?namespace={a(quote(history.namespace, safe=""))}">← runs</a></p>{body}')


def timeline(history: RunHistory, run: dict[str, Any], *, talk: Conversation | None = None) -> str:
    """The part of a run's page that a live update replaces."""
    status = run.get("status") or {}
    spec = run.get("spec") or {}
    parts = [_summary(history, status, spec), _actions(history, status, spec)]
    parts.append(_interrupts(history, status))
    parts.append(_attempts(history))
    parts.append(_tool_calls(history))
    parts.append(graph_picture(talk.graph if talk else None, history.current_node))
    parts.append(conversation(talk))
    parts.append(_steps(history))
    return flagged("".join(parts))


def _tool_counts(history: RunHistory, status: dict[str, Any]) -> dict[str, Any]:
    """The history's counts (``RunHistory.tool_counts``: counted as ``status.toolCalls`` is, from the records the
    calls and attempts tables below show, so the summary cannot disagree with them); ``status.toolCalls`` when the
    store holds nothing of the run."""
    if history.recorded:
        return dict(history.tool_counts)
    return dict(status.get("toolCalls") or {})


def _tool_warning(history: RunHistory, status: dict[str, Any], calls: dict[str, Any]) -> str:
    """A warning above the summary when tool calls failed, with the last error (condition ``ToolErrors``)."""
    failures = toolerrors.failure_words(calls)
    if not failures:
        return ""
    last: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == toolerrors.CONDITION), {}
    )
    said = f" {last['message']}." if last.get("message") else ""
    phase = "Deleted" if history.deleted else (history.phase or "Pending")
    return (
        f"<p class=warning role=status><strong>{e(phase)} with {e(failures)}.</strong>{e(said)} The model got "
        "each error as the tool's answer and the run went on; <code>spec.config.failOnToolError: true</code> "
        "fails such a run instead.</p>"
    )


def _summary(history: RunHistory, status: dict[str, Any], spec: dict[str, Any]) -> str:
    calls = _tool_counts(history, status)
    rows = [
        *([("AgentRun", "deleted: this is what the store kept of it")] if history.deleted else []),
        ("Graph", history.graph),
        ("Thread", history.thread_id),
        (
            "Node / step / version",
            f"{history.current_node or '-'} / "
            f"{history.steps[-1].step if history.steps else '-'} / {history.version or '-'}",
        ),
        ("Store status", history.status or "nothing recorded yet"),
        (
            "Attempts",
            f"{len(history.attempts)} (restarts {status.get('restarts', 0)}, "
            f"disruptions {status.get('disruptions', 0)})",
        ),
        (
            "Tool calls",
            f"executed {calls.get('executed', 0)}, replayed {calls.get('replayed', 0)}, "
            f"in doubt {calls.get('inDoubt', 0)}, failed {calls.get('failed', 0)}",
        ),
    ]
    if history.reason or history.message:
        rows.append(("Reason", ": ".join(x for x in (history.reason, history.message) if x)))
    if history.stop is not None:
        rows.append(("Stop requested", f"{when(history.stop.requested_at)} {history.stop.reason}"))
    if history.error:
        rows.append(("Error", json.dumps(history.error, ensure_ascii=False)[:2000]))
    result = _result(history)
    cells = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    return (
        f"<section class=summary><h1><span class=ns>{e(history.namespace)}/</span>{e(history.name)} "
        f"<span id=phase>{badge('Deleted') if history.deleted else phase_badge(history.phase, calls)}</span></h1>"
        f"{_unreadable(history)}{_tool_warning(history, status, calls)}"
        f"<table class=kv>{cells}</table>{result}</section>"
    )


def _result(history: RunHistory) -> str:
    """The run's answer (``agentrun.result``): the last assistant message, or the final state's values."""
    if history.result is None:
        return ""
    found = history.result
    what = "the final state's values" if history.result_kind == "state" else "the last assistant message"
    cut = f", the first {len(found.preview)} characters" if found.truncated else ""
    return (
        f"<h3>Result <span class=note>({e(what)}{e(cut)}; sha256 <code>{e(found.sha256[:16])}</code>)</span></h3>"
        f'<pre class="result result-{a(history.result_kind or "message")}">{e(found.preview)}</pre>'
    )


def _unreadable(history: RunHistory) -> str:
    """A warning naming the rows the store could not read (``RunHistory.unreadable``), or nothing.

    Placed above the summary: a reader must not take a history with rows missing for a whole one. Each note
    names the row by its key, which a run wrote (a message id, a call id), so it is escaped like any value."""
    if not history.unreadable:
        return ""
    count = len(history.unreadable)
    rows = "".join(f"<li><code>{e(note)}</code></li>" for note in history.unreadable)
    return (
        f"<div class=unreadable role=alert><p><strong>The store could not read {count} "
        f"row{'s' if count != 1 else ''} of this run.</strong> Each is shown only as far as its stored text "
        "goes (a tool call's result as stored, a checkpoint without its interrupts or error) or, for a message, "
        f"left out; everything else on this page is as recorded.</p><ul>{rows}</ul></div>"
    )


def pending_ids(interrupt: dict[str, Any]) -> list[str]:
    """The ids of the interrupts ``status.interrupt`` says the run waits on."""
    return [str(i) for i in interrupt.get("ids") or [interrupt.get("id")] if i]


def interrupt_digest(interrupt: dict[str, Any]) -> str:
    """The sha256 of ``status.interrupt`` as shown (ids, question, payload): what an answer says it saw.

    The id alone names the question; the digest also pins its text and payload, so an answer is never
    applied to a question that reads differently from the one on the person's screen."""
    seen = {"ids": pending_ids(interrupt), "message": interrupt.get("message"), "payload": interrupt.get("payload")}
    canonical = json.dumps(seen, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def retry_pending(run: dict[str, Any]) -> bool:
    """A Failed run whose ``spec.retry`` is above the retry the operator acted on: it is about to run again."""
    status = AgentRunStatus.parse(run.get("status"))
    return jobparity.retry_requested(jobparity.retry_of(run.get("spec")), status)


def ended(run: dict[str, Any]) -> bool:
    """The run is in a final phase and stays there (a Failed run with a retry requested does not)."""
    return ((run.get("status") or {}).get("phase") or "Pending") in TERMINAL and not retry_pending(run)


def _actions(history: RunHistory, status: dict[str, Any], spec: dict[str, Any]) -> str:
    if history.deleted:
        return ""
    phase = history.phase or "Pending"
    base = run_url(history.namespace, history.name)
    parts = []
    if phase == "Interrupted" and pending_ids(status.get("interrupt") or {}):
        parts.append(_answer_form(base, status.get("interrupt") or {}))
    if phase not in TERMINAL and not spec.get("stop"):
        parts.append(f'<button class="act stop" data-action="{a(base + "/stop")}">Stop</button>')
    if phase == "Failed":
        parts.append(_retry_action(history.name, base, status, spec))
    if not any(parts):
        return ""
    return (
        "<section class=actions>" + "".join(parts) + "<span class=act-note>acts as you: the patch is made with your "
        "own Kubernetes identity</span><span id=act-result></span>"
        "<div id=act-confirm class=confirm hidden role=dialog aria-label=Confirm></div></section>"
    )


def _answer_form(base: str, interrupt: dict[str, Any]) -> str:
    """The question, a JSON value field and Approve / Reject; app.js confirms exactly what is sent first.

    The buttons carry what this page shows (the interrupt ids, its digest, its question as ``a()`` writes it,
    hidden characters as escapes): the server answers only that question (else 409), and the confirmation
    shows the question from the same attribute, so it cannot read differently from what the answer names."""
    ids = pending_ids(interrupt)
    question = interrupt.get("message") or "(no message)"
    seen = (
        f'data-interrupt="{a(ids[0])}" data-digest="{a(interrupt_digest(interrupt))}" '
        f'data-ids="{a(", ".join(ids))}" data-question="{a(question)}"'
    )
    pending = hitl.actions(interrupt.get("payload"))
    if pending is not None:
        return _review_form(base, ids, seen, pending)
    payload = json.dumps(interrupt.get("payload"), ensure_ascii=False, default=str)
    buttons = "".join(
        f'<button class="act {verb}" data-action="{a(base + "/" + verb)}" data-verb="{verb}" '
        f'data-default="{default}" {seen}>{verb.capitalize()}</button>'
        for verb, default in (("approve", "true"), ("reject", "false"))
    )
    return (
        f"<p class=question>Answers interrupt <code>{e(', '.join(ids))}</code>: "
        f"<q>{e(question)}</q> payload <code>{e(payload[:2000])}</code></p>"
        "<label class=answer-value>Answer value, as JSON (optional: empty, Approve sends <code>true</code> and "
        "Reject <code>false</code>; the graph's <code>interrupt()</code> returns it)"
        "<textarea id=answer-value rows=3 spellcheck=false autocomplete=off "
        """placeholder='e.g. {"approved": true, "note": "checked the order"}'></textarea></label>"""
        f"<span id=answer-error class=error role=alert></span>{buttons}"
    )


def _review_form(base: str, ids: list[str], seen: str, pending: list[hitl.Action]) -> str:
    """A tool call review (``hitl``): each pending call (tool, arguments as content, allowed decisions) and, for
    one call, Approve / Edit (its arguments as editable JSON, prefilled) / Reject where allowed; for several,
    the whole answer as JSON, prefilled with an approve of each. app.js builds the decision and confirms it."""
    calls = "".join(
        f"<li class=review-call><code class=tool>{e(x.name)}</code> "
        f"<span class=allowed>allowed: {e(', '.join(x.allowed) or 'nothing')}</span>"
        f"<pre class=args>{e(json.dumps(x.args, indent=2, ensure_ascii=False, default=str))}</pre>"
        + (f"<p class=description>{e(x.description)}</p>" if x.description else "")
        + "</li>"
        for x in pending
    )
    head = (
        f"<p class=question>Tool call review (interrupt <code>{e(', '.join(ids))}</code>): the agent waits to run "
        f"{len(pending)} tool call{'s' if len(pending) != 1 else ''}</p><ol class=review>{calls}</ol>"
    )

    tool = f' data-tool="{a(pending[0].name)}"' if len(pending) == 1 else ""

    def button(verb: str, kind: str, label: str, default: dict[str, Any] | None = None) -> str:
        value = f' data-default="{a(json.dumps(default))}"' if default is not None else ""
        return (
            f'<button class="act {kind}" data-action="{a(base + "/" + verb)}" data-verb="{verb}"{value} {seen} '
            f'data-hitl="{kind}"{tool}>{label}</button>'
        )

    if len(pending) != 1:
        answer = json.dumps({"decisions": [{"type": "approve"} for _ in pending]}, indent=2)
        return (
            f"{head}<label class=answer-value>The answer, as JSON: {e(hitl.SHAPE)}"
            f"<textarea id=answer-value rows=6 spellcheck=false autocomplete=off>{e(answer)}</textarea></label>"
            f"<span id=answer-error class=error role=alert></span>"
            + button("approve", "approve", "Send", {"decisions": [{"type": "approve"} for _ in pending]})
        )
    allowed, parts = pending[0].allowed, [head]
    if "approve" in allowed:
        parts.append(button("approve", "approve", "Approve", {"decisions": [{"type": "approve"}]}))
    if "edit" in allowed:
        args = json.dumps(pending[0].args, indent=2, ensure_ascii=False, default=str)
        parts.append(
            "<label class=answer-value>Edit the arguments (JSON), then Edit runs the call with them"
            f"<textarea id=edit-args rows=4 spellcheck=false autocomplete=off>{e(args)}</textarea></label>"
            + button("approve", "edit", "Edit")
        )
    if "reject" in allowed:
        parts.append(
            "<label class=answer-value>Why (optional, the model reads it)"
            "<input id=reject-message autocomplete=off></label>" + button("reject", "reject", "Reject")
        )
    parts.append("<span id=answer-error class=error role=alert></span>")
    return "".join(parts)


def _retry_action(name: str, base: str, status: dict[str, Any], spec: dict[str, Any]) -> str:
    """A Failed run's Retry button (with the ``spec.retry`` this page shows), or why there is none."""
    run = {"spec": spec, "status": status}
    parsed = AgentRunStatus.parse(status)
    if retry_pending(run):
        return f"<p class=note>Retry {e(jobparity.retry_of(spec))} requested: the operator re-opens the run.</p>"
    refusal = jobparity.retry_refusal(name, spec, parsed)
    if refusal is not None:
        return f"<p class=note>{e(refusal)}</p>"
    retry = jobparity.retry_of(spec)
    what = (
        f"Retry agentrun {name}: spec.retry {retry} -> {jobparity.next_retry(spec, parsed)}. It resumes its turn "
        "from the last checkpoint; completed tool calls replay from the ledger."
    )
    return (
        f'<button class="act retry" data-action="{a(base + "/retry")}" data-retry="{retry}" '
        f'data-confirm="{a(what)}">Retry</button>'
    )


def _interrupts(history: RunHistory, status: dict[str, Any]) -> str:
    if not history.interrupts:
        return ""
    rows = []
    for item in history.interrupts:
        answer = _digest(item.answer, label="answer") if item.answer else "waiting"
        rows.append(
            f"<tr><td>{e(when(item.at))}</td><td>{e(item.attempt)}</td><td>{e(item.message)}</td>"
            f"<td>{_digest(item.payload, label='payload')}</td><td>{answer}</td>"
            f"<td>{e(when(item.answered_at))}</td><td>{e(item.answered_in_attempt or '-')}</td></tr>"
        )
    return (
        "<section><h2>Interrupts</h2><table class=interrupts><thead><tr><th>Asked</th><th>Attempt</th>"
        "<th>Question</th><th>Payload</th><th>Answer</th><th>Answered</th><th>Resumed in</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _attempts(history: RunHistory) -> str:
    if not history.attempts:
        return "<section><h2>Attempts</h2><p class=empty>No attempt yet.</p></section>"
    rows = []
    for a in history.attempts:
        exit_code = "-" if a.exit_code is None else a.exit_code
        rows.append(
            f"<tr><td>{e(a.attempt)}</td><td>{e(a.pod or '-')}</td><td>{e(when(a.started_at))}</td>"
            f"<td>{e(seconds(a.pod_start_seconds))}</td>"
            f"<td>{e(when(a.ended_at))}</td><td>{e(a.last_node or '-')}</td>"
            f"<td>{e(a.outcome or '-')}</td><td>{e(exit_code)}</td>"
            f"<td>{e(a.reason or '')}</td><td>{e(a.steps)}</td>"
            f"<td>{e(a.tool_calls_executed)} / {e(a.tool_calls_replayed)}"
            f"{e(f' ({a.tool_calls_failed} failed)' if a.tool_calls_failed else '')}</td>"
            f"<td>{e((a.message or '')[:200])}</td></tr>"
        )
    return (
        "<section><h2>Attempts</h2><table class=attempts><thead><tr><th>#</th><th>Pod</th><th>Started</th>"
        '<th title="pod created to runner ready: scheduling, image, imports, store">Pod start</th>'
        "<th>Last checkpoint</th><th>At node</th><th>Outcome</th><th>Exit</th><th>Reason</th><th>Steps</th>"
        "<th>Tools run / replayed</th><th>Message</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>{_logs(history)}</section>"
    )


def _logs(history: RunHistory) -> str:
    """Where each attempt's log is: its runner pod's, read with ``kubectl agentrun logs`` (the store keeps none:
    README "See what happened")."""
    if history.deleted:
        return (
            "<p class=note>Logs: each attempt's pod went with the deleted AgentRun; its log is only where your "
            "cluster collects container logs.</p>"
        )
    where = f"-n {history.namespace} " if history.namespace else ""
    commands = "".join(
        f"<li>attempt {e(x.attempt)}: <code class=logs>kubectl agentrun logs {e(where)}{e(history.name)} "
        f"--attempt {e(x.attempt)}</code></li>"
        for x in history.attempts
    )
    return (
        "<p class=note>Logs: each attempt's runner log is its pod's, kept while the pod exists (pods go with the "
        "AgentRun, <code>ttlSecondsAfterFinished</code> or a lost node); the store keeps none.</p>"
        f"<ul class=logs>{commands}</ul>"
    )


def _tool_calls(history: RunHistory) -> str:
    if not history.tool_calls:
        return "<section><h2>Tool calls</h2><p class=empty>No tool call recorded.</p></section>"
    rows = []
    for c in history.tool_calls:
        replayed = ", ".join(str(n) for n in c.replayed_in) or "-"
        retried = f" (in doubt in attempt {', '.join(map(str, c.in_doubt_in))}, ran again)" if c.in_doubt_in else ""
        rows.append(
            f'<tr class="call outcome-{a(c.outcome)}"><td class=tool>{e(c.name)}</td>'
            f"<td><code>{e(c.call_id)}</code>{_edited(c)}</td>"
            f'<td><span class="badge out-{a(c.outcome)}">{e(c.outcome.replace("_", " "))}</span>{e(retried)}</td>'
            f"<td>{e(c.attempt or '-')}</td><td>{e(replayed)}</td>"
            f"<td>{e(('≤ ' if c.duration_from == 'node' else '') + seconds(c.duration_seconds))}</td>"
            f"<td>{_digest(c.arguments, label='arguments')}</td><td>{_digest(c.result, label='tool-result')}</td>"
            f"<td><code class=idem>{e(c.idempotency_key or '-')}</code></td></tr>"
        )
    return (
        "<section><h2>Tool calls</h2><table class=calls><thead><tr><th>Tool</th><th>Call id</th><th>Outcome</th>"
        "<th>Ran in attempt</th><th>Replayed in</th><th>Duration</th><th>Arguments</th><th>Result</th>"
        f"<th>Idempotency key</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _edited(call: ToolCallRecord) -> str:
    """The mark of an edited re-run of a call (``ToolCallRecord.edit_of``), naming both ledger keys, or nothing."""
    if call.edit_of is None:
        return ""
    why = f"re-run of {call.edit_of} with other arguments (a fork or an edited message), recorded as {call.ledger_key}"
    return f' <span class="badge edited" title="{a(why)}">edited re-run</span>'


def _steps(history: RunHistory) -> str:
    if not history.steps:
        return ""
    # Each step opens on demand (app.js fetches its detail: the state and what the step changed); the link is the
    # same detail as a page of its own, without script.
    base = run_url(history.namespace, history.name, "/steps/")
    rows = "".join(
        f"<tr><td>{e(s.version)}</td><td>{e(s.step)}</td><td>{e(s.node or '-')}</td><td>{e(s.status)}</td>"
        f"<td>{e(s.attempt or '-')}</td><td>{e(when(s.at))}</td>"
        f"<td>{e(seconds(s.pod_start_seconds) if s.pod_start_seconds is not None else '')}</td>"
        f"<td>{e(seconds(s.duration_seconds))}</td>"
        f'<td><details class=step data-version="{a(s.version)}" data-detail="{a(base + str(s.version))}?fragment=1">'
        f'<summary>state and changes</summary><div class=step-body><a href="{a(base + str(s.version))}">open</a>'
        "</div></details></td></tr>"
        for s in history.steps
    )
    return (
        "<section><h2>Steps (checkpoints)</h2><table class=steps><thead><tr><th>Version</th><th>Step</th>"
        "<th>Next node</th><th>Status</th><th>Attempt</th><th>Written</th>"
        '<th title="before the attempt\'s first checkpoint: its pod was created, scheduled and started">Pod start</th>'
        "<th>Duration</th><th>What it changed</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def query(**params: str | None) -> str:
    """A query string of the non-empty ``params`` (``""`` when none)."""
    kept = {k: v for k, v in params.items() if v}
    return ("?" + urlencode(kept)) if kept else ""


# --- the run inspector: the conversation and each step's detail (agentrun.inspector) ---------------------------------


def _text(value: Digest | None, *, label: str) -> str:
    """A value as text (its preview, escaped), and, when cut, its size and digest: never a collapsed blob."""
    if value is None:
        return ""
    cut = (
        f'<span class=cut title="sha256 {a(value.sha256)}">… preview cut: {e(value.bytes)} B, '
        f"sha256 <code>{e(value.sha256[:12])}</code></span>"
        if value.truncated
        else ""
    )
    return f'<pre class="{a(label)}">{e(value.preview)}</pre>{cut}'


def chat(messages: Sequence[ChatMessage]) -> str:
    """Messages as a conversation: role, content, the tool calls asked for and each tool's answer, as content."""
    items = []
    for m in messages:
        who = e(m.role) + (f" <span class=name>{e(m.name)}</span>" if m.name else "")
        where = f" <span class=at>v{e(m.version)}</span>" if m.version is not None else ""
        answer = ""
        if m.tool_call_id:
            failed = ' <span class="badge out-failed">error</span>' if m.is_error else ""
            answer = f"<div class=answers>answer to <code>{e(m.tool_call_id)}</code>{failed}</div>"
        calls = "".join(
            f"<div class=call>→ <strong class=tool>{e(c.name)}</strong> <code>{e(c.id or '')}</code>"
            f"{_text(c.arguments, label='arguments')}</div>"
            for c in m.tool_calls
        )
        body = _text(m.content, label="content") if m.content is not None and m.content.preview else ""
        items.append(
            f'<li class="msg role-{a(m.role)}{" is-error" if m.is_error else ""}">'
            f"<div class=who>{who}{where}</div>{answer}{body}{calls}</li>"
        )
    return f"<ol class=chat>{''.join(items)}</ol>"


def conversation(talk: Conversation | None) -> str:
    """The run's input and the thread's conversation (the newest ``CONVERSATION_LIMIT`` messages)."""
    if talk is None:
        return ""
    given = ""
    if talk.input is not None:
        attempt = f" (run inputs of attempt {e(talk.input_attempt)})" if talk.input_attempt is not None else ""
        given = f"<h3>Input{attempt}</h3>{_text(talk.input, label='input')}"
    if not talk.messages:
        return f"<section class=conversation><h2>Conversation</h2>{given}<p class=empty>No message.</p></section>"
    shown = len(talk.messages)
    note = f"<p class=note>The newest {shown} of {talk.total} messages of the thread.</p>" if talk.total > shown else ""
    return (
        f"<section class=conversation><h2>Conversation</h2>{given}{note}"
        "<p class=note>Each message with the version of the checkpoint that appended it (v…; open that step "
        f"below for the state and what it changed).</p>{chat(talk.messages)}</section>"
    )


def step_detail(detail: StepDetail) -> str:
    """One checkpoint: what its step changed (keys and messages) and its state, key by key."""
    since = f"version {detail.previous_version}" if detail.previous_version is not None else "the empty state"
    rows = "".join(
        f"<tr class=change-{a(c.change)}><td><code>{e(c.key)}</code></td><td>{e(c.change)}</td>"
        f"<td>{_digest(c.before, label='before')}</td><td>{_digest(c.after, label='after')}</td></tr>"
        for c in detail.changes
    )
    changes = (
        "<table class=changes><thead><tr><th>Key</th><th>Change</th><th>Before</th><th>After</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if rows
        else "<p class=empty>No key of the state changed.</p>"
    )
    cut = f" (the first {len(detail.messages)})" if detail.appended > len(detail.messages) else ""
    said = f"<h4>Messages appended: {e(detail.appended)}{e(cut)}</h4>{chat(detail.messages)}" if detail.appended else ""
    state = "".join(
        f"<tr><td><code>{e(key)}</code></td><td>{_digest(value, label='value')}</td></tr>"
        for key, value in detail.state.items()
    )
    held = (
        f"<table class=state><tbody>{state}</tbody></table>"
        if state
        else "<p class=empty>No key besides its messages.</p>"
    )
    return (
        f"<div class=step-detail data-version={e(detail.version)}><h4>What step {e(detail.step)} changed "
        f"(version {e(detail.version)} against {e(since)})</h4>{changes}{said}"
        f"<h4>State as of version {e(detail.version)}</h4>{held}</div>"
    )


# The graph picture: one node per row (in the order a walk from the start meets them), plain edges to the next
# row straight down, others as arcs (forward on the right, back on the left); conditional ones dashed.
_BOX_W, _ROW, _BOX_H, _LEFT = 180, 54, 30, 140


def _order(shape: GraphShape) -> list[str]:
    after: dict[str, list[str]] = {}
    for source, target, _c in shape.edges:
        after.setdefault(source, []).append(target)
    seen: list[str] = []
    queue = [n for n in shape.nodes if n == "__start__"] or shape.nodes[:1]
    while queue:
        node = queue.pop(0)
        if node in seen or node in ("__end__", "*"):
            continue
        seen.append(node)
        queue += after.get(node, [])
    rest = [n for n in shape.nodes if n not in seen and n != "__end__"]
    return seen + rest + [n for n in shape.nodes if n == "__end__"]


def _edge(y1: float, y2: float, rank: int, conditional: bool) -> str:
    x = _LEFT + _BOX_W / 2
    dash = ' stroke-dasharray="5 4"' if conditional else ""
    if y2 == y1 + _ROW:  # the next row: straight down
        path = f"M{x} {y1 + _BOX_H} L{x} {y2}"
    else:
        side = _LEFT + _BOX_W if y2 > y1 else _LEFT
        bend = side + (1 if y2 > y1 else -1) * (24 + 14 * rank)
        top, bottom = y1 + _BOX_H / 2, y2 + _BOX_H / 2
        path = f"M{side} {top} C{bend} {top} {bend} {bottom} {side} {bottom}"
    return f'<path class=edge d="{path}" fill="none" stroke="#6b7785"{dash} marker-end="url(#arrow)"/>'


def graph_picture(shape: GraphShape | None, at: str | None) -> str:
    """The run's graph (``agentrun.structure``) as inline SVG, the node the run is at (``at``) marked."""
    if shape is None or not shape.nodes:
        return ""
    order = _order(shape)
    row = {name: i for i, name in enumerate(order)}
    edges = []
    for rank, (source, target, conditional) in enumerate(shape.edges):
        if target == "*":  # a conditional edge without a path map: to whichever node it names
            continue
        if source in row and target in row:
            edges.append(_edge(row[source] * _ROW + 8, row[target] * _ROW + 8, rank % 6, conditional))
    boxes = []
    for name, i in row.items():
        y = i * _ROW + 8
        kind = "current" if name == at else ("terminal" if name in ("__start__", "__end__") else "node")
        label = {"__start__": "start", "__end__": "end"}.get(name, name)
        boxes.append(
            f'<g class="gnode {kind}" data-node="{a(name)}"><rect x="{_LEFT}" y="{y}" width="{_BOX_W}" '
            f'height="{_BOX_H}" rx="6"/><text x="{_LEFT + _BOX_W / 2}" y="{y + 19}" text-anchor="middle">'
            f"{e(label[:28])}</text></g>"
        )
    anywhere = [s for s, t, _c in shape.edges if t == "*"]
    height = len(order) * _ROW + 8
    notes = []
    if anywhere:
        notes.append(f"conditional edges of {', '.join(anywhere)} may go to any node (no path map)")
    if shape.cut:
        notes.append("the graph is larger than the drawing keeps (200 nodes, 1000 edges)")
    legend = "dashed: a conditional edge" + (f"; {at} is where the run is" if at in row else "")
    return (
        f"<section class=graph><h2>Graph <span class=note>({e(shape.engine)}; {e(legend)})</span></h2>"
        f'<svg class=graph-picture role=img aria-label="the graph\'s nodes and edges" width="{_LEFT * 2 + _BOX_W}" '
        f'height="{height}" viewBox="0 0 {_LEFT * 2 + _BOX_W} {height}"><defs><marker id=arrow viewBox="0 0 10 10" '
        'refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0 0 L10 5 L0 10 z" fill="#6b7785"/></marker></defs>'
        f"{''.join(edges)}{''.join(boxes)}</svg>" + "".join(f"<p class=note>{e(n)}</p>" for n in notes) + "</section>"
    )
