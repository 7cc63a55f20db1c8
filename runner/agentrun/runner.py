"""The runner pod entrypoint: ``python -m agentrun.runner``.

The operator starts one pod per attempt of an AgentRun and talks to it only
through environment variables (in), the store and the exit code (out); the
names, the inputs and the exit codes live in ``agentrun.contract``.
The outcome is also in the store (the checkpoint's status and error),
and a one-line reason goes to the termination log, so the operator never has
to trust an exit code alone. The runner needs no Kubernetes credentials.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from .checkpoint import Checkpointer, open_store
from .checkpoint.base import Checkpoint, CheckpointWrite
from .contract import RUN_CONFIG_KEYS, Env, ExitCode, InvalidEnvironment, RunnerInputs
from .engine import CompiledGraph, Preemption
from .errors import (
    AgentRunError,
    DeterminismError,
    FencedError,
    GraphDefinitionError,
    GraphRecursionError,
    GraphReferenceError,
    InvalidUpdateError,
    NodeError,
    RunnerInputError,
    RunPreempted,
    RunStopped,
    StoreConfigError,
    StoreUnavailableError,
    ThreadStateError,
    ToolError,
)
from .interrupts import Command
from .loader import compile_reference, is_langgraph, load_target
from .logs import configure_logging
from .state import MESSAGES

# Errors a retry cannot fix: the operator marks the run Failed instead of rescheduling.
PERMANENT = (
    GraphReferenceError,
    GraphDefinitionError,
    GraphRecursionError,
    InvalidUpdateError,
    DeterminismError,
    NodeError,
    ThreadStateError,
    ToolError,  # fail_on_tool_error: a retry of the same turn (spec.retry) runs the failed call again
)

log = logging.getLogger("agentrun.runner")


class RunnerSettings(RunnerInputs):
    """``RunnerInputs`` as the runner uses them (read with ``RunnerInputs.from_environ``)."""

    def run_config(self) -> dict[str, Any]:
        """The run config the pod's inputs describe, as ``RunConfig.from_any`` takes it."""
        config = {RUN_CONFIG_KEYS.get(k, k): v for k, v in self.config.items()}
        config.update(thread_id=self.thread_id, attempt=self.attempt, run_uid=self.run_uid or None)
        if self.request_key:
            config["request_key"] = self.request_key
        return config


@dataclass(frozen=True)
class Plan:
    """What this attempt does, decided from the thread's latest checkpoint (pure: unit-tested)."""

    action: str  # "start" | "resume" | "exit"
    payload: Any = None
    exit_code: ExitCode = ExitCode.COMPLETED
    reason: str = ""


def _ours(checkpoint: Checkpoint, settings: RunnerSettings) -> bool:
    """Whether the thread's latest turn is this run's: the same request key when one is set, else the same run uid.

    With a request key, a re-applied AgentRun (a new uid, the same request) owns the turn its
    predecessor started, and resumes it.
    """
    if settings.request_key:
        return bool(checkpoint.meta.get("request_key") == settings.request_key)
    return bool(checkpoint.meta.get("run_uid") == (settings.run_uid or None))


def _another_runs_unfinished_turn(checkpoint: Checkpoint | None, settings: RunnerSettings) -> bool:
    """The thread's latest turn belongs to another AgentRun and has not ended: ``plan`` answers ThreadBusy."""
    return (
        checkpoint is not None
        and not _ours(checkpoint, settings)
        and checkpoint.status not in ("completed", "stopped", "failed")
    )


def _orphaned(checkpoint: Checkpoint | None, settings: RunnerSettings) -> bool:
    """The thread's unfinished turn is the deleted AgentRun's the operator told this run to take over from."""
    return (
        bool(settings.take_over_from)
        and _another_runs_unfinished_turn(checkpoint, settings)
        and checkpoint is not None
        and checkpoint.meta.get("run_uid") == settings.take_over_from
    )


