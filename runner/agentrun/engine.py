"""The engine: the public API of a compiled graph and the one loop that runs it step by step, durably.

Semantics (DESIGN.md section 2): before a node runs, the state names it as
``current_node``; after it completes, the next node is chosen, the step
counter advances and the state is persisted (by default durably, after
every step). A crash therefore resumes from ``current_node``: the node that
was running runs again, and the tool ledger keeps its completed tool calls
from running twice.

``invoke``/``ainvoke``/``stream`` all consume ``astream``: there is one
engine, so deadlines, stop, the ledger and checkpoints apply to every entry
point alike. The blocking methods run on one event loop for the whole
process (``agentrun.blocking``).

The jobs around the loop live in their own modules: what a call does to a
thread (``lifecycle``), running one node under its deadline, stop and
preemption (``supervisor``), and writing the run (``persistence``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncGenerator, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeVar

from . import blocking, lifecycle, structure
from .ahead import Ahead, call_pure, is_pure, write_while_ahead
from .checkpoint.base import Checkpoint, Checkpointer, RunStatus, StopWatch
from .checkpoint.memory import InMemoryCheckpointer
from .config import RunConfig
from .constants import END, START
from .context import RunContext, ToolCounts, executed_since, run_logger
from .errors import (
    AgentRunError,
    FencedError,
    GraphInterrupt,
    GraphRecursionError,
    NodeError,
    Preempted,
    StaleStateError,
    StopRequested,
    ToolError,
)
from .faults import fault_point
from .interrupts import Command, Interrupt
from .messages import Message
from .metrics import STEP_SECONDS
from .nodes import Node, Topology
from .persistence import Run, RunWriter
from .state import MESSAGES
from .supervisor import Preemption, run_node, stop_reason
from .usage import ModelUsage

__all__ = ["CompiledGraph", "Preemption", "StateSnapshot", "StreamEvent"]

T = TypeVar("T")


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
class StateSnapshot:
    """A thread's state as ``aget_state`` reads it: version, values, next node, status, interrupts, meta."""

    thread_id: str
    version: int
    values: dict[str, Any]
    current_node: str | None
    step: int
    status: RunStatus
    interrupts: list[Interrupt]
    meta: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class _Paused:
    """The node raised ``interrupt()``: the run waits on these interrupts."""

    interrupts: list[Interrupt]


