"""The tool ledger (DESIGN §2): its key, and what a broken ledger may and may not cost.

A broken ledger may cost a duplicate call, never a lost, wrong or
misattributed result, and never a stuck run.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentrun import Command, DeterminismError, InMemoryCheckpointer, SqliteCheckpointer, StorageError, tool
from agentrun.checkpoint import Checkpointer, LedgerEntry
from agentrun.errors import StoreUnavailableError
from agentrun.ledger import args_digest, decode, edited_key, encode, idempotency_key, ledger_key
from agentrun.tools import InDoubtPolicy, Tool
from tests.support.checkpointers import Backend

from .helpers import app_for, call, log_lines, seed_tool_step, tool_messages


class Crash(BaseException):
    """Stands in for the process dying."""


def test_ledger_key_is_origin_message_id_and_tool_call_id() -> None:
    assert ledger_key("msg_abc", "call_1") == "msg_abc:call_1"
    for origin, call_id in ((None, "call_1"), ("", "call_1"), ("msg_abc", None), ("msg_abc", "")):
        assert ledger_key(origin, call_id) is None, f"a key without both parts must be None: {origin!r}, {call_id!r}"
    assert idempotency_key("thread", None) is None


async def test_recorded_key_is_the_requesting_message_id_and_call_id(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()

    @tool
    async def lookup(order_id: str) -> dict[str, str]:
        return {"order": order_id}

    app = app_for([lookup], [call("call_1", "lookup", order_id="4821")], checkpointer)
    values = await app.ainvoke("look it up", {"thread_id": t})
    request = next(m for m in values["messages"] if m.tool_calls)
    [entry] = await checkpointer.ledger_list(t)
    assert entry.key == f"{request.id}:call_1"
    assert entry.tool_name == "lookup"
    assert entry.result == {"__kind__": "raw", "value": {"order": "4821"}, "args": args_digest({"order_id": "4821"})}, (
        "the stored envelope changed"
    )


@pytest.mark.parametrize("missing", ["message id", "call id"])
async def test_missing_message_or_call_id_skips_the_ledger_and_the_tool_runs_every_time(
    backend: Backend, checkpointer: Checkpointer, missing: str, caplog: pytest.LogCaptureFixture
) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()
    finished = asyncio.Event()
    crash = True

    @tool(side_effects=True, in_doubt="report")
    async def charge() -> str:
        ran["charge"] += 1
        finished.set()
        return "charged"

    @tool
    async def crasher() -> str:
        if crash:
            await finished.wait()
            raise Crash
        return "ok"

    call_id = None if missing == "call id" else "call_1"
    calls = [call(call_id, "charge"), call("call_2", "crasher")]
    app = app_for([charge, crasher], calls, checkpointer, id_less=missing == "message id")
    with pytest.raises(Crash):
        await app.ainvoke("go", {"thread_id": t})
    crash = False
    values = await app.ainvoke(None, {"thread_id": t})
    assert ran["charge"] == 2, "without a safe ledger key the tool must run again on every replay"
    assert not [e for e in await checkpointer.ledger_list(t) if e.tool_name == "charge"], "an unsafe key was recorded"
    assert [m.content for m in values["messages"] if m.name == "charge"] == ["charged"]
    assert any(f"has no {missing}; the ledger is skipped and the tool runs" in line for line in log_lines(caplog))


GARBAGE = [
    pytest.param({"not": "an envelope"}, id="not-an-envelope"),
    pytest.param("just a string", id="string"),
    pytest.param(None, id="null"),
    pytest.param({"__kind__": "message", "value": {"role": "robot"}}, id="message-that-does-not-parse"),
    pytest.param({"__kind__": "pickle", "value": "gASV"}, id="unknown-kind"),
    pytest.param({"__kind__": "raw", "value": 1, "extra": 2}, id="extra-field"),
]


@pytest.mark.parametrize("garbage", GARBAGE)
async def test_malformed_ledger_entry_is_a_miss_the_tool_runs_again_and_its_result_repairs_the_entry(
    backend: Backend, checkpointer: Checkpointer, garbage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentrun")
    t = backend.thread()
    ran: Counter[str] = Counter()

    @tool
    async def lookup() -> str:
        ran["lookup"] += 1
        return "fresh result"

    request = await seed_tool_step(checkpointer, t, [call("call_1", "lookup")])
    await checkpointer.ledger_put(t, f"{request.id}:call_1", "lookup", garbage)
    values = await app_for([lookup], [], checkpointer).ainvoke(None, {"thread_id": t})
    assert ran["lookup"] == 1, "a malformed ledger entry must be a miss: the tool runs"
    assert tool_messages(values)["call_1"].content == "fresh result"
    warnings = log_lines(caplog, logging.WARNING)
    assert any("is malformed" in line and "will run again" in line for line in warnings)
    # The first WELL-FORMED result wins: the fresh result replaced the garbage, so later replays hit.
    entry = await checkpointer.ledger_get(t, f"{request.id}:call_1")
    assert entry is not None and decode(entry.result).result == "fresh result", (
        "a malformed ledger entry must be replaced by the result of the call that ran again"
    )
    assert not any("COMPLETED but the ledger already holds an entry" in line for line in warnings), warnings
    assert any("malformed ledger entry was replaced" in line for line in log_lines(caplog, logging.INFO))


async def test_malformed_entry_of_a_started_side_effect_call_pauses_the_run_and_says_so(
    backend: Backend, checkpointer: Checkpointer, caplog: pytest.LogCaptureFixture
) -> None:
    """Default in-doubt policy: the log line says the run pauses (it does not claim the tool runs again)."""
    t = backend.thread()
    ran: Counter[str] = Counter()

    @tool(side_effects=True)
    async def charge_card() -> str:
        ran["charge_card"] += 1
        return "charged"

    request = await seed_tool_step(checkpointer, t, [call("call_1", "charge_card")])
    key = f"{request.id}:call_1"
    await checkpointer.intent_put(t, key, "charge_card", idempotency_key(t, key))
    await checkpointer.ledger_put(t, key, "charge_card", {"not": "an envelope"})
    paused = await app_for([charge_card], [], checkpointer).ainvoke(None, {"thread_id": t})
    [pending] = paused["__interrupt__"]
    assert pending.payload["reason"] == "in_doubt" and ran["charge_card"] == 0
    [line] = [line for line in log_lines(caplog, logging.WARNING) if "is malformed" in line]
    assert "the run pauses with an in-doubt interrupt" in line, f"the log must say what really happens next: {line}"
    assert "the tool will run again" not in line.split("if not,")[0], line

    values = await app_for([charge_card], [], checkpointer).ainvoke(Command(resume="retry"), {"thread_id": t})
    assert ran["charge_card"] == 1 and tool_messages(values)["call_1"].content == "charged"
    entry = await checkpointer.ledger_get(t, key)
    assert entry is not None and decode(entry.result).result == "charged", "the retried call must repair the entry"


async def test_unparsable_ledger_row_written_with_raw_sql_is_a_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentrun")
    ran: Counter[str] = Counter()

    @tool
    async def lookup() -> str:
        ran["lookup"] += 1
        return "fresh result"

    path = tmp_path / "store.db"
    checkpointer = SqliteCheckpointer(path)
    try:
        await checkpointer.setup()
        request = await seed_tool_step(checkpointer, "t", [call("call_1", "lookup")])
        db = sqlite3.connect(path)
        with db:
            db.execute(
                "INSERT INTO tool_executions (thread_id, tool_call_id, tool_name, result, created_at) "
                "VALUES (?, ?, ?, ?, 0)",
                ("t", f"{request.id}:call_1", "lookup", '{"__kind__": "raw", "value": tru'),
            )
        db.close()
        values = await app_for([lookup], [], checkpointer).ainvoke(None, {"thread_id": "t"})
    finally:
        await checkpointer.aclose()
    assert ran["lookup"] == 1, "an unparsable ledger row must be a miss: the tool runs"
    assert tool_messages(values)["call_1"].content == "fresh result"
    assert any("is malformed" in line for line in log_lines(caplog, logging.WARNING))
    assert any("malformed ledger entry was replaced" in line for line in log_lines(caplog, logging.INFO)), (
        "an unparsable row must be replaced by the fresh result"
    )


class UnreadableLedger(InMemoryCheckpointer):
    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        raise StorageError("disk on fire")


class UnwritableLedger(InMemoryCheckpointer):
    async def ledger_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        raise StorageError("disk full")


async def test_ledger_read_failure_is_logged_and_the_tool_runs(caplog: pytest.LogCaptureFixture) -> None:
    ran: Counter[str] = Counter()

    @tool
    async def lookup() -> str:
        ran["lookup"] += 1
        return "fresh result"

    checkpointer = UnreadableLedger()
    values = await app_for([lookup], [call("call_1", "lookup")], checkpointer).ainvoke("go", {"thread_id": "t"})
    assert ran["lookup"] == 1
    assert tool_messages(values)["call_1"].content == "fresh result"
    state = await checkpointer.aget("t")
    assert state is not None and state.status == "completed", "a ledger read failure must not fail the run"
    warnings = log_lines(caplog, logging.WARNING)
    assert any("ledger read failed" in line and "disk on fire" in line for line in warnings), warnings


class UnavailableStore(InMemoryCheckpointer):
    """The store stayed down past the runner's retry bound (what PgCheckpointer raises then)."""

    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        raise StoreUnavailableError("postgres stayed unreachable for 60s")


