"""A 10 MB tool result: recorded, replayed byte for byte, and never copied into status (issue 13).

Store level (SQLite file and PostgreSQL database): a run records a 10 MB
result, the process "dies" before the step's checkpoint (a sibling call
raises a ``BaseException`` once the big call has returned), and the resumed
run answers the call from the ledger: the tool ran once, and the result the
model sees after the replay is the same bytes. The cluster test lives in
``test_cluster_large_result.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from typing import Any

import pytest

from agentrun import tool
from agentrun.ledger import decode
from tests.badinput.conftest import Store
from tests.unit.helpers import app_for, call, tool_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MB10 = 10 << 20


class Crash(BaseException):
    """Stands in for the process dying."""


def big_text() -> str:
    # Not one repeated byte: multi-byte UTF-8, quotes and backslashes that JSON must escape, a NUL.
    unit = 'é"\\ \u2603 line\n𝄞 \x00 '
    return unit * (MB10 // len(unit.encode()) + 1) + "tail"


def big_object() -> dict[str, Any]:
    return {"rows": [{"id": i, "name": f"row {i}", "note": "x" * 100} for i in range(75_000)], "end": True}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.mark.parametrize("shape", ["text", "object"])
async def test_a_10_mb_result_is_recorded_and_replayed_intact(store: Store, shape: str) -> None:
    ran: Counter[str] = Counter()
    returned = asyncio.Event()
    crash = True
    result: Any = big_text() if shape == "text" else big_object()

    @tool
    async def export_report() -> Any:
        ran["export_report"] += 1
        returned.set()
        return result

    @tool
    async def crasher() -> str:
        if crash:
            await returned.wait()
            raise Crash
        return "ok"

    calls = [call("call_1", "export_report"), call("call_2", "crasher")]
    checkpointer = await store.open()
    with pytest.raises(Crash):
        await app_for([export_report, crasher], calls, checkpointer).ainvoke("export", {"thread_id": "big"})
    entries = {e.tool_name: e for e in await (await store.open()).ledger_list("big")}
    recorded = decode(entries["export_report"].result).result
    assert len(json.dumps(recorded).encode()) >= MB10
    assert recorded == result, "the ledger does not hold the whole 10 MB result"
    if store.kind == "postgres":
        [(size,)] = await store.sql(
            "SELECT octet_length(result_text) FROM tool_executions WHERE tool_name = $1", "export_report"
        )
        assert size >= MB10, f"the stored text is {size} bytes"

    crash = False
    resumed = await app_for([export_report, crasher], calls, await store.open()).ainvoke(None, {"thread_id": "big"})
    assert ran["export_report"] == 1, "GUARANTEE BROKEN: a recorded 10 MB result was executed again on replay"
    seen = tool_messages(resumed)["call_1"].content
    first_seen = result if isinstance(result, str) else None
    if first_seen is not None:
        assert len(seen) == len(first_seen) and digest(seen) == digest(first_seen), "the replayed text differs"
    else:
        assert json.loads(seen) == result, "the replayed object differs"
    # And the checkpoint holds the same message, read back on a fresh connection.
    stored = await (await store.open()).aget("big")
    assert stored is not None and stored.status == "completed"
    [message] = [m for m in stored.messages if m.tool_call_id == "call_1"]
    assert digest(message.content) == digest(seen)
