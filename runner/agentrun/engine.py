"""The engine: one loop that runs a compiled graph step by step, durably.

Semantics (DESIGN.md section 2): before a node runs, the state names it as
``current_node``; after it completes, the next node is chosen, the step
counter advances and the state is persisted (by default durably, after
every step). A crash therefore resumes from ``current_node``: the node that
was running runs again, and the tool ledger keeps its completed tool calls
from running twice.

``invoke``/``ainvoke``/``stream`` all consume ``astream``: there is one
engine, so deadlines, stop, the ledger and checkpoints apply to every entry
point alike.

Thread life cycle, by the status of the latest checkpoint:
- ``running`` (a process died mid-run) or ``failed``: call with input
  ``None`` to resume from ``current_node``;
- ``interrupted``: call with ``Command(resume=...)``;
- ``completed`` / ``stopped`` (or no thread yet): call with new input to
  start the next turn.
Anything else raises ``ThreadStateError`` instead of guessing, so input is
never silently dropped and a paused run is never silently restarted.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from .checkpoint.base import Checkpoint, Checkpointer, CheckpointWrite, RunStatus
from .checkpoint.memory import InMemoryCheckpointer
from .config import RunConfig
from .context import CallScope, RunContext, RunLogger, ToolCounts, current_run, current_scope, run_logger
from .errors import (
    AgentRunError,
    FencedError,
    GraphInterrupt,
    GraphRecursionError,
    NodeError,
    NodeTimeoutError,
    Preempted,
    RunPreempted,
    RunStopped,
    StaleStateError,
    StopRequested,
    ThreadNotFoundError,
    ThreadStateError,
)
from .faults import fault_point
from .interrupts import Command, Interrupt
from .messages import Message, tool_message, user
from .metrics import CHECKPOINT_SECONDS, FENCED, INTERRUPTS, NODE_TIMEOUTS, STALE_STATE, STEP_SECONDS, STOPS
from .state import MESSAGES, node_input
from .sync import run_sync
from .toolnode import last_tool_request

if TYPE_CHECKING:
    from .graph import Node, StateGraph

# How long a cancelled node may take to unwind before the engine stops waiting for it.
CANCEL_GRACE_SECONDS = 5.0


@dataclass
class StreamEvent:
    """One event of ``astream``: a finished step, a pause, or the end of the run."""

    kind: Literal["step", "interrupt", "end"]
    thread_id: str
    node: str | None
    step: int
    version: int
    status: RunStatus
    new_messages: list[Message] = field(default_factory=list)
    update: dict[str, Any] | None = None
    interrupts: list[Interrupt] = field(default_factory=list)
    values: dict[str, Any] | None = None


@dataclass
class Preemption:
    """Set from a SIGTERM handler to end a run at a safe point, keeping it resumable.

    ``requested``: start no further node (the current one may finish).
    ``cancel_now``: cancel the current node as well; its tool calls that
    completed are already in the ledger, so the next process replays them.
    """

    requested: bool = False
    cancel_now: bool = False


@dataclass
class StateSnapshot:
    thread_id: str
    version: int
    values: dict[str, Any]
    current_node: str | None
    step: int
    status: RunStatus
    interrupts: list[Interrupt]
    meta: dict[str, Any]
    created_at: float


@dataclass
class _Run:
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

    @property
    def messages(self) -> list[Message]:
        return self.state.get(MESSAGES, [])  # type: ignore[no-any-return]


def _input_update(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {MESSAGES: [user(value)]}
    if isinstance(value, Message):
        return {MESSAGES: [value]}
    if isinstance(value, dict):
        return value
    raise ThreadStateError(f"input must be a dict of channel values, a message or a string, not {type(value).__name__}")


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _unanswered_calls(state: dict[str, Any]) -> list[Message]:
    request = last_tool_request(state)
    if request is None:
        return []
    return [
        tool_message(
            "Error: not executed: the previous run ended before this call completed",
            tool_call_id=call.id,
            name=call.name,
            is_error=True,
        )
        for call in request.tool_calls
    ]


class CompiledGraph:
    """A runnable graph bound to a checkpointer. Create it with ``StateGraph.compile()``."""

    def __init__(self, graph: StateGraph, *, checkpointer: Checkpointer | None, name: str) -> None:
        self.graph = graph
        self.name = name
        self._ephemeral = checkpointer is None
        self.checkpointer: Checkpointer = checkpointer or InMemoryCheckpointer()
        self._setup_done = False

    # -- public API ----------------------------------------------------------

    async def ainvoke(self, input: Any, config: RunConfig | dict[str, Any] | None = None) -> dict[str, Any]:
        """Run to the end or to a pause and return the state values.

        When the run paused, the values carry ``"__interrupt__"``: the pending
        ``Interrupt`` list. Raises ``RunStopped`` after a stop (state persisted),
        ``NodeTimeoutError``, ``NodeError``, ``GraphRecursionError`` (state
        persisted as failed, resumable with input ``None``), ``StaleStateError``
        or ``FencedError`` (another process owns the thread; nothing written).
        """
        values: dict[str, Any] = {}
        async for event in self.astream(input, config):
            if event.values is not None:
                values = dict(event.values)
            if event.kind == "interrupt":
                values["__interrupt__"] = event.interrupts
        return values

    def invoke(self, input: Any, config: RunConfig | dict[str, Any] | None = None) -> dict[str, Any]:
        """Blocking ``ainvoke``; not for use inside a running event loop."""

        async def invoke_and_close() -> dict[str, Any]:
            try:
                return await self.ainvoke(input, config)
            finally:
                await self._aclose_nodes()

        return asyncio.run(invoke_and_close())

    def stream(self, input: Any, config: RunConfig | dict[str, Any] | None = None) -> Iterator[StreamEvent]:
        """Blocking ``astream`` on a private event loop."""
        loop = asyncio.new_event_loop()
        agen = self.astream(input, config)
        try:
            while True:
                try:
                    yield loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    break
        finally:
            loop.run_until_complete(agen.aclose())
            loop.run_until_complete(self._aclose_nodes())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _aclose_nodes(self) -> None:
        """Close what nodes hold on the private loop of the blocking wrappers (e.g. HTTP sessions)."""
        for node in self.graph.nodes.values():
            close = getattr(node.fn, "aclose", None)
            if close is not None and inspect.iscoroutinefunction(close):
                await close()

    async def aget_state(self, config: RunConfig | dict[str, Any] | str) -> StateSnapshot | None:
        thread_id = config if isinstance(config, str) else RunConfig.from_any(config).thread_id
        await self._setup()
        checkpoint = await self.checkpointer.aget(thread_id)
        return None if checkpoint is None else self._snapshot(checkpoint)

    def get_state(self, config: RunConfig | dict[str, Any] | str) -> StateSnapshot | None:
        return asyncio.run(self.aget_state(config))

    async def arequest_stop(self, thread_id: str, reason: str = "") -> None:
        """Ask whichever process runs ``thread_id`` to stop; it does within about a second."""
        await self._setup()
        await self.checkpointer.request_stop(thread_id, reason)

    async def astream(
        self,
        input: Any,
        config: RunConfig | dict[str, Any] | None = None,
        *,
        preemption: Preemption | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Run the graph, yielding an event after each durable (or cached) step.

        See ``ainvoke`` for what is raised; ``astream`` ends with an ``end``
        or an ``interrupt`` event. With ``preemption`` set by a signal handler,
        the run ends at the next safe point with ``RunPreempted``.
        """
        cfg = RunConfig.from_any(config, default_thread=f"ephemeral-{uuid.uuid4().hex}" if self._ephemeral else None)
        log = run_logger("agentrun.engine", cfg.thread_id, cfg.attempt)
        await self._setup()
        checkpoint = await self.checkpointer.aget(cfg.thread_id)
        run, needs_write = self._begin(checkpoint, input, cfg, log)
        if needs_write:
            await self._persist(run, cfg, log, durable=True)
        while True:
            node_name = run.current_node
            if node_name is None or node_name == "__end__":
                await self._finish(run, cfg, log, "completed")
                yield self._event("end", run, cfg, None, values=True)
                return
            if run.step >= cfg.recursion_limit:
                limit = GraphRecursionError(
                    f"recursion limit of {cfg.recursion_limit} steps reached before node {node_name!r}; "
                    "raise recursion_limit in the run config if the graph really needs more steps"
                )
                await self._fail(run, cfg, log, limit)
                raise limit
            node = self.graph.nodes[node_name]
            if preemption is not None and preemption.requested:
                await self._preempted(run, cfg, log)
            reason = await self._stop_reason(cfg, log)
            if reason is not None:
                await self._stopped(run, cfg, log, reason)
            ctx = RunContext(
                config=cfg,
                checkpointer=self.checkpointer,
                run_id=str(run.meta.get("run_id", "")),
                node=node_name,
                step=run.step,
                log=log,
                resume=dict(run.meta.get("resume") or {}),
                counts=run.counts,
            )
            started = time.perf_counter()
            try:
                update = await self._run_node(node, run.state, cfg, ctx, log, preemption)
            except Preempted:
                await self._preempted(run, cfg, log)
            except StopRequested as stop:
                await self._stopped(run, cfg, log, str(stop.args[0]) if stop.args else "")
            except GraphInterrupt as paused:
                interrupts = [i for i in paused.interrupts if isinstance(i, Interrupt)]
                run.meta["interrupts"] = [i.to_json() for i in interrupts]
                INTERRUPTS.inc()
                log.info(
                    "paused at node %s for %d interrupt(s): %s",
                    node_name,
                    len(interrupts),
                    ", ".join(i.id for i in interrupts),
                )
                await self._finish(run, cfg, log, "interrupted")
                yield self._event("interrupt", run, cfg, node_name, values=True, interrupts=interrupts)
                return
            except (StaleStateError, FencedError):
                raise  # another process owns the thread: write nothing more
            except NodeTimeoutError as e:
                NODE_TIMEOUTS.labels(node_name).inc()
                await self._fail(run, cfg, log, e)
                raise
            except Exception as e:
                # Our own errors (determinism, model, storage) keep their codes; user code's become NodeError.
                error = (
                    e
                    if isinstance(e, AgentRunError)
                    else NodeError(f"node {node_name!r} raised {type(e).__name__}: {e}", node=node_name)
                )
                await self._fail(run, cfg, log, error)
                if error is e:
                    raise
                raise error from e
            STEP_SECONDS.labels(node_name).observe(time.perf_counter() - started)
            try:
                before = run.messages
                run.state = self.graph.schema.apply(run.state, update)
                self._track_replaced(run, before)
                next_node = self.graph.next_node(node_name, run.state)
            except AgentRunError as e:
                await self._fail(run, cfg, log, e)
                raise
            new_messages = run.messages[len(before) :] if MESSAGES in run.state else []
            run.step += 1
            run.current_node = next_node
            # The interrupted node completed: its resume values are spent.
            run.meta.pop("resume", None)
            run.meta.pop("interrupts", None)
            fault_point("before_checkpoint", node_name)
            if next_node == "__end__":
                await self._finish(run, cfg, log, "completed")
                yield self._event("step", run, cfg, node_name, update=update, new_messages=new_messages)
                yield self._event("end", run, cfg, None, values=True)
                return
            await self._persist(run, cfg, log, durable=self._must_be_durable(run, cfg))
            fault_point("after_checkpoint", node_name)
            yield self._event("step", run, cfg, node_name, update=update, new_messages=new_messages)

    # -- run life cycle ------------------------------------------------------

    def _begin(self, checkpoint: Checkpoint | None, input: Any, cfg: RunConfig, log: RunLogger) -> tuple[_Run, bool]:
        """Decide from the thread's status and the input what this call does; returns (run, write first)."""
        status = checkpoint.status if checkpoint else None
        if isinstance(input, Command):
            if checkpoint is None or status != "interrupted":
                raise ThreadStateError(
                    f"thread {cfg.thread_id!r} is not waiting on an interrupt (status: {status or 'no thread'})"
                )
            run = self._from_checkpoint(checkpoint)
            run.meta["resume"] = {**(run.meta.get("resume") or {}), **self._resume_map(checkpoint, input, cfg)}
            run.meta.pop("interrupts", None)
            run.status = "running"
            log.info("resuming node %s with %d resume value(s)", run.current_node, len(run.meta["resume"]))
            return run, True
        if input is None:
            if checkpoint is None:
                raise ThreadNotFoundError(f"thread {cfg.thread_id!r} does not exist; start it with some input")
            if status == "interrupted":
                ids = ", ".join(i["id"] for i in checkpoint.interrupts)
                raise ThreadStateError(
                    f"thread {cfg.thread_id!r} is paused on interrupt(s) {ids}: resume it with Command(resume=...)"
                )
            if status in ("completed", "stopped"):
                raise ThreadStateError(
                    f"thread {cfg.thread_id!r} has no unfinished run to resume (status: {status}); "
                    "send new input to start the next turn"
                )
            run = self._from_checkpoint(checkpoint)
            log.info(
                "resuming at node %s, step %d, from version %d (last status: %s)",
                run.current_node,
                run.step,
                run.version,
                status,
            )
            run.status = "running"
            return run, False
        if status in ("running", "interrupted"):
            assert checkpoint is not None
            raise ThreadStateError(
                f"thread {cfg.thread_id!r} has an unfinished run ({status} at node {checkpoint.current_node!r}, "
                f"step {checkpoint.step}); resume it (input None, or Command(resume=...) when interrupted) "
                "before sending new input"
            )
        if checkpoint is None:
            run = _Run(self.graph.schema.initial(), 0, None, 0, "running", {}, 0, ToolCounts())
        else:
            run = self._from_checkpoint(checkpoint)
        before = run.messages
        update = _input_update(input)
        unanswered = _unanswered_calls(run.state)
        if unanswered and MESSAGES in update:
            # The previous turn stopped or failed between a model's tool request and its results. Chat APIs
            # reject a tool call without a result, so the next turn starts by saying why there is none.
            update = {**update, MESSAGES: [*unanswered, *_as_list(update[MESSAGES])]}
        run.state = self.graph.schema.apply(run.state, update)
        self._track_replaced(run, before)
        run.current_node = self.graph.next_node("__start__", run.state)
        run.step = 0
        run.status = "running"
        run.counts = ToolCounts()
        run.meta = {"run_id": uuid.uuid4().hex}
        if cfg.run_uid is not None:
            run.meta["run_uid"] = cfg.run_uid
        return run, True

    def _resume_map(self, checkpoint: Checkpoint, command: Command, cfg: RunConfig) -> dict[str, Any]:
        pending = [i["id"] for i in checkpoint.interrupts]
        value = command.resume
        if isinstance(value, dict) and value and set(value) <= set(pending):
            return dict(value)
        if len(pending) == 1:
            return {pending[0]: value}
        raise ThreadStateError(
            f"thread {cfg.thread_id!r} has {len(pending)} pending interrupts ({', '.join(pending)}): "
            "resume with a mapping {interrupt_id: value}"
        )

    def _from_checkpoint(self, checkpoint: Checkpoint) -> _Run:
        state = dict(checkpoint.values)
        if MESSAGES in self.graph.schema.reducers:
            state[MESSAGES] = list(checkpoint.messages)
        meta = dict(checkpoint.meta)
        counts = ToolCounts(**(meta.get("tool_calls") or {}))
        return _Run(
            state,
            checkpoint.version,
            checkpoint.current_node,
            checkpoint.step,
            checkpoint.status,
            meta,
            len(checkpoint.messages),
            counts,
        )

    @staticmethod
    def _track_replaced(run: _Run, before: list[Message]) -> None:
        # add_messages builds a new list; an element that is not the same object was replaced.
        after = run.messages
        for index in range(min(run.persisted_messages, len(before), len(after))):
            if after[index] is not before[index]:
                run.replaced.add(index)

    @staticmethod
    def _must_be_durable(run: _Run, cfg: RunConfig) -> bool:
        if cfg.durable_checkpoint_every_step:
            return True
        # The ledger keys on the id of the message that asked for the tools: it must be
        # durable before those tools run, or a crash would re-run the model under new ids.
        return any(m.tool_calls for m in run.messages[run.persisted_messages :])

    async def _run_node(
        self,
        node: Node,
        state: dict[str, Any],
        cfg: RunConfig,
        ctx: RunContext,
        log: RunLogger,
        preemption: Preemption | None = None,
    ) -> Any:
        """Run one node as a cancellable task under its deadline, polling for stop requests."""

        async def body() -> Any:
            current_run.set(ctx)
            current_scope.set(CallScope(name=node.name))
            args: tuple[Any, ...] = (node_input(state), cfg) if node.wants_config else (node_input(state),)
            fn = node.fn
            if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
                return await fn(*args)
            result = await run_sync(fn, *args)
            return await result if inspect.isawaitable(result) else result

        task = asyncio.create_task(body(), name=f"agentrun:{cfg.thread_id}:{node.name}")
        loop = asyncio.get_running_loop()
        deadline = None if cfg.node_timeout is None else loop.time() + cfg.node_timeout
        try:
            while True:
                wait = cfg.stop_poll_interval
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - loop.time()))
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    return task.result()
                if deadline is not None and loop.time() >= deadline:
                    await self._cancel(task, log)
                    raise NodeTimeoutError(
                        f"node {node.name!r} did not finish within {cfg.node_timeout:g}s",
                        code=NodeTimeoutError.NODE,
                        timeout=cfg.node_timeout or 0,
                    )
                if preemption is not None and preemption.cancel_now:
                    log.info(
                        "preempted while node %s runs; cancelling it (completed tool calls are recorded)", node.name
                    )
                    await self._cancel(task, log)
                    raise Preempted()
                reason = await self._stop_reason(cfg, log)
                if reason is not None:
                    log.info("stop requested while node %s runs; cancelling it", node.name)
                    await self._cancel(task, log)
                    raise StopRequested(reason)
        finally:
            if not task.done():
                await self._cancel(task, log)

    @staticmethod
    async def _cancel(task: asyncio.Task[Any], log: RunLogger) -> None:
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_SECONDS)
        if not done:
            log.error(
                "node task %s ignored cancellation for %.0fs; abandoning it", task.get_name(), CANCEL_GRACE_SECONDS
            )
        elif not task.cancelled() and task.exception() is not None:
            log.debug("node task ended with %r while being cancelled", task.exception())

    async def _stop_reason(self, cfg: RunConfig, log: RunLogger) -> str | None:
        try:
            return await self.checkpointer.stop_requested(cfg.thread_id)
        except Exception as e:  # a failed poll must not end the run; the next poll tries again
            log.warning("could not check for a stop request: %s", e)
            return None

    async def _stopped(self, run: _Run, cfg: RunConfig, log: RunLogger, reason: str) -> NoReturn:
        """Persist the stop, acknowledge the request and raise ``RunStopped``."""
        run.meta["stop_reason"] = reason
        await self._finish(run, cfg, log, "stopped")
        await self.checkpointer.clear_stop(cfg.thread_id)
        STOPS.inc()
        log.info("stopped at node %s (version %d)%s", run.current_node, run.version, f": {reason}" if reason else "")
        raise RunStopped(cfg.thread_id, node=run.current_node, version=run.version, reason=reason)

    async def _preempted(self, run: _Run, cfg: RunConfig, log: RunLogger) -> NoReturn:
        """Leave the thread resumable at ``current_node`` and raise ``RunPreempted``."""
        if run.persisted_messages < len(run.messages) or run.replaced:
            await self._persist(run, cfg, log, durable=True)  # steps kept only in the cache so far
        log.info("preempted before node %s (version %d); the next attempt resumes here", run.current_node, run.version)
        raise RunPreempted(
            f"thread {cfg.thread_id!r} preempted at node {run.current_node!r} (version {run.version}); resumable"
        )

    async def _fail(self, run: _Run, cfg: RunConfig, log: RunLogger, error: BaseException) -> None:
        code = getattr(error, "code", "NODE_ERROR_001")
        run.meta["error"] = {"code": code, "message": str(error)[:2000], "node": run.current_node}
        log.error("run failed at node %s: %s; resumable with input None", run.current_node, error)
        try:
            await self._finish(run, cfg, log, "failed")
        except Exception as e:  # the original error is the one to report
            log.error("could not persist the failure: %s", e)

    async def _finish(self, run: _Run, cfg: RunConfig, log: RunLogger, status: RunStatus) -> None:
        run.status = status
        await self._persist(run, cfg, log, durable=True)

    async def _persist(self, run: _Run, cfg: RunConfig, log: RunLogger, *, durable: bool) -> None:
        messages = run.messages
        changed = sorted(i for i in run.replaced if i < run.persisted_messages)
        pending = [(i, messages[i]) for i in changed]
        pending += [(i, messages[i]) for i in range(run.persisted_messages, len(messages))]
        run.meta["tool_calls"] = run.counts.as_dict()
        write = CheckpointWrite(
            values={k: v for k, v in run.state.items() if k != MESSAGES},
            current_node=run.current_node,
            step=run.step,
            status=run.status,
            meta=run.meta,
            message_count=len(messages),
            messages=pending,
        )
        if not durable:
            await self.checkpointer.cache_put(cfg.thread_id, write, version=run.version)
            return
        started = time.perf_counter()
        try:
            run.version = await self.checkpointer.aput(
                cfg.thread_id, write, expected_version=run.version, attempt=cfg.attempt
            )
        except StaleStateError:
            STALE_STATE.inc()
            log.error("checkpoint rejected: another process advanced this thread; this run stops writing")
            raise
        except FencedError:
            FENCED.inc()
            log.error("checkpoint rejected: a newer attempt owns this thread; this attempt stops")
            raise
        CHECKPOINT_SECONDS.labels(self.checkpointer.backend).observe(time.perf_counter() - started)
        run.persisted_messages = len(messages)
        run.replaced.clear()

    # -- views ---------------------------------------------------------------

    def _event(
        self,
        kind: Literal["step", "interrupt", "end"],
        run: _Run,
        cfg: RunConfig,
        node: str | None,
        *,
        values: bool = False,
        update: dict[str, Any] | None = None,
        new_messages: list[Message] | None = None,
        interrupts: list[Interrupt] | None = None,
    ) -> StreamEvent:
        return StreamEvent(
            kind=kind,
            thread_id=cfg.thread_id,
            node=node,
            step=run.step,
            version=run.version,
            status=run.status,
            new_messages=list(new_messages or []),
            update=update,
            interrupts=list(interrupts or []),
            values=dict(run.state) if values else None,
        )

    def _snapshot(self, checkpoint: Checkpoint) -> StateSnapshot:
        values = dict(checkpoint.values)
        if MESSAGES in self.graph.schema.reducers:
            values[MESSAGES] = list(checkpoint.messages)
        return StateSnapshot(
            thread_id=checkpoint.thread_id,
            version=checkpoint.version,
            values=values,
            current_node=checkpoint.current_node,
            step=checkpoint.step,
            status=checkpoint.status,
            interrupts=[Interrupt.from_json(i) for i in checkpoint.interrupts],
            meta=dict(checkpoint.meta),
            created_at=checkpoint.created_at,
        )

    async def _setup(self) -> None:
        if not self._setup_done:
            await self.checkpointer.setup()
            self._setup_done = True
