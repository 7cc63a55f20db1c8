"""A LangGraph graph as an AgentRun's turn: what the runner pod does when ``spec.graph`` names one.

The operator knows a thread by our state rows (version, node, step, status,
interrupts, outcome) and the runner decides what to do from them
(``runner.plan``). A LangGraph graph checkpoints into the ``lg_*`` tables
through ``AgentrunSaver``; this module also MIRRORS its progress into our
state rows — one versioned, fenced row after each LangGraph super-step
(``current_node``: the node(s) LangGraph runs next; ``step``: LangGraph's
step; ``END`` once nothing is next, as our engine writes), the messages of its
``messages`` channel (only those new or changed since the last row, into our
messages table: the history reads a call's request and answer there), and the
turn's end (completed with its result, interrupted with its interrupts,
stopped, failed). So status, ``kubectl agentrun``, the history, approvals and
stop work unchanged; the graph's own state lives only in LangGraph's tables
(the mirror's ``values`` are empty).

Per turn: the graph runs with ``durability="sync"`` (every super-step durable
before the next starts); a stop request is polled every
``stop_poll_interval`` and cancels the graph at once, even inside a hung async
tool (the node re-runs on a later turn; ``LedgerToolNode`` answers its
finished calls); a SIGTERM ends the turn at the next super-step boundary, or
at once after the grace period (exit 6, resumable); LangGraph ``interrupt()``
becomes the run's Waiting state and ``spec.resume`` becomes
``Command(resume=...)`` (one value, or a map of interrupt id to value).

HAZARDS
- Tool-call counts are those of ``LedgerToolNode`` (executed, replayed,
  failed, in doubt); model usage is metered by a LangChain callback on every
  chat model the graph calls (tokens from ``usage_metadata``), so a model
  called outside LangChain's callbacks is not counted.
- A graph error is recorded as failed and the attempt exits as a crash (the
  operator retries with backoff); LangGraph's ``GraphRecursionError`` is
  permanent (exit 5).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langgraph.errors import GraphRecursionError as LangGraphRecursionError
from langgraph.graph import StateGraph as LangGraphStateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command as LangGraphCommand

from agentrun import structure
from agentrun.checkpoint.base import Checkpoint, Checkpointer, CheckpointWrite, Commit, RunStatus
from agentrun.config import RunConfig
from agentrun.constants import END
from agentrun.context import ToolCounts, executed_since
from agentrun.errors import GraphRecursionError, GraphReferenceError, NodeError, RunPreempted, RunStopped
from agentrun.heartbeat import Heartbeat
from agentrun.messages import Message, from_langchain
from agentrun.metrics import MODEL_REQUEST_SECONDS, MODEL_TOKENS
from agentrun.result import final_result
from agentrun.usage import META_KEY as MODEL_USAGE
from agentrun.usage import ModelUsage

from . import hold
from .saver import AgentrunSaver
from .tools import track

log = logging.getLogger("agentrun.integrations.langgraph")

# How long a super-step's progress row waits for the next super-step's statement to carry it (seconds): longer
# than LangGraph takes from one checkpoint to the next when no node waits on anything (its own loop costs 2-5 ms
# of CPU a step here, several times that on a loaded machine; 2 ms let most rows go alone in the bench), far
# below what a person watching `kubectl get agentruns` would notice. A node that waits (a model, a tool) lets the
# row go alone; a crash in the window loses only the row, which the next attempt writes again.
MIRROR_WINDOW = 0.05
# How long the turn's end waits for a progress write in flight before it reads the version back instead.
DRAIN_SECONDS = 30

# The LangGraph versions this integration is tested with (the saver contract and ToolNode's wrappers).
SUPPORTED = ((1, 2), (2, 0))


class PreemptionFlags(Protocol):
    """The runner's SIGTERM state (``supervisor.Preemption``)."""

    requested: bool
    cancel_now: bool


