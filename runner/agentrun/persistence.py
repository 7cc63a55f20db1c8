"""Persistence of a run: its in-memory state, what of it is already durable, and every write the engine makes.

Every state write goes through ``RunWriter.persist``: durable writes are the
store's versioned ``aput`` (from the version the run last wrote, under the
attempt's fence), cache-only writes its ``cache_put``. Only messages not yet
durable (appended, or replaced in place) are sent, so the cost of a step does
not grow with the thread's history.

``StaleStateError`` and ``FencedError`` mean another process owns the thread:
they propagate and nothing more is written. A failure to record a *failure*
is logged and the original error is the one reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .checkpoint.base import Checkpoint, Checkpointer, CheckpointWrite, RunStatus
from .config import RunConfig
from .context import RunLogger, ToolCounts
from .errors import FencedError, NodeError, RunPreempted, RunStopped, StaleStateError
from .interrupts import Interrupt
from .messages import (
    Message,
    MessageList,
    add_messages,
    append_messages,
    coerce_messages,
    copy_messages,
    replaced_positions,
)
from .metrics import CHECKPOINT_SECONDS, FENCED, INTERRUPTS, STALE_STATE, STOPS
from .result import final_result
from .state import MESSAGES, Replace, StateSchema
from .structure import META_KEY as GRAPH_META
from .usage import META_KEY as MODEL_USAGE
from .usage import ModelUsage


@dataclass
class Run:
    """The in-memory state of one run and what of it is already durable."""

    state: dict[str, Any]
    version: int
    current_node: str | None
    step: int
    status: RunStatus
    meta: dict[str, Any]
    persisted_messages: int
    counts: ToolCounts
    replaced: set[int] = field(default_factory=set)
    # The turn's model usage, checkpointed in meta ``model_usage`` (``agentrun.usage``) once a model was called.
    usage: ModelUsage = field(default_factory=ModelUsage)
    # The next durable write also records the turn (``CheckpointWrite.record_turn``): set when a call
    # opens the run, so the turn record says "running" again once a resumed turn writes.
    record_turn: bool = False
    # Non-message channels updated since the last durable write (``CheckpointWrite.changed``).
    changed: set[str] = field(default_factory=set)
    # The message list this run made (a load's copy, or what ``add_messages`` returned in ``apply``): no one
    # else holds it until the run hands its values out at its end (nodes get a copy, ``node_input``), so
    # ``apply`` appends to it in place instead of copying 10,000 references per step. A list put in the state
    # by a ``Replace`` or another reducer is not it: that one is copied once by the reducer, as before.
    owned: MessageList | None = field(default=None, repr=False)

    @classmethod
    def new(cls, schema: StateSchema) -> Run:
        """A thread's first run: the schema's initial state, nothing durable yet."""
        return cls(schema.initial(), 0, None, 0, "running", {}, 0, ToolCounts())

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, schema: StateSchema) -> Run:
        """The run as ``checkpoint`` left it, everything in it durable."""
        state = dict(checkpoint.values)
        if MESSAGES in schema.reducers:
            state[MESSAGES] = copy_messages(checkpoint.messages)  # with the store's id index
        meta = dict(checkpoint.meta)
        meta.pop(GRAPH_META, None)  # the opening checkpoint's alone (agentrun.structure): not carried on each step
        counts = ToolCounts.from_meta(meta)
        return cls(
            state,
            checkpoint.version,
            checkpoint.current_node,
            checkpoint.step,
            checkpoint.status,
            meta,
            len(checkpoint.messages),
            counts,
            usage=ModelUsage.from_meta(meta),
            owned=state[MESSAGES] if MESSAGES in schema.reducers else None,
        )

    @property
    def messages(self) -> list[Message]:
        """The state's messages."""
        return self.state.get(MESSAGES, [])  # type: ignore[no-any-return]

    def apply(self, schema: StateSchema, update: dict[str, Any] | None) -> None:
        """Merge ``update`` into the state, noting durable messages it replaced in place."""
        before = self.messages
        if self._appends_in_place(schema, update, before):
            assert update is not None and isinstance(before, MessageList)
            # All that can fail first (making the messages, the other channels' reducers): a failed update
            # leaves the run's state, its message list included, as it was.
            items = coerce_messages(update[MESSAGES])
            state = schema.apply(self.state, {k: v for k, v in update.items() if k != MESSAGES})
            replaced = append_messages(before, items)
            state[MESSAGES] = before
            self.state = state
            self.changed.update(k for k in update if k != MESSAGES)
            self.replaced.update(i for i in replaced if i < self.persisted_messages)
            return
        self.state = schema.apply(self.state, update)
        if update:
            self.changed.update(k for k in update if k != MESSAGES)
        after = self.messages
        if after is before:
            return
        known = replaced_positions(before, after)
        if known is not None:  # add_messages said which positions it replaced: no walk over the history
            if update is not None and not isinstance(update.get(MESSAGES), Replace):
                self.owned = after  # type: ignore[assignment]  # the reducer's new MessageList, in no one's hands
            self.replaced.update(i for i in known if i < self.persisted_messages)
            return
        # Another reducer, or a Replace: an element that is not the same object was replaced.
        for index in range(min(self.persisted_messages, len(before), len(after))):
            if after[index] is not before[index]:
                self.replaced.add(index)

    def _appends_in_place(self, schema: StateSchema, update: dict[str, Any] | None, before: list[Message]) -> bool:
        """Whether ``update``'s messages go into the run's own list in place (``owned``) rather than a copy."""
        return (
            before is self.owned
            and type(update) is dict
            and MESSAGES in update
            and not isinstance(update[MESSAGES], Replace)
            and schema.reducers.get(MESSAGES) is add_messages
        )

    def must_be_durable(self, cfg: RunConfig) -> bool:
        """Whether this step's write must reach the store, not only the cache."""
        if cfg.durable_checkpoint_every_step:
            return True
        # The ledger keys on the id of the message that asked for the tools: it must be
        # durable before those tools run, or a crash would re-run the model under new ids.
        return any(m.tool_calls for m in self.messages[self.persisted_messages :])

    @property
    def has_cached_steps(self) -> bool:
        """Whether steps were kept only in the cache since the last durable write."""
        return self.persisted_messages < len(self.messages) or bool(self.replaced)