async def _close_orphaned_turn(checkpointer: Checkpointer, checkpoint: Checkpoint, settings: RunnerSettings) -> None:
    """End a deleted AgentRun's unfinished turn as stopped, so this run's turn can start on the thread.

    Called after this attempt registered (so the deleted run's pod, were it still alive, is fenced off). The
    state is kept as it was; its tool calls stay in the ledger. Closed rather than resumed: the deleted run's
    input was its own request, and nobody asked for it any more.
    """
    reason = f"its AgentRun (uid {settings.take_over_from}) was deleted; closed by run {settings.run_name or '-'}"
    write = CheckpointWrite(
        values={k: v for k, v in checkpoint.values.items() if k != MESSAGES},
        current_node=checkpoint.current_node,
        step=checkpoint.step,
        status="stopped",
        meta={**checkpoint.meta, "stop_reason": reason},
        message_count=len(checkpoint.messages),
        record_turn=True,  # a terminal write, as the engine's
        changed=frozenset(),
    )
    await checkpointer.aput(
        settings.thread_id,
        write,
        expected_version=checkpoint.version,
        attempt=settings.attempt,
        run_uid=settings.run_uid or None,
    )
    log.warning("thread %s: %s at node %s", settings.thread_id, reason, checkpoint.current_node)


def plan(checkpoint: Checkpoint | None, settings: RunnerSettings) -> Plan:
    """What this attempt does. Not ours and ended: start (the engine answers a request key it has
    already completed without running anything); not ours and unfinished: ThreadBusy; ours: carry on."""
    ours = checkpoint is not None and _ours(checkpoint, settings)
    if checkpoint is None or (not ours and checkpoint.status in ("completed", "stopped", "failed")):
        if settings.input is None:
            # Said in the user's terms: an AgentRun sets spec.input; the variable is the operator's.
            return Plan(
                "exit",
                exit_code=ExitCode.FAILED,
                reason=f"InputMissing: the thread has no run to continue, so a new one needs an input "
                f"(spec.input of the AgentRun; {Env.INPUT} for the runner)",
            )
        return Plan("start", payload=settings.input)
    if not ours:
        return Plan(
            "exit",
            exit_code=ExitCode.FAILED,
            reason=f"ThreadBusy: thread {settings.thread_id} has an unfinished run of another AgentRun "
            f"(uid {checkpoint.meta.get('run_uid')}, status {checkpoint.status})",
        )
    if checkpoint.status in ("running", "failed"):
        return Plan("resume", payload=None)
    if checkpoint.status == "interrupted":
        if settings.resume is None:
            return Plan("exit", exit_code=ExitCode.INTERRUPTED, reason="Interrupted: waiting for spec.resume")
        values = settings.resume.get("values")
        return Plan("resume", payload=Command(resume=values if values else settings.resume.get("value")))
    if checkpoint.status == "stopped":
        return Plan("exit", exit_code=ExitCode.STOPPED, reason="Stopped")
    return Plan("exit", exit_code=ExitCode.COMPLETED, reason="Completed")


def exit_code_for(error: BaseException) -> ExitCode:
    """The pod's exit code for the error that ended the attempt (``contract.ExitCode``)."""
    if isinstance(error, RunStopped):
        return ExitCode.STOPPED
    if isinstance(error, RunPreempted):
        return ExitCode.PREEMPTED
    if isinstance(error, FencedError):
        return ExitCode.FENCED
    if isinstance(error, StoreUnavailableError):
        return ExitCode.STORE_UNAVAILABLE  # the store stayed down past the retries: a disruption
    if isinstance(error, StoreConfigError):
        return ExitCode.FAILED  # a wrong DSN, password or database: no retry can fix it
    if isinstance(error, NodeError) and isinstance(error.__cause__, OSError | TimeoutError):
        return ExitCode.CRASH  # a node hit the network or disk: worth a retry with backoff
    if isinstance(error, (*PERMANENT, RunnerInputError)):
        return ExitCode.FAILED
    return ExitCode.CRASH


def _checkpointer(settings: RunnerSettings) -> Checkpointer:
    url = settings.postgres_dsn or settings.store
    if url:
        try:
            return open_store(url, redis_url=settings.redis_url, retry_timeout=settings.store_retry_seconds)
        except ValueError as e:  # an unknown scheme; the message names the scheme only, never the URL
            raise StoreConfigError(str(e)) from None
    raise RunnerInputError("no store configured: set AGENTRUN_POSTGRES_DSN (from the store Secret) or AGENTRUN_STORE")


def _start_metrics(port: int) -> None:
    if port <= 0:
        return
    from prometheus_client import start_http_server

    from .metrics import build_info

    try:
        start_http_server(port)
        build_info("runner")
    except OSError as e:  # several runners on one host (local tests) share the port space
        log.warning("metrics port %d unavailable (%s); continuing without /metrics", port, e)


