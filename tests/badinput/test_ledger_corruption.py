"""Ledger rows corrupted in the real database: the tool runs again with a warning, nothing is skipped (issue 13).

DESIGN §2: a malformed or unreadable ledger entry is a miss (the tool runs
again, and its fresh result repairs the row); an entry whose recorded tool
name differs from the call being replayed is a determinism error, reported,
never the other tool's result. Here the rows are damaged with raw SQL in a
real SQLite file and a real PostgreSQL database, as a bad migration, a
manual edit or a torn write would leave them; the store's own API is not
used to write the damage. Each step has two parallel calls: the intact one
must replay (not run), the damaged one must run again and say so.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun import DeterminismError, tool
from agentrun.ledger import MalformedEntry, decode, encode
from tests.badinput.conftest import Store
from tests.unit.helpers import app_for, call, seed_tool_step, tool_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

THREAD = "default/corrupt"
ran: Counter[str] = Counter()


@tool
async def lookup_order(order_id: str) -> dict[str, str]:
    ran["lookup_order"] += 1
    return {"order": order_id, "status": "fresh"}


@tool
async def check_stock(sku: str) -> str:
    ran["check_stock"] += 1
    return f"{sku}: fresh"


# What a damaged row holds instead of its envelope. PostgreSQL keeps the exact text in result_text
# (a replay reads it) and a JSONB copy in result; SQLite keeps the text in result.
DAMAGE = {
    "truncated-json": ("substr", None),
    "not-json": ("set", "garbage, not JSON"),
    "empty-text": ("set", ""),
    "json-null": ("set", "null"),
    "wrong-shape-object": ("set", '{"order": "4821", "status": "recorded"}'),
    "wrong-shape-array": ("set", '[{"__kind__": "raw", "value": "x"}]'),
    "unknown-kind": ("set", '{"__kind__": "pickle", "value": "gASV"}'),
    "message-that-does-not-parse": ("set", '{"__kind__": "message", "value": {"role": "robot"}}'),
    "state-not-an-object": ("set", '{"__kind__": "raw", "value": 1, "state": [1]}'),
}


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(f"{record.levelname} {record.getMessage()}")  # type: ignore[method-assign]
    logger = logging.getLogger("agentrun")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


async def _recorded_step(store: Store) -> tuple[str, str]:
    """A thread inside its tool node, both calls recorded with their real results; returns the two keys."""
    checkpointer = await store.open()
    request = await seed_tool_step(
        checkpointer, THREAD, [call("call_1", "lookup_order", order_id="4821"), call("call_2", "check_stock", sku="A")]
    )
    damaged, intact = f"{request.id}:call_1", f"{request.id}:call_2"
    assert await checkpointer.ledger_put(THREAD, damaged, "lookup_order", encode({"order": "4821", "status": "old"}))
    assert await checkpointer.ledger_put(THREAD, intact, "check_stock", encode("A: recorded"))
    return damaged, intact


def _is_json(text: str | None) -> bool:
    try:
        json.loads(text or "")
    except ValueError:
        return False
    return True


async def _damage(store: Store, key: str, how: str, text: str | None) -> None:
    if store.kind == "postgres":
        if how == "substr":
            update = "UPDATE tool_executions SET result_text = left(result_text, length(result_text) / 2)"
        elif _is_json(text):  # as a tool that knows only the JSONB column writes it: no exact text
            update = "UPDATE tool_executions SET result = $3::jsonb, result_text = NULL"
        else:
            update = "UPDATE tool_executions SET result_text = $3, result = NULL"
    elif how == "substr":
        update = "UPDATE tool_executions SET result = substr(result, 1, length(result) / 2)"
    else:
        update = "UPDATE tool_executions SET result = $3"
    query = update + " WHERE thread_id = $1 AND tool_call_id = $2"
    if store.kind == "sqlite":
        query = query.replace("$3", "?3")
    args = (THREAD, key) if how == "substr" else (THREAD, key, text)
    await store.sql(query, *args)


@pytest.mark.parametrize("damage", list(DAMAGE))
async def test_a_damaged_row_is_a_miss_the_tool_runs_again_with_a_warning_and_the_row_is_repaired(
    store: Store, warnings: list[str], damage: str
) -> None:
    damaged, intact = await _recorded_step(store)
    how, text = DAMAGE[damage]
    await _damage(store, damaged, how, text)
    ran.clear()
    values = await app_for([lookup_order, check_stock], [], await store.open()).ainvoke(None, {"thread_id": THREAD})
    results = tool_messages(values)
    assert ran["lookup_order"] == 1, f"GUARANTEE BROKEN: a {damage} ledger row was used or skipped, not re-run"
    assert ran["check_stock"] == 0, "the intact sibling must replay from the ledger, not run again"
    assert '"status": "fresh"' in results["call_1"].content and not results["call_1"].is_error
    assert results["call_2"].content == "A: recorded"
    malformed = [line for line in warnings if line.startswith("WARNING") and damaged in line and "malformed" in line]
    assert malformed, f"nothing said the {damage} entry was not usable: {warnings}"
    assert "the tool will run again" in malformed[0], malformed[0]
    assert any(line.startswith("INFO") and f"tool replayed: {intact}" in line for line in warnings), warnings
    # The fresh result repaired the row: the next replay hits.
    entry = await (await store.open()).ledger_get(THREAD, damaged)
    assert entry is not None and decode(entry.result).result == {"order": "4821", "status": "fresh"}
    state = await (await store.open()).aget(THREAD)
    assert state is not None and state.status == "completed"


@pytest.mark.parametrize("recorded_as", ["refund_payment", "Lookup_Order", "lookup_order ", ""])
async def test_a_row_naming_another_tool_is_a_determinism_error_and_no_result_is_handed_over(
    store: Store, warnings: list[str], recorded_as: str
) -> None:
    damaged, _ = await _recorded_step(store)
    await store.sql(
        "UPDATE tool_executions SET tool_name = $3 WHERE thread_id = $1 AND tool_call_id = $2".replace(
            "$3", "$3" if store.kind == "postgres" else "?3"
        ),
        THREAD,
        damaged,
        recorded_as,
    )
    ran.clear()
    app = app_for([lookup_order, check_stock], [], await store.open())
    with pytest.raises(DeterminismError) as raised:
        await app.ainvoke(None, {"thread_id": THREAD})
    assert recorded_as.join("''") in str(raised.value) or repr(recorded_as) in str(raised.value), raised.value
    assert ran["lookup_order"] == 0, "the tool must not run while the ledger disagrees about what was called"
    state = await (await store.open()).aget(THREAD)
    assert state is not None and state.status == "failed", "a determinism error must fail the run, visibly"
    assert state.meta["error"]["code"] == "LEDGER_DETERMINISM_001"
    assert any(line.startswith("ERROR") and "LEDGER_DETERMINISM_001" in line for line in warnings) or any(
        line.startswith("ERROR") and "recorded by tool" in line for line in warnings
    ), f"the failure must be logged: {warnings}"
    assert all('"status": "old"' not in m.content for m in state.messages), "another tool's result was handed out"


# --- any damage at all ------------------------------------------------------------------------------------------------

storable = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=80)
envelope_text = st.builds(
    lambda value, cut: json.dumps({"__kind__": "raw", "value": value})[:cut],
    storable,
    st.integers(0, 120),
)
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | storable,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(storable, inner, max_size=3),
    max_leaves=8,
).map(json.dumps)
damaged_text = st.one_of(storable, envelope_text, any_json)
rounds = 0


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=damaged_text)
async def test_whatever_the_row_holds_the_call_replays_a_valid_record_or_runs_again_and_says_so(
    store: Store, warnings: list[str], text: str
) -> None:
    global rounds
    rounds += 1
    thread = f"default/any-{rounds}"
    warnings.clear()
    checkpointer = await store.connect()
    try:
        request = await seed_tool_step(checkpointer, thread, [call("call_1", "lookup_order", order_id="4821")])
        key = f"{request.id}:call_1"
        assert await checkpointer.ledger_put(thread, key, "lookup_order", encode({"order": "4821"}))
        column = "result_text" if store.kind == "postgres" else "result"
        await store.sql(
            f"UPDATE tool_executions SET {column} = $3 WHERE thread_id = $1 AND tool_call_id = $2".replace(
                "$3", "$3" if store.kind == "postgres" else "?3"
            ),
            thread,
            key,
            text,
        )
        try:
            expected: Any = decode(json.loads(text)).result
        except (ValueError, MalformedEntry):
            expected = MISSING
        before = ran["lookup_order"]
        values = await app_for([lookup_order, check_stock], [], checkpointer).ainvoke(None, {"thread_id": thread})
        reran = ran["lookup_order"] - before
        content = tool_messages(values)["call_1"].content
        if expected is MISSING:
            assert reran == 1, f"GUARANTEE BROKEN: the damaged row {text!r} was used or skipped, not re-run"
            assert any("malformed" in line and key in line for line in warnings), f"no warning for {text!r}"
            assert '"status": "fresh"' in content
        else:
            assert reran == 0, f"a well-formed record {text!r} was not replayed"
            assert content == (expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False))
        state = await checkpointer.aget(thread)
        assert state is not None and state.status == "completed"
    finally:
        await checkpointer.aclose()


MISSING = object()