class RunWriter:
    """Writes one run's checkpoints to ``checkpointer`` and ends the run in each of its ways."""

    def __init__(self, checkpointer: Checkpointer, cfg: RunConfig, log: RunLogger) -> None:
        self.checkpointer = checkpointer
        self.cfg = cfg
        self.log = log
        # Once per run, not per step: ``labels()`` takes the metric's lock and builds its key each call.
        self._checkpoint_seconds = CHECKPOINT_SECONDS.labels(checkpointer.backend)

    async def persist(self, run: Run, *, durable: bool) -> None:
        """Write the run's state and its not yet durable messages; ``durable=False`` writes the cache only."""
        messages = run.messages
        # The count now: the run's list is appended to in place (``Run.owned``), so what this write made
        # durable is what it held here, whatever is appended while the write is in flight.
        count = len(messages)
        changed = sorted(i for i in run.replaced if i < run.persisted_messages)
        pending = [(i, messages[i]) for i in changed]
        pending += [(i, messages[i]) for i in range(run.persisted_messages, count)]
        run.meta["tool_calls"] = run.counts.as_dict()
        if run.counts.last_error is not None:
            run.meta["last_tool_error"] = run.counts.last_error
        if run.usage:  # the operator exports it (agentrun_operator_model_*), so it outlives the pod
            run.meta[MODEL_USAGE] = run.usage.as_dict()
        write = CheckpointWrite(
            values={k: v for k, v in run.state.items() if k != MESSAGES},
            current_node=run.current_node,
            step=run.step,
            status=run.status,
            meta=run.meta,
            message_count=count,
            messages=pending,
            # A turn's first write, and its interrupted and terminal ones: not plain steps.
            record_turn=run.record_turn or run.status != "running",
            changed=frozenset(run.changed),
        )
        thread_id = self.cfg.thread_id
        if not durable:
            await self.checkpointer.cache_put(thread_id, write, version=run.version)
            return
        started = time.perf_counter()
        try:
            run.version = await self.checkpointer.aput(
                thread_id, write, expected_version=run.version, attempt=self.cfg.attempt, run_uid=self.cfg.run_uid
            )
        except StaleStateError:
            STALE_STATE.inc()
            self.log.error("checkpoint rejected: another process advanced this thread; this run stops writing")
            raise
        except FencedError:
            FENCED.inc()
            self.log.error("checkpoint rejected: a newer attempt owns this thread; this attempt stops")
            raise
        self._checkpoint_seconds.observe(time.perf_counter() - started)
        run.persisted_messages = count
        run.replaced.clear()
        run.changed.clear()
        run.record_turn = False

    async def finish(self, run: Run, status: RunStatus) -> None:
        """Persist the run durably with its new ``status``; a completed turn records its result."""
        run.status = status
        if status == "completed":
            result = turn_result(run)
            if result is not None:
                run.meta["result"] = result
        await self.persist(run, durable=True)

    async def pause(self, run: Run, interrupts: list[Interrupt]) -> None:
        """Persist the run as interrupted, waiting on ``interrupts``."""
        run.meta["interrupts"] = [i.to_json() for i in interrupts]
        INTERRUPTS.inc()
        self.log.info(
            "paused at node %s for %d interrupt(s): %s",
            run.current_node,
            len(interrupts),
            ", ".join(i.id for i in interrupts),
        )
        await self.finish(run, "interrupted")

    async def fail(self, run: Run, error: BaseException) -> None:
        """Persist the run as failed with ``error`` (resumable with input ``None``); never raises."""
        code = getattr(error, "code", NodeError.code)
        run.meta["error"] = {"code": code, "message": str(error)[:2000], "node": run.current_node}
        self.log.error("run failed at node %s: %s; resumable with input None", run.current_node, error)
        try:
            await self.finish(run, "failed")
        except Exception as e:  # the original error is the one to report
            self.log.error("could not persist the failure: %s", e)

    async def stop(self, run: Run, reason: str) -> NoReturn:
        """Persist the stop, acknowledge the request and raise ``RunStopped``."""
        run.meta["stop_reason"] = reason
        await self.finish(run, "stopped")
        await self.checkpointer.clear_stop(self.cfg.thread_id)
        STOPS.inc()
        self.log.info(
            "stopped at node %s (version %d)%s", run.current_node, run.version, f": {reason}" if reason else ""
        )
        raise RunStopped(self.cfg.thread_id, node=run.current_node, version=run.version, reason=reason)

    async def preempt(self, run: Run) -> NoReturn:
        """Leave the thread resumable at ``current_node`` and raise ``RunPreempted``."""
        if run.has_cached_steps:
            await self.persist(run, durable=True)
        self.log.info(
            "preempted before node %s (version %d); the next attempt resumes here", run.current_node, run.version
        )
        raise RunPreempted(
            f"thread {self.cfg.thread_id!r} preempted at node {run.current_node!r} (version {run.version}); resumable"
        )


def turn_result(run: Run) -> dict[str, Any] | None:
    """``Turn.result`` of a completed turn (``agentrun.result``): its last assistant message, else its final
    state's values; cut to 1024 characters, with the digest of the whole."""
    answer = next((m.content for m in reversed(run.messages) if m.role == "assistant"), None)
    return final_result(answer, run.state, messages_key=MESSAGES)
