"""The store contract, a suite collected by each tier that runs it against its backends, per protocol.

Collected by ``tests/unit/test_checkpointers.py`` (every backend of the ``backend``/``checkpointer``
fixtures) and ``tests/postgres/test_conformance_cached.py`` (PostgreSQL with the Redis hot cache).

Sections follow ``agentrun.checkpoint.base``: ``StateStore`` (versioned
writes, threads), ``LedgerStore`` (ledger, repair, intents),
``ControlStore`` (stop requests, fencing across attempts and AgentRuns),
then ``Checkpointer``: the engine on each backend where the store is what
makes the guarantee hold (a completed tool call is not executed again after
a crash). Each test names the guarantee it protects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from agentrun import Command, FencedError, StaleStateError, StorageError, interrupt, tool, user
from agentrun.checkpoint import Checkpointer, ControlStore, LedgerStore, StateStore
from agentrun.checkpoint.base import LedgerRow
from agentrun.messages import assistant
from tests.support.checkpointers import Backend, write
from tests.unit.helpers import app_for, call, eventually, tool_messages


def envelope(value: Any) -> dict[str, Any]:
    return {"__kind__": "raw", "value": value}


def test_importing_agentrun_loads_no_store_driver_until_a_store_needs_it() -> None:
    script = (
        "import sys, agentrun, agentrun.runner\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('asyncpg', 'redis', 'sqlite3'))\n"
        "assert not loaded, f'importing agentrun loaded {loaded}'\n"
        "from agentrun import CachedStore, PgCheckpointer, SqliteCheckpointer, open_store\n"
        "assert PgCheckpointer.__module__ == 'agentrun.checkpoint.postgres' and 'asyncpg' in sys.modules\n"
        "assert CachedStore.__module__ == 'agentrun.checkpoint.cached'\n"
        "assert isinstance(open_store('postgresql://u@h/db', redis_url='redis://h:6379/0'), CachedStore)\n"
        "assert SqliteCheckpointer.__module__ == 'agentrun.checkpoint.sqlite' and 'sqlite3' in sys.modules\n"
        "assert isinstance(open_store('sqlite:///:memory:'), SqliteCheckpointer)\n"
        "assert isinstance(open_store('threads.db'), SqliteCheckpointer)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"the public face broke: {done.stderr}"


def test_every_backend_implements_the_three_protocols(checkpointer: Checkpointer) -> None:
    for protocol in (StateStore, LedgerStore, ControlStore):
        assert isinstance(checkpointer, protocol), f"{type(checkpointer).__name__} is not a {protocol.__name__}"


# == StateStore ====================================================================================

# -- versioned writes -----------------------------------------------------------------------------


async def test_versions_start_at_1_and_each_write_advances_by_one(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    assert await checkpointer.aget(t) is None, "an unknown thread must read as None"
    m1 = user("hello")
    v1 = await checkpointer.aput(t, write((0, m1), count=1, values={"n": 1}, meta={"run_id": "r"}), expected_version=0)
    v2 = await checkpointer.aput(t, write(count=1, step=1, node="tools", values={"n": 2}), expected_version=1)
    assert (v1, v2) == (1, 2)
    cp = await checkpointer.aget(t)
    assert cp is not None
    assert (cp.version, cp.current_node, cp.step, cp.status, cp.values) == (2, "tools", 1, "running", {"n": 2})
    assert [m.id for m in cp.messages] == [m1.id], "the message written at version 1 belongs to version 2 too"


async def test_stale_expected_version_raises_storage_conflict_and_nothing_of_it_lands(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    first = user("first")
    await checkpointer.aput(t, write((0, first), count=1, values={"who": "a"}), expected_version=0)
    with pytest.raises(StaleStateError) as raised:
        await checkpointer.aput(
            t,
            write((0, user("replaced")), (1, assistant("appended")), count=2, values={"who": "b"}, status="completed"),
            expected_version=0,
        )
    assert raised.value.code == "STORAGE_CONFLICT_001"
    assert (raised.value.expected, raised.value.actual) == (0, 1)
    assert "STORAGE_CONFLICT_001" in str(raised.value)
    cp = await checkpointer.aget(t)
    assert cp is not None
    assert cp.version == 1 and cp.values == {"who": "a"} and cp.status == "running", "a rejected write changed state"
    assert [m.content for m in cp.messages] == ["first"], "a rejected write's messages landed"
    with pytest.raises(StaleStateError):
        await checkpointer.aput(t, write(count=1), expected_version=5)  # ahead of the store is stale too


async def test_state_that_is_not_json_is_a_storage_error_and_nothing_lands(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    await checkpointer.aput(t, write((0, user("a")), count=1, values={"n": 1}), expected_version=0)
    for values, meta in (({"n": {1, 2}}, {}), ({"n": 2}, {"when": object()}), ({"n": float("nan")}, {})):
        with pytest.raises(StorageError):
            await checkpointer.aput(t, write((1, user("b")), count=2, values=values, meta=meta), expected_version=1)
    cp = await checkpointer.aget(t)
    assert cp is not None and cp.version == 1 and cp.values == {"n": 1} and len(cp.messages) == 1


async def test_messages_are_written_incrementally_and_replaced_by_index(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    a, b, c = user("a"), assistant("b"), user("c")
    await checkpointer.aput(t, write((0, a), (1, b), count=2), expected_version=0)
    await checkpointer.aput(t, write((2, c), count=3), expected_version=1)  # only the new one
    cp = await checkpointer.aget(t)
    assert cp is not None and [m.content for m in cp.messages] == ["a", "b", "c"]
    b2 = b.model_copy(update={"content": "b, edited"})
    await checkpointer.aput(t, write((1, b2), count=3), expected_version=2)  # replace in place
    cp = await checkpointer.aget(t)
    assert cp is not None
    assert [m.content for m in cp.messages] == ["a", "b, edited", "c"]
    assert [m.id for m in cp.messages] == [a.id, b.id, c.id]
    assert cp.messages[0] == a, "a message must round-trip unchanged"


async def test_setup_is_idempotent_and_keeps_data(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    await checkpointer.aput(t, write((0, user("x")), count=1), expected_version=0)
    await checkpointer.ledger_put(t, "m:c", "tool", envelope(1))
    await checkpointer.setup()
    await checkpointer.setup()
    second = await backend.open()  # another process migrating the same store
    await second.setup()
    for cp in (checkpointer, second):
        state = await cp.aget(t)
        assert state is not None and state.version == 1 and [m.content for m in state.messages] == ["x"]
        entry = await cp.ledger_get(t, "m:c")
        assert entry is not None and entry.result == envelope(1)


async def test_head_is_the_latest_version_and_changes_incarnation_when_the_thread_is_recreated(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    assert await checkpointer.ahead(t) is None, "a thread without state has no head"
    commit = await checkpointer.acommit(t, write((0, user("a")), count=1), expected_version=0)
    head = await checkpointer.ahead(t)
    assert head is not None and (head.version, head.incarnation) == (1, commit.incarnation)
    await checkpointer.aput(t, write(count=1, step=1), expected_version=1)
    assert (await checkpointer.ahead(t)) == type(head)(2, head.incarnation)
    await checkpointer.delete_thread(t)
    again = await checkpointer.acommit(t, write((0, user("b")), count=1), expected_version=0)
    assert again.incarnation != commit.incarnation, "a re-created thread must not pass for the deleted one"


# == LedgerStore ===================================================================================

# -- the ledger and intents ---------------------------------------------------------------------


async def test_ledger_first_write_wins(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    assert await checkpointer.ledger_get(t, "msg_1:call_1") is None
    assert await checkpointer.ledger_put(t, "msg_1:call_1", "charge_card", envelope({"charged": 1})) is True
    assert await checkpointer.ledger_put(t, "msg_1:call_1", "other_tool", envelope({"charged": 2})) is False
    entry = await checkpointer.ledger_get(t, "msg_1:call_1")
    assert entry is not None
    assert (entry.key, entry.tool_name, entry.result) == ("msg_1:call_1", "charge_card", envelope({"charged": 1}))


async def test_ledger_is_scoped_by_thread_and_listed_in_order(backend: Backend, checkpointer: Checkpointer) -> None:
    t, other = backend.thread("a"), backend.thread("b")
    for key in ("m1:call_1", "m1:call_2", "m2:call_1"):
        await checkpointer.ledger_put(t, key, "tool", envelope(key))
    assert await checkpointer.ledger_get(other, "m1:call_1") is None, "a ledger entry leaked into another thread"
    entries = await checkpointer.ledger_list(t)
    assert [e.key for e in entries] == ["m1:call_1", "m1:call_2", "m2:call_1"]
    assert [e.result for e in entries] == [envelope(k) for k in ("m1:call_1", "m1:call_2", "m2:call_1")]
    assert await checkpointer.ledger_list(other) == []


async def test_ledger_replace_swaps_only_the_exact_text_it_read(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    await checkpointer.ledger_put(t, "m:c", "lookup", {"not": "an envelope"})
    broken = await checkpointer.ledger_get(t, "m:c")
    assert broken is not None and broken.text is not None, "a ledger entry must carry its stored text"
    assert not await checkpointer.ledger_replace(t, "m:c", "other", envelope(1), expected_text=broken.text), (
        "an entry of another tool must never be replaced"
    )
    assert not await checkpointer.ledger_replace(t, "m:c", "lookup", envelope(1), expected_text=broken.text + " "), (
        "a replace must compare the exact stored text"
    )
    assert not await checkpointer.ledger_replace(t, "m:none", "lookup", envelope(1), expected_text=broken.text)
    assert await checkpointer.ledger_replace(t, "m:c", "lookup", envelope("first"), expected_text=broken.text)
    # A second repairer that read the same broken text loses: the first well-formed result stays.
    assert not await checkpointer.ledger_replace(t, "m:c", "lookup", envelope("second"), expected_text=broken.text)
    entry = await checkpointer.ledger_get(t, "m:c")
    assert entry is not None and entry.result == envelope("first")
    assert [e.key for e in await checkpointer.ledger_list(t)] == ["m:c"]


async def test_intents_are_kept_once_recorded(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    assert await checkpointer.intent_get(t, "m:c") is None
    await checkpointer.intent_put(t, "m:c", "charge_card", "ar-key-1")
    await checkpointer.intent_put(t, "m:c", "charge_card", "ar-key-2")
    intent = await checkpointer.intent_get(t, "m:c")
    assert intent is not None
    assert (intent.key, intent.tool_name, intent.idempotency_key) == ("m:c", "charge_card", "ar-key-1")
    await checkpointer.intent_put(t, "m:d", "send_receipt", None)
    none_key = await checkpointer.intent_get(t, "m:d")
    assert none_key is not None and none_key.idempotency_key is None
    assert await checkpointer.intent_get(backend.thread("other"), "m:c") is None


async def test_ledger_put_many_answers_per_row_and_the_first_result_of_each_key_stays(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    """The group commit's write: each row insert-if-absent, its own answer, exactly its own text kept."""
    t = backend.thread()
    assert await checkpointer.ledger_put(t, "m:b", "score", envelope("first")) is True
    rows = [
        LedgerRow("m:a", "lookup", envelope({"v": "caf\u00e9 \u0000 nul"})),
        LedgerRow("m:b", "score", envelope("second")),
        LedgerRow("m:c", "notify", envelope([1, 2])),
    ]
    assert await checkpointer.ledger_put_many(t, rows) == [True, False, True], (
        "each row of a batch must say whether it was recorded (False: the key already had a result)"
    )
    entries = {e.key: e for e in await checkpointer.ledger_list(t)}
    assert {k: (e.tool_name, e.result) for k, e in entries.items()} == {
        "m:a": ("lookup", envelope({"v": "caf\u00e9 \u0000 nul"})),
        "m:b": ("score", envelope("first")),
        "m:c": ("notify", envelope([1, 2])),
    }, "a batch must record every new row exactly and never overwrite a recorded one"
    assert await checkpointer.ledger_put_many(t, rows) == [False, False, False], "a batch written again is a no-op"
    assert await checkpointer.ledger_put_many(backend.thread("other"), rows[:1]) == [True], "batches are per thread"


