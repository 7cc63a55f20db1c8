"""The run history read from a real PostgreSQL store (checkpoint.pg_history, agentrun_history.store).

A real graph with a ledgered side-effect tool runs on PgCheckpointer; the history server's store reads
it back in one snapshot and ``agentrun.history.build`` shows each tool call executed once, with its
intent's duration and idempotency key; its live views are woken by the store's own progress
notification (``ProgressHub`` on ``agentrun_progress``), not only by polling.
"""

from __future__ import annotations

import asyncio
import hashlib
import html as html_lib
import json
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from agentrun import Command, Message, Replace, ToolCall, assistant, interrupt, tool
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.history import PREVIEW_CHARS, build
from agentrun.ledger import args_digest, edited_key
from agentrun.models import ScriptedModel
from agentrun_history import pages
from agentrun_history.store import HistoryStore, ProgressHub
from agentrun_operator import kubectl_plugin
from tests.unit.helpers import tool_graph

pytestmark = pytest.mark.postgres

# Deeper than any reader's stack allows json.loads (the issue met 980 levels on the server; 960 read fine).
DEEP = 2000
MB10 = 10 << 20


async def test_a_finished_run_reads_back_as_its_history(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPPORT_EFFECTS_DB", str(tmp_path / "effects.db"))
    from examples.support_agent import graph

    store = PgCheckpointer(pg_dsn)
    try:
        app = graph.compile(store)
        text = "charge my saved card for order 4821"
        config = {"thread_id": "default/h-1", "attempt": 1, "run_uid": "uid-1"}
        await app.ainvoke({"messages": [{"role": "user", "content": text}]}, config)
    finally:
        await store.aclose()
    reader = HistoryStore(pg_dsn)
    try:
        rows = await reader.rows("default/h-1", "uid-1")
        other = await reader.rows("default/h-1", "another-run")
    finally:
        await reader.aclose()
    history = build(rows, namespace="default", name="h-1", uid="uid-1", thread_id="default/h-1")
    assert history.status == "completed" and history.recorded
    assert [c.name for c in history.tool_calls] == ["lookup_order", "charge_card", "send_receipt"]
    assert {c.outcome for c in history.tool_calls} == {"executed"}
    assert all(c.attempt == 1 and c.replayed_in == [] for c in history.tool_calls)
    charge = history.tool_calls[1]
    assert charge.duration_from == "intent" and charge.duration_seconds is not None
    assert charge.idempotency_key and charge.idempotency_key.startswith("ar-")
    assert charge.result is not None and "succeeded" in charge.result.preview
    assert [a.attempt for a in history.attempts] == [1] and history.attempts[0].steps == len(history.steps)
    assert not other.states, "rows of another AgentRun on the thread are not its history"


async def test_the_progress_hub_is_woken_by_the_stores_notification(pg_dsn: str) -> None:
    runner_store = PgCheckpointer(pg_dsn)
    await runner_store.setup()  # the schema, as a runner makes it
    await runner_store.aclose()
    hub = ProgressHub(pg_dsn)
    hub.start()
    try:
        woken = hub.subscribe("default/h-2")
        for _ in range(100):
            if hub.listening:
                break
            await asyncio.sleep(0.05)
        assert hub.listening
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute("SELECT pg_notify('agentrun_progress', 'default/other')")
            await conn.execute("SELECT pg_notify('agentrun_progress', 'default/h-2')")
        finally:
            await conn.close()
        await asyncio.wait_for(woken.wait(), 5)
        hub.unsubscribe("default/h-2", woken)
    finally:
        await hub.aclose()


# -- what a graph, a tool or a model may write, read back (issue 31 items 1, 2 and 7) ---------------------------

NUL = "\x00"


def _approving_graph(tools: list[Any], first_reply: Message, final: str) -> Any:
    """model -> tools -> model: the first reply asks for ``tools``' calls, the second says ``final``."""
    return tool_graph(tools, ScriptedModel.replies([first_reply, assistant(final)]))


async def test_text_holding_nul_from_a_tool_the_user_and_the_model_is_shown_escaped_in_the_history(
    pg_dsn: str,
) -> None:
    @tool
    async def fetch_page(url: str) -> str:
        return f"page {url}:{NUL}hidden after a NUL"

    @tool
    async def refund(amount: str) -> str:
        answer = interrupt({"amount": amount, "note": f"x{NUL}y"}, message=f"refund {amount}{NUL}?")
        return f"refunded {amount}: {answer}"

    reply = assistant(
        f"looking{NUL}",
        tool_calls=[
            ToolCall(id="c1", name="fetch_page", arguments=json.dumps({"url": f"a{NUL}b"})),
            ToolCall(id="c2", name="refund", arguments=json.dumps({"amount": "5"})),
        ],
    )
    config = {"thread_id": "default/nul", "attempt": 1, "run_uid": "uid-1"}
    store = PgCheckpointer(pg_dsn)
    try:
        app = _approving_graph([fetch_page, refund], reply, f"done{NUL}end").compile(store)
        await app.ainvoke({"messages": [{"role": "user", "content": f"hi{NUL}there"}]}, config)
        await app.ainvoke(Command(resume=f"yes{NUL}"), config)
        rows = await store.thread_rows("default/nul", run_uid="uid-1")
    finally:
        await store.aclose()
    history = build(rows, namespace="default", name="nul", uid="uid-1", thread_id="default/nul")
    assert history.status == "completed", "GUARANTEE BROKEN: a NUL in what a run wrote hides its history"
    fetch, refunded = history.tool_calls
    assert fetch.result is not None and fetch.result.preview == "page a\\u0000b:\\u0000hidden after a NUL"
    assert fetch.arguments is not None and "\\u0000" in fetch.arguments.preview
    assert refunded.result is not None and refunded.result.preview == "refunded 5: yes\\u0000"
    (asked,) = history.interrupts
    assert asked.message == "refund 5\\u0000?" and asked.payload is not None
    assert json.loads(asked.payload.preview) == {"amount": "5", "note": "x\\u0000y"}
    assert asked.answer is not None and asked.answer.preview == "yes\\u0000"
    assert history.result is not None and history.result.preview == "done\\u0000end"
    assert all(NUL not in (c.result.preview if c.result else "") for c in history.tool_calls)


async def test_a_result_nested_a_thousand_levels_deep_shows_what_it_can(pg_dsn: str) -> None:
    deep: Any = "leaf"
    for _ in range(DEEP):
        deep = {"a": deep}

    @tool
    async def nested() -> Any:
        return deep

    reply = assistant(tool_calls=[ToolCall(id="c1", name="nested", arguments="{}")])
    config = {"thread_id": "default/deep", "attempt": 1, "run_uid": "uid-1"}

    async def run() -> None:
        store = PgCheckpointer(pg_dsn)
        try:
            app = _approving_graph([nested], reply, "done").compile(store)
            await app.ainvoke({"messages": [{"role": "user", "content": "go"}]}, config)
        finally:
            await store.aclose()

    def write() -> None:
        # A graph may raise its recursion limit (the limit is the process's): then it stores what it likes.
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(10 * DEEP)
        try:
            asyncio.run(run())
        finally:
            sys.setrecursionlimit(limit)

    await asyncio.to_thread(write)
    store = PgCheckpointer(pg_dsn)
    try:
        rows = await store.thread_rows("default/deep", run_uid="uid-1")
    finally:
        await store.aclose()
    history = build(rows, namespace="default", name="deep", uid="uid-1", thread_id="default/deep")
    (call,) = history.tool_calls
    assert call.outcome == "executed" and call.result is not None
    assert call.result.preview.startswith('{"a": {"a": ') and call.result.truncated
    history.model_dump_json()  # what the server answers: no RecursionError on the way out either


class CountingProxy:
    """A TCP proxy in front of PostgreSQL that counts the bytes the server sends (what a history read fetches)."""

    def __init__(self, dsn: str) -> None:
        self.target = urlsplit(dsn)
        self.received = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = self.target.netloc.replace(f"{self.target.hostname}:{self.target.port}", f"127.0.0.1:{port}")
        return urlunsplit(self.target._replace(netloc=netloc))

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.target.hostname, self.target.port)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, count: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if count:
                        self.received += len(data)
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_r, server_w, count=False), pipe(server_r, client_w, count=True))