def explained(code: int, line: str) -> str:
    """The termination line of an exit that is no failure, with what it means (``ExitCode.on_purpose``)."""
    try:
        meaning = ExitCode(code).on_purpose
    except ValueError:  # a crash's code
        meaning = None
    return _one_line(f"{line} ({meaning})") if line and meaning else line


async def _inputs_from_store(checkpointer: Checkpointer, settings: RunnerSettings) -> RunnerSettings:
    """``settings`` with the input and resume value the operator recorded for this attempt."""
    record = await checkpointer.aget_run_inputs(settings.thread_id, run_uid=settings.run_uid, attempt=settings.attempt)
    if record is None:
        raise RunnerInputError(
            f"{Env.INPUTS_IN_STORE} is set but the store holds no inputs for run uid {settings.run_uid or '-'} "
            f"attempt {settings.attempt} of thread {settings.thread_id} (the operator writes them before it "
            "creates the pod): the thread was deleted meanwhile, or this is a bug"
        )
    return settings.model_copy(update={"input": record.input, "resume": record.resume})


async def attempt(settings: RunnerSettings) -> tuple[int, str]:  # noqa: C901 -- every exit code of one attempt in one place
    """One attempt: the exit code and the one-line termination message ("CODE: message", or "")."""
    preemption = Preemption()
    loop = asyncio.get_running_loop()

    def on_sigterm() -> None:
        if preemption.requested:
            return
        log.info(
            "SIGTERM: finishing the current node for up to %.0fs, then checkpointing and exiting 6",
            settings.preempt_finish_seconds,
        )
        preemption.requested = True
        loop.call_later(settings.preempt_finish_seconds, lambda: setattr(preemption, "cancel_now", True))

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    checkpointer: Checkpointer | None = None
    try:
        app: CompiledGraph | None = None
        checkpointer = _checkpointer(settings)
        target = load_target(settings.graph)
        # A LangGraph graph runs on LangGraph's engine with our saver and a mirror of its progress in our
        # state rows (integrations/langgraph/run.py); plan() below decides for both alike.
        langgraph_app = _langgraph(target, settings.graph) if is_langgraph(target) else None
        if langgraph_app is None:
            app = compile_reference(settings.graph, checkpointer)
        await checkpointer.setup()
        if settings.inputs_in_store:
            settings = await _inputs_from_store(checkpointer, settings)
        # Registering claims the thread for this run (fencing every other run off), so a run that will
        # refuse the thread (ThreadBusy: another AgentRun's turn is unfinished) must not register.
        existing = await checkpointer.aget(settings.thread_id)
        if _orphaned(existing, settings):
            assert existing is not None
            await checkpointer.register_attempt(settings.thread_id, settings.attempt, run_uid=settings.run_uid or None)
            await _close_orphaned_turn(checkpointer, existing, settings)
            existing = await checkpointer.aget(settings.thread_id)
        elif not _another_runs_unfinished_turn(existing, settings):
            await checkpointer.register_attempt(settings.thread_id, settings.attempt, run_uid=settings.run_uid or None)
            # Read again after registering: all that a now fenced attempt committed before it, nothing after.
            existing = await checkpointer.aget(settings.thread_id)
        decided = plan(existing, settings)
        if decided.action == "exit":
            log.info("nothing to run: %s", decided.reason)
            return decided.exit_code, _one_line(decided.reason)
        log.info(
            "attempt %d of run %s: %s thread %s",
            settings.attempt,
            settings.run_name or "-",
            decided.action,
            settings.thread_id,
        )
        if langgraph_app is not None:
            return await _run_langgraph(langgraph_app, checkpointer, settings, decided, existing, preemption)
        assert app is not None
        last = None
        async for event in app.astream(decided.payload, settings.run_config(), preemption=preemption):
            last = event
        if last is not None and last.kind == "end" and last.status == "stopped":  # a request that was stopped
            return ExitCode.STOPPED, "Stopped"
        if last is not None and last.kind == "interrupt":
            waiting = "; ".join(f"{i.id}" + (f" ({i.message})" if i.message else "") for i in last.interrupts)
            return ExitCode.INTERRUPTED, _one_line(f"Interrupted: waiting on {waiting}")
        return ExitCode.COMPLETED, ""
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt | SystemExit | asyncio.CancelledError):
            raise
        code = exit_code_for(e)
        name = getattr(e, "code", type(e).__name__)
        level = logging.INFO if code in (ExitCode.STOPPED, ExitCode.PREEMPTED) else logging.ERROR
        log.log(level, "exit %d: %s", code, e, exc_info=code == ExitCode.CRASH)
        message = e.args[0] if isinstance(e, AgentRunError) and e.args and isinstance(e.args[0], str) else str(e)
        return code, _one_line(f"{name}: {message}")
    finally:
        if checkpointer is not None:
            try:
                await checkpointer.aclose()
            except Exception as e:
                log.warning("closing the store failed: %s", e)