async def test_intent_claim_returns_the_earlier_start_or_records_this_one(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    assert await checkpointer.intent_claim(t, "m:c", "charge_card", "ar-key-1") is None, "a first start is recorded"
    recorded = await checkpointer.intent_get(t, "m:c")
    assert recorded is not None and (recorded.tool_name, recorded.idempotency_key) == ("charge_card", "ar-key-1")
    again = await checkpointer.intent_claim(t, "m:c", "charge_card", "ar-key-2")
    assert again is not None, "a second start must find the first one: the call is in doubt"
    assert (again.key, again.tool_name, again.idempotency_key) == ("m:c", "charge_card", "ar-key-1")
    assert again.started_at == pytest.approx(recorded.started_at, abs=1e-3)
    assert await checkpointer.intent_claim(backend.thread("other"), "m:c", "charge_card", None) is None


async def test_a_fenced_batch_or_intent_claim_records_nothing(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    await checkpointer.register_attempt(t, 2, run_uid="run-a")
    rows = [LedgerRow("m:a", "lookup", envelope(1)), LedgerRow("m:b", "score", envelope(2))]
    with pytest.raises(FencedError):
        await checkpointer.ledger_put_many(t, rows, attempt=1, run_uid="run-a")
    with pytest.raises(FencedError):
        await checkpointer.ledger_put_many(t, rows, attempt=2, run_uid="run-b")
    with pytest.raises(FencedError):
        await checkpointer.intent_claim(t, "m:a", "charge_card", None, attempt=1, run_uid="run-a")
    assert await checkpointer.ledger_list(t) == [], "a fenced batch must record nothing"
    assert await checkpointer.intent_get(t, "m:a") is None, "a fenced claim must record nothing"
    assert await checkpointer.ledger_put_many(t, rows, attempt=2, run_uid="run-a") == [True, True]


# == ControlStore ==================================================================================

# -- stop requests ------------------------------------------------------------------------------


async def test_stop_request_is_kept_until_cleared(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    assert await checkpointer.stop_requested(t) is None
    await checkpointer.request_stop(t, "operator asked")
    assert await checkpointer.stop_requested(t) == "operator asked"
    await checkpointer.request_stop(t, "second request")
    assert await checkpointer.stop_requested(t) == "operator asked", "a pending request keeps its first reason"
    await checkpointer.clear_stop(t)
    assert await checkpointer.stop_requested(t) is None
    await checkpointer.request_stop(t)
    assert await checkpointer.stop_requested(t) == "", "a stop without a reason is still a stop"
    await checkpointer.clear_stop(backend.thread("never-stopped"))  # clearing nothing is fine


async def test_stop_request_is_seen_by_another_connection(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    other = await backend.open()
    await other.request_stop(t, "from another process")
    assert await checkpointer.stop_requested(t) == "from another process"
    await checkpointer.clear_stop(t)
    assert await other.stop_requested(t) is None


# -- run inputs -----------------------------------------------------------------------------------


async def test_run_inputs_round_trip_per_run_and_attempt_and_go_with_their_thread(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    assert await checkpointer.aget_run_inputs(t, run_uid="u1", attempt=1) is None
    text = {"messages": [{"role": "user", "content": 'caf\u00e9 \U0001f600 \\ "q"'}], "n": 1.5, "z": None}
    await checkpointer.put_run_inputs(t, run_uid="u1", attempt=1, input=text, resume=None)
    record = await checkpointer.aget_run_inputs(t, run_uid="u1", attempt=1)
    assert record is not None and (record.input, record.resume) == (text, None), "the input must read back exactly"
    await checkpointer.put_run_inputs(t, run_uid="u1", attempt=1, input=text, resume={"value": {"ok": True}})
    record = await checkpointer.aget_run_inputs(t, run_uid="u1", attempt=1)
    assert record is not None and record.resume == {"value": {"ok": True}}, "writing an attempt again is an upsert"
    assert await checkpointer.aget_run_inputs(t, run_uid="u1", attempt=2) is None, "inputs are per attempt"
    assert await checkpointer.aget_run_inputs(t, run_uid="u2", attempt=1) is None, "inputs are per run uid"
    await checkpointer.put_run_inputs(t, run_uid="u1", attempt=2, input=None, resume={"values": {"i": 1}})
    record = await checkpointer.aget_run_inputs(t, run_uid="u1", attempt=2)
    assert record is not None and (record.input, record.resume) == (None, {"values": {"i": 1}})
    assert await checkpointer.aget_run_inputs(t, run_uid="u1", attempt=1) is None, "older attempts are dropped"
    other = await backend.open()
    assert await other.aget_run_inputs(t, run_uid="u1", attempt=2) == record, "another process reads the record"
    assert t not in await checkpointer.list_threads(), "a thread with inputs but no state is not listed"
    await checkpointer.delete_thread(t)
    assert await checkpointer.aget_run_inputs(t, run_uid="u1", attempt=2) is None, "inputs go with their thread"
    with pytest.raises(StorageError):
        await checkpointer.put_run_inputs(t, run_uid="u1", attempt=3, input={"x": float("nan")}, resume=None)


# -- turns --------------------------------------------------------------------------------------


def turn_write(status: Any, *, step: int = 0, record: bool = True, **meta: Any) -> Any:
    return dataclasses.replace(write(count=0, step=step, status=status, meta=meta), record_turn=record)


async def test_a_turn_is_recorded_with_its_first_and_final_checkpoints_only(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    assert await checkpointer.aget_turn(t, "req-1") is None, "an unknown thread has no turns"
    calls = {"executed": 1, "replayed": 0, "failed": 1, "in_doubt": 0}
    await checkpointer.aput(t, turn_write("running", request_key="req-1", run_uid="u1"), expected_version=0)
    first = await checkpointer.aget_turn(t, "req-1")
    assert first is not None, "a turn's first checkpoint must record the turn"
    assert (first.thread_id, first.request_key, first.run_uid, first.status, first.version) == (
        t,
        "req-1",
        "u1",
        "running",
        1,
    )
    # A plain step does not touch the record (it says running, at the version the turn started).
    await checkpointer.aput(
        t, turn_write("running", step=1, record=False, request_key="req-1", tool_calls=calls), expected_version=1
    )
    assert await checkpointer.aget_turn(t, "req-1") == first, "a plain step must not write the turn record"
    result = {"message": "Done.", "digest": "sha256:" + "0" * 64, "truncated": False}
    await checkpointer.aput(
        t,
        turn_write("completed", step=2, request_key="req-1", run_uid="u1", tool_calls=calls, result=result),
        expected_version=2,
    )
    done = await checkpointer.aget_turn(t, "req-1")
    assert done is not None and (done.status, done.version, done.result, done.tool_calls) == (
        "completed",
        3,
        result,
        calls,
    ), "the final checkpoint must record the outcome, the result and the tool counts"
    assert done.error is None and done.started_at == first.started_at and done.updated_at >= first.updated_at
    assert await checkpointer.aget_turn(t, "req-2") is None, "turns are per request key"
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and (progress.request_key, progress.result, progress.tool_calls) == (
        "req-1",
        result,
        calls,
    ), "progress must carry the latest turn's key, result and tool counts"
    other = await backend.open()
    assert await other.aget_turn(t, "req-1") == done, "another process reads the same record"


async def test_a_failed_turn_records_its_error_and_a_rejected_write_records_nothing(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    error = {"code": "TOOL_ERROR_001", "message": "charge_card failed", "node": "tools"}
    last = {"tool": "charge_card", "code": "TOOL_ERROR_001", "message": "ValueError: declined"}
    await checkpointer.aput(t, turn_write("running", request_key="k"), expected_version=0)
    with pytest.raises(StaleStateError):
        await checkpointer.aput(t, turn_write("completed", request_key="k"), expected_version=0)
    with pytest.raises(StaleStateError):
        await checkpointer.aput(t, turn_write("running", request_key="other"), expected_version=0)
    assert await checkpointer.aget_turn(t, "other") is None, "a rejected write must not record its turn"
    stale = await checkpointer.aget_turn(t, "k")
    assert stale is not None and stale.status == "running", "a rejected write must not change the turn"
    await checkpointer.aput(
        t, turn_write("failed", request_key="k", error=error, last_tool_error=last), expected_version=1
    )
    failed = await checkpointer.aget_turn(t, "k")
    assert failed is not None and (failed.status, failed.error, failed.result) == ("failed", error, None)
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and progress.last_tool_error == last and progress.result is None
    await checkpointer.aput(t, turn_write("running", request_key=""), expected_version=2)
    await checkpointer.delete_thread(t)
    assert await checkpointer.aget_turn(t, "k") is None, "turns go with their thread"


# -- fencing ------------------------------------------------------------------------------------


async def test_register_attempt_fences_off_older_attempts(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    await checkpointer.register_attempt(t, 1)
    await checkpointer.aput(t, write((0, user("a")), count=1), expected_version=0, attempt=1)
    await checkpointer.register_attempt(t, 2)
    await checkpointer.register_attempt(t, 2)  # re-registering the newest attempt is fine
    with pytest.raises(FencedError) as raised:
        await checkpointer.aput(t, write((1, user("zombie")), count=2), expected_version=1, attempt=1)
    assert raised.value.code == "STORAGE_FENCED_001"
    with pytest.raises(FencedError):
        await checkpointer.ledger_put(t, "m:c", "tool", envelope(1), attempt=1)
    with pytest.raises(FencedError):
        await checkpointer.intent_put(t, "m:c", "tool", None, attempt=1)
    with pytest.raises(FencedError):
        await checkpointer.register_attempt(t, 1)
    cp = await checkpointer.aget(t)
    assert cp is not None and cp.version == 1 and [m.content for m in cp.messages] == ["a"], "a fenced write landed"
    assert await checkpointer.ledger_get(t, "m:c") is None and await checkpointer.intent_get(t, "m:c") is None
    assert await checkpointer.aput(t, write((1, user("b")), count=2), expected_version=1, attempt=2) == 2
    assert await checkpointer.ledger_put(t, "m:c", "tool", envelope(1), attempt=3) is True


async def test_a_new_agentrun_claims_a_thread_that_outlived_the_previous_one(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    await checkpointer.register_attempt(t, 1, run_uid="run-a")
    await checkpointer.register_attempt(t, 2, run_uid="run-a")
    await checkpointer.aput(t, write((0, user("a")), count=1), expected_version=0, attempt=2, run_uid="run-a")
    # The next turn of the conversation is a new AgentRun, its first pod is attempt 1.
    await checkpointer.register_attempt(t, 1, run_uid="run-b")
    assert await checkpointer.aput(t, write(count=1, step=1), expected_version=1, attempt=1, run_uid="run-b") == 2
    assert await checkpointer.ledger_put(t, "m:b", "tool", envelope(1), attempt=1, run_uid="run-b") is True
    await checkpointer.intent_put(t, "m:b", "tool", "k", attempt=1, run_uid="run-b")
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and progress.version == 2
    if progress.attempt is not None:
        assert (progress.run_uid, progress.attempt) == ("run-b", 1), "progress must name the run owning the thread"


async def test_the_superseded_runs_zombie_writes_and_re_registration_are_fenced(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    await checkpointer.register_attempt(t, 2, run_uid="run-a")
    await checkpointer.aput(t, write((0, user("a")), count=1), expected_version=0, attempt=2, run_uid="run-a")
    await checkpointer.register_attempt(t, 1, run_uid="run-b")
    for zombie in (
        checkpointer.aput(t, write((1, user("zombie")), count=2), expected_version=1, attempt=2, run_uid="run-a"),
        checkpointer.ledger_put(t, "m:a", "tool", envelope("zombie"), attempt=2, run_uid="run-a"),
        checkpointer.intent_put(t, "m:a", "tool", None, attempt=2, run_uid="run-a"),
    ):
        with pytest.raises(FencedError) as raised:
            await zombie
        assert "run-b" in str(raised.value), f"the error must name the run that owns the thread: {raised.value}"
    # A restarted pod of the superseded run cannot take the thread back, whatever its attempt.
    for attempt in (2, 3):
        with pytest.raises(FencedError, match="run-b"):
            await checkpointer.register_attempt(t, attempt, run_uid="run-a")
    cp = await checkpointer.aget(t)
    assert cp is not None and cp.version == 1 and [m.content for m in cp.messages] == ["a"], "a fenced write landed"
    assert await checkpointer.ledger_get(t, "m:a") is None and await checkpointer.intent_get(t, "m:a") is None
    # The owner's own older attempt is still fenced by attempt number.
    await checkpointer.register_attempt(t, 2, run_uid="run-b")
    with pytest.raises(FencedError, match="attempt 1 is fenced off by newer attempt 2"):
        await checkpointer.aput(t, write(count=1), expected_version=1, attempt=1, run_uid="run-b")
    assert await checkpointer.aput(t, write(count=1), expected_version=1, attempt=2, run_uid="run-b") == 2


async def test_writers_without_a_run_uid_keep_the_attempt_only_rule(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    await checkpointer.register_attempt(t, 3, run_uid="run-a")
    with pytest.raises(FencedError):
        await checkpointer.aput(t, write(count=0), expected_version=0, attempt=2)
    assert await checkpointer.aput(t, write(count=0), expected_version=0, attempt=3) == 1
    assert await checkpointer.aput(t, write(count=0), expected_version=1) == 2, "an unfenced writer is not fenced"
    with pytest.raises(FencedError):
        await checkpointer.register_attempt(t, 2)
    await checkpointer.register_attempt(t, 4)
    # The owner has no uid now: a writer of any run is held to the attempt number alone.
    assert await checkpointer.aput(t, write(count=0), expected_version=2, attempt=4, run_uid="run-a") == 3


# == StateStore: threads ===========================================================================

# -- threads ------------------------------------------------------------------------------------


async def test_delete_thread_cascades_to_ledger_intents_and_stop(backend: Backend, checkpointer: Checkpointer) -> None:
    t, kept = backend.thread("deleted"), backend.thread("kept")
    for thread in (t, kept):
        await checkpointer.aput(thread, write((0, user("x")), count=1), expected_version=0)
        await checkpointer.ledger_put(thread, "m:c", "tool", envelope(1))
        await checkpointer.intent_put(thread, "m:c", "tool", "k")
        await checkpointer.request_stop(thread, "stop")
        await checkpointer.register_attempt(thread, 3)
    await checkpointer.delete_thread(t)
    assert await checkpointer.aget(t) is None
    assert await checkpointer.ledger_get(t, "m:c") is None and await checkpointer.ledger_list(t) == []
    assert await checkpointer.intent_get(t, "m:c") is None
    assert await checkpointer.stop_requested(t) is None
    assert t not in await checkpointer.list_threads()
    # The attempt registry went with it: a new thread under the old id starts unfenced.
    await checkpointer.aput(t, write((0, user("again")), count=1), expected_version=0, attempt=1)
    # The other thread is untouched.
    cp = await checkpointer.aget(kept)
    assert cp is not None and cp.version == 1
    assert await checkpointer.ledger_get(kept, "m:c") is not None
    assert await checkpointer.intent_get(kept, "m:c") is not None
    assert await checkpointer.stop_requested(kept) == "stop"
    await checkpointer.delete_thread(backend.thread("never-existed"))  # deleting nothing is fine


async def test_list_threads_lists_threads_with_state(backend: Backend, checkpointer: Checkpointer) -> None:
    a, b, ledger_only, stop_only = (backend.thread(n) for n in ("a", "b", "ledger-only", "stop-only"))
    await checkpointer.aput(a, write(count=0), expected_version=0)
    await checkpointer.aput(b, write(count=0), expected_version=0)
    await checkpointer.ledger_put(ledger_only, "m:c", "tool", envelope(1))
    await checkpointer.request_stop(stop_only)
    mine = [t for t in await checkpointer.list_threads() if t.startswith(backend.prefix)]
    assert sorted(mine) == sorted([a, b])


# == Checkpointer: the engine on each backend =======================================================


class Crash(BaseException):
    """Stands in for the process dying: nothing after it runs, nothing catches it."""


async def test_completed_tool_is_replayed_not_rerun_after_a_crash(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    ran: Counter[str] = Counter()
    crash = True

    @tool(side_effects=True, in_doubt="retry")
    async def charge_card(order_id: str) -> dict[str, Any]:
        ran["charge_card"] += 1
        return {"charged": order_id}

    @tool
    async def send_receipt(order_id: str, state: dict[str, Any]) -> str:
        ran["send_receipt"] += 1
        if crash:
            # The process dies once charge_card's result is in the ledger, before the node finishes.
            key = f"{state['messages'][-1].id}:call_1"
            await eventually(lambda: checkpointer.ledger_get(t, key), "charge_card recorded")
            raise Crash
        return "sent"

    calls = [call("call_1", "charge_card", order_id="4821"), call("call_2", "send_receipt", order_id="4821")]
    app = app_for([charge_card, send_receipt], calls, checkpointer)
    with pytest.raises(Crash):
        await app.ainvoke("charge order 4821", {"thread_id": t})
    assert ran == {"charge_card": 1, "send_receipt": 1}

    crash = False
    restarted = app_for([charge_card, send_receipt], calls, await backend.open())  # a new process
    values = await restarted.ainvoke(None, {"thread_id": t})
    assert ran == {"charge_card": 1, "send_receipt": 2}, "a tool whose result was recorded ran again after a crash"
    results = tool_messages(values)
    assert results["call_1"].content == '{"charged": "4821"}' and results["call_2"].content == "sent"
    state = await restarted.aget_state(t)
    assert state is not None and state.status == "completed"
    # Both processes' calls count (issue 24): charge_card executed in the first (recorded, never checkpointed)
    # and replayed in the second, send_receipt executed in the second.
    assert state.meta["tool_calls"] == {"executed": 2, "replayed": 1, "failed": 0, "in_doubt": 0}


async def _async_value(value: bool) -> bool:
    return value


async def test_cancelled_run_resumes_from_the_last_checkpoint(backend: Backend, checkpointer: Checkpointer) -> None:
    """A run cancelled mid-node (the process going away) leaves a resumable thread and its ledger."""
    t = backend.thread()
    ran: Counter[str] = Counter()
    release = asyncio.Event()

    @tool
    async def quick() -> str:
        ran["quick"] += 1
        return "quick result"

    @tool
    async def slow() -> str:
        ran["slow"] += 1
        await release.wait()
        return "slow result"

    app = app_for([quick, slow], [call("call_1", "quick"), call("call_2", "slow")], checkpointer)
    run = asyncio.create_task(app.ainvoke("go", {"thread_id": t}))
    await eventually(lambda: checkpointer.ledger_list(t), "quick recorded")
    # Both calls must have started: with a networked store, slow may start after quick was recorded.
    await eventually(lambda: _async_value(ran["slow"] == 1), "slow started")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    state = await app.aget_state(t)
    assert state is not None and state.status == "running" and state.current_node == "tools"

    release.set()
    values = await app_for([quick, slow], [], await backend.open()).ainvoke(None, {"thread_id": t})
    assert ran == {"quick": 1, "slow": 2}
    assert [m.content for m in values["messages"] if m.role == "tool"] == ["quick result", "slow result"]


async def test_interrupt_and_resume_round_trip(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()

    @tool
    async def approve(amount: int) -> str:
        answer = interrupt({"amount": amount}, message="approve the refund?")
        return f"approved={answer}"

    app = app_for([approve], [call("call_1", "approve", amount=5)], checkpointer)
    paused = await app.ainvoke("refund", {"thread_id": t})
    [pending] = paused["__interrupt__"]
    assert pending.payload == {"amount": 5} and pending.tool_call_id == "call_1"
    restarted = app_for([approve], [], await backend.open())
    state = await restarted.aget_state(t)
    assert state is not None and state.status == "interrupted" and [i.id for i in state.interrupts] == [pending.id]
    values = await restarted.ainvoke(Command(resume="yes"), {"thread_id": t})
    assert tool_messages(values)["call_1"].content == "approved=yes"
