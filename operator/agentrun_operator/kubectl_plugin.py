"""``kubectl agentrun``: list, describe, approve, reject, retry, stop, follow the logs of and watch AgentRuns.

A kubectl plugin: the console script ``kubectl-agentrun`` is found on PATH by
kubectl, which runs it for ``kubectl agentrun ...`` (``pip install agentrun``
puts it next to the Python it was installed for). Every API call goes
through the real ``kubectl`` binary (``$KUBECTL``, else ``kubectl`` on PATH),
so the user's kubeconfig, contexts, exec credential plugins and RBAC apply
exactly as for kubectl itself; the plugin never reads a store. What it shows
comes from the AgentRun (its status, including ``status.attempts``, the
interrupt waiting and the tool call counts), its Events and its pods; what it
changes is the AgentRun's spec (``spec.resume``, ``spec.retry``, ``spec.stop``),
the one way a user steers a run.

RBAC it needs: get/list/watch on agentruns, patch on agentruns to approve,
reject, retry or stop, list on events, get/list on pods and get on pods/log.

``history`` and ``ui`` talk to the history server (``agentrun_history``),
which reads the store for you: ``--server URL`` (or ``$AGENTRUN_HISTORY_URL``),
else the URL the kubeconfig's cluster names in its ``agentrun.dev/history``
extension (``make cluster`` writes it), else a ``kubectl port-forward`` to its
Service (``--history-namespace``, default ``agentrun-system``). They send your kubeconfig's bearer token (a
token, a token file or an exec credential plugin); the server shows a run
only when that identity may ``get`` it. A client-certificate identity has no
token to send: use a token (``kubectl create token``) or the chart's login.

Approve and reject answer the waiting interrupt by id (``spec.resume.values``),
replacing any earlier answer: an answer keyed by the interrupt's id cannot be
taken for the answer to a later interrupt of the run, and it is what a run
waiting on several interrupts at once needs. ``approve`` sends ``true`` unless
``--value`` gives another JSON value, ``reject`` sends ``false``; the graph's
``interrupt()`` returns that value. The answer applies only to the question
the command read (a JSON patch guarded by a ``test`` of the resourceVersion;
``--id`` names the one you mean), and the command prints the question it
answered. ``retry`` re-opens a Failed run (``spec.retry`` one higher, as
README documents it), guarded the same way: a run retried or changed by
someone else meanwhile is read again, never retried twice.

What a run wrote (questions, payloads, results, messages, log lines) is
printed with invisible and bidirectional control characters as escapes
(``\\u202e``: ``agentrun_history.text``), and a closing note on stderr says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from agentrun_history import hitl
from agentrun_history.text import hidden, note, visible, visible_json

from .decide import jobparity, toolerrors
from .decide.answers import waiting_words
from .decide.attempts import is_open
from .decide.podspec import ATTEMPT_LABEL, GROUP, PLURAL, RUN_LABEL, label_value, pod_name
from .decide.reasons import TERMINAL, Phase
from .decide.status import AgentRunStatus, AttemptRecord, parse_time

RESOURCE = f"{PLURAL}.{GROUP}"
PAYLOAD_LIMIT = 2000
WATCH_POLL_SECONDS = 1.0


class PluginError(Exception):
    """A failure to report to the user in one line (exit code 1), not a traceback."""


# Hidden characters (bidi controls, zero-width and control characters) met in the output, for the closing note.
_hidden_seen: dict[str, None] = {}


def say(*values: Any, sep: str = " ", end: str = "\n", file: Any = None, flush: bool = False) -> None:
    """``print``, with every invisible or bidirectional control character shown as its escape (``\\u202e``).

    What a run wrote (a question, a payload, a result, a log line) reaches the terminal only through here:
    U+202E would make a terminal draw "IBAN 8765 4321" for "IBAN \\u202e1234 5678", and an escape sequence
    would reach the terminal itself. ``main`` says at the end when a value contained such characters."""
    line = sep.join(str(v) for v in values) + end
    for char in hidden(line):
        _hidden_seen.setdefault(char, None)
    (file or sys.stdout).write(visible(line))
    if flush:
        (file or sys.stdout).flush()


def say_json(value: Any) -> None:
    """``value`` as indented JSON, hidden characters as their JSON escapes (the same JSON value, nothing hidden)."""
    dumped = json.dumps(value, indent=2, ensure_ascii=False)
    for char in hidden(dumped):
        _hidden_seen.setdefault(char, None)
    sys.stdout.write(visible_json(dumped) + "\n")


# --- kubectl -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl with the user's global flags (namespace, context, kubeconfig)."""

    binary: str
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None

    @classmethod
    def find(cls, args: argparse.Namespace) -> Kubectl:
        """The kubectl to run (``$KUBECTL``, else ``PATH``'s) with the command line's kubeconfig and context."""
        binary = os.environ.get("KUBECTL") or shutil.which("kubectl")
        if not binary:
            raise PluginError("kubectl is not on PATH (kubectl agentrun runs the real kubectl; set $KUBECTL to it)")
        return cls(binary, namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig)

    def argv(self, *args: str, namespaced: bool = True) -> list[str]:
        """kubectl's command line for ``args``: the plugin's kubeconfig, context and (``namespaced``) namespace."""
        argv = [self.binary]
        if self.kubeconfig:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        if self.context:
            argv.append(f"--context={self.context}")
        if namespaced and self.namespace:
            argv.append(f"--namespace={self.namespace}")
        return [*argv, *args]

    def run(self, *args: str, namespaced: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl with ``args``; its output captured, never raising for its exit status."""
        return subprocess.run(
            self.argv(*args, namespaced=namespaced), input=input, capture_output=True, text=True, check=False
        )

    def json(self, *args: str, namespaced: bool = True) -> Any:
        """Run kubectl with ``args -o json``; its output decoded; ``PluginError`` with kubectl's message if it fails."""
        done = self.run(*args, "-o", "json", namespaced=namespaced)
        if done.returncode != 0:
            raise PluginError(done.stderr.strip() or f"kubectl {' '.join(args)} failed ({done.returncode})")
        return json.loads(done.stdout)

    def current_namespace(self) -> str:
        """The namespace commands act in: ``-n``, else the context's, else ``default``."""
        if self.namespace:
            return self.namespace
        done = self.run("config", "view", "--minify", "-o", "jsonpath={..namespace}", namespaced=False)
        return (done.stdout.strip() if done.returncode == 0 else "") or "default"

    def get_run(self, name: str) -> dict[str, Any]:
        """The AgentRun ``name``; ``PluginError`` if kubectl cannot get it."""
        done = self.run("get", RESOURCE, name, "-o", "json")
        if done.returncode != 0:
            if "NotFound" in done.stderr or "not found" in done.stderr:
                raise PluginError(
                    f'agentrun "{name}" not found in namespace "{self.current_namespace()}" '
                    "(kubectl agentrun list shows the runs there; -n NAMESPACE for another)"
                )
            raise PluginError(done.stderr.strip() or f"kubectl get {RESOURCE} {name} failed")
        run: dict[str, Any] = json.loads(done.stdout)
        return run

    def patch_run(self, name: str, kind: str, body: Any) -> None:
        """Patch the AgentRun ``name`` (``kind``: merge or json); ``PluginError`` if kubectl refuses."""
        done = self.run("patch", RESOURCE, name, "--type", kind, "-p", json.dumps(body))
        if done.returncode != 0:
            raise PluginError(done.stderr.strip() or f"kubectl patch {RESOURCE} {name} failed")


# --- presentation ----------------------------------------------------------------------------------------------------


def age(moment: datetime | None, now: datetime) -> str:
    """kubectl's short age: 45s, 12m, 3h, 5d."""
    if moment is None:
        return "<unknown>"
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "d" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def duration(start: datetime | None, end: datetime | None) -> str:
    """A duration in seconds below two minutes, in minutes above, or ``-``."""
    if start is None or end is None:
        return "-"
    seconds = max(0.0, (end - start).total_seconds())
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` as text columns, each as wide as its widest cell."""
    rows = [[visible(cell) for cell in row] for row in rows]  # escapes first: they widen their cell
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def waiting_for(status: AgentRunStatus) -> str:
    """The interrupts an Interrupted run waits on, in a few words."""
    if status.phase != Phase.INTERRUPTED:
        return ""
    return status.waiting_for or waiting_words(status.interrupt)


def shown(value: Any) -> str:
    """``value`` as text, ``None`` as nothing."""
    return "" if value is None else str(value)


def pending_ids(status: AgentRunStatus) -> list[str]:
    """The ids of the interrupts the run waits on."""
    interrupt = status.interrupt or {}
    return [str(i) for i in interrupt.get("ids") or [interrupt.get("id")] if i]


# --- commands --------------------------------------------------------------------------------------------------------


def cmd_list(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun list``: runs with phase, node, version, attempt, age and what they wait for."""
    listing = kubectl.json("get", RESOURCE, *(["--all-namespaces"] if args.all_namespaces else []))
    items = listing.get("items") or []
    if not items:
        where = "any namespace" if args.all_namespaces else f'namespace "{kubectl.current_namespace()}"'
        say(f"No AgentRuns in {where}.", file=sys.stderr)
        return 0
    now = datetime.now(UTC)
    header = ["NAME", "PHASE", "NODE", "VERSION", "ATTEMPT", "TOOLS", "AGE", "WAITING"]
    rows: list[list[str]] = [(["NAMESPACE"] if args.all_namespaces else []) + header]
    for run in sorted(items, key=lambda r: (r["metadata"].get("namespace", ""), r["metadata"]["name"])):
        meta, status = run["metadata"], AgentRunStatus.parse(run.get("status"))
        row = [
            meta["name"],
            shown(status.phase) or "Pending",
            shown(status.current_node),
            shown(status.state_version),
            shown(status.attempt or ""),
            toolerrors.summary(status.tool_calls) if status.tool_calls else "",
            age(parse_time(meta.get("creationTimestamp")), now),
            waiting_for(status),
        ]
        rows.append(([meta.get("namespace", "")] if args.all_namespaces else []) + row)
    say(table(rows))
    return 0


def _events(kubectl: Kubectl, run: dict[str, Any]) -> list[dict[str, Any]]:
    meta = run["metadata"]
    selector = f"involvedObject.kind=AgentRun,involvedObject.name={meta['name']}"
    try:
        listing = kubectl.json("get", "events", "--field-selector", selector)
    except PluginError:  # events are extra: a run is described without them
        return []
    events = [e for e in listing.get("items") or [] if (e.get("involvedObject") or {}).get("uid") == meta.get("uid")]
    return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def _attempt_rows(attempts: Sequence[AttemptRecord]) -> list[list[str]]:
    rows = [["ATTEMPT", "POD", "STARTED", "DURATION", "OUTCOME", "EXIT", "REASON", "MESSAGE"]]
    now = datetime.now(UTC)
    for entry in attempts:
        start, end = parse_time(entry.get("startTime")), parse_time(entry.get("endTime"))
        rows.append(
            [
                str(entry.get("attempt", "")),
                entry.get("podName", "-"),
                start.strftime("%H:%M:%S") if start else "-",
                duration(start, end if end is not None else (now if is_open(entry) else None)),
                entry.get("outcome", ""),
                shown(entry.get("exitCode", "")),
                entry.get("reason", ""),
                (entry.get("message") or "")[:100],
            ]
        )
    return rows


def _waiting_lines(name: str, status: AgentRunStatus) -> list[str]:
    """``describe``'s lines for an Interrupted run: the question, its ids and payload, a tool call review's calls,
    and the command that answers it."""
    lines: list[str] = []
    interrupt = status.interrupt or {}
    lines.append("Waiting for:  " + (interrupt.get("message") or "spec.resume"))
    for interrupt_id in pending_ids(status):
        lines.append(f"  interrupt   {interrupt_id}")
    payload = json.dumps(interrupt.get("payload"), indent=2, default=str)
    if len(payload) > PAYLOAD_LIMIT:
        payload = payload[:PAYLOAD_LIMIT] + "…(truncated)"
    lines.append("  payload:    " + payload.replace("\n", "\n              "))
    by_id = f" --id {pending_ids(status)[0]}" if pending_ids(status) else ""
    review = hitl.actions(interrupt.get("payload"))
    for action in review or ():
        lines.append(
            f"  tool call:  {action.name} {json.dumps(action.args, ensure_ascii=False, default=str)} "
            f"(allowed: {', '.join(action.allowed)})"
        )
    edit = " [--edit ARGS]" if review and len(review) == 1 and "edit" in review[0].allowed else ""
    lines.append(
        f"  answer:     kubectl agentrun approve {name}{by_id}{edit or ' [--value JSON]'}   |   "
        f"kubectl agentrun reject {name}{by_id}"
    )
    return lines


def cmd_describe(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun describe``: a run, its attempts and pods, tool calls, the interrupt waiting, Events."""
    run = kubectl.get_run(args.run)
    meta, spec = run["metadata"], run.get("spec") or {}
    status = AgentRunStatus.parse(run.get("status"))
    now = datetime.now(UTC)
    lines = [
        f"Name:         {meta['name']}",
        f"Namespace:    {meta.get('namespace', '')}",
        f"Graph:        {spec.get('graph', '')}",
        f"Thread:       {spec.get('threadId', '')}",
        f"Phase:        {toolerrors.phase_words(status.phase, status.tool_calls)}"
        + (f" ({status.reason})" if status.reason else ""),
    ]
    if status.message:
        lines.append(f"Message:      {status.message}")
    lines.append(
        f"Progress:     node {status.current_node or '-'}, step {shown(status.step) or '-'}, "
        f"version {shown(status.state_version) or '-'}"
    )
    if status.start_time:
        lines.append(f"Started:      {status.start_time.isoformat()} ({age(status.start_time, now)} ago)")
    if status.completion_time:
        lines.append(
            f"Completed:    {status.completion_time.isoformat()} "
            f"(took {duration(status.start_time, status.completion_time)})"
        )
    lines.append(f"Restarts:     {status.restarts}   Disruptions: {status.disruptions}")
    calls = status.tool_calls or {"executed": 0, "replayed": 0}
    lines.append(
        f"Tool calls:   executed {calls.get('executed', 0)}, replayed from the ledger {calls.get('replayed', 0)}, "
        f"in doubt {calls.get('inDoubt', 0)}, failed {calls.get('failed', 0)}"
        + (f", completed but unrecorded {calls['unrecorded']}" if calls.get("unrecorded") else "")
    )
    if status.phase == Phase.INTERRUPTED:
        lines.extend(_waiting_lines(meta["name"], status))
    if status.phase == Phase.FAILED and jobparity.retry_refusal(meta["name"], spec, status) is None:
        lines.append(
            f"Retry:        kubectl agentrun retry {meta['name']}   (resumes the turn; completed calls replay)"
        )
    if status.result:
        result = status.result
        text = (result.get("message") or "").replace("\n", " ")
        kind = " (final state)" if result.get("kind") == "state" else ""
        lines.append(f"Result{kind}:".ljust(14) + text + (" …(truncated)" if result.get("truncated") else ""))
        if result.get("digest"):
            lines.append(f"  digest:     {result['digest']}")
    say("\n".join(lines))
    say("Attempts:")
    if status.attempts:
        say(_indent(table(_attempt_rows(status.attempts))))
    elif status.attempt:
        say(f"  {status.attempt} attempt(s); the last pod: {status.pod_name or '-'} (no history recorded)")
    else:
        say("  none yet")
    events = _events(kubectl, run)
    say("Events:")
    if not events:
        say("  none")
    else:
        rows = [["AGE", "TYPE", "REASON", "MESSAGE"]]
        for event in events[-20:]:
            stamp = parse_time(event.get("lastTimestamp") or event.get("eventTime"))
            rows.append([age(stamp, now), event.get("type", ""), event.get("reason", ""), event.get("message", "")])
        say(_indent(table(rows)))
    return 0


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


ANSWER_ATTEMPTS = 3


def _question(status: AgentRunStatus) -> str:
    """The question an Interrupted run waits on, as the answer's message and errors quote it."""
    interrupt = status.interrupt or {}
    payload = json.dumps(interrupt.get("payload"), ensure_ascii=False, default=str)
    payload = payload if len(payload) <= 300 else payload[:300] + "…(truncated)"
    return f'"{interrupt.get("message") or "(no message)"}" (payload {payload})'


def _chosen(name: str, status: AgentRunStatus, args: argparse.Namespace, verb: str) -> list[str]:
    """The interrupt ids this answer is for (``PluginError`` when the run does not wait on them)."""
    if status.phase != Phase.INTERRUPTED:
        raise PluginError(
            f"agentrun {name} is not waiting for approval: its phase is {status.phase or 'Pending'}"
            + (" (it already ended)" if status.phase in TERMINAL else "")
        )
    pending = pending_ids(status)
    if args.id is not None:
        if pending and args.id not in pending:
            raise PluginError(
                f"agentrun {name} waits on interrupt(s) {', '.join(pending)}, not {args.id}: "
                f"{_question(status)}; nothing was answered"
            )
        return [args.id]
    if len(pending) > 1 and not args.all:
        raise PluginError(
            f"agentrun {name} waits on {len(pending)} interrupts ({', '.join(pending)}): "
            f"{verb} each with --id ID, or all of them with --all"
        )
    return pending


def _answer(kubectl: Kubectl, args: argparse.Namespace, answer: Callable[[AgentRunStatus], Any], verb: str) -> int:
    """Answer the interrupt the run waits on now, only if it still waits on it when the patch lands.

    The JSON patch starts with a ``test`` of the resourceVersion just read: if the run moved on in between (a
    new question, another phase), the API server refuses the patch (422) and nothing is answered. The run is
    read again; unchanged, the answer is tried again; changed, the error shows the question it waits on now.
    What was answered is printed: the interrupt id and its question."""
    run = kubectl.get_run(args.run)
    name = run["metadata"]["name"]
    for _ in range(ANSWER_ATTEMPTS):
        status = AgentRunStatus.parse(run.get("status"))
        chosen = _chosen(name, status, args, verb)
        value = answer(status)
        resume: dict[str, Any] = {"values": {i: value for i in chosen}} if chosen else {"value": value}
        # "add" replaces a spec.resume already there, so no answer of an earlier interrupt stays beside this one.
        moved = _patch_as_read(kubectl, run, [{"op": "add", "path": "/spec/resume", "value": resume}])
        if moved is None:
            target = f"interrupt {', '.join(chosen)}" if chosen else "the interrupt"
            say(
                f"agentrun {name}: {verb}d {target}, {_question(status)}, with {json.dumps(value)}; "
                "the run resumes in a new pod"
            )
            return 0
        run = moved
        now = AgentRunStatus.parse(run.get("status"))
        if now.phase != status.phase or now.interrupt != status.interrupt:
            waits = _question(now) if now.phase == Phase.INTERRUPTED else f"nothing (phase {now.phase or 'Pending'})"
            raise PluginError(
                f"agentrun {name} moved on while you answered {_question(status)}: nothing was answered. "
                f"It now waits on {waits}; run the command again to answer that"
            )
    raise PluginError(f"agentrun {name} kept changing while you answered; nothing was answered, try again")


def _patch_as_read(kubectl: Kubectl, run: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Apply ``ops`` to ``run`` only as it was read: the JSON patch starts with a ``test`` of its resourceVersion.
    None when it applied; else the run read again (it changed meanwhile). PluginError when the API server
    refused the patch itself (the run had not changed)."""
    name, version = run["metadata"]["name"], run["metadata"].get("resourceVersion")
    guarded = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]
    done = kubectl.run("patch", RESOURCE, name, "--type", "json", "-p", json.dumps(guarded))
    if done.returncode == 0:
        return None
    again = kubectl.get_run(name)
    if again["metadata"].get("resourceVersion") == version:  # not the test: the API server's own refusal
        raise PluginError(done.stderr.strip() or f"kubectl patch {RESOURCE} {name} failed")
    return again


def _value(text: str | None, default: Any, flag: str = "--value") -> Any:
    if text is None:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PluginError(
            f"{flag} is not JSON ({e.msg} at character {e.pos}): {text!r}; "
            f"""quote strings as JSON, e.g. {flag} '"yes"' or {flag} '{{"amount": 120}}'"""
        ) from None


def _review_answer(status: AgentRunStatus, value: Any, edit: Any, verb: str) -> Any:
    """The answer to a tool call review (``agentrun_history.hitl``): ``--edit`` ARGS for its one call, ``--value``
    as given, else every call approved (rejected); the middleware fails the run on anything it does not allow,
    so that is refused here. Another interrupt: ``--value`` (default ``true``/``false``); ``--edit`` is refused."""
    pending = hitl.actions((status.interrupt or {}).get("payload"))
    if pending is None:
        if edit is not _UNSET:
            raise PluginError(
                "--edit answers a tool call review (LangChain HumanInTheLoopMiddleware) and this interrupt is not "
                f"one: {_question(status)}; answer it with --value JSON"
            )
        return verb == "approve" if value is _UNSET else value
    try:
        if edit is not _UNSET:
            return hitl.edit(pending, edit)
        if value is _UNSET:
            return hitl.every(pending, verb)
    except ValueError as e:
        raise PluginError(f"{e}; nothing was answered") from None
    why = hitl.problem(pending, value)
    if why is not None:
        raise PluginError(f"--value: {why} (allowed: {hitl.allowed_words(pending)}); nothing was answered")
    return value


_UNSET: Any = object()  # no --value / --edit given


def cmd_approve(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun approve``: answer the run's interrupt with ``--value`` (default ``true``), or a tool call
    review with ``--edit`` ARGS (its one call run with them) or ``--value`` (default: approve every call)."""
    if args.value is not None and args.edit is not None:
        raise PluginError("--value and --edit are two answers: give one (--edit builds the edit decision)")
    value = _UNSET if args.value is None else _value(args.value, None)
    edit = _UNSET if args.edit is None else _value(args.edit, None, flag="--edit")
    return _answer(kubectl, args, lambda status: _review_answer(status, value, edit, "approve"), "approve")


def cmd_reject(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun reject``: answer the run's interrupt with ``--value`` (default ``false``; a tool call
    review: every call rejected)."""
    value = _UNSET if args.value is None else _value(args.value, None)
    return _answer(kubectl, args, lambda status: _review_answer(status, value, _UNSET, "reject"), "reject")


def cmd_retry(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun retry``: re-open a Failed run (``spec.retry`` one higher), only while it is as read.

    Guarded like an answer: the JSON patch tests the resourceVersion read, so a run that changed meanwhile
    (retried by someone else, deleted and re-created) is read again and checked again, never retried twice."""
    run = kubectl.get_run(args.run)
    name = run["metadata"]["name"]
    for _ in range(ANSWER_ATTEMPTS):
        spec, status = run.get("spec") or {}, AgentRunStatus.parse(run.get("status"))
        refusal = jobparity.retry_refusal(name, spec, status)
        if refusal is not None:
            raise PluginError(refusal)
        if jobparity.retry_requested(jobparity.retry_of(spec), status):
            say(
                f"agentrun {name}: a retry was already requested (spec.retry {jobparity.retry_of(spec)}); "
                f"the operator re-opens the run (kubectl agentrun watch {name})"
            )
            return 0
        retry = jobparity.next_retry(spec, status)
        moved = _patch_as_read(kubectl, run, [{"op": "add", "path": "/spec/retry", "value": retry}])
        if moved is None:
            why = ": ".join(x for x in (status.reason, status.message) if x)
            say(
                f"agentrun {name}: retry {retry} requested (it failed: {why or 'no reason recorded'}); the next "
                "attempt resumes its turn from the last checkpoint and completed tool calls replay from the "
                f"ledger (kubectl agentrun watch {name})"
            )
            return 0
        run = moved
    raise PluginError(f"agentrun {name} kept changing while you retried it; nothing was changed, try again")


def cmd_stop(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun stop``: set ``spec.stop`` (the run ends within seconds, even inside a tool)."""
    run = kubectl.get_run(args.run)
    name = run["metadata"]["name"]
    status = AgentRunStatus.parse(run.get("status"))
    if status.phase in TERMINAL:
        raise PluginError(f"agentrun {name} already ended ({status.phase}); there is nothing to stop")
    if (run.get("spec") or {}).get("stop"):
        say(f"agentrun {name}: a stop was already requested (phase {status.phase or 'Pending'})")
        return 0
    kubectl.patch_run(name, "merge", {"spec": {"stop": True}})
    say(f"agentrun {name}: stop requested; the runner cancels its current node (kubectl agentrun watch {name})")
    return 0


def _attempt_pods(kubectl: Kubectl, run: dict[str, Any]) -> dict[int, str]:
    """The run's pods by attempt: its history, the pods that exist, and the current attempt."""
    name = run["metadata"]["name"]
    status = AgentRunStatus.parse(run.get("status"))
    pods: dict[int, str] = {}
    for entry in status.attempts:
        if entry.get("attempt"):
            pods[int(entry["attempt"])] = entry.get("podName") or pod_name(name, int(entry["attempt"]))
    listing = kubectl.json("get", "pods", "-l", f"{RUN_LABEL}={label_value(name)}")
    for pod in listing.get("items") or []:
        attempt = (pod["metadata"].get("labels") or {}).get(ATTEMPT_LABEL, "")
        if attempt.isdigit():
            pods[int(attempt)] = pod["metadata"]["name"]
    if status.attempt:
        pods.setdefault(status.attempt, status.pod_name or pod_name(name, status.attempt))
    return dict(sorted(pods.items()))


def _print_logs(kubectl: Kubectl, pod: str, *, follow: bool, quiet: bool = False) -> str:
    """The pod's log to stdout: ``"ok"``, ``"gone"`` (the pod and its log are gone) or ``"waiting"`` (not started)."""
    argv = kubectl.argv("logs", pod, *(["-f"] if follow else []))
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            say(line, end="", flush=True)
        error = proc.stderr.read()
        proc.wait()
    if proc.returncode == 0:
        return "ok"
    if "NotFound" in error or "not found" in error:
        say(f"(pod {pod} no longer exists: its log is gone)")
        return "gone"
    if "ContainerCreating" in error or "waiting to start" in error or "PodInitializing" in error:
        if not quiet:
            say(f"(pod {pod} has not started yet)")
        return "waiting"
    raise PluginError(error.strip() or f"kubectl logs {pod} failed")


def cmd_logs(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun logs``: the runner logs of every attempt, oldest first (``--attempt``: one)."""
    run = kubectl.get_run(args.run)
    name = run["metadata"]["name"]
    pods = _attempt_pods(kubectl, run)
    if args.attempt is not None:
        if args.attempt not in pods:
            known = ", ".join(map(str, pods)) or "none yet"
            raise PluginError(f"agentrun {name} has no attempt {args.attempt} (attempts: {known})")
        pods = {args.attempt: pods[args.attempt]}
    if not pods:
        say(f"agentrun {name} has no pod yet", file=sys.stderr)
        if not args.follow:
            return 0
    done: set[int] = set()
    while True:
        for attempt, pod in pods.items():
            if attempt in done:
                continue
            following = args.follow and attempt == max(pods)
            say(f"==> attempt {attempt}, pod {pod} <==", flush=True)
            # Following a pod that has not started yet: wait for it, or its whole log would be missed.
            while _print_logs(kubectl, pod, follow=following, quiet=following) == "waiting" and following:
                time.sleep(WATCH_POLL_SECONDS)
            done.add(attempt)
        if not args.follow or args.attempt is not None:
            return 0
        # Following: once the current pod's log ends, go on with the next attempt, until the run ends.
        while True:
            run = kubectl.get_run(name)
            status = AgentRunStatus.parse(run.get("status"))
            newer = {a: p for a, p in _attempt_pods(kubectl, run).items() if a not in done}
            if newer:
                pods = newer
                break
            if status.phase in TERMINAL:
                return 0
            time.sleep(WATCH_POLL_SECONDS)


def _watch_stream(kubectl: Kubectl, name: str) -> Iterator[dict[str, Any]]:
    """The run as ``kubectl get --watch`` streams it (each change a JSON object), until the stream ends."""
    argv = kubectl.argv("get", RESOURCE, name, "--watch", "-o", "json")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        assert proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        try:
            for line in proc.stdout:
                buffer += line
                while buffer.strip():
                    try:
                        obj, end = decoder.raw_decode(buffer.lstrip())
                    except ValueError:
                        break  # an object still arriving
                    buffer = buffer.lstrip()[end:]
                    yield obj
        finally:
            proc.terminate()


def _progress_line(status: AgentRunStatus) -> str:
    stamp = datetime.now().strftime("%H:%M:%S")
    parts = [
        f"{stamp}  {toolerrors.phase_words(status.phase, status.tool_calls):<11}",
        f"node={status.current_node or '-'}",
        f"step={shown(status.step) or '-'}",
        f"version={shown(status.state_version) or '-'}",
        f"attempt={status.attempt or '-'}",
    ]
    calls = status.tool_calls
    if calls:
        # Failures always counted: a run whose every call failed must not read "tools=0 run/0 replayed".
        counted = (
            f"tools={calls.get('executed', 0)} run/{calls.get('replayed', 0)} replayed/{calls.get('failed', 0)} failed"
        )
        parts.append(counted + (f"/{calls['inDoubt']} in doubt" if calls.get("inDoubt") else ""))
    if status.phase not in (Phase.RUNNING, None) and status.message:
        parts.append(f"({status.reason}: {status.message[:120]})" if status.reason else f"({status.message[:120]})")
    return "  ".join(parts)


def cmd_watch(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """Live progress until a final phase: exit 0 when Succeeded, 1 when Failed or Stopped."""
    name = kubectl.get_run(args.run)["metadata"]["name"]
    last: tuple[Any, ...] | None = None
    while True:
        for run in _watch_stream(kubectl, name):
            status = AgentRunStatus.parse(run.get("status"))
            failed = status.tool_calls.get("failed", 0) if status.tool_calls else 0
            key = (status.phase, status.current_node, status.step, status.state_version, status.attempt, failed)
            if key != last:
                last = key
                say(_progress_line(status), flush=True)
                if status.phase == Phase.INTERRUPTED:
                    say(
                        f"          waiting: {waiting_for(status)} -> kubectl agentrun approve {name} [--value JSON]",
                        flush=True,
                    )
            if status.phase in TERMINAL:
                if status.result and status.result.get("message"):
                    say(f"result: {status.result['message'][:500]}", flush=True)
                return 0 if status.phase == Phase.SUCCEEDED else 1
        # The watch ended (a timeout, a dropped connection): read the run again and watch on.
        kubectl.get_run(name)
        time.sleep(WATCH_POLL_SECONDS)


# --- history (through the history server) ----------------------------------------------------------------------------

HISTORY_SERVICE = "agentrun-history"
# A kubeconfig cluster extension naming that cluster's history server (``agentrun-dev`` writes it into the
# kubeconfig it exports): ``extensions: [{name: agentrun.dev/history, extension: {server: URL}}]``.
HISTORY_EXTENSION = "agentrun.dev/history"


def _bearer(args: argparse.Namespace) -> str:
    """The kubeconfig user's ``Authorization`` header, as kubectl would send it (exec plugins included)."""
    import asyncio

    from .io import kubeconfig

    paths = args.kubeconfig or os.environ.get("KUBECONFIG") or str(kubeconfig.DEFAULT_KUBECONFIG)
    try:
        config = kubeconfig.load_kubeconfig(paths, context=args.context)
        header = asyncio.run(kubeconfig.credentials_for(config.user).header())
    except Exception as e:
        raise PluginError(f"cannot get your credentials from the kubeconfig: {e}") from None
    if not header or not header.lower().startswith("bearer "):
        raise PluginError(
            "your kubeconfig user has no bearer token (a client certificate?); the history server authorizes by "
            "token: use a token (kubectl create token ...) or an exec credential plugin"
        )
    return header


def kubeconfig_history_url(kubectl: Kubectl) -> str:
    """The history server the current context's cluster names (``HISTORY_EXTENSION``), or ``""``.

    Read through kubectl (``config view --minify``), so ``--kubeconfig``, ``--context`` and a merged
    ``KUBECONFIG`` pick the cluster as kubectl does. Trusting it is no new trust: the same kubeconfig already
    says where your token goes (the cluster's server) and which credential plugin runs. The extension holds
    ``{server: URL}``, or ``{unavailable: why}`` (``make cluster`` on SQLite): then a ``PluginError`` says why.
    """
    path = f'jsonpath={{.clusters[0].cluster.extensions[?(@.name=="{HISTORY_EXTENSION}")].extension}}'
    done = kubectl.run("config", "view", "--minify", "-o", path, namespaced=False)
    try:
        extension = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}
    except ValueError:
        extension = {}
    if not isinstance(extension, dict):
        extension = {}
    if extension.get("unavailable"):
        raise PluginError(f"this cluster has no history server: {extension['unavailable']}")
    url = str(extension.get("server") or "")
    if url and not url.startswith(("http://", "https://")):
        raise PluginError(f"the kubeconfig's {HISTORY_EXTENSION} extension names {url!r}, not an http(s) URL")
    return url


class HistoryServer:
    """The history server's URL: ``--server``, ``$AGENTRUN_HISTORY_URL``, the kubeconfig's cluster extension
    ``agentrun.dev/history`` (``make cluster`` writes it), else a port-forward to its Service while in use."""

    def __init__(self, kubectl: Kubectl, args: argparse.Namespace) -> None:
        url = args.server or os.environ.get("AGENTRUN_HISTORY_URL") or kubeconfig_history_url(kubectl)
        self.url = url.rstrip("/")
        self._forward: subprocess.Popen[str] | None = None
        if not self.url:
            self._port_forward(kubectl, args.history_namespace, args.history_service)

    def _port_forward(self, kubectl: Kubectl, namespace: str, service: str) -> None:
        argv = kubectl.argv(
            "port-forward",
            "--address",
            "127.0.0.1",
            "-n",
            namespace,
            f"service/{service}",
            ":80",
            namespaced=False,
        )
        self._forward = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._forward.stdout is not None
        line = self._forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080"
        if "127.0.0.1:" not in line:
            error = self._forward.stderr.read() if self._forward.stderr else ""
            self.close()
            raise PluginError(
                f"cannot reach the history server (service/{service} in namespace {namespace}): "
                f"{(error or line).strip()}; pass --server URL or set AGENTRUN_HISTORY_URL"
            )
        self.url = "http://127.0.0.1:" + line.split("127.0.0.1:", 1)[1].split()[0]

    def close(self) -> None:
        """Stop the port-forward to the history server, if one was started."""
        if self._forward is not None:
            self._forward.terminate()
            self._forward.wait(timeout=5)
            self._forward = None

    def get_json(self, path: str, authorization: str) -> Any:
        """GET ``path`` from the history server as ``authorization``; ``PluginError`` with its message if refused."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.url + path, headers={"Authorization": authorization})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            with e:
                try:
                    message = json.loads(e.read()).get("message") or e.reason
                except ValueError:
                    message = e.reason
            raise HistoryAnswer(e.code, f"the history server answered {e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PluginError(f"cannot reach the history server at {self.url}: {e}") from None


class HistoryAnswer(PluginError):
    """The history server refused (``status``: its HTTP status)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _runs_of_thread(kubectl: Kubectl, thread_id: str) -> list[str]:
    """The AgentRuns of the namespace whose ``spec.threadId`` is ``thread_id`` (a hint for a 404), by name."""
    done = kubectl.run("get", RESOURCE, "-o", "json")
    if done.returncode != 0:
        return []
    items = json.loads(done.stdout).get("items") or []
    return sorted(i["metadata"]["name"] for i in items if (i.get("spec") or {}).get("threadId") == thread_id)


def _when(moment: float | None) -> str:
    return "-" if moment is None else datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S")


def _secs(value: float | None) -> str:
    return "-" if value is None else (f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s")


def cmd_history(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl agentrun history``: a run's attempts, tool calls, interrupts and steps from the history server."""
    from urllib.parse import quote

    namespace = kubectl.current_namespace()
    authorization = _bearer(args)
    server = HistoryServer(kubectl, args)
    try:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/agentruns/{quote(args.run, safe='')}/history"
        found = server.get_json(path, authorization)
    except HistoryAnswer as e:
        # The history is an AgentRun's (a thread may hold several runs' turns): a thread id is a 404 that names them.
        runs = _runs_of_thread(kubectl, args.run) if e.status == 404 else []
        if runs:
            raise PluginError(
                f"{e}; {args.run!r} is the threadId of {', '.join(runs)}: "
                f"kubectl agentrun history {runs[0]} (history takes the AgentRun's name)"
            ) from None
        raise
    finally:
        server.close()
    if args.output == "json":
        say_json(found)
        return 0
    print_history(found)
    return 0


def print_history(found: dict[str, Any]) -> None:
    """``kubectl agentrun history``'s table output of the history server's answer ``found``."""
    say(
        f"Run:      {found['namespace']}/{found['name']}   phase {_history_phase(found)}"
        + (f" ({found['reason']})" if found.get("reason") else "")
    )
    say(
        f"Thread:   {found['thread_id']}   store status {found.get('status') or '-'}, version "
        f"{shown(found.get('version')) or '-'}"
    )
    if not found.get("recorded"):
        say("(nothing recorded in the store for this run yet)")
    if unreadable := found.get("unreadable"):
        # Up front: a history with rows missing must not read as a whole one (each row named, as the page does).
        say(
            f"WARNING:  the store could not read {len(unreadable)} row(s) of this run; each is shown only as far "
            "as its stored text goes, or (a message) left out:"
        )
        for note in unreadable:
            say(f"  - {' '.join(str(note).splitlines())}")
    say("Attempts:")
    rows = _history_attempt_rows(found)
    say(_indent(table(rows)) if len(rows) > 1 else "  none")
    if len(rows) > 1 and not found.get("deleted"):  # the store keeps no log: each attempt's is its pod's
        say(f"  logs of attempt N (while its pod exists): kubectl agentrun logs {found['name']} --attempt N")
    say(f"Tool calls: {_history_counts(found)}")
    rows = _history_tool_call_rows(found)
    say(_indent(table(rows)) if len(rows) > 1 else "  none")
    if found.get("interrupts"):
        say("Interrupts:")
        say(_indent(table(_history_interrupt_rows(found))))
    say("Steps:")
    rows = _history_step_rows(found)
    say(_indent(table(rows)) if len(rows) > 1 else "  none")
    if found.get("stop"):
        say(f"Stop requested: {_when(found['stop']['requested_at'])} {found['stop']['reason']}")
    print_conversation(found.get("conversation"))
    if result := found.get("result"):
        what = "the final state's values" if found.get("result_kind") == "state" else "the last assistant message"
        cut = " …(preview cut)" if result.get("truncated") else ""
        say(f"Result ({what}, sha256 {str(result.get('sha256'))[:16]}):")
        say(_indent(str(result.get("preview") or "") + cut))


def _line(digest: dict[str, Any] | None, width: int = 160) -> str:
    """A value's preview on one line, cut at ``width`` characters (``…`` when cut here or by the store)."""
    text = " ".join(str((digest or {}).get("preview") or "").split())
    return text[:width] + ("…" if len(text) > width or (digest or {}).get("truncated") else "")


def print_conversation(talk: dict[str, Any] | None) -> None:
    """The run's input and conversation (``agentrun.inspector``), one line per message, tool calls as content."""
    if not talk:
        return
    if talk.get("input"):
        say(f"Input:    {_line(talk['input'])}")
    messages = talk.get("messages") or []
    if not messages:
        return
    more = f", the newest {len(messages)} of {talk.get('total')}" if (talk.get("total") or 0) > len(messages) else ""
    say(f"Conversation ({len(messages)} messages{more}; the page shows each step's state and changes):")
    for m in messages:
        at = f"v{m['version']} " if m.get("version") is not None else ""
        if m.get("tool_call_id"):
            error = " ERROR" if m.get("is_error") else ""
            say(f"  {at}{m.get('role')} [{m['tool_call_id']}]{error}: {_line(m.get('content'))}")
        elif content := _line(m.get("content")):
            say(f"  {at}{m.get('role')}: {content}")
        for call in m.get("tool_calls") or []:
            say(f"  {at}{m.get('role')} -> {call.get('name')}({_line(call.get('arguments'), 120)}) [{call.get('id')}]")


def _history_phase(found: dict[str, Any]) -> str:
    """The phase, "with 3 failed tool calls" when the history's calls failed (``toolerrors.phase_words``)."""
    failed = sum(1 for c in found.get("tool_calls") or [] if c.get("outcome") == "failed")
    return toolerrors.phase_words(found.get("phase"), {"failed": failed})


def _history_counts(found: dict[str, Any]) -> str:
    """The history's call counts (``tool_counts``, counted as ``status.toolCalls`` is), in the page's words."""
    counts = found.get("tool_counts") or {}
    return (
        f"executed {counts.get('executed', 0)}, replayed {counts.get('replayed', 0)}, "
        f"in doubt {counts.get('inDoubt', 0)}, failed {counts.get('failed', 0)}"
    )


def _history_attempt_rows(found: dict[str, Any]) -> list[list[str]]:
    """``kubectl agentrun history``'s attempts table: the header, then one row per attempt."""
    rows = [
        [
            "ATTEMPT",
            "POD",
            "STARTED",
            "POD START",
            "LAST CHECKPOINT",
            "AT NODE",
            "OUTCOME",
            "EXIT",
            "REASON",
            "STEPS",
            "TOOLS RUN/REPLAYED",
        ]
    ]
    for a in found.get("attempts") or []:
        rows.append(
            [
                str(a["attempt"]),
                a.get("pod") or "-",
                _when(a.get("started_at")),
                _secs(a.get("pod_start_seconds")),
                _when(a.get("ended_at")),
                a.get("last_node") or "-",
                a.get("outcome") or "-",
                shown(a.get("exit_code")) or "-",
                a.get("reason") or "",
                str(a.get("steps", 0)),
                f"{a.get('tool_calls_executed', 0)}/{a.get('tool_calls_replayed', 0)}"
                + (f" ({a['tool_calls_failed']} failed)" if a.get("tool_calls_failed") else ""),
            ]
        )
    return rows


def _history_tool_call_rows(found: dict[str, Any]) -> list[list[str]]:
    """The tool calls table: digests and sizes of arguments and results, never their text."""
    rows = [["TOOL", "CALL ID", "OUTCOME", "ATTEMPT", "REPLAYED IN", "DURATION", "ARGS", "RESULT", "IDEMPOTENCY KEY"]]
    for c in found.get("tool_calls") or []:
        args_d, result_d = c.get("arguments") or {}, c.get("result") or {}
        rows.append(
            [
                c["name"],
                (c.get("call_id") or "-") + (" (edited re-run)" if c.get("edit_of") else ""),
                c["outcome"],
                shown(c.get("attempt")) or "-",
                ",".join(str(n) for n in c.get("replayed_in") or []) or "-",
                ("≤" if c.get("duration_from") == "node" else "") + _secs(c.get("duration_seconds")),
                f"{args_d.get('sha256', '')[:12]} {args_d.get('bytes', '')}B" if args_d else "-",
                f"{result_d.get('sha256', '')[:12]} {result_d.get('bytes', '')}B" if result_d else "-",
                c.get("idempotency_key") or "-",
            ]
        )
    return rows


def _history_interrupt_rows(found: dict[str, Any]) -> list[list[str]]:
    """The interrupts table: each question, its answer (a preview) and the attempt it resumed."""
    rows = [["ASKED", "ATTEMPT", "QUESTION", "ANSWER", "ANSWERED", "RESUMED IN"]]
    for i in found["interrupts"]:
        answer = (i.get("answer") or {}).get("preview") or "waiting"
        rows.append(
            [
                _when(i.get("at")),
                shown(i.get("attempt")),
                (i.get("message") or "")[:60],
                answer[:60],
                _when(i.get("answered_at")),
                shown(i.get("answered_in_attempt")) or "-",
            ]
        )
    return rows


def _history_step_rows(found: dict[str, Any]) -> list[list[str]]:
    """The steps table: one row per checkpoint version."""
    # POD START on an attempt's first checkpoint: its pod's start, never counted in that step's DURATION.
    rows = [["VERSION", "STEP", "NEXT NODE", "STATUS", "ATTEMPT", "WRITTEN", "POD START", "DURATION"]]
    for st in found.get("steps") or []:
        rows.append(
            [
                str(st["version"]),
                str(st["step"]),
                st.get("node") or "-",
                st["status"],
                shown(st.get("attempt")) or "-",
                _when(st.get("at")),
                _secs(st["pod_start_seconds"]) if st.get("pod_start_seconds") is not None else "",
                _secs(st.get("duration_seconds")),
            ]
        )
    return rows


def cmd_ui(kubectl: Kubectl, args: argparse.Namespace) -> int:
    """The history server's web view on 127.0.0.1, every request carrying the kubeconfig's identity."""
    import asyncio
    import webbrowser

    from agentrun_history.proxy import serve_proxy

    from .io import kubeconfig

    _bearer(args)  # fail now, in one line, when there is no token to carry
    paths = args.kubeconfig or os.environ.get("KUBECONFIG") or str(kubeconfig.DEFAULT_KUBECONFIG)
    credentials = kubeconfig.credentials_for(kubeconfig.load_kubeconfig(paths, context=args.context).user)
    server = HistoryServer(kubectl, args)
    namespace = kubectl.current_namespace()

    def ready(port: int) -> None:
        url = f"http://127.0.0.1:{port}/runs?namespace={namespace}"
        say(f"agentrun history UI on {url} (as your kubeconfig identity; Ctrl-C stops it)", flush=True)
        if not args.no_browser:
            webbrowser.open(url)

    try:
        asyncio.run(serve_proxy(server.url, credentials, port=args.port, ready=ready))
    finally:
        server.close()
    return 0


# --- the command line ------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """``kubectl agentrun``'s command line: list, describe, approve, reject, retry, stop, logs, watch, history, ui."""
    top = argparse.ArgumentParser(
        prog="kubectl agentrun",
        description="Day-to-day commands for AgentRuns, through your kubeconfig and RBAC (no database access).",
    )
    top.add_argument("-n", "--namespace", help="the namespace (default: the context's)")
    top.add_argument("--context", help="the kubeconfig context to use")
    top.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        # Also after the command, as kubectl users type them: kubectl agentrun list -n shop.
        sub.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help="the namespace (default: the context's)")
        sub.add_argument("--context", default=argparse.SUPPRESS, help="the kubeconfig context to use")
        sub.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="the kubeconfig file")
        return sub

    listing = command("list", "runs with phase, node, version, attempt, age and what they wait for")
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="runs of every namespace")
    command("describe", "a run: its attempts and pods, tool calls, the interrupt waiting, Events").add_argument("run")
    for verb, default in (("approve", "true"), ("reject", "false")):
        answer = command(verb, f"answer the interrupt a run waits on (default value: {default})")
        answer.add_argument("run")
        answer.add_argument("--id", help="the interrupt id (when the run waits on several)")
        answer.add_argument("--all", action="store_true", help="answer every pending interrupt with the value")
        answer.add_argument("--value", help=f"the answer, as JSON (default: {default})")
        if verb == "approve":
            answer.add_argument(
                "--edit",
                metavar="ARGS",
                help="a tool call review (LangChain HumanInTheLoopMiddleware): run its one pending call with these "
                'arguments instead, as a JSON object (e.g. \'{"order_id": "4821"}\')',
            )
    command("stop", "stop a run, even one hung inside a tool (spec.stop)").add_argument("run")
    command(
        "retry", "re-open a Failed run (spec.retry): it resumes its turn, completed tool calls replay"
    ).add_argument("run")
    logs = command("logs", "the runner logs of every attempt, oldest first")
    logs.add_argument("run")
    logs.add_argument("--attempt", type=int, help="only this attempt's pod")
    logs.add_argument("-f", "--follow", action="store_true", help="follow, across new attempts, until the run ends")
    command("watch", "live progress (node, step, version) until the run ends").add_argument("run")
    history = command("history", "what a run did, from the store (attempts, steps, tool calls, interrupts)")
    history.add_argument("run")
    history.add_argument("-o", "--output", choices=["table", "json"], default="table")
    ui = command("ui", "the history web view on 127.0.0.1, as your kubeconfig identity")
    ui.add_argument("--port", type=int, default=8765, help="the local port (0: any free one)")
    ui.add_argument("--no-browser", action="store_true", help="print the address, do not open a browser")
    for sub in (history, ui):
        sub.add_argument(
            "--server",
            help="the history server's URL (default: $AGENTRUN_HISTORY_URL, else the kubeconfig cluster's "
            f"{HISTORY_EXTENSION} extension, which make cluster writes, else a port-forward to its Service)",
        )
        sub.add_argument(
            "--history-namespace",
            default="agentrun-system",
            help="where the chart installed the history server (for the port-forward)",
        )
        sub.add_argument(
            "--history-service", default=HISTORY_SERVICE, help="its Service (the chart's <release>-history)"
        )
    return top


COMMANDS = {
    "list": cmd_list,
    "describe": cmd_describe,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "retry": cmd_retry,
    "stop": cmd_stop,
    "logs": cmd_logs,
    "watch": cmd_watch,
    "history": cmd_history,
    "ui": cmd_ui,
}


def fail(message: str) -> NoReturn:
    """Print ``message`` as an error and exit 1."""
    say(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


def note_hidden() -> None:
    """Say on stderr, once, that the output showed hidden characters as escapes (and which)."""
    if _hidden_seen:
        found = list(_hidden_seen)
        _hidden_seen.clear()
        sys.stderr.write("note: " + note(found) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``kubectl agentrun`` (the ``kubectl-agentrun`` plugin): run one command; returns its exit code."""
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](Kubectl.find(args), args)
    except PluginError as e:
        fail(str(e))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # kubectl agentrun logs RUN | head
        return 0
    finally:
        note_hidden()


if __name__ == "__main__":
    sys.exit(main())