async def test_a_store_down_past_the_retry_bound_ends_the_attempt_before_the_tool_runs() -> None:
    """Running the tool now would leave a side effect nobody can record; the next attempt would repeat it."""
    ran: Counter[str] = Counter()

    @tool(side_effects=True)
    async def charge() -> str:
        ran["charge"] += 1
        return "ch_1"

    app = app_for([charge], [call("call_1", "charge")], UnavailableStore())
    with pytest.raises(StoreUnavailableError):
        await app.ainvoke("go", {"thread_id": "t"})
    assert ran["charge"] == 0, "a tool ran although its result could not have been recorded"


async def test_ledger_write_failure_logs_completed_but_not_recorded_and_the_run_continues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @tool
    async def charge() -> dict[str, str]:
        return {"charge": "ch_1"}

    checkpointer = UnwritableLedger()
    values = await app_for([charge], [call("call_1", "charge")], checkpointer).ainvoke("go", {"thread_id": "t"})
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("COMPLETED but could not be recorded" in r.getMessage() for r in errors), [
        r.getMessage() for r in errors
    ]
    line = next(r.getMessage() for r in errors if "COMPLETED" in r.getMessage())
    assert "charge" in line and ":call_1" in line and "disk full" in line, "the line must say which call to reconcile"
    assert tool_messages(values)["call_1"].content == '{"charge": "ch_1"}'
    assert values["messages"][-1].content == 'done: call_1={"charge": "ch_1"}', "the result must reach the model"
    state = await checkpointer.aget("t")
    assert state is not None and state.status == "completed"
    assert state.meta["tool_calls"]["unrecorded"] == 1, "the checkpoint must carry the record failure to the operator"


