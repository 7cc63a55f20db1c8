"""LangGraph's own conformance suite passes on ``AgentrunSaver`` over our SQLite store (issue 23).

Guarantee protected: a LangGraph graph compiled with ``AgentrunSaver`` on
SQLite gets a checkpointer that LangGraph's maintainers' suite accepts:
every base capability (put, put_writes, get_tuple, list, delete_thread) and
every extended one (delete_for_runs, copy_thread, prune).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from agentrun.checkpoint import SqliteCheckpointer
from tests.support.langgraph_conformance import BASE, EXTENDED, failures, run_conformance


async def test_langgraph_conformance_suite_passes_on_the_sqlite_store(tmp_path: Path) -> None:
    report = await run_conformance("agentrun-sqlite", lambda: SqliteCheckpointer(tmp_path / f"{uuid.uuid4().hex}.db"))
    assert not failures(report, BASE), f"GUARANTEE BROKEN: LangGraph base capabilities fail: {failures(report, BASE)}"
    assert not failures(report, EXTENDED), f"LangGraph extended capabilities fail: {failures(report, EXTENDED)}"