def is_langgraph(target: object) -> bool:
    """Whether ``target`` (a graph reference's attribute) is a LangGraph graph, compiled or not."""
    return type(target).__module__.startswith("langgraph.") or isinstance(target, Pregel | LangGraphStateGraph)


def prepare(target: object, reference: str) -> Pregel[Any, Any, Any, Any]:
    """The compiled LangGraph graph of ``target``; ``GraphReferenceError`` (one line, what to do) if unusable."""
    version = importlib.metadata.version("langgraph")
    parsed = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if not SUPPORTED[0] <= parsed < SUPPORTED[1]:
        raise GraphReferenceError(
            f"graph reference {reference!r}: LangGraph {version} is installed but agentrun supports 1.2 to 1.x; "
            "install 'agentrun[langgraph]' in the runner image"
        )
    if isinstance(target, LangGraphStateGraph):
        log.warning(
            "graph reference %r is an uncompiled LangGraph StateGraph: it is compiled here (graph.compile()) with "
            "AgentrunSaver on the run's store; if the module compiles it, name that instead to silence this",
            reference,
        )
        target = target.compile()
    if not isinstance(target, Pregel):
        raise GraphReferenceError(
            f"graph reference {reference!r} is a {type(target).__name__}, not a compiled LangGraph graph "
            "(StateGraph(...).compile()) or an agentrun graph"
        )
    if target.checkpointer is not None:
        raise GraphReferenceError(
            f"graph reference {reference!r} was compiled with its own checkpointer "
            f"({type(target.checkpointer).__name__}); compile it without one (graph.compile()): the runner gives it "
            "AgentrunSaver on the run's store"
        )
    return target


class _Metering(BaseCallbackHandler):
    """Every LangChain chat model call of the graph into the turn's ``ModelUsage`` and the runner's metrics."""

    # Chat model events only. Said, so LangChain does not dispatch every node's, router's and channel write's
    # chain events to this handler: measured, that dispatch was a quarter of a LangGraph run's CPU per super-step
    # (3.58 against 2.69 ms of the client's CPU, a 40-step chain, 5 alternating rounds).
    ignore_chain = True
    ignore_agent = True
    ignore_retriever = True
    ignore_custom_event = True

    def __init__(self, usage: ModelUsage) -> None:
        self.usage = usage
        self._started: dict[Any, tuple[str, float]] = {}

    def on_chat_model_start(self, serialized: dict[str, Any], messages: Any, *, run_id: Any, **kwargs: Any) -> None:
        params = kwargs.get("invocation_params") or {}
        model = params.get("model") or params.get("model_name") or (serialized or {}).get("name") or "unknown"
        self._started[run_id] = (str(model), time.perf_counter())

    def _ended(self, run_id: Any, status: str) -> str:
        model, started = self._started.pop(run_id, ("unknown", time.perf_counter()))
        seconds = time.perf_counter() - started
        MODEL_REQUEST_SECONDS.observe(seconds)
        self.usage.add_request(model, status, seconds)
        return model

    def on_llm_end(self, response: LLMResult, *, run_id: Any, **kwargs: Any) -> None:
        model = self._ended(run_id, "ok")
        for generation in (g for batch in response.generations for g in batch):
            message = generation.message if isinstance(generation, ChatGeneration) else None
            usage = message.usage_metadata if isinstance(message, AIMessage) else None
            if not usage:
                continue
            for kind, key in (("prompt", "input_tokens"), ("completion", "output_tokens")):
                count = usage.get(key)
                if isinstance(count, int) and count > 0:
                    MODEL_TOKENS.labels(model, kind).inc(count)
                    self.usage.add_tokens(model, kind, count)

    def on_llm_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
        self._ended(run_id, "error")


