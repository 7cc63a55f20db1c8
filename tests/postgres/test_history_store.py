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

from agentrun import Command, Message, ToolCall, assistant, interrupt, tool
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.history import PREVIEW_CHARS, build
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
