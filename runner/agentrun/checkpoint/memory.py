"""In-process checkpointer for tests and notebooks: same contract, nothing survives the process.

Values are stored as JSON round-trips so that a graph which works here does
not break on a durable backend because it kept a non-serializable object.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import FencedError, StaleStateError, StorageError
from ..messages import Message
from .base import Checkpoint, Checkpointer, CheckpointWrite, Intent, LedgerEntry


@dataclass
class _Thread:
    version: int = 0
    state: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, LedgerEntry] = field(default_factory=dict)
    intents: dict[str, Intent] = field(default_factory=dict)
    stop: str | None = None
    attempt: int = 0


def _roundtrip(value: Any) -> Any:
    # The durable stores' rules: strict JSON (no NaN), and StorageError for what they cannot store.
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise StorageError(f"state is not JSON-serializable: {e}") from e


class InMemoryCheckpointer(Checkpointer):
    backend = "memory"

    def __init__(self) -> None:
        self._threads: dict[str, _Thread] = {}
        self._lock = asyncio.Lock()

    def _fence(self, thread: _Thread, thread_id: str, attempt: int | None) -> None:
        if attempt is not None and attempt < thread.attempt:
            raise FencedError(
                f"thread {thread_id!r}: attempt {attempt} is fenced off by newer attempt {thread.attempt}"
            )

    async def aget(self, thread_id: str) -> Checkpoint | None:
        thread = self._threads.get(thread_id)
        if thread is None or thread.state is None:
            return None
        s = _roundtrip(thread.state)
        return Checkpoint(
            thread_id=thread_id,
            version=thread.version,
            values=s["values"],
            messages=[Message.from_json(m) for m in thread.messages[: s["message_count"]]],
            current_node=s["current_node"],
            step=s["step"],
            status=s["status"],
            meta=s["meta"],
            created_at=s["created_at"],
        )

    async def aput(
        self, thread_id: str, write: CheckpointWrite, *, expected_version: int, attempt: int | None = None
    ) -> int:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            self._fence(thread, thread_id, attempt)
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
            return thread.version

    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        thread = self._threads.get(thread_id)
        return thread.ledger.get(key) if thread else None

    async def ledger_put(
        self, thread_id: str, key: str, tool_name: str, result: Any, *, attempt: int | None = None
    ) -> bool:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            self._fence(thread, thread_id, attempt)
            if key in thread.ledger:
                return False
            thread.ledger[key] = LedgerEntry(key, tool_name, _roundtrip(result), time.time())
            return True

    async def ledger_list(self, thread_id: str) -> list[LedgerEntry]:
        thread = self._threads.get(thread_id)
        return sorted(thread.ledger.values(), key=lambda e: e.created_at) if thread else []

    async def intent_get(self, thread_id: str, key: str) -> Intent | None:
        thread = self._threads.get(thread_id)
        return thread.intents.get(key) if thread else None

    async def intent_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
    ) -> None:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            self._fence(thread, thread_id, attempt)
            thread.intents.setdefault(key, Intent(key, tool_name, idempotency_key, time.time()))

    async def register_attempt(self, thread_id: str, attempt: int) -> None:
        async with self._lock:
            thread = self._threads.setdefault(thread_id, _Thread())
            self._fence(thread, thread_id, attempt)
            thread.attempt = attempt

    async def request_stop(self, thread_id: str, reason: str = "") -> None:
        thread = self._threads.setdefault(thread_id, _Thread())
        if thread.stop is None:  # a pending request keeps its first reason, as in the durable stores
            thread.stop = reason

    async def stop_requested(self, thread_id: str) -> str | None:
        thread = self._threads.get(thread_id)
        return thread.stop if thread else None

    async def clear_stop(self, thread_id: str) -> None:
        thread = self._threads.get(thread_id)
        if thread:
            thread.stop = None

    async def delete_thread(self, thread_id: str) -> None:
        self._threads.pop(thread_id, None)

    async def list_threads(self) -> list[str]:
        return [t for t, th in self._threads.items() if th.state is not None]