async def test_result_that_cannot_be_serialized_is_reported_as_not_recorded(
    backend: Backend, checkpointer: Checkpointer, caplog: pytest.LogCaptureFixture
) -> None:
    t = backend.thread()

    @tool
    async def odd() -> Any:
        return {"value": {1, 2}}  # a set: not JSON

    values = await app_for([odd], [call("call_1", "odd")], checkpointer).ainvoke("go", {"thread_id": t})
    assert any("COMPLETED but could not be recorded" in line for line in log_lines(caplog, logging.ERROR))
    assert tool_messages(values)["call_1"].content == '{"value": "{1, 2}"}'
    assert await checkpointer.ledger_list(t) == []


async def test_entry_recorded_by_another_tool_is_a_determinism_error_not_its_result(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()

    @tool
    async def refund_payment() -> str:
        ran["refund_payment"] += 1
        return "refunded"

    request = await seed_tool_step(checkpointer, t, [call("call_1", "refund_payment")])
    await checkpointer.ledger_put(t, f"{request.id}:call_1", "lookup_order", {"__kind__": "raw", "value": "ORDER"})
    app = app_for([refund_payment], [], checkpointer)
    with pytest.raises(DeterminismError) as raised:
        await app.ainvoke(None, {"thread_id": t})
    assert raised.value.code == "LEDGER_DETERMINISM_001"
    assert "lookup_order" in str(raised.value) and "refund_payment" in str(raised.value)
    assert ran["refund_payment"] == 0, "the tool must not run when the ledger disagrees about what was called"
    state = await app.aget_state(t)
    assert state is not None and state.status == "failed"
    assert state.meta["error"]["code"] == "LEDGER_DETERMINISM_001"
    assert all("ORDER" not in m.content for m in state.values["messages"]), "another tool's result was handed out"


async def test_turn_9_refund_as_call_1_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The support example: every turn's model reuses call_1; the ledger never confuses turns."""
    effects = tmp_path / "effects.db"
    monkeypatch.setenv("SUPPORT_EFFECTS_DB", str(effects))
    from examples.support_agent import count_effects, graph

    checkpointer = SqliteCheckpointer(tmp_path / "agentrun.db")
    try:
        app = graph.compile(checkpointer)
        config = {"thread_id": "order-4821"}
        for _ in range(8):
            await app.ainvoke("charge my saved card for order 4821 and email me the receipt", config)
        values = await app.ainvoke("I changed my mind: please refund order 4821", config)
        ledger = await checkpointer.ledger_list("order-4821")
    finally:
        await checkpointer.aclose()
    counts = count_effects(str(effects))
    assert counts["refunds"] == 1, "turn 9's refund_payment (call_1) was answered from an earlier turn's call_1"
    assert counts["charges"] == 8 and counts["receipts"] == 8, "every turn's charge and receipt run exactly once"
    refund = values["messages"][-2]
    assert refund.role == "tool" and refund.name == "refund_payment" and refund.tool_call_id == "call_1"
    assert '"refunded"' in refund.content
    call_1 = [e for e in ledger if e.key.endswith(":call_1")]
    assert len(call_1) == 9 and len({e.key for e in call_1}) == 9
    assert [e.tool_name for e in call_1] == ["lookup_order"] * 8 + ["refund_payment"]


# -- an edited call (same message id and call id, other arguments) is not a replay (issue 31) -----------------


def _charging(ran: list[tuple[str, str | None]], *, in_doubt: InDoubtPolicy = "interrupt") -> Tool:
    @tool(side_effects=True, in_doubt=in_doubt)
    async def charge_card(order_id: str, idempotency_key: str | None) -> str:
        ran.append((order_id, idempotency_key))
        return f"charged order {order_id}"

    return charge_card


def _recorded(order_id: str) -> dict[str, Any]:
    return encode(f"charged order {order_id}", args=args_digest({"order_id": order_id}))


async def test_a_call_whose_entry_holds_other_arguments_is_no_replay_and_runs_under_its_own_key(
    backend: Backend, checkpointer: Checkpointer, caplog: pytest.LogCaptureFixture
) -> None:
    """Two parallel edited calls: on PostgreSQL their records share a group commit, which carries the digests."""
    t = backend.thread()
    ran: list[tuple[str, str | None]] = []
    calls = [call("call_1", "charge_card", order_id="9999"), call("call_2", "charge_card", order_id="5000")]
    request = await seed_tool_step(checkpointer, t, calls)
    for call_id, order in (("call_1", "4821"), ("call_2", "4999")):
        await checkpointer.ledger_put(t, f"{request.id}:{call_id}", "charge_card", _recorded(order))
    values = await app_for([_charging(ran)], [], checkpointer).ainvoke(None, {"thread_id": t})
    assert sorted(order for order, _ in ran) == ["5000", "9999"], (
        f"GUARANTEE BROKEN: an edited call was answered with the recorded result of other arguments: ran {ran}"
    )
    answers = tool_messages(values)
    assert (answers["call_1"].content, answers["call_2"].content) == ("charged order 9999", "charged order 5000")
    given = dict(ran)
    for (call_id, order), recorded in zip((("call_1", "9999"), ("call_2", "5000")), ("4821", "4999"), strict=True):
        key = f"{request.id}:{call_id}"
        own = edited_key(key, args_digest({"order_id": order}))
        assert given[order] == idempotency_key(t, own) != idempotency_key(t, key), "the edited call needs its own key"
        entry = await checkpointer.ledger_get(t, own)
        assert entry is not None and decode(entry.result) == decode(_recorded(order)), "the edited call's record"
        original = await checkpointer.ledger_get(t, key)
        assert original is not None and decode(original.result) == decode(_recorded(recorded)), "the original stays"
    assert any("holds this call with other arguments" in line for line in log_lines(caplog, logging.WARNING))


async def test_an_edited_call_is_answered_from_its_own_entry_on_replay(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    ran: list[tuple[str, str | None]] = []
    request = await seed_tool_step(checkpointer, t, [call("call_1", "charge_card", order_id="9999")])
    key = f"{request.id}:call_1"
    await checkpointer.ledger_put(t, key, "charge_card", _recorded("4821"))
    await checkpointer.ledger_put(
        t, edited_key(key, args_digest({"order_id": "9999"})), "charge_card", _recorded("9999")
    )
    values = await app_for([_charging(ran)], [], checkpointer).ainvoke(None, {"thread_id": t})
    assert ran == [], "GUARANTEE BROKEN: an edited call recorded under its own key ran again on replay"
    assert tool_messages(values)["call_1"].content == "charged order 9999"


async def test_a_start_recorded_with_other_arguments_is_another_calls_so_the_edited_call_is_not_in_doubt(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    ran: list[tuple[str, str | None]] = []
    for started, expected in (("4821", ["9999"]), ("9999", [])):
        t = backend.thread(f"started-{started}")
        request = await seed_tool_step(checkpointer, t, [call("call_1", "charge_card", order_id="9999")])
        key = f"{request.id}:call_1"
        await checkpointer.intent_put(t, key, "charge_card", "ar-x", args_digest=args_digest({"order_id": started}))
        ran.clear()
        values = await app_for([_charging(ran, in_doubt="report")], [], checkpointer).ainvoke(None, {"thread_id": t})
        assert [order for order, _ in ran] == expected, (
            f"GUARANTEE BROKEN: a start of order {started} made the call for 9999 {'run' if ran else 'in doubt'}"
        )
        if ran:
            assert ran[0][1] == idempotency_key(t, edited_key(key, args_digest({"order_id": "9999"})))
        else:
            assert "outcome is unknown" in tool_messages(values)["call_1"].content


async def test_entries_and_intents_recorded_before_argument_digests_replay_as_they_did(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    ran: list[tuple[str, str | None]] = []
    looked_up: list[str] = []

    @tool
    async def lookup_order(order_id: str) -> str:
        looked_up.append(order_id)
        return "fresh"

    calls = [call("call_1", "lookup_order", order_id="4821"), call("call_2", "charge_card", order_id="4821")]
    request = await seed_tool_step(checkpointer, t, calls)
    # Written by a release before digests: no "args" in the entry, no digest on the intent.
    await checkpointer.ledger_put(t, f"{request.id}:call_1", "lookup_order", {"__kind__": "raw", "value": "ORDER"})
    await checkpointer.intent_put(t, f"{request.id}:call_2", "charge_card", "ar-x")
    app = app_for([lookup_order, _charging(ran, in_doubt="report")], [], checkpointer)
    answers = tool_messages(await app.ainvoke(None, {"thread_id": t}))
    assert looked_up == [] and answers["call_1"].content == "ORDER", "an entry without a digest must still replay"
    assert ran == [] and "outcome is unknown" in answers["call_2"].content, "an intent without a digest is in doubt"