@dataclass
class _Mirror:
    """Our state rows for a LangGraph turn: what the operator and ``runner.plan`` read."""

    store: Checkpointer
    cfg: RunConfig
    version: int
    meta: dict[str, Any] = field(default_factory=dict)
    counts: ToolCounts = field(default_factory=ToolCounts)
    usage: ModelUsage = field(default_factory=ModelUsage)
    node: str | None = None
    step: int = 0
    first: bool = True
    # The thread's messages as our messages table holds them: per position the LangChain message last seen
    # there (None: read back from the store) and its stored form; ``pending``: what the next write sends.
    shown: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    pending: list[tuple[int, Message]] = field(default_factory=list)
    # A staged row (``stage``) waits at most ``window`` seconds for the next super-step's statement to carry it.
    window: float = field(default_factory=lambda: MIRROR_WINDOW)  # read when made: tests widen it
    _dirty: bool = False  # staged and not yet sent
    _timer: asyncio.TimerHandle | None = None
    _flight: asyncio.Future[None] | None = None  # a row of ours in a statement now (riding or alone)
    _alone: asyncio.Future[None] | None = None
    _error: BaseException | None = None  # what a staged row met; raised by the next stage()
    _uncertain: bool = False  # a write cancelled mid-statement may have landed: read the version before the next

    def take(self, values: Any) -> None:
        """Queue the messages of LangGraph's ``messages`` channel our table does not hold as they are now.

        Why: the history, the page and ``kubectl agentrun history`` read a run's requests and answers from our
        messages table (LangGraph's are serialized blobs SQL cannot read); with them a LangGraph run shows each
        call's arguments, its answer and the attempt that answered it (a replay) as our engine's runs do.
        The same objects stay in LangGraph's list from step to step, so a step converts only what is new.
        """
        listed = values.get("messages") if isinstance(values, dict) else None
        if not isinstance(listed, list):
            return  # no messages channel: the history shows the ledger's records only
        end = len(listed)
        for index, message in enumerate(listed):
            if index < len(self.shown) and self.shown[index][0] is message:
                continue
            try:
                converted = from_langchain(message)
            except (AttributeError, TypeError, ValueError):  # not a LangChain message we have a role for
                log.debug("thread %s: messages from %d on are not mirrored", self.cfg.thread_id, index)
                end = index  # the ones before it are
                break
            stored = converted.to_json()
            if index >= len(self.shown) or self.shown[index][1] != stored:
                self.pending.append((index, converted))
            self.shown[index : index + 1] = [(message, stored)]
        del self.shown[end:]

    def stage(self) -> None:
        """The progress after a super-step, written within ``window``: in the next super-step's statement when
        that comes sooner (``ride``: one round trip and one commit for both), else on its own.

        Raises what an earlier staged write met (it ends the turn, as a failed write did when it was awaited).
        """
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        self._dirty = True
        self._arm()

    def ride(self, thread_id: str) -> _Ride | None:
        """The saver's rider (``hold.Rider``): the staged row, if one waits and nothing of ours is in flight."""
        if not self._dirty or self._flight is not None or self._error is not None or thread_id != self.cfg.thread_id:
            return None
        ride = _Ride(self, self._take("running"))
        self._flight = asyncio.get_running_loop().create_future()
        return ride

    async def send_now(self, thread_id: str) -> None:
        """The saver's ``progress_now``: store the staged row now (a tool node is about to act)."""
        if thread_id == self.cfg.thread_id:
            await self.settle()

    async def settle(self) -> None:
        """Wait for what is in flight and write what is staged: the progress is stored when this returns."""
        await self._drain()
        if self._dirty:
            await self.write("running")

    async def write(self, status: RunStatus) -> None:
        """Write the progress now with ``status`` (the turn's start and end), after anything in flight."""
        await self._drain()
        if self._uncertain:  # a write was cancelled mid-statement: it may have landed, so ask which version is last
            progress = await self.store.aget_progress(self.cfg.thread_id)
            if progress is not None:
                self.version = progress.version
            self._uncertain = False
        write = self._take(status)
        try:
            commit = await self._commit(write)
        except BaseException as e:
            self._failed(write, e)
            raise
        self._stored(commit)
        self._error = None

    async def _commit(self, write: CheckpointWrite) -> Commit:
        return await self.store.acommit(
            self.cfg.thread_id, write, expected_version=self.version, attempt=self.cfg.attempt, run_uid=self.cfg.run_uid
        )

    def _take(self, status: RunStatus) -> CheckpointWrite:
        """The row as of now (the pending messages go with it); the turn is recorded at its start and end."""
        self._disarm()
        self.meta["tool_calls"] = self.counts.as_dict()
        if self.counts.last_error is not None:
            self.meta["last_tool_error"] = self.counts.last_error
        if self.usage:
            self.meta[MODEL_USAGE] = self.usage.as_dict()
        write = CheckpointWrite(
            values={},
            current_node=self.node,
            step=self.step,
            status=status,
            meta=dict(self.meta),  # a copy: the row may be encoded after the next super-step changed the meta
            message_count=len(self.shown),
            messages=self.pending,
            record_turn=self.first or status != "running",
            changed=frozenset(),
        )
        self.pending = []
        self._dirty = False
        return write

    def _stored(self, commit: Commit) -> None:
        self.version = commit.version
        self.first = False

    def _failed(self, write: CheckpointWrite, error: BaseException) -> None:
        self.pending = [*write.messages, *self.pending]  # sent again with the next row
        self._dirty = True
        if isinstance(error, asyncio.CancelledError):
            self._uncertain = True

    def _landed(self, write: CheckpointWrite, commit: Commit | None, error: BaseException | None) -> None:
        """A staged row's outcome, riding or alone; then arm the window again if more was staged meanwhile."""
        flight, self._flight = self._flight, None
        if commit is not None:
            self._stored(commit)
        else:
            assert error is not None
            self._failed(write, error)
            if isinstance(error, Exception):
                self._error = error  # raised by the next stage(); write() tries again for the turn's end
        if flight is not None and not flight.done():
            flight.set_result(None)
        self._arm()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._dirty and self._timer is None and self._flight is None and self._error is None:
            self._timer = asyncio.get_running_loop().call_later(self.window, self._send_alone)

    def _send_alone(self) -> None:
        """The window ended and no super-step took the row: it goes on its own statement."""
        self._timer = None
        if not self._dirty or self._flight is not None:
            return
        self._flight = asyncio.get_running_loop().create_future()
        write = self._take("running")
        self._alone = asyncio.ensure_future(self._write_alone(write))  # referenced until it ends

    async def _write_alone(self, write: CheckpointWrite) -> None:
        try:
            commit = await self._commit(write)
        except BaseException as e:
            self._landed(write, None, e)
            if not isinstance(e, Exception):
                raise
            return
        self._landed(write, commit, None)

    def close(self) -> None:
        """The attempt ends without a last row (preempted, cancelled): a staged row is dropped, not sent later.

        Nothing depends on it: the next attempt resumes from LangGraph's checkpoint and mirrors from there.
        """
        self._disarm()

    async def _drain(self) -> None:
        self._disarm()
        while self._flight is not None:
            flight = self._flight
            try:
                await asyncio.wait_for(asyncio.shield(flight), DRAIN_SECONDS)
            except TimeoutError:  # its statement never answered (its task was dropped): assume nothing
                log.warning("thread %s: a progress write did not end in %ds", self.cfg.thread_id, DRAIN_SECONDS)
                if self._flight is flight:
                    self._flight = None
                    self._dirty = True
                    self._uncertain = True