class CompiledGraph:
    """A runnable graph bound to a checkpointer. Create it with ``StateGraph.compile()``."""

    def __init__(self, graph: Topology, *, checkpointer: Checkpointer | None, name: str) -> None:
        self.graph = graph
        self.name = name
        self._ephemeral = checkpointer is None
        self.checkpointer: Checkpointer = checkpointer or InMemoryCheckpointer()
        self._setup_done = False
        # Blocking calls in flight on the blocking API's loop; only that loop's thread touches it.
        self._blocking_calls = 0
        self._step_metrics: dict[str, Any] = {}

    def _step_seconds(self, node: str) -> Any:
        """The node's step-duration histogram (``labels()`` once per node, not per step: it takes a lock)."""
        child = self._step_metrics.get(node)
        if child is None:
            child = self._step_metrics[node] = STEP_SECONDS.labels(node)
        return child

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
        """Blocking ``ainvoke``; raises ``RuntimeError`` inside a running event loop."""
        return blocking.run(lambda: self._blocking(self.ainvoke(input, config)), caller="invoke")

    def stream(
        self, input: Any, config: RunConfig | dict[str, Any] | None = None
    ) -> Generator[StreamEvent, None, None]:
        """Blocking ``astream``; raises ``RuntimeError`` inside a running event loop.

        Closing the generator early (``close()``, leaving a ``for`` loop and
        dropping it) ends the run where it is, resumable with input ``None``.
        """
        return blocking.iterate(lambda: self._blocking_stream(self.astream(input, config)), caller="stream")

    async def aget_state(self, config: RunConfig | dict[str, Any] | str) -> StateSnapshot | None:
        """The thread's latest state, or ``None`` for an unknown thread (``config``: a run config or a thread id)."""
        thread_id = config if isinstance(config, str) else RunConfig.from_any(config).thread_id
        await self._setup()
        checkpoint = await self.checkpointer.aget(thread_id)
        return None if checkpoint is None else self._snapshot(checkpoint)

    def get_state(self, config: RunConfig | dict[str, Any] | str) -> StateSnapshot | None:
        """Blocking ``aget_state``; raises ``RuntimeError`` inside a running event loop."""
        return blocking.run(lambda: self.aget_state(config), caller="get_state")

    async def arequest_stop(self, thread_id: str, reason: str = "") -> None:
        """Ask whichever process runs ``thread_id``'s current turn to stop; it does within about a second.

        The stop belongs to the turn in progress (running, or interrupted: it stops when resumed). Raises
        ``ThreadNotFoundError`` for an unknown thread and ``ThreadStateError`` when the latest turn has
        ended, since a stop kept for it would end the thread's next turn.
        """
        await self._setup()
        before = await self.checkpointer.aget_progress(thread_id)
        lifecycle.check_stoppable(before.status if before else None, thread_id=thread_id)
        await self.checkpointer.request_stop(thread_id, reason)
        after = await self.checkpointer.aget_progress(thread_id)
        if after is None or after.status in lifecycle.ENDED:  # the turn ended meanwhile: withdraw the request
            await self.checkpointer.clear_stop(thread_id)
            lifecycle.check_stoppable(after.status if after else None, thread_id=thread_id)

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
        writer = RunWriter(self.checkpointer, cfg, log)
        opened = await self._open(input, writer)
        if isinstance(opened, StreamEvent):  # the request already completed: its answer, not a new run
            yield opened
            return
        run = opened
        stops = await self.checkpointer.watch_stops(cfg.thread_id)
        # A pure node's update computed while the previous checkpoint was in flight (``agentrun.ahead``):
        # used only once that checkpoint returned, its event was yielded and no check before the node acted.
        ahead: Ahead | None = None
        try:
            while run.current_node not in (None, END):
                node = await self._node_to_run(run, writer, preemption, stops)
                if ahead is not None and ahead.node is node and ahead.state is run.state:
                    outcome = ahead.update
                    self._step_seconds(node.name).observe(ahead.seconds)
                    writer.log.info("node %s finished in %.3fs (step %d, ahead)", node.name, ahead.seconds, run.step)
                else:
                    outcome = await self._execute(node, run, writer, preemption=preemption, stops=stops)
                if isinstance(outcome, _Paused):
                    await writer.pause(run, outcome.interrupts)
                    yield self._event("interrupt", run, cfg, node.name, values=True, interrupts=outcome.interrupts)
                    return
                event, ahead = await self._advance(node, run, outcome, writer=writer, preemption=preemption)
                yield event
        finally:
            await stops.aclose()
        if run.status != "completed":  # the turn reached END without a step (a graph from START to END)
            await writer.finish(run, "completed")
        yield self._event("end", run, cfg, None, values=True)

    # -- the loop's steps ----------------------------------------------------

    async def _open(self, input: Any, writer: RunWriter) -> Run | StreamEvent:
        """Apply the life-cycle decision for ``input`` to the thread; returns the run to continue.

        A request (``cfg.request_key``) that already completed or stopped returns
        the ``end`` event to yield instead: the thread's current values, the
        turn's status and the version it ended at.
        """
        cfg, log = writer.cfg, writer.log
        checkpoint = await self.checkpointer.aget(cfg.thread_id)
        turn = None
        key = cfg.request_key
        new_input = input is not None and not isinstance(input, Command)
        # Not the latest turn's key: it may be an earlier turn's (one read, only for keyed new input).
        if key and new_input and checkpoint is not None and checkpoint.meta.get("request_key") != key:
            turn = await self.checkpointer.aget_turn(cfg.thread_id, key)
        action = lifecycle.decide(checkpoint, input, thread_id=cfg.thread_id, request_key=key, turn=turn)
        schema = self.graph.schema
        if isinstance(action, lifecycle.AlreadyDone):
            assert checkpoint is not None  # a request with a turn has a thread
            log.info(
                "request %s already %s at version %d; not run again", action.request_key, action.status, action.version
            )
            done = Run.from_checkpoint(checkpoint, schema)
            event = self._event("end", done, cfg, None, values=True)
            event.status, event.version = action.status, action.version
            return event
        if isinstance(action, lifecycle.StartTurn):
            run = Run.new(schema) if checkpoint is None else Run.from_checkpoint(checkpoint, schema)
            run.apply(schema, lifecycle.opening_update(run.state, action.update))
            run.current_node = self.graph.next_node(START, run.state)
            run.step = 0
            run.counts = ToolCounts()
            run.usage = ModelUsage()
            run.meta = {"run_id": uuid.uuid4().hex}
            if key:
                run.meta["request_key"] = key
        else:
            assert checkpoint is not None  # decide() resumes only a thread that exists
            run = Run.from_checkpoint(checkpoint, schema)
            # Results recorded after that checkpoint ran in an attempt that died before counting them.
            run.counts.executed += await executed_since(self.checkpointer, cfg.thread_id, checkpoint.created_at)
        if cfg.run_uid is not None:  # the run that carries the turn on (a re-applied request resumes it)
            run.meta["run_uid"] = cfg.run_uid
        run.status = "running"
        run.record_turn = True
        if isinstance(action, lifecycle.Resume):
            log.info(
                "resuming at node %s, step %d, from version %d (last status: %s)",
                run.current_node,
                run.step,
                run.version,
                checkpoint.status if checkpoint else None,
            )
            return run
        if isinstance(action, lifecycle.AnswerInterrupts):
            run.meta["resume"] = {**(run.meta.get("resume") or {}), **action.values}
            run.meta.pop("interrupts", None)
            log.info("resuming node %s with %d resume value(s)", run.current_node, len(run.meta["resume"]))
        # The graph's shape, for the history's picture: on this opening checkpoint only (no step pays for it).
        if (shape := structure.of_agentrun(self.graph)) is not None:
            run.meta[structure.META_KEY] = shape
        try:
            await writer.persist(run, durable=True)
        finally:
            run.meta.pop(structure.META_KEY, None)
        return run

    async def _node_to_run(self, run: Run, writer: RunWriter, preemption: Preemption | None, stops: StopWatch) -> Node:
        """The node to run next, unless the recursion limit, a preemption or a stop ends the run here."""
        cfg = writer.cfg
        name = run.current_node
        assert name is not None
        if run.step >= cfg.recursion_limit:
            limit = GraphRecursionError(
                f"recursion limit of {cfg.recursion_limit} steps reached before node {name!r}; "
                "raise recursion_limit in the run config if the graph really needs more steps"
            )
            await writer.fail(run, limit)
            raise limit
        node = self.graph.nodes[name]
        if preemption is not None and preemption.requested:
            await writer.preempt(run)
        # The store is asked before a call's first node, then when the store says a stop was requested
        # (PostgreSQL: a notification), or at most every stop_poll_interval where it cannot say (SQLite,
        # memory, a lost listener): a step pays no round trip for it. While a node runs, its supervisor
        # asks the same watch.
        if stops.due(asyncio.get_running_loop().time(), cfg.stop_poll_interval):
            reason = await stop_reason(self.checkpointer, cfg.thread_id, writer.log)
            if reason is not None:
                await writer.stop(run, reason)
        return node

    async def _execute(
        self, node: Node, run: Run, writer: RunWriter, *, preemption: Preemption | None, stops: StopWatch
    ) -> Any:
        """Run ``node`` under supervision (a pure one inline); returns its update or ``_Paused``, and ends the
        run on anything else."""
        started = time.perf_counter()
        failed_before = run.counts.failed
        writer.log.info("node %s started (step %d, version %d)", node.name, run.step, run.version)
        try:
            if is_pure(node):  # no task, thread or context (agentrun.ahead: a blocked loop hears no stop)
                update = call_pure(node, run.state, writer.cfg)
                if inspect.isawaitable(update):
                    update = await update
            else:
                ctx = self._context(node, run, writer)
                update = await run_node(node, run.state, ctx, preemption=preemption, stops=stops)
        except Preempted:
            await writer.preempt(run)
        except StopRequested as stop:
            await writer.stop(run, str(stop.args[0]) if stop.args else "")
        except GraphInterrupt as paused:
            return _Paused([i for i in paused.interrupts if isinstance(i, Interrupt)])
        except (StaleStateError, FencedError):
            raise  # another process owns the thread: write nothing more
        except Exception as e:
            # Our own errors (timeout, determinism, model, storage) keep their codes; user code's become NodeError.
            error = e if isinstance(e, AgentRunError) else NodeError(_raised(node.name, e), node=node.name)
            await writer.fail(run, error)
            if error is e:
                raise
            raise error from e
        elapsed = time.perf_counter() - started
        self._step_seconds(node.name).observe(elapsed)
        writer.log.info("node %s finished in %.3fs (step %d)", node.name, elapsed, run.step)
        if writer.cfg.fail_on_tool_error and run.counts.failed > failed_before:
            await self._fail_on_tool_error(node, run, writer)
        return update

    def _context(self, node: Node, run: Run, writer: RunWriter) -> RunContext:
        return RunContext(
            config=writer.cfg,
            checkpointer=self.checkpointer,
            run_id=str(run.meta.get("run_id", "")),
            node=node.name,
            step=run.step,
            log=writer.log,
            resume=dict(run.meta.get("resume") or {}),
            counts=run.counts,
            usage=run.usage,
        )

    @staticmethod
    async def _fail_on_tool_error(node: Node, run: Run, writer: RunWriter) -> NoReturn:
        """End the run failed at ``node``, its update dropped: a resume runs the node again.

        What the node's calls recorded stays: completed calls replay from the
        ledger, the failed ones run again (a retry of the turn retries them).
        """
        last = run.counts.last_error or {}
        failures = run.counts.failed
        error = ToolError(
            f"tool {last.get('tool')!r} failed ({last.get('code')}: {last.get('message')}); fail_on_tool_error is "
            f"set, so the run fails at node {node.name!r} ({failures} failed call(s) in this turn). Resuming runs "
            "the node again: completed calls replay from the ledger, failed ones run again",
            tool=str(last.get("tool")),
        )
        await writer.fail(run, error)
        raise error

    async def _advance(
        self, node: Node, run: Run, update: Any, *, writer: RunWriter, preemption: Preemption | None
    ) -> tuple[StreamEvent, Ahead | None]:
        """Merge the node's update, route to the next node and checkpoint the step; returns its event and,
        when the next node is pure, its update computed while the checkpoint was in flight (``agentrun.ahead``)."""
        cfg = writer.cfg
        before = len(run.messages)
        try:
            run.apply(self.graph.schema, update)
            next_node = self.graph.next_node(node.name, run.state)
        except AgentRunError as e:
            await writer.fail(run, e)
            raise
        new_messages = run.messages[before:] if MESSAGES in run.state else []
        run.step += 1
        run.current_node = next_node
        # The interrupted node completed: its resume values are spent.
        run.meta.pop("resume", None)
        run.meta.pop("interrupts", None)
        fault_point("before_checkpoint", node.name)
        ahead = None
        if next_node == END:
            await writer.finish(run, "completed")
        else:
            write = writer.persist(run, durable=run.must_be_durable(cfg))
            following = self.graph.nodes.get(next_node)
            # Not when the next node will not run anyway (the recursion limit, a preemption asked for).
            if (
                following is not None
                and is_pure(following)
                and run.step < cfg.recursion_limit
                and not (preemption is not None and preemption.requested)
            ):
                ahead = await write_while_ahead(write, following, run.state, cfg)
            else:
                await write
            fault_point("after_checkpoint", node.name)
        return self._event("step", run, cfg, node.name, update=update, new_messages=new_messages), ahead

    # -- the blocking API ----------------------------------------------------

    async def _blocking(self, call: Coroutine[Any, Any, T]) -> T:
        self._blocking_calls += 1
        try:
            return await call
        finally:
            await self._release_blocking()

    async def _blocking_stream(self, events: AsyncGenerator[StreamEvent, None]) -> AsyncGenerator[StreamEvent, None]:
        self._blocking_calls += 1
        try:
            async for event in events:
                yield event
        finally:
            try:
                await events.aclose()
            finally:
                await self._release_blocking()

    async def _release_blocking(self) -> None:
        """After the last blocking call in flight, close what nodes hold on the loop (e.g. HTTP sessions).

        Not after each call: a call of another thread may be using them.
        """
        self._blocking_calls -= 1
        if self._blocking_calls:
            return
        for node in self.graph.nodes.values():
            close = getattr(node.fn, "aclose", None)
            if close is not None and inspect.iscoroutinefunction(close):
                await close()

    # -- views ---------------------------------------------------------------

    def _event(
        self,
        kind: Literal["step", "interrupt", "end"],
        run: Run,
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


def _raised(node: str, error: Exception) -> str:
    return f"node {node!r} raised {type(error).__name__}: {error}"
