"""In-process checkpointer for tests and notebooks: same contract, nothing survives the process.

Values are stored as JSON round-trips so that a graph which works here does
not break on a durable backend because it kept a non-serializable object.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import override

from ..errors import StaleStateError, StorageError
from ..messages import stored_messages
from .base import (
    Checkpoint,
    Checkpointer,
    CheckpointWrite,
    Commit,
    Head,
    Intent,
    LedgerEntry,
    Owner,
    Progress,
    RunInputsRecord,
    Turn,
    check_fence,
    claim,
    turn_fields,
)


@dataclass
class _Thread:
    version: int = 0
    state: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, LedgerEntry] = field(default_factory=dict)
    intents: dict[str, Intent] = field(default_factory=dict)
    stop: str | None = None
    owner: Owner | None = None
    # Every run uid that ever registered on the thread: a superseded run cannot take it back.
    runs: set[str] = field(default_factory=set)
    # (run uid, attempt) -> the JSON text of (input, resume), as the durable stores keep it.
    run_inputs: dict[tuple[str, int], str] = field(default_factory=dict)
    # request key -> its turn record.
    turns: dict[str, Turn] = field(default_factory=dict)
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex)


def _roundtrip(value: Any) -> Any:
    # The durable stores' rules: strict JSON (no NaN), and StorageError for what they cannot store.
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise StorageError(f"state is not JSON-serializable: {e}") from e


def _roundtrip_turn(turn: Turn) -> Turn:
    # The JSON parts as the durable stores return them: copies, never the caller's objects.
    return dataclasses.replace(
        turn,
        error=_roundtrip(turn.error),
        result=_roundtrip(turn.result),
        tool_calls=_roundtrip(turn.tool_calls),
    )


def _entry(key: str, tool_name: str, result: Any, created_at: float) -> LedgerEntry:
    value = _roundtrip(result)
    return LedgerEntry(key, tool_name, value, created_at, text=json.dumps(value, separators=(",", ":")))


class InMemoryCheckpointer(Checkpointer):
    """A store in this process's memory: tests and one-process runs; gone with the process."""

    backend = "memory"

    def __init__(self) -> None:
        self._threads: dict[str, _Thread] = {}
        self._lock = asyncio.Lock()

    @override
    async def aget(self, thread_id: str) -> Checkpoint | None:
        thread = self._threads.get(thread_id)
        if thread is None or thread.state is None:
            return None
        s = _roundtrip(thread.state)
        stored = thread.messages[: s["message_count"]]
        return Checkpoint(
            thread_id=thread_id,
            version=thread.version,
            values=s["values"],
            # Validated when first used, as the other stores' (``messages.stored_messages``).
            messages=stored_messages([m.get("id") for m in stored], stored),
            current_node=s["current_node"],
            step=s["step"],
            status=s["status"],
            meta=s["meta"],
            created_at=s["created_at"],
        )

    @override
    async def ahead(self, thread_id: str) -> Head | None:
        thread = self._threads.get(thread_id)
        if thread is None or thread.state is None:
            return None
        return Head(thread.version, thread.incarnation)

    @override
    async def aget_progress(self, thread_id: str) -> Progress | None:
        checkpoint = await self.aget(thread_id)
        if checkpoint is None:
            return None
        thread = self._threads[thread_id]
        owner = thread.owner
        return dataclasses.replace(
            Progress.from_checkpoint(checkpoint),
            attempt=owner.attempt if owner else None,
            run_uid=owner.run_uid if owner else None,
            incarnation=thread.incarnation,
        )

    @override
    async def acommit(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> Commit:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            check_fence(thread_id, thread.owner, attempt=attempt, run_uid=run_uid)
            if thread.version != expected_version:
                raise StaleStateError(thread_id, expected_version, thread.version)
            state = _roundtrip(
                {
                    "values": write.values,
                    "current_node": write.current_node,
                    "step": write.step,
                    "status": write.status,
                    "meta": write.meta,
                    "message_count": write.message_count,
                    "created_at": time.time(),
                }
            )
            messages = list(thread.messages)
            for index, message in write.messages:
                body = message.to_json()
                if index < len(messages):
                    messages[index] = body
                elif index == len(messages):
                    messages.append(body)
                else:
                    raise ValueError(f"message index {index} leaves a gap after {len(messages)}")
            thread.state, thread.messages = state, messages
            thread.version += 1
            turn = turn_fields(write)
            if turn is not None:
                key = turn["request_key"]
                started = thread.turns[key].started_at if key in thread.turns else state["created_at"]
                thread.turns[key] = _roundtrip_turn(
                    Turn(
                        thread_id=thread_id,
                        version=thread.version,
                        started_at=started,
                        updated_at=state["created_at"],
                        **turn,
                    )
                )
            return Commit(thread.version, thread.incarnation, state["created_at"])

    @override
    async def aget_turn(self, thread_id: str, request_key: str) -> Turn | None:
        thread = self._threads.get(thread_id)
        return thread.turns.get(request_key) if thread else None

    @override
    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        thread = self._threads.get(thread_id)
        return thread.ledger.get(key) if thread else None

    @override
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
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            check_fence(thread_id, thread.owner, attempt=attempt, run_uid=run_uid)
            if key in thread.ledger:
                return False
            thread.ledger[key] = _entry(key, tool_name, result, time.time())
            return True

    @override
    async def ledger_replace(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        expected_text: str,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            check_fence(thread_id, thread.owner, attempt=attempt, run_uid=run_uid)
            current = thread.ledger.get(key)
            if current is None or current.tool_name != tool_name or current.text != expected_text:
                return False
            thread.ledger[key] = _entry(key, tool_name, result, current.created_at)
            return True

    @override
    async def ledger_list(self, thread_id: str) -> list[LedgerEntry]:
        thread = self._threads.get(thread_id)
        return sorted(thread.ledger.values(), key=lambda e: e.created_at) if thread else []

    @override
    async def intent_get(self, thread_id: str, key: str) -> Intent | None:
        thread = self._threads.get(thread_id)
        return thread.intents.get(key) if thread else None

    @override
    async def intent_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        args_digest: str | None = None,
    ) -> None:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            check_fence(thread_id, thread.owner, attempt=attempt, run_uid=run_uid)
            thread.intents.setdefault(key, Intent(key, tool_name, idempotency_key, time.time(), args_digest))

    @override
    async def register_attempt(self, thread_id: str, attempt: int, *, run_uid: str | None = None) -> None:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            seen = run_uid is not None and run_uid in thread.runs
            thread.owner = claim(thread_id, thread.owner, attempt=attempt, run_uid=run_uid, seen=seen)
            if run_uid is not None:
                thread.runs.add(run_uid)

    @override
    async def put_run_inputs(
        self,
        thread_id: str,
        *,
        run_uid: str,
        attempt: int,
        input: dict[str, Any] | None,
        resume: dict[str, Any] | None,
    ) -> None:
        try:
            text = json.dumps([input, resume], allow_nan=False)
        except (TypeError, ValueError) as e:
            raise StorageError(f"run inputs are not JSON-serializable: {e}") from e
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            for key in [k for k in thread.run_inputs if k[0] == run_uid and k[1] < attempt]:
                del thread.run_inputs[key]
            thread.run_inputs[(run_uid, attempt)] = text

    @override
    async def aget_run_inputs(self, thread_id: str, *, run_uid: str, attempt: int) -> RunInputsRecord | None:
        thread = self._threads.get(thread_id)
        text = thread.run_inputs.get((run_uid, attempt)) if thread else None
        if text is None:
            return None
        input, resume = json.loads(text)
        return RunInputsRecord(input, resume)

    @override
    async def request_stop(self, thread_id: str, reason: str = "") -> None:
        thread = self._threads.setdefault(thread_id, _Thread())
        if thread.stop is None:  # a pending request keeps its first reason, as in the durable stores
            thread.stop = reason

    @override
    async def stop_requested(self, thread_id: str) -> str | None:
        thread = self._threads.get(thread_id)
        return thread.stop if thread else None

    @override
    async def clear_stop(self, thread_id: str) -> None:
        thread = self._threads.get(thread_id)
        if thread:
            thread.stop = None

    @override
    async def delete_thread(self, thread_id: str) -> None:
        self._threads.pop(thread_id, None)

    @override
    async def list_threads(self) -> list[str]:
        return [t for t, th in self._threads.items() if th.state is not None]