@dataclass
class _Ride:
    """A staged progress row on its way in a super-step's statement (``hold.Ride``)."""

    mirror: _Mirror
    write: CheckpointWrite
    thread_id: str = field(init=False)
    expected_version: int = field(init=False)
    attempt: int | None = field(init=False)
    run_uid: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.expected_version = self.mirror.version
        self.thread_id = self.mirror.cfg.thread_id
        self.attempt = self.mirror.cfg.attempt
        self.run_uid = self.mirror.cfg.run_uid

    def landed(self, commit: Commit | None, error: BaseException | None) -> None:
        self.mirror._landed(self.write, commit, error)


def _result(values: Any) -> dict[str, Any] | None:
    """The turn's result by ``agentrun.result``'s rule: the last AIMessage's text, else the final values."""
    values = values if isinstance(values, dict) else {}
    messages = values.get("messages")
    answer = None
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, AIMessage):
            answer = message.content if isinstance(message.content, str) else str(message.content)
            break
    return final_result(answer, values)


# Over 80 lines on purpose: the turn's mirror, counts and heartbeat are shared by its step loop and its outcome.
async def run_turn(  # noqa: C901 -- see the comment above: the turn reads in order
    app: Pregel[Any, Any, Any, Any],
    *,
    store: Checkpointer,
    cfg: RunConfig,
    payload: Any,
    resume: tuple[Any] | None = None,
    existing: Checkpoint | None,
    preemption: PreemptionFlags,
) -> tuple[RunStatus, list[dict[str, Any]]]:
    """Run the turn: start it with ``payload``, continue it (``payload`` None), or answer its interrupts
    (``resume``: a 1-tuple of ``spec.resume``'s value or its map of interrupt id to value).
    Returns ``("completed", [])`` or ``("interrupted", interrupts)``.

    Raises ``RunStopped`` (a stop request; persisted), ``RunPreempted`` (SIGTERM;
    resumable), ``FencedError``/``StoreUnavailableError`` from the store, and the
    graph's own error after recording the turn as failed.
    """
    saver = AgentrunSaver(store, attempt=cfg.attempt, run_uid=cfg.run_uid, hold_writes=hold.WRITE_HOLD_WINDOW)
    graph = app.copy(update={"checkpointer": saver})
    config: Any = {"configurable": {"thread_id": cfg.thread_id}, "recursion_limit": cfg.recursion_limit}
    meta = {k: v for k, v in (existing.meta if existing else {}).items() if k in ("run_uid", "request_key")}
    if payload is not None:
        meta = {}  # a new turn
    meta.update(run_uid=cfg.run_uid, engine="langgraph")
    if cfg.request_key:
        meta["request_key"] = cfg.request_key
    # The turn's tool calls (LedgerToolNode counts them), carried on from the previous attempt of the turn.
    continuing = existing is not None and payload is None
    counts = ToolCounts.from_meta(existing.meta) if existing is not None and continuing else ToolCounts()
    if existing is not None and continuing:  # results recorded after it: an attempt died before counting them
        counts.executed += await executed_since(store, cfg.thread_id, existing.created_at)
    usage = ModelUsage.from_meta(existing.meta) if existing is not None and continuing else ModelUsage()
    mirror = _Mirror(store, cfg, existing.version if existing else 0, meta=meta, counts=counts, usage=usage)
    config["callbacks"] = [_Metering(usage)]
    saver.rider = mirror.ride
    saver.progress_now = mirror.send_now
    if existing is not None:
        mirror.node, mirror.step = existing.current_node, existing.step
        mirror.shown = [(None, m.to_json()) for m in existing.messages]  # what our messages table holds
    # The graph's shape, for the history's picture: on the attempt's opening checkpoint only (agentrun.structure).
    if (shape := structure.of_langgraph(app)) is not None:
        mirror.meta[structure.META_KEY] = shape
    try:
        await mirror.write("running")
    finally:
        mirror.meta.pop(structure.META_KEY, None)

    def alive(elapsed: float, left: float | None) -> None:
        log.info(
            "thread %s: node %s still running after %.0fs (LangGraph step %d)",
            cfg.thread_id,
            mirror.node or "-",
            elapsed,
            mirror.step,
        )

    # A step (the nodes between two LangGraph checkpoints) running longer than HEARTBEAT_SECONDS says so.
    heartbeat = Heartbeat(alive, asyncio.get_running_loop(), None)

    async def steps() -> None:
        stream: AsyncIterator[Any] = graph.astream(
            payload if resume is None else LangGraphCommand(resume=resume[0]),
            config,
            stream_mode="checkpoints",
            durability="sync",
        )
        async for checkpoint in stream:
            following = list(checkpoint.get("next") or [])
            mirror.node = ",".join(following) or END  # nothing next: the graph ended (our engine says END too)
            mirror.step = max(0, int((checkpoint.get("metadata") or {}).get("step", mirror.step)))
            mirror.take(checkpoint.get("values"))
            mirror.meta["langgraph_checkpoint_id"] = checkpoint["config"]["configurable"].get("checkpoint_id")
            mirror.stage()  # stored in the next super-step's statement, or alone within the mirror's window
            heartbeat.restart()
            if preemption.requested and following:
                await mirror.settle()
                raise RunPreempted(
                    f"thread {cfg.thread_id!r} preempted before node {mirror.node!r} (LangGraph step {mirror.step}); "
                    "resumable"
                )

    track(cfg.thread_id, counts)
    task = asyncio.ensure_future(steps())
    try:
        reason = await _supervise(task, store, cfg, preemption)
    except LangGraphRecursionError as e:
        await _fail(mirror, e)
        raise GraphRecursionError(str(e)) from e
    except (RunPreempted, asyncio.CancelledError):
        mirror.close()
        raise
    except Exception as e:
        if not isinstance(e, RunStopped):
            await _fail(mirror, e)
        raise
    finally:
        heartbeat.cancel()
        track(cfg.thread_id, None)
    if reason is not None:
        mirror.meta["stop_reason"] = reason
        await mirror.write("stopped")
        await store.clear_stop(cfg.thread_id)
        log.info("thread %s: stopped at node %s%s", cfg.thread_id, mirror.node, f": {reason}" if reason else "")
        raise RunStopped(cfg.thread_id, node=mirror.node, version=mirror.version, reason=reason)
    state = await graph.aget_state(config)
    interrupts = [
        {"id": i.id, "payload": i.value, "message": i.value if isinstance(i.value, str) else "", "node": t.name}
        for t in state.tasks
        for i in t.interrupts
    ]
    if interrupts:
        mirror.meta["interrupts"] = interrupts
        await mirror.write("interrupted")
        return "interrupted", interrupts
    mirror.meta.pop("interrupts", None)
    if (result := _result(state.values)) is not None:
        mirror.meta["result"] = result
    mirror.node = END
    await mirror.write("completed")
    return "completed", []


async def _supervise(
    task: asyncio.Future[None], store: Checkpointer, cfg: RunConfig, preemption: PreemptionFlags
) -> str | None:
    """Wait for ``task``; cancel it on a stop request (returns its reason) or when SIGTERM's grace ran out."""
    while True:
        done, _ = await asyncio.wait({task}, timeout=cfg.stop_poll_interval)
        if done:
            task.result()
            return None
        try:
            reason = await store.stop_requested(cfg.thread_id)
        except Exception as e:  # the next poll is the retry; an outage shows at the next checkpoint write
            log.warning(
                "thread %s: could not read stop requests (%s); asking again in %.1fs",
                cfg.thread_id,
                e,
                cfg.stop_poll_interval,
            )
            reason = None
        if reason is not None or preemption.cancel_now:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if reason is None:
                raise RunPreempted(f"thread {cfg.thread_id!r} preempted mid-step (grace period over); resumable")
            return reason


async def _fail(mirror: _Mirror, error: BaseException) -> None:
    mirror.meta["error"] = {"code": getattr(error, "code", NodeError.code), "message": str(error)[:2000]}
    try:
        await mirror.write("failed")
    except Exception as e:  # the graph's error is the one to report
        log.error("could not persist the failure: %s", e)
