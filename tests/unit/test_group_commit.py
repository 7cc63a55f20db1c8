"""The group-commit policy (``checkpoint.group``) on fake time: when a batch is written, and who waits.

looptime: the window and the tools' durations pass in no real time, and the
assertions on ``looptime`` say exactly when each batch was written. The store is
the in-memory one with a window, counting its batches; the same policy runs on
PostgreSQL in ``tests/postgres/test_group_commit.py`` (one commit per batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from agentrun import InMemoryCheckpointer, tool
from agentrun.checkpoint.base import LedgerRow
from agentrun.checkpoint.group import LedgerGroup
from agentrun.errors import StorageError

from .helpers import app_for, call, tool_messages

pytestmark = pytest.mark.looptime
WINDOW = 0.5


class Batching(InMemoryCheckpointer):
    """The memory store with a group-commit window; remembers each batch and when it was written."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.batches: list[tuple[float, list[str]]] = []
        self.fail = fail

    @property
    def ledger_group_window(self) -> float:
        return WINDOW

    async def ledger_put_many(
        self, thread_id: str, rows: Sequence[LedgerRow], *, attempt: int | None = None, run_uid: str | None = None
    ) -> list[bool]:
        self.batches.append((asyncio.get_running_loop().time(), sorted(r.tool_name for r in rows)))
        if self.fail:
            raise StorageError("disk full")
        return await super().ledger_put_many(thread_id, rows, attempt=attempt, run_uid=run_uid)


def tools_taking(**seconds: float) -> list[Any]:
    made = []
    for name, duration in seconds.items():

        async def body(duration: float = duration, name: str = name) -> str:
            await asyncio.sleep(duration)
            return name

        body.__name__ = name
        made.append(tool(body))
    return made


async def run(store: Batching, **seconds: float) -> dict[str, Any]:
    calls = [call(f"c_{name}", name) for name in seconds]
    return await app_for(tools_taking(**seconds), calls, store).ainvoke("go", {"thread_id": "t"})


async def test_calls_that_finish_together_are_written_at_once_in_one_batch(looptime: Any) -> None:
    store = Batching()
    await run(store, a=1, b=1, c=1)
    assert store.batches == [(1, ["a", "b", "c"])], "all siblings finished: the batch must not wait out its window"
    assert looptime == 1


async def test_a_slow_call_is_not_waited_for_the_batch_goes_when_the_window_ends(looptime: Any) -> None:
    store = Batching()
    await run(store, a=1, b=1.2, slow=10)
    assert store.batches == [(1 + WINDOW, ["a", "b"]), (10, ["slow"])], (
        "b joins a's batch within the window; the batch goes when the window ends, not when slow does; "
        "slow, the last call running, is written at once on its own"
    )


async def test_a_sibling_that_ends_without_a_result_stops_the_batch_waiting_for_it(looptime: Any) -> None:
    store = Batching()

    async def broken() -> str:
        await asyncio.sleep(1.1)
        raise RuntimeError("no result")

    calls = [call("c_a", "a"), call("c_broken", "broken")]
    await app_for([*tools_taking(a=1), tool(broken)], calls, store).ainvoke("go", {"thread_id": "t"})
    assert store.batches == [(1.1, ["a"])], "the failed sibling left: the batch must go then, not at the window's end"


async def test_a_failed_batch_fails_each_of_its_records_which_the_ledger_logs_per_call(looptime: Any) -> None:
    store = Batching(fail=True)
    values = await run(store, a=1, b=1)
    assert {k: m.content for k, m in tool_messages(values).items()} == {"c_a": "a", "c_b": "b"}
    checkpoint = await store.aget("t")
    assert checkpoint is not None and checkpoint.meta["tool_calls"]["unrecorded"] == 2


async def test_a_store_answering_the_wrong_number_of_outcomes_fails_every_waiter_instead_of_hanging(
    looptime: Any,
) -> None:
    class Short(Batching):
        async def ledger_put_many(self, *args: Any, **kwargs: Any) -> list[bool]:
            return [True]

    group = LedgerGroup(Short(), "t", siblings=2, window=WINDOW, attempt=None, run_uid=None)
    outcomes = await asyncio.gather(
        *(group.put(LedgerRow(k, "x", {"__kind__": "raw", "value": 1})) for k in ("m:a", "m:b")),
        return_exceptions=True,
    )
    assert [type(o) for o in outcomes] == [StorageError, StorageError]
