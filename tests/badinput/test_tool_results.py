"""Tool results that are not Unicode text: recorded and shown, never a failed checkpoint (issue 13).

A tool may hand back a string holding an unpaired UTF-16 surrogate: an MCP
server or an HTTP API answering JSON with a lone ``\\ud800`` escape, bytes
decoded with ``surrogateescape``. No UTF-8 encoder takes it: PostgreSQL
refused the ledger record, then the step's checkpoint, and the run crashed on
every attempt, running the tool again each time. Such a result now reaches the
model and the store with U+FFFD in place of each unpaired surrogate, the
same on the first run and on a replay.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from agentrun import Message, tool, tool_message
from agentrun.ledger import decode
from tests.badinput.conftest import Store
from tests.unit.helpers import app_for, call, tool_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Crash(BaseException):
    """Stands in for the process dying."""


RESULTS: dict[str, tuple[Any, str]] = {
    "text": ("a\ud800b", "a\ufffdb"),
    "low-first": ("\udc00\ud800x", "\ufffd\ufffdx"),
    "object": ({"name": "x\udfffy", "ok": True}, json.dumps({"name": "x\ufffdy", "ok": True}, ensure_ascii=False)),
    "key": ({"\ud800": 1}, json.dumps({"\ufffd": 1}, ensure_ascii=False)),
    "pair-kept": ("\ud834\udd1e", "𝄞"),  # a pair written as two code units is one character, not two errors
    "message": (tool_message("m\ud800", tool_call_id="x", name="x"), "m\ufffd"),
}


@pytest.mark.parametrize("kind", list(RESULTS))
async def test_a_result_with_an_unpaired_surrogate_is_recorded_and_replayed_with_replacement_characters(
    store: Store, kind: str
) -> None:
    result, shown = RESULTS[kind]
    ran: Counter[str] = Counter()
    returned = asyncio.Event()
    crash = True

    @tool
    async def fetch() -> Any:
        ran["fetch"] += 1
        returned.set()
        return result

    @tool
    async def crasher() -> str:
        if crash:
            await returned.wait()
            raise Crash
        return "ok"

    calls = [call("call_1", "fetch"), call("call_2", "crasher")]
    with pytest.raises(Crash):
        await app_for([fetch, crasher], calls, await store.open()).ainvoke("go", {"thread_id": "t"})
    [entry] = [e for e in await (await store.open()).ledger_list("t") if e.tool_name == "fetch"]
    recorded = decode(entry.result).result
    assert json.dumps(recorded.to_json() if isinstance(recorded, Message) else recorded).isascii()
    crash = False
    values = await app_for([fetch, crasher], calls, await store.open()).ainvoke(None, {"thread_id": "t"})
    assert ran["fetch"] == 1, "GUARANTEE BROKEN: the result was not recorded, so the tool ran again"
    assert tool_messages(values)["call_1"].content == shown
    state = await (await store.open()).aget("t")
    assert state is not None and state.status == "completed"
    assert [m.content for m in state.messages if m.tool_call_id == "call_1"] == [shown]


async def test_without_a_crash_the_first_answer_is_the_same_as_the_replayed_one(store: Store) -> None:
    @tool
    async def fetch() -> dict[str, str]:
        return {"name": "x\udfffy"}

    values = await app_for([fetch], [call("call_1", "fetch")], await store.open()).ainvoke("go", {"thread_id": "u"})
    assert tool_messages(values)["call_1"].content == '{"name": "x\ufffdy"}'
    state = await (await store.open()).aget("u")
    assert state is not None and state.status == "completed"


async def test_a_tool_error_holding_an_unpaired_surrogate_is_a_tool_error_message_not_a_failed_run(
    store: Store,
) -> None:
    @tool
    async def fetch() -> str:
        raise ValueError("upstream said \udc9f")

    values = await app_for([fetch], [call("call_1", "fetch")], await store.open()).ainvoke("go", {"thread_id": "e"})
    message = tool_messages(values)["call_1"]
    assert message.is_error and message.content == "Error: ValueError: upstream said \ufffd"
    state = await (await store.open()).aget("e")
    assert state is not None and state.status == "completed", state and state.meta.get("error")