def _langgraph(target: object, reference: str) -> Any:
    """The compiled LangGraph graph of ``target``; ``GraphReferenceError`` if the extra is missing or it is unusable."""
    try:
        from .integrations.langgraph.run import prepare
    except ImportError as e:
        raise GraphReferenceError(
            f"graph reference {reference!r} is a LangGraph graph but the runner image lacks the LangGraph "
            f"integration: install 'agentrun[langgraph]' ({e})"
        ) from None
    return prepare(target, reference)


async def _run_langgraph(
    app: Any,
    checkpointer: Checkpointer,
    settings: RunnerSettings,
    decided: Plan,
    existing: Checkpoint | None,
    preemption: Preemption,
) -> tuple[int, str]:
    from .config import RunConfig
    from .integrations.langgraph.run import run_turn

    answer = decided.payload if isinstance(decided.payload, Command) else None
    status, interrupts = await run_turn(
        app,
        store=checkpointer,
        cfg=RunConfig.from_any(settings.run_config()),
        payload=None if answer is not None else decided.payload,
        resume=(answer.resume,) if answer is not None else None,
        existing=existing,
        preemption=preemption,
    )
    if status == "interrupted":
        return ExitCode.INTERRUPTED, _one_line("Interrupted: waiting on " + "; ".join(i["id"] for i in interrupts))
    return ExitCode.COMPLETED, ""


def _one_line(message: str, limit: int = 4000) -> str:
    """``message`` as one line of at most ``limit`` UTF-8 bytes (Kubernetes keeps 4096 of the termination log)."""
    line = " ".join(message.split())
    encoded = line.encode()
    return line if len(encoded) <= limit else encoded[:limit].decode(errors="ignore")


def _termination(settings: RunnerSettings | None, line: str) -> None:
    """Write the termination message; on a non-zero exit ``main`` also prints it as the last stderr line,
    which is what a kubelet shows (``FallbackToLogsOnError``) when this file is empty or unwritable."""
    path = settings.termination_log if settings is not None else os.environ.get(Env.TERMINATION_LOG, "")
    try:
        with open(path or "/dev/termination-log", "w") as f:
            f.write(line)
    except OSError:
        pass  # not in a pod, or a read-only path: the store, the exit code and the last log line still tell


# What a kubelet keeps of the log for ``FallbackToLogsOnError``: the last 80 lines, at most 2048 bytes.
FALLBACK_LOG_BYTES = 2048


def _last_words(code: int, line: str) -> None:
    """The termination message as the process's last stderr line: no timestamp, no logger prefix.

    Short enough for the kubelet's fallback to keep all of it: it keeps the END of the log, so a longer
    line would reach the operator without its start, the error code the reason is read from.
    """
    if code != ExitCode.COMPLETED and line:
        logging.shutdown()  # flush the handlers first, so nothing of theirs comes after this line
        print(_one_line(line, FALLBACK_LOG_BYTES - 48), file=sys.stderr, flush=True)


def main() -> int:
    """``python -m agentrun.runner``: one attempt of one AgentRun in a pod; returns the exit code."""
    try:
        settings = RunnerSettings.from_environ()
    except InvalidEnvironment as e:
        configure_logging("text")
        problems = str(e)
        log.error("invalid runner environment: %s", problems)
        line = _one_line(f"{RunnerInputError.code}: invalid runner environment: {problems}")
        _termination(None, line)
        _last_words(ExitCode.FAILED, line)
        return ExitCode.FAILED
    configure_logging(settings.log_format)
    _start_metrics(settings.metrics_port)
    code, line = asyncio.run(attempt(settings))
    line = explained(code, line)
    if line:
        _termination(settings, line)
    _last_words(code, line)
    return code


if __name__ == "__main__":
    sys.exit(main())
