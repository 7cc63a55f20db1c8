"""Run inputs in the store: an input and a resume value of 1 MiB each, written as the operator does, read back exactly.

The operator writes them (``put_run_inputs``) before it creates the pod,
because Linux caps one environment string at 128 KiB; the runner reads them
(``aget_run_inputs``) at start. Both sides go through Redis when it is
configured, so the round trip is proven with the cache on.
"""

from __future__ import annotations

import json

from agentrun.checkpoint.cached import CachedStore

MIB = 1024 * 1024


def big_input(size: int) -> dict[str, object]:
    # Non-ASCII and characters JSON must escape, so a value survives only if stored verbatim.
    chunk = 'caf\u00e9 "q" \\ \U0001f600 '
    text = (chunk * (size // len(chunk.encode()) + 1))[: size // 2]
    return {"messages": [{"role": "user", "content": text}], "pad": "x" * (size - len(json.dumps(text)))}


async def test_a_1_mib_input_and_a_1_mib_resume_value_round_trip_exactly(cached: CachedStore) -> None:
    payload = big_input(MIB)
    resume = {"value": big_input(MIB)}
    assert len(json.dumps(payload).encode()) >= MIB and len(json.dumps(resume).encode()) >= MIB
    await cached.put_run_inputs("ns/big", run_uid="uid-1", attempt=1, input=payload, resume=resume)
    record = await cached.aget_run_inputs("ns/big", run_uid="uid-1", attempt=1)
    assert record is not None, "GUARANTEE BROKEN: the recorded inputs were not found"
    assert record.input == payload and record.resume == resume, "GUARANTEE BROKEN: a large input did not read back"
