"""What a store backend must provide beyond ``Checkpointer``, and who says so (issue 33 item 4).

The history server takes any store that implements ``HistoryReads`` and names the ones that do when
given another; the LangGraph saver finds a backend's row store in one registry.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentrun.checkpoint import HistoryReads, InMemoryCheckpointer, PgCheckpointer, SqliteCheckpointer
from agentrun_history.store import HistoryStore


def test_postgres_alone_implements_the_history_reads(tmp_path: Path) -> None:
    """The protocol is what the history server checks: PostgreSQL has it; SQLite and memory do not."""
    assert isinstance(PgCheckpointer("postgresql://nobody@127.0.0.1:1/none"), HistoryReads)
    assert not isinstance(SqliteCheckpointer(str(tmp_path / "one.db")), HistoryReads)
    assert not isinstance(InMemoryCheckpointer(), HistoryReads)


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/one.db", "memory://"])
def test_history_server_names_the_stores_it_reads(url: str, tmp_path: Path) -> None:
    """A store without the history reads is refused at startup, in one line: which stores have them and why."""
    with pytest.raises(ValueError) as refused:
        HistoryStore(url.format(tmp=tmp_path))
    message = str(refused.value)
    assert "PostgreSQL (postgresql://...) only" in message
    assert "no server" in message  # the why: SQLite and memory keep one machine's runs
    assert "\n" not in message


def test_history_server_takes_a_postgres_store() -> None:
    """Nothing connects at construction; the store it keeps is typed by the protocol, not the class."""
    store = HistoryStore("postgresql://nobody@127.0.0.1:1/none")
    assert isinstance(store.store, HistoryReads)


class _Registered(InMemoryCheckpointer):
    """A backend of its own name: what a new backend with LangGraph tables would be."""

    backend = "registered"


def test_row_store_comes_from_the_backend_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The saver finds a backend's row store by its name in ``ROW_STORES``: one line per backend, no type chain."""
    from agentrun.integrations.langgraph import rows, saver
    from agentrun.integrations.langgraph.sqlite_rows import SqliteRows

    assert isinstance(saver.row_store(SqliteCheckpointer(str(tmp_path / "one.db"))), SqliteRows)
    monkeypatch.setitem(rows.ROW_STORES, "registered", "agentrun.integrations.langgraph.sqlite_rows:SqliteRows")
    assert isinstance(saver.row_store(_Registered()), SqliteRows)
    with pytest.raises(TypeError, match=r"LangGraph tables \(postgres, registered, sqlite\).*InMemorySaver"):
        saver.row_store(InMemoryCheckpointer())


async def test_turn_batch_serves_one_turn_in_one_call() -> None:
    """Items asked in one loop turn under one group share one serve call; each caller gets its own answer."""
    from agentrun.checkpoint.batch import TurnBatch

    calls: list[tuple[str, list[int]]] = []

    async def serve(group: str, items: list[int]) -> list[int]:
        calls.append((group, items))
        return [item * 10 for item in items]

    batch: TurnBatch[str, int, int] = TurnBatch(serve, lambda group: f"test:{group}")
    answers = await asyncio.gather(batch.ask("a", 1), batch.ask("a", 2), batch.ask("b", 3), batch.ask("a", 1))
    assert list(answers) == [10, 20, 30, 10]
    assert sorted(calls) == [("a", [1, 2, 1]), ("b", [3])]
    assert await batch.ask("a", 4) == 40  # a later turn: a batch of its own
    assert len(calls) == 3


async def test_turn_batch_fails_every_caller_of_a_failed_call() -> None:
    """A batch has one fate: the serve call's error reaches each of its callers; the next turn is served anew."""
    from agentrun.checkpoint.batch import TurnBatch

    failing = True

    async def serve(group: str, items: list[int]) -> list[int]:
        if failing:
            raise ConnectionError("store down")
        return items

    batch: TurnBatch[str, int, int] = TurnBatch(serve, lambda group: f"test:{group}")
    outcomes = await asyncio.gather(batch.ask("a", 1), batch.ask("a", 2), return_exceptions=True)
    assert [type(o) for o in outcomes] == [ConnectionError, ConnectionError]
    failing = False
    assert await batch.ask("a", 3) == 3