async def test_the_history_of_a_10_mb_result_fetches_its_preview_and_digest_not_the_result(pg_dsn: str) -> None:
    big = 'é"\\ line\n' * (MB10 // 12)

    @tool
    async def export_report() -> str:
        return big

    reply = assistant(tool_calls=[ToolCall(id="c1", name="export_report", arguments="{}")])
    config = {"thread_id": "default/big", "attempt": 1, "run_uid": "uid-1"}
    store = PgCheckpointer(pg_dsn)
    try:
        app = _approving_graph([export_report], reply, "done").compile(store)
        await app.ainvoke({"messages": [{"role": "user", "content": "export"}]}, config)
    finally:
        await store.aclose()
    conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": "agentrun"})
    try:
        envelope = await conn.fetchval("SELECT COALESCE(result_text, result::text) FROM tool_executions")
    finally:
        await conn.close()
    proxy = CountingProxy(pg_dsn)
    async with proxy as proxied:
        reader = HistoryStore(proxied)
        try:
            await reader.store.setup()  # the pool and the schema check, counted apart from the read
            before = proxy.received
            rows = await reader.rows("default/big", "uid-1")
            fetched = proxy.received - before
        finally:
            await reader.aclose()
    # The result is in the ledger and in the tool's answer message: two 10 MB values, neither fetched.
    assert fetched < 64 * 1024, f"GUARANTEE BROKEN: a history read fetched {fetched} bytes of a 10 MB result"
    history = build(rows, namespace="default", name="big", uid="uid-1", thread_id="default/big")
    (call,) = history.tool_calls
    assert call.result is not None and len(call.result.preview) == PREVIEW_CHARS and call.result.truncated
    assert call.result.preview == big[:PREVIEW_CHARS]
    whole = envelope.encode()
    assert (call.result.sha256, call.result.bytes) == (hashlib.sha256(whole).hexdigest(), len(whole))
    assert len(whole) > MB10


async def test_rows_the_store_cannot_read_are_named_and_the_rest_of_the_history_is_shown(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @tool
    async def fetch_page(url: str) -> str:
        return f"page {url}"

    @tool
    async def lookup(order_id: str) -> str:
        return f"order {order_id}"

    reply = assistant(
        tool_calls=[
            ToolCall(id="c1", name="fetch_page", arguments=json.dumps({"url": "a"})),
            ToolCall(id="c2", name="lookup", arguments=json.dumps({"order_id": "7"})),
        ]
    )
    config = {"thread_id": "default/damaged", "attempt": 1, "run_uid": "uid-1"}
    store = PgCheckpointer(pg_dsn)
    try:
        await _approving_graph([fetch_page, lookup], reply, "done").compile(store).ainvoke("go", config)
    finally:
        await store.aclose()
    # Damage three rows as a person with psql could: a ledger row that is not JSON, an answer message and a
    # checkpoint's meta holding a number PostgreSQL's JSON accepts but cannot read (beyond numeric).
    conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": "agentrun"})
    try:
        await conn.execute(
            "UPDATE tool_executions SET result_text = 'not json {', result = NULL WHERE tool_name = 'fetch_page'"
        )
        answer_idx = await conn.fetchval("SELECT idx FROM messages WHERE body::jsonb ->> 'tool_call_id' = 'c2'")
        await conn.execute(
            """UPDATE messages SET body = '{"role": "tool", "tool_call_id": "c2", "n": 1e1000000}' WHERE idx = $1""",
            answer_idx,
        )
        await conn.execute("""UPDATE states SET meta = '{"error": 1e1000000}' WHERE version = 1""")
    finally:
        await conn.close()
    reader = HistoryStore(pg_dsn)
    try:
        rows = await reader.rows("default/damaged", "uid-1")
    finally:
        await reader.aclose()
    history = build(rows, namespace="default", name="damaged", uid="uid-1", thread_id="default/damaged")
    assert history.status == "completed" and len(history.steps) >= 3
    fetch, looked_up = history.tool_calls
    assert fetch.result is not None and fetch.result.preview == "not json {" and fetch.outcome == "executed"
    assert looked_up.result is not None and looked_up.result.preview == "order 7"
    assert sorted(note.split(": ")[0] for note in history.unreadable) == [
        f"messages row idx={answer_idx}",
        "states row version=1",
        f"tool_executions row tool_call_id={fetch.ledger_key!r}",
    ], history.unreadable
    # The page and kubectl agentrun history name each of them, above everything else.
    html = pages.timeline(history, {"status": {"phase": "Succeeded"}, "spec": {}})
    warning = re.search(r"<div class=unreadable role=alert>(.*?)</div>", html, re.S)
    assert warning and "could not read 3 rows" in warning.group(1), "GUARANTEE BROKEN: the page hides the damage"
    assert [html_lib.unescape(i) for i in re.findall(r"<li><code>(.*?)</code></li>", warning.group(1), re.S)] == [
        *history.unreadable
    ]
    kubectl_plugin.print_history(history.model_dump(mode="json"))
    printed = capsys.readouterr().out
    assert "could not read 3 row(s)" in printed, printed
    # One line each (PostgreSQL's message has a DETAIL line: joined).
    assert all(f"  - {' '.join(note.splitlines())}" in printed.splitlines() for note in history.unreadable), printed


# -- an edited call (issue 31 item 10) in the history: attached to the call it re-ran ---------------------------


async def test_a_langgraph_forks_edited_call_shows_as_an_edited_re_run_of_its_call(pg_dsn: str) -> None:
    """A real LangGraph fork (update_state edits charge_card 4821 -> 9999, same message and call ids) on
    PostgreSQL, the history server's only store: the edit's record ``ai-1:c1#args-...`` is call c1's edited re-run
    right after c1, not a call of its own named ``c1#args-...``; each with the idempotency key it was charged with."""
    from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode
    from tests.support.langgraph_fork import CHARGES, EDITED, ORIGINAL, afork, check, tools
    from tests.support.langgraph_fork import build as fork_graph

    CHARGES.clear()
    saver = AgentrunSaver.from_url(pg_dsn)
    try:
        node = LedgerToolNode(tools(sync=False), side_effects={"charge_card"})
        check(await afork(fork_graph(node).compile(checkpointer=saver)), "PostgreSQL")
    finally:
        await saver.aclose()
    reader = HistoryStore(pg_dsn)
    try:
        rows = await reader.rows("order-4821", None)
    finally:
        await reader.aclose()
    history = build(rows, namespace="default", name="order-4821", thread_id="order-4821")
    original, edit = history.tool_calls
    assert (original.call_id, original.ledger_key, original.edit_of) == ("c1", "ai-1:c1", None)
    assert (edit.call_id, edit.edit_of) == ("c1", "ai-1:c1"), (
        f"the edited call shows as a call of its own: {edit.call_id!r}, edit of {edit.edit_of!r}"
    )
    assert edit.ledger_key == edited_key("ai-1:c1", args_digest({"order_id": EDITED}))
    assert [(c.outcome, c.idempotency_key) for c in history.tool_calls] == [("executed", k) for _, k in CHARGES]
    assert original.result and f"charged order {ORIGINAL}" in original.result.preview
    assert edit.result and f"charged order {EDITED}" in edit.result.preview
    # The page and kubectl agentrun history say which call it re-ran.
    html = pages.timeline(history, {"status": {"phase": "Succeeded"}, "spec": {}})
    marks = re.findall(r'<span class="badge edited" title="([^"]*)">edited re-run</span>', html)
    assert [html_lib.unescape(m) for m in marks] == [
        f"re-run of ai-1:c1 with other arguments (a fork or an edited message), recorded as {edit.ledger_key}"
    ]
    rows_shown = kubectl_plugin._history_tool_call_rows(history.model_dump(mode="json"))
    assert [r[1] for r in rows_shown] == ["CALL ID", "c1", "c1 (edited re-run)"]


async def test_a_request_edited_in_the_threads_history_shows_the_record_of_its_own_arguments(
    pg_dsn: str,
) -> None:
    """Our own engine: after charge_card(4821) ran, a node rewrites the thread's history (``Replace``): the request
    (same message id ai-1, call id c1) now asks for 9999, and its answer is gone; the tool node runs it as an
    edited call. The request in the history shows the 9999 record (its edited key), not the 4821 record of its
    key; the 4821 record is left without its request (the request it answered was edited away)."""
    charged: list[tuple[str, str | None]] = []

    @tool(side_effects=True)
    async def charge_card(order_id: str, idempotency_key: str | None) -> str:
        charged.append((order_id, idempotency_key))
        return f"charged order {order_id}"

    def request(order: str) -> Message:
        arguments = json.dumps({"order_id": order})
        return assistant(tool_calls=[ToolCall(id="c1", name="charge_card", arguments=arguments)], id="ai-1")

    def model(state: dict[str, Any]) -> dict[str, Any]:
        messages = state["messages"]
        if messages[-1].role == "user":
            return {"messages": [request("4821")]}
        if messages[-1].content == "charged order 4821":  # a reviewer corrects the order in the history
            return {"messages": Replace([messages[0], request("9999")])}
        return {"messages": [assistant(f"done: {messages[-1].content}")]}

    config = {"thread_id": "default/edited", "attempt": 1, "run_uid": "uid-1"}
    store = PgCheckpointer(pg_dsn)
    try:
        await tool_graph([charge_card], model).compile(store).ainvoke("charge order 4821", config)
    finally:
        await store.aclose()
    assert [o for o, _ in charged] == ["4821", "9999"]
    reader = HistoryStore(pg_dsn)
    try:
        rows = await reader.rows("default/edited", "uid-1")
    finally:
        await reader.aclose()
    history = build(rows, namespace="default", name="edited", uid="uid-1", thread_id="default/edited")
    edited, original = history.tool_calls
    assert edited.result and edited.result.preview == "charged order 9999", (
        f"GUARANTEE BROKEN: the 9999 request shows the result {edited.result and edited.result.preview!r}"
    )
    assert (edited.call_id, edited.edit_of) == ("c1", "ai-1:c1") and edited.requested_version is not None
    assert edited.ledger_key == edited_key("ai-1:c1", args_digest({"order_id": "9999"}))
    assert original.result and original.result.preview == "charged order 4821"
    assert (original.ledger_key, original.requested_version, original.edit_of) == ("ai-1:c1", None, None)
    assert [c.idempotency_key for c in history.tool_calls] == [charged[1][1], charged[0][1]]


async def test_the_store_lists_the_runs_it_recorded_newest_first_by_their_derived_request_key(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run list's deleted runs (issue 32 item 4): the latest turn of each <namespace>/<name>, newest first.
    monkeypatch.setenv("SUPPORT_EFFECTS_DB", str(tmp_path / "effects.db"))
    from examples.support_agent import graph

    store = PgCheckpointer(pg_dsn)
    turns = [
        ("team-a/t-1", "team-a/first/0123456789abcdef", "u-1"),
        ("team-a/t-2", "team-a/second/fedcba9876543210", "u-2"),
        ("team-a/t-1", "team-a/first/00000000000000ff", "u-3"),  # the same run name, a later turn
        ("team-b/t-9", "team-b/other/0123456789abcdef", "u-4"),
        ("team-a/t-3", "order-4821/retry/1", "u-5"),  # a spec.requestId with slashes: no run name
        ("team-b/t-8", "team-a/spoof/0123456789abcdef", "u-6"),  # a key naming another namespace than its thread
    ]
    try:
        app = graph.compile(store)
        for thread, key, uid in turns:
            config = {"thread_id": thread, "attempt": 1, "run_uid": uid, "request_key": key}
            await app.ainvoke({"messages": [{"role": "user", "content": f"look up order 4821 ({key})"}]}, config)
    finally:
        await store.aclose()
    reader = HistoryStore(pg_dsn)
    try:
        team_a = await reader.recorded_runs("team-a")
        every = await reader.recorded_runs(None)
    finally:
        await reader.aclose()
    assert [(r["name"], r["run_uid"], r["thread_id"]) for r in team_a] == [
        ("first", "u-3", "team-a/t-1"),
        ("second", "u-2", "team-a/t-2"),
    ], team_a
    assert all(r["status"] == "completed" and r["started_at"] <= r["updated_at"] for r in team_a)
    assert [(r["namespace"], r["name"]) for r in every] == [
        ("team-b", "other"),
        ("team-a", "first"),
        ("team-a", "second"),
    ]
