"""The ``agentrun`` command: run a graph on a thread, inspect it, stop it.

    agentrun run GRAPH_REF --thread-id ID --input TEXT   start a turn, streaming each step
    agentrun run GRAPH_REF --thread-id ID --input TEXT --request-id R   the same, once per request R
    agentrun run GRAPH_REF --thread-id ID --input-json OBJ   the same with spec.input-shaped JSON
    agentrun run GRAPH_REF --thread-id ID                resume the thread's unfinished run
    agentrun run GRAPH_REF --thread-id ID --resume JSON  answer a pending interrupt
    agentrun state --thread-id ID                        version, node, step, messages, ledger
    agentrun stop --thread-id ID                         ask the running process to stop

The store defaults to a SQLite file ``agentrun.db`` in the current directory
(``--store`` or ``AGENTRUN_STORE`` to change it; both options go before or
after the subcommand). Exit codes are the runner pod's (``agentrun.contract``):
0 completed, 3 interrupted, 4 stopped, 5 failed, 8 store unavailable (try
again later); 2 for a usage error (bad graph reference, unknown thread, bad
JSON, nothing to stop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import lifecycle
from .checkpoint import Checkpointer, from_url
from .contract import Env, ExitCode
from .errors import AgentRunError, GraphReferenceError, RunStopped, StorageError, ThreadStateError
from .interrupts import Command
from .loader import compile_reference, is_langgraph, load_target
from .messages import Message

DEFAULT_STORE = "sqlite:///agentrun.db"
# Someone is waiting at a terminal: say "store unavailable" sooner than a runner pod would give up.
CLI_STORE_RETRY_SECONDS = 10.0


class UsageError(Exception):
    """The command line was wrong: the message says what to type instead (``ExitCode.USAGE``)."""


def _describe(message: Message, width: int = 160) -> str:
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({c.id})" for c in message.tool_calls)
        text = f"{message.role}: calls {calls}"
    elif message.role == "tool":
        text = f"tool {message.name}{' ERROR' if message.is_error else ''}: {message.content}"
    else:
        text = f"{message.role}: {message.content}"
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _json_arg(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise UsageError(f"{name} is not valid JSON: {e.msg} at position {e.pos}") from None


def _payload(args: argparse.Namespace) -> Any:
    """What the run starts with: a resume value, a text input, channel values (JSON), or nothing (continue)."""
    if args.resume is not None:
        return Command(resume=_json_arg("--resume", args.resume))
    if args.input is not None:
        return args.input
    if args.input_json is not None:
        payload = _json_arg("--input-json", args.input_json)
        if not isinstance(payload, dict):
            raise UsageError('--input-json must be a JSON object of channel values, e.g. {"messages": [...]}')
        return payload
    return None


async def _run(args: argparse.Namespace, checkpointer: Checkpointer) -> int:
    if is_langgraph(load_target(args.graph)):
        raise UsageError(
            f"{args.graph} is a LangGraph graph: this command runs agentrun graphs. Run it as an AgentRun "
            "(spec.graph; make cluster for a local one), or in your own process with LangGraph's invoke and "
            "agentrun.integrations.langgraph.AgentrunSaver (README: Bring your LangGraph graph)"
        )
    app = compile_reference(args.graph, checkpointer)
    config: dict[str, Any] = _json_arg("--config", args.config) if args.config else {}
    if not isinstance(config, dict):
        raise UsageError("--config must be a JSON object")
    config["thread_id"] = args.thread_id
    if args.request_id is not None:
        if not args.request_id.strip():
            raise UsageError("--request-id must not be empty")
        config["request_key"] = args.request_id
    async for event in app.astream(_payload(args), config):
        if event.kind == "step":
            print(f"[step {event.step}] {event.node}  version {event.version}", flush=True)
            for message in event.new_messages:
                print(f"    {_describe(message)}", flush=True)
        elif event.kind == "interrupt":
            print(f"interrupted at node {event.node} (version {event.version}); waiting for a human:")
            for pending in event.interrupts:
                print(f"    id {pending.id}: {pending.message or '(no message)'}")
                print(f"        payload: {json.dumps(pending.payload, default=str)[:500]}")
            example = json.dumps({i.id: "..." for i in event.interrupts})
            print(f"resume with: agentrun run {args.graph} --thread-id {args.thread_id} --resume '{example}'")
            return ExitCode.INTERRUPTED
        else:
            snapshot = await app.aget_state(args.thread_id)
            counts = (snapshot.meta.get("tool_calls") if snapshot else None) or {}
            failed = f", {counts['failed']} failed" if counts.get("failed") else ""
            print(
                f"{event.status}: thread {args.thread_id} at version {event.version}, step {event.step} "
                f"({counts.get('executed', 0)} tool calls executed, {counts.get('replayed', 0)} replayed{failed})",
                flush=True,
            )
            last_error = snapshot.meta.get("last_tool_error") if snapshot else None
            if failed and last_error:
                print(f"last tool error: {last_error['tool']}: {last_error['code']}: {last_error['message']}")
            if event.status == "stopped":
                return ExitCode.STOPPED
    return ExitCode.COMPLETED


# How many namespaced ids a "not found" suggests.
SUGGESTIONS = 5


async def _not_found(args: argparse.Namespace, checkpointer: Checkpointer) -> UsageError:
    """The error for an unknown thread, naming the ``<namespace>/<id>`` threads an AgentRun gave that id.

    The operator keys an AgentRun's thread by namespace (``default/mine-crash``); the list of threads is
    read only on this error path.
    """
    wanted = args.thread_id
    text = f"thread {wanted!r} not found in {args.store}"
    if "/" in wanted:
        return UsageError(text)
    try:
        found = [t for t in await checkpointer.list_threads() if t.endswith(f"/{wanted}") and t.count("/") == 1]
    except Exception:  # the hint is a courtesy: the error stays the error
        return UsageError(text)
    if not found:
        return UsageError(text)
    found.sort(key=lambda t: (not t.startswith("default/"), t))
    shown = ", ".join(repr(t) for t in found[:SUGGESTIONS]) + (" …" if len(found) > SUGGESTIONS else "")
    return UsageError(
        f"{text}; an AgentRun's thread id has its namespace in front: did you mean {shown}? "
        f"(agentrun {args.command} --thread-id {found[0]})"
    )


async def _state(args: argparse.Namespace, checkpointer: Checkpointer) -> int:
    checkpoint = await checkpointer.aget(args.thread_id)
    if checkpoint is None:
        raise await _not_found(args, checkpointer)
    ledger = await checkpointer.ledger_list(args.thread_id)
    stop = await checkpointer.stop_requested(args.thread_id)
    if args.json:
        print(
            json.dumps(
                {
                    "thread_id": checkpoint.thread_id,
                    "version": checkpoint.version,
                    "status": checkpoint.status,
                    "current_node": checkpoint.current_node,
                    "step": checkpoint.step,
                    "meta": checkpoint.meta,
                    "values": checkpoint.values,
                    "messages": [m.to_json() for m in checkpoint.messages],
                    "ledger": [{"key": e.key, "tool": e.tool_name, "result": e.result} for e in ledger],
                    "stop_requested": stop,
                },
                indent=2,
                default=str,
            )
        )
        return ExitCode.COMPLETED
    print(f"thread:   {checkpoint.thread_id}")
    print(f"status:   {checkpoint.status}" + (" (stop requested)" if stop is not None else ""))
    print(f"version:  {checkpoint.version}")
    print(f"node:     {checkpoint.current_node}")
    print(f"step:     {checkpoint.step}")
    if checkpoint.meta.get("error"):
        error = checkpoint.meta["error"]
        print(f"error:    {error.get('code')}: {error.get('message')}")
    for pending in checkpoint.interrupts:
        print(f"interrupt {pending['id']}: {pending.get('message') or ''}")
    if checkpoint.values:
        print(f"values:   {json.dumps(checkpoint.values, default=str)[:500]}")
    print(f"messages ({len(checkpoint.messages)}):")
    for message in checkpoint.messages:
        print(f"    {_describe(message)}")
    print(f"ledger ({len(ledger)} entries):")
    for entry in ledger:
        print(f"    {entry.key}  {entry.tool_name}")
    return ExitCode.COMPLETED


async def _stop(args: argparse.Namespace, checkpointer: Checkpointer) -> int:
    checkpoint = await checkpointer.aget(args.thread_id)
    if checkpoint is None:
        raise await _not_found(args, checkpointer)
    try:  # the library's rule (lifecycle.check_stoppable), said as a usage error
        lifecycle.check_stoppable(checkpoint.status, thread_id=args.thread_id)
    except ThreadStateError as e:
        raise UsageError(str(e)) from None
    await checkpointer.request_stop(args.thread_id, args.reason)
    if checkpoint.status == "running":
        print(f"stop requested for thread {args.thread_id}; a process running it stops within about a second")
    else:
        print(
            f"stop requested for thread {args.thread_id} (status {checkpoint.status}); "
            "the run stops before running a node when it is resumed"
        )
    return ExitCode.COMPLETED


def _common_options(*, top: bool) -> argparse.ArgumentParser:
    """``--store`` and ``--quiet``, accepted before or after the subcommand and shown in every help.

    On subcommands the default is SUPPRESS, so an option given before the subcommand is not
    overwritten by the subcommand's default.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=os.environ.get(Env.STORE, DEFAULT_STORE) if top else argparse.SUPPRESS,
        help=f"store URL: sqlite:///path.db (default {DEFAULT_STORE}, or ${Env.STORE}) or postgresql://...",
    )
    common.add_argument(
        "--store-retry-seconds",
        type=float,
        default=float(os.environ.get(Env.STORE_RETRY_SECONDS, CLI_STORE_RETRY_SECONDS)) if top else argparse.SUPPRESS,
        help=f"how long an unreachable PostgreSQL is retried before exit 8 (default {CLI_STORE_RETRY_SECONDS:g}s, "
        f"or ${Env.STORE_RETRY_SECONDS}; a pod waits 60s)",
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="only warnings and errors on stderr",
    )
    return common


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun", description="Run durable agent graphs.", parents=[_common_options(top=True)]
    )
    common = _common_options(top=False)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", parents=[common], help="run or resume a graph on a thread")
    run.add_argument("graph", help="graph reference, module:attribute (e.g. examples.support_agent:app)")
    run.add_argument("--thread-id", required=True)
    what = run.add_mutually_exclusive_group()
    what.add_argument("--input", help="the user's message as plain text; omit to resume the unfinished run")
    what.add_argument(
        "--input-json",
        help="the input as a JSON object, like an AgentRun's spec.input: '{\"messages\": [...]}'",
    )
    what.add_argument("--resume", help="JSON resume value for a pending interrupt, or {interrupt_id: value}")
    run.add_argument("--config", help="run config JSON, e.g. '{\"tool_timeout\": 60}'")
    run.add_argument(
        "--request-id",
        help="the identity of this request: sent again, a completed request is not run again (its tools do not "
        "run twice) and an unfinished one resumes; use a new id for a new turn",
    )

    state = commands.add_parser("state", parents=[common], help="show a thread's state, messages and ledger")
    state.add_argument("--thread-id", required=True)
    state.add_argument("--json", action="store_true")

    stop = commands.add_parser("stop", parents=[common], help="ask the process running a thread to stop")
    stop.add_argument("--thread-id", required=True)
    stop.add_argument("--reason", default="requested from the command line")
    return parser


async def _main(args: argparse.Namespace) -> int:
    try:
        checkpointer = from_url(args.store, retry_timeout=args.store_retry_seconds)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        await checkpointer.setup()
        handler = {"run": _run, "state": _state, "stop": _stop}[args.command]
        return await handler(args, checkpointer)
    finally:
        await checkpointer.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """``agentrun``: run a graph on a thread, show or stop a thread; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(_main(args))
    except (UsageError, GraphReferenceError, ThreadStateError) as e:
        print(f"agentrun: error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except RunStopped as e:
        print(f"stopped: {e}", file=sys.stderr)
        return ExitCode.STOPPED
    except StorageError as e:
        # Transient as far as we know: the same command may well work once the store is back.
        print(f"agentrun: store unavailable: {e}", file=sys.stderr)
        return ExitCode.STORE_UNAVAILABLE
    except AgentRunError as e:
        print(f"agentrun: failed: {e}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``agentrun state ... | head``): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again; 141 is what a shell reports.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
