"""A run's history, built from what the store recorded: one model for the JSON API, the web view and the CLI.

``build(rows, ...)`` turns a thread's rows (``checkpoint.pg_history``) and,
when the caller has it, the AgentRun's ``status.attempts`` (pod, exit code,
reason: facts only Kubernetes knows) into a ``RunHistory``: attempts, steps,
tool calls, interrupts and the stop request. It is pure: no I/O, the same
rows give the same history. Everything shown lasts as long as the thread's
rows do (``delete_thread`` is the only thing that removes them), except the
pod facts, which live in the AgentRun's status (its last 20 attempts).

How each fact is derived (nothing extra is written on the step's path):
- an attempt's **pod start** runs from its start (its run inputs row, written
  just before its pod, or ``status.attempts``) to its runner being ready: its
  registration (``register_attempt``; the store keeps the newest attempt's),
  else its opening checkpoint (a new turn's step 0, an answered interrupt's
  re-run: written before any node runs); unknown otherwise (an older attempt
  that resumed after a crash). Pod start is never counted in a step;
- a step's duration is the time from the previous checkpoint of the same
  attempt to this one (node plus write); the first step of an attempt counts
  from its runner being ready, and has none when that is unknown or when it is
  the opening checkpoint itself (no node ran; the pod start is shown instead);
- a tool call comes from the assistant message that asked for it; its ledger
  key (``ledger.ledger_key``) finds the ledger record (executed, by which
  attempt, when) and the intent (started when, with which idempotency key);
  its duration runs from its intent (recorded just before the call, by tools
  with side effects) to its record, else from the start of its tool node
  (the checkpoint that scheduled it, in the same attempt) to its record: an
  upper bound, which ``duration_from`` says;
- an **edited** call (a LangGraph fork or an edited message: other arguments
  under the same message and call ids) ran under its own key,
  ``<key>#args-<digest prefix>`` (``ledger.edited_key``): a call finds that
  record when the digest of its arguments (``ledger.args_digest``) names it,
  or when the key's record or intent holds other arguments (arguments longer
  than a preview are not known whole here: such a call keeps its key's
  record, as before edits were told apart); a record of an
  edited key without its request (a LangGraph thread's: its messages are in
  LangGraph's tables, not read here) is shown right after the call it
  re-ran, under that call id, with ``edit_of`` naming its key;
- **replayed**: the tool's answer was checkpointed by a later attempt than
  the one that recorded it in the ledger, so that attempt took the result
  from the ledger instead of calling the tool (a crash between the record and
  the checkpoint, or an interrupted node run again);
- **in doubt**: an intent without a record: the call started and its outcome
  is unknown (the tool's in-doubt policy decided what came next); a record of
  a later attempt than its intent was in doubt there and ran again
  (``in_doubt_in``);
- **running** only while the attempt that started it may still run; once that
  attempt ended, a call without a record or an answer is **cancelled** when the
  attempt ended by a stop (a stopped checkpoint, ``status.attempts`` Stopped:
  the runner cancelled it, or the forced stop killed it), else **in doubt** (a
  crash, an eviction: it may or may not have taken effect), and
  **interrupted** while it waits at its own ``interrupt()`` (a known point: not
  in doubt; it starts again in the attempt that resumes the run). A call
  requested and never started in a run that ended stopped is cancelled too;
- an interrupt's answer is the resume value of the first checkpoint after it
  that carries its id (state meta ``resume``), before that the operator's
  run inputs for the next attempt; who answered is in the API server's audit
  log (the answer is a patch of the AgentRun by that person);
- **failed**: the answer is a tool error message (``is_error``);
- digests are SHA-256 of the arguments' text and of the recorded result
  envelope's text, with their sizes in bytes; previews are cut at
  ``PREVIEW_CHARS``. Previews are plain text: a view must escape them. The
  store computes both (``pg_history``): a value is never read whole, and a
  NUL in it shows as the text ``\\u0000``;
- a stored value parsed here (an error, the final result, a stop reason) is
  cut at ``MAX_DEPTH`` levels, deeper parts shown as ``DEPTH_MARKER``: the
  history shows what it can of any value and never fails on one; a row the
  store could not read is named in ``unreadable`` and the rest is shown.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from .checkpoint.pg_history import PREVIEW_CHARS, ThreadRows
from .ledger import args_digest, edited_from, edited_key, idempotency_key, ledger_key
from .messages import ToolCall

__all__ = ["DEPTH_MARKER", "MAX_DEPTH", "PREVIEW_CHARS", "Digest", "RunHistory", "build", "digest"]

# Levels of a stored value parsed for the history: json.loads recurses once per level, and a value as deep
# as a runner could write (its own stack) fails on the server's deeper one (RecursionError, a 500).
MAX_DEPTH = 64
DEPTH_MARKER = f"<nested deeper than {MAX_DEPTH} levels: not shown>"

Outcome = Literal["executed", "replayed", "in_doubt", "failed", "running", "requested", "cancelled", "interrupted"]


class Digest(BaseModel):
    """A value shown by its digest, size and a short preview, never whole."""

    sha256: str
    bytes: int
    preview: str
    truncated: bool = False


class StepRecord(BaseModel):
    """One checkpoint of the run: version, step, the next node, status and when it was written."""

    version: int
    step: int
    node: str | None
    status: str
    attempt: int | None
    at: float
    duration_seconds: float | None = None  # the step's own time, never its pod's start (module docstring)
    pod_start_seconds: float | None = None  # on an attempt's first checkpoint: that attempt's pod start


class ToolCallRecord(BaseModel):
    """One tool call: its ledger and idempotency keys, outcome, attempt, the attempts that replayed it, duration."""

    name: str
    call_id: str | None
    ledger_key: str | None
    idempotency_key: str | None
    outcome: Outcome
    # The attempt that ran the tool (its ledger record or, in doubt, its intent) and those that replayed it.
    attempt: int | None = None
    replayed_in: list[int] = Field(default_factory=list)
    # An intent of an earlier attempt than the record's: the call was in doubt there and ran again (retry policy).
    in_doubt_in: list[int] = Field(default_factory=list)
    requested_version: int | None = None
    # An edited re-run (other arguments under the same message and call ids): the ledger key of the call it
    # re-ran; it ran and is recorded under its own key (``ledger_key``, ``ledger.edited_key``).
    edit_of: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    duration_seconds: float | None = None
    # Where the start comes from: "intent" (recorded just before the call) or "node" (the checkpoint that
    # scheduled the tool node, or the attempt's start: an upper bound, shared by parallel siblings).
    duration_from: Literal["intent", "node"] | None = None
    arguments: Digest | None = None
    result: Digest | None = None


class InterruptRecord(BaseModel):
    """An interrupt: what it asked, in which version and attempt, and the answer if any."""

    ids: list[str]
    message: str = ""
    payload: Digest | None = None
    version: int
    attempt: int | None
    at: float
    answered_at: float | None = None
    answered_in_attempt: int | None = None
    answer: Digest | None = None


class AttemptHistory(BaseModel):
    """One attempt (one runner pod): when it started and ended, its outcome and what it did."""

    attempt: int
    pod: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    # Pod creation -> runner ready (its registration or opening checkpoint): scheduling, image, imports, store.
    pod_start_seconds: float | None = None
    outcome: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    steps: int = 0
    first_version: int | None = None
    last_version: int | None = None
    last_node: str | None = None  # the node its last checkpoint was at (where it stopped, crashed or ended)
    # As ``status.toolCalls`` counts them: a call that returned (recorded) in this attempt, one this attempt took
    # from the ledger, one that failed here (its answer an error); the run's ``tool_counts`` are their sums.
    tool_calls_executed: int = 0
    tool_calls_replayed: int = 0
    tool_calls_failed: int = 0


class StopRecord(BaseModel):
    """A pending stop request."""

    reason: str
    requested_at: float


class RunHistory(BaseModel):
    """A run's whole history as the history server serves it (``build``)."""

    namespace: str
    name: str
    uid: str | None = None
    thread_id: str
    graph: str | None = None
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    status: str | None = None  # the store's last checkpoint status (running, interrupted, completed, ...)
    version: int | None = None
    current_node: str | None = None
    attempts: list[AttemptHistory] = Field(default_factory=list)
    steps: list[StepRecord] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    # The calls counted as ``status.toolCalls`` counts them (keys executed, replayed, failed, inDoubt; the last two
    # when not zero), from the same records as the calls and attempts above: what the page and the CLI show.
    tool_counts: dict[str, int] = Field(default_factory=dict)
    interrupts: list[InterruptRecord] = Field(default_factory=list)
    stop: StopRecord | None = None
    error: dict[str, Any] | None = None
    result: Digest | None = None
    # What ``result`` is (``agentrun.result``): "message" (the last assistant message) or "state" (the final
    # state's values as JSON); None for an older runner's result (a message) or none.
    result_kind: str | None = None
    recorded: bool = True  # False: the store has nothing of this thread (not started, or its data deleted)
    unreadable: list[str] = Field(default_factory=list)  # rows the store could not read: which, and why
    deleted: bool = False  # the AgentRun is gone; this is what the store kept of it


def digest(text: str) -> Digest:
    """SHA-256, size in bytes and a preview of ``text`` (plain text, to be escaped by whoever shows it)."""
    data = text.encode("utf-8", "surrogatepass")
    return Digest(
        sha256=hashlib.sha256(data).hexdigest(),
        bytes=len(data),
        preview=text[:PREVIEW_CHARS],
        truncated=len(text) > PREVIEW_CHARS,
    )


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _loads(text: Any) -> Any:
    """JSON text parsed, nesting beyond ``MAX_DEPTH`` replaced by ``DEPTH_MARKER``; None if it is not JSON."""
    if text is None or not isinstance(text, str):
        return text
    try:
        # Fewer brackets than levels allowed: parse as is (the usual case, counted without a Python loop).
        return json.loads(text if text.count("{") + text.count("[") <= MAX_DEPTH else _cap_depth(text))
    except (ValueError, RecursionError):
        return None


# A JSON string (its escapes included) or a bracket: what nesting is counted by.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _cap_depth(text: str) -> str:
    """``text`` with every object or array nested deeper than ``MAX_DEPTH`` replaced by ``DEPTH_MARKER``."""
    parts: list[str] = []
    depth, cut_from, kept = 0, -1, 0
    for token in _TOKEN.finditer(text):
        bracket = token.group()
        if bracket in "{[":
            depth += 1
            if depth == MAX_DEPTH + 1 and cut_from < 0:
                cut_from = token.start()
        elif bracket in "}]":
            depth -= 1
            if depth == MAX_DEPTH and cut_from >= 0:
                parts += [text[kept:cut_from], json.dumps(DEPTH_MARKER)]
                kept, cut_from = token.end(), -1
    return "".join(parts) + text[kept:]


def _digest_of(text: Any) -> Digest | None:
    """A digest the store computed (``pg_history``: JSON text of Digest's fields), or None."""
    fields = _loads(text) if isinstance(text, str) else text
    return Digest.model_validate(fields) if isinstance(fields, dict) else None


def _final(result: Any) -> Digest | None:
    """The final answer (``agentrun.result``: its first 1024 characters and the digest of the whole)."""
    if isinstance(result, dict) and isinstance(result.get("message"), str):
        shown = digest(result["message"])
        whole = str(result.get("digest") or "").removeprefix("sha256:")
        return shown.model_copy(update={"sha256": whole or shown.sha256, "truncated": bool(result.get("truncated"))})
    return digest(_json_text(result)) if result is not None else None


def _result_kind(result: Any) -> str | None:
    if not isinstance(result, dict) or not isinstance(result.get("message"), str):
        return None
    return "state" if result.get("kind") == "state" else "message"


def _opening(row: Mapping[str, Any], before: Mapping[str, Any] | None) -> bool:
    """A checkpoint written before any node ran: a new turn's step 0, or an answered interrupt's re-run."""
    if row["status"] != "running":
        return False
    return int(row["step"]) == 0 or (before is not None and before["status"] == "interrupted")


def _ready(states: Sequence[Mapping[str, Any]], owner: Mapping[str, Any] | None, uid: str | None) -> dict[int, float]:
    """When each attempt's runner was ready: its registration (the store keeps the newest attempt's only),
    else its opening checkpoint when its first checkpoint is one; attempts not listed are unknown."""
    ready: dict[int, float] = {}
    before: Mapping[str, Any] | None = None
    seen: set[int] = set()
    for row in states:
        attempt = row.get("attempt")
        if attempt is not None and attempt not in seen:
            seen.add(attempt)
            if _opening(row, before):
                ready[attempt] = float(row["at"])
        before = row
    # Another AgentRun's registration on the thread is not ours.
    ours = owner is not None and (uid is None or owner.get("run_uid") in (None, uid))
    if owner is not None and ours and isinstance(owner.get("attempt"), int) and owner.get("at") is not None:
        ready[owner["attempt"]] = float(owner["at"])
    return ready


def _steps(
    states: Sequence[Mapping[str, Any]], attempt_starts: Mapping[int, float], ready: Mapping[int, float]
) -> list[StepRecord]:
    steps: list[StepRecord] = []
    previous: dict[int | None, float] = {}
    for row in states:
        attempt = row.get("attempt")
        at = float(row["at"])
        step = StepRecord(
            version=int(row["version"]),
            step=int(row["step"]),
            node=row.get("current_node"),
            status=str(row["status"]),
            attempt=attempt,
            at=at,
        )
        since = previous.get(attempt)
        if since is None and attempt is not None:  # the attempt's first checkpoint: its pod start goes apart
            began, up = attempt_starts.get(attempt), ready.get(attempt)
            if began is not None and up is not None and began <= up <= at:
                step.pod_start_seconds = round(up - began, 3)
            # From the runner being ready; none when that is this checkpoint (the opening: no node ran).
            since = up if up is not None and up < at else None
        if since is not None and at >= since:
            step.duration_seconds = round(at - since, 3)
        steps.append(step)
        previous[attempt] = at
    return steps


def _tool_calls(rows: ThreadRows, thread_id: str, version_attempt: Mapping[int, int | None]) -> list[ToolCallRecord]:
    ledger = {r["tool_call_id"]: r for r in rows.ledger}
    intents = {r["tool_call_id"]: r for r in rows.intents}
    # A message the store could not read is left out (named in ``unreadable``): its calls' ledger records
    # still show, as calls whose request is not among the run's messages.
    messages = [(m, int(m["version"])) for m in rows.messages if not m.get("unreadable")]
    calls: list[ToolCallRecord] = []
    seen: set[str] = set()
    for position, (body, version) in enumerate(messages):
        if body.get("role") == "tool" or version not in version_attempt:
            continue
        # The answers to this request: the tool messages after it, up to the next request.
        answers: dict[str, tuple[dict[str, Any], int]] = {}
        for later, later_version in messages[position + 1 :]:
            if later.get("role") != "tool":
                break
            if later.get("tool_call_id"):
                answers.setdefault(str(later["tool_call_id"]), (later, later_version))
        requested = _loads(body.get("tool_calls"))
        for call in requested if isinstance(requested, list) else []:
            call_id = call.get("id")
            asked = ledger_key(body.get("id"), call_id)
            key = _ran_under(asked, call.get("arguments"), ledger, intents)
            record = ledger.get(key) if key else None
            intent = intents.get(key) if key else None
            answer = answers.get(str(call_id)) if call_id else None
            if key:
                seen.add(key)
            made = _tool_call(call, key, thread_id, version, record, intent, answer, version_attempt)
            made.edit_of = asked if key != asked else None
            calls.append(made)
    # Ledger records whose request is not among the run's messages (an older turn's, a foreign graph's, a
    # LangGraph thread's); an edited re-run goes right after the call it re-ran.
    for key, record in ledger.items():
        if key in seen:
            continue
        original = edited_from(key)
        call = {"name": record["tool_name"], "id": original.split(":", 1)[1] if original and ":" in original else None}
        made = _tool_call(call, key, thread_id, None, record, intents.get(key))
        made.edit_of = original
        after = [i for i, c in enumerate(calls) if original is not None and original in (c.ledger_key, c.edit_of)]
        calls.insert(after[-1] + 1 if after else len(calls), made)
    return calls


def _ran_under(
    key: str | None, arguments: Any, ledger: Mapping[str, Mapping[str, Any]], intents: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """The ledger key a call asked for under ``key`` ran under: ``key``, or its ``edited_key`` when edited.

    Edited: a record or intent exists under the edited key of the call's arguments digest, or the key's own
    holds other arguments. Arguments not known whole (a preview cut, a value not parsed) keep ``key``."""
    digest = _arguments_digest(arguments) if key else None
    if key is None or digest is None:
        return key
    edited = edited_key(key, digest)
    held = next((r.get("args_digest") for r in (ledger.get(key), intents.get(key)) if r and r.get("args_digest")), None)
    return edited if edited in ledger or edited in intents or held not in (None, digest) else key


def _arguments_digest(arguments: Any) -> str | None:
    """``ledger.args_digest`` of a call's arguments, as the tool node computed it, when its preview is whole."""
    shown = _digest_of(arguments)
    if shown is None or shown.truncated:
        return None
    try:  # the tool node's own parse: the digest is of the parsed arguments, or of the text it refused
        parsed: Any = ToolCall(id=None, name="-", arguments=shown.preview).parsed_arguments()
    except ValueError:
        parsed = shown.preview
    return args_digest(parsed)


def _tool_call(
    call: Mapping[str, Any],
    key: str | None,
    thread_id: str,
    version: int | None,
    record: Mapping[str, Any] | None,
    intent: Mapping[str, Any] | None,
    answer: tuple[dict[str, Any], int] | None = None,
    version_attempt: Mapping[int, int | None] | None = None,
) -> ToolCallRecord:
    result: Digest | None = None
    is_error = False
    if record is not None:  # the envelope's digest, the preview of what the model read
        result = Digest(
            sha256=str(record["result_sha256"]),
            bytes=int(record["result_bytes"]),
            preview=str(record["result_preview"] or ""),
            truncated=bool(record["result_truncated"]),
        )
        is_error = bool(record.get("result_is_error"))
    elif answer is not None:
        result = _digest_of(answer[0].get("content")) or digest("")
        is_error = bool(answer[0].get("is_error"))
    answered_in = (version_attempt or {}).get(answer[1]) if answer is not None else None
    # Nothing recorded it (a failure, a call without a ledger key): the attempt whose checkpoint has its answer.
    ran_in = (record or intent or {}).get("attempt") or (answered_in if record is None and intent is None else None)
    replayed = [answered_in] if record is not None and answered_in is not None and answered_in != ran_in else []
    outcome: Outcome
    if is_error:
        outcome = "failed"
    elif record is not None:
        outcome = "replayed" if replayed else "executed"
    elif intent is not None:
        outcome = "in_doubt" if answer is not None else "running"
    elif answer is not None:
        outcome = "executed"
    else:
        outcome = "requested"
    started = (intent or {}).get("at")
    finished = (record or {}).get("at")
    intent_attempt = (intent or {}).get("attempt")
    # In doubt there, then run again (a record) or answered otherwise (an in-doubt policy) by a later attempt.
    later = ran_in if record is not None else answered_in
    in_doubt_in = [intent_attempt] if intent_attempt is not None and later not in (None, intent_attempt) else []
    if in_doubt_in:
        started = None  # the intent's start belongs to the attempt that died, not to the call that recorded
    return ToolCallRecord(
        name=str(call.get("name") or (record or intent or {}).get("tool_name") or "?"),
        call_id=call.get("id") or (key.split(":", 1)[1] if key and ":" in key else None),
        ledger_key=key,
        idempotency_key=(intent or {}).get("idempotency_key") or idempotency_key(thread_id, key),
        outcome=outcome,
        attempt=ran_in,
        replayed_in=replayed,
        in_doubt_in=in_doubt_in,
        requested_version=version,
        started_at=started,
        finished_at=finished,
        duration_seconds=round(finished - started, 3) if started is not None and finished is not None else None,
        duration_from="intent" if started is not None and finished is not None else None,
        arguments=_digest_of(call.get("arguments")),
        result=result,
    )


def _node_durations(calls: Sequence[ToolCallRecord], steps: Sequence[StepRecord], ready: Mapping[int, float]) -> None:
    """A call without an intent: from the start of its tool node (in the attempt that recorded it) to its record;
    in an attempt that resumed at that node, from its runner being ready (never from its pod's creation: a 5 ms
    call must not show the pod's start as its duration)."""
    at_version = {s.version: s for s in steps}
    for call in calls:
        if call.duration_seconds is not None or call.finished_at is None or call.attempt is None:
            continue
        scheduled = at_version.get(call.requested_version) if call.requested_version is not None else None
        start = scheduled.at if scheduled is not None and scheduled.attempt == call.attempt else None
        if start is None:
            start = ready.get(call.attempt)
        if start is not None and start <= call.finished_at:
            call.started_at = start
            call.duration_seconds = round(call.finished_at - start, 3)
            call.duration_from = "node"


def _interrupts(states: Sequence[Mapping[str, Any]], inputs: Sequence[Mapping[str, Any]]) -> list[InterruptRecord]:
    found: list[InterruptRecord] = []
    for position, row in enumerate(states):
        if row["status"] != "interrupted":
            continue
        raw = _loads(row.get("interrupts"))
        raw = raw if isinstance(raw, list) else []
        ids = [str(i.get("id")) for i in raw if isinstance(i, dict) and i.get("id")]
        first = next((i for i in raw if isinstance(i, dict)), {})
        interrupt = InterruptRecord(
            ids=ids,
            message=str(first.get("message") or ""),
            payload=_digest_of(first.get("payload")),
            version=int(row["version"]),
            attempt=row.get("attempt"),
            at=float(row["at"]),
        )
        # The answer: the run's resume values (state meta "resume", by interrupt id) in the first checkpoint
        # after the interrupt that holds one of its ids; the attempt that wrote it is the one that resumed.
        for later in states[position + 1 :]:
            resume = _loads(later.get("resume"))
            if isinstance(resume, dict) and any(i in resume for i in ids):
                answers = [resume[i] for i in ids if i in resume]
                # Several ids answered at once: the digest of the checkpoint's resume values together.
                interrupt.answer = _digest_of(answers[0] if len(answers) == 1 else later.get("resume_all"))
                interrupt.answered_at = float(later["at"])
                interrupt.answered_in_attempt = later.get("attempt")
                break
        else:  # not resumed yet: the operator may already hold the answer for the next attempt
            for entry in inputs:
                if entry.get("resume") and float(entry["at"]) >= interrupt.at:
                    interrupt.answer = _answer_to(ids, _digest_of(entry["resume"]))
                    interrupt.answered_at = float(entry["at"])
                    interrupt.answered_in_attempt = int(entry["attempt"])
                    break
        found.append(interrupt)
    return found


def _answer_to(ids: Sequence[str], resume: Digest | None) -> Digest | None:
    """The answer to ``ids`` in the resume value the operator holds for the next attempt, as the resumed
    checkpoint will show it: the value for those ids, not the operator's ``{"values": {id: value}}`` wrapping
    (the issue saw that flash by). A preview cut short cannot be unwrapped: the whole digest then."""
    if resume is None or resume.truncated:
        return resume
    parsed = _loads(resume.preview)
    values = parsed.get("values") if isinstance(parsed, dict) else None
    if isinstance(values, dict) and (picked := {i: values[i] for i in ids if i in values}):
        return digest(_json_text(next(iter(picked.values())) if len(picked) == 1 else picked))
    if isinstance(parsed, dict) and set(parsed) == {"value"}:
        return digest(_json_text(parsed["value"]))
    return resume


def _error(text: Any) -> dict[str, Any] | None:
    """The last checkpoint's error (a dict; anything else stored there, or a cut one, as its message)."""
    error = _loads(text)
    return error if isinstance(error, dict) or error is None else {"message": str(error)}


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _attempts(
    steps: Sequence[StepRecord],
    calls: Sequence[ToolCallRecord],
    inputs: Sequence[Mapping[str, Any]],
    status_attempts: Iterable[Mapping[str, Any]],
    pod_starts: Mapping[int, float],
) -> list[AttemptHistory]:
    by_number: dict[int, AttemptHistory] = {}

    def entry(number: int) -> AttemptHistory:
        return by_number.setdefault(number, AttemptHistory(attempt=number))

    for row in inputs:
        entry(int(row["attempt"])).started_at = float(row["at"])
    for step in steps:
        if step.attempt is None:
            continue
        item = entry(step.attempt)
        item.steps += 1
        item.first_version = item.first_version if item.first_version is not None else step.version
        item.last_version = step.version
        item.last_node = step.node
        item.ended_at = step.at
    for call in calls:
        if call.attempt is not None and call.outcome in ("executed", "replayed"):
            entry(call.attempt).tool_calls_executed += 1
        elif call.attempt is not None and call.outcome == "failed":
            entry(call.attempt).tool_calls_failed += 1
        for number in call.replayed_in:
            entry(number).tool_calls_replayed += 1
    for raw in status_attempts:
        listed = raw.get("attempt")
        if not isinstance(listed, int):
            continue
        item = entry(listed)
        item.pod = raw.get("podName") or item.pod
        item.started_at = _epoch(raw.get("startTime")) or item.started_at
        item.outcome = raw.get("outcome") or item.outcome
        item.exit_code = raw.get("exitCode") if isinstance(raw.get("exitCode"), int) else item.exit_code
        item.reason = raw.get("reason") or item.reason
        item.message = raw.get("message") or item.message
    for number, seconds in pod_starts.items():
        entry(number).pod_start_seconds = seconds
    return [by_number[n] for n in sorted(by_number)]


def _tool_counts(calls: Sequence[ToolCallRecord]) -> dict[str, int]:
    """The run's calls counted as the runner counts them into ``status.toolCalls`` (``context.ToolCounts``):
    executed once per call that returned (in whichever attempt), replayed once per attempt that took a recorded
    result from the ledger, failed per call whose answer is an error (not executed: as the runner counts), in
    doubt per call a later attempt found started without a result. Zero failed and in doubt are left out, as
    the operator leaves them out of the status."""
    counts = {
        "executed": sum(1 for c in calls if c.outcome in ("executed", "replayed")),
        "replayed": sum(len(c.replayed_in) for c in calls),
        "failed": sum(1 for c in calls if c.outcome == "failed"),
        "inDoubt": sum(1 for c in calls if c.in_doubt_in),
    }
    return {k: n for k, n in counts.items() if n or k in ("executed", "replayed")}


def _pod_starts(attempt_starts: Mapping[int, float], ready: Mapping[int, float]) -> dict[int, float]:
    """Each attempt's pod start, where both ends are known (module docstring)."""
    return {n: round(up - attempt_starts[n], 3) for n, up in ready.items() if attempt_starts.get(n, up + 1) <= up}


# The statuses a runner writes last before it exits: the attempt that wrote one has ended.
_EXITED = frozenset({"completed", "failed", "stopped", "interrupted"})


def _settle(calls: Sequence[ToolCallRecord], steps: Sequence[StepRecord], status: Mapping[str, Any]) -> None:
    """Calls an ended attempt left open: "running" (started, no record, no answer) becomes "cancelled" when that
    attempt was stopped, "interrupted" when it paused at the tool's own ``interrupt()`` (a known point: not in
    doubt), else "in_doubt"; "requested" (never started) becomes "cancelled" after a stop."""
    listed = [raw for raw in status.get("attempts") or [] if isinstance(raw.get("attempt"), int)]
    stopped = {s.attempt for s in steps if s.status == "stopped"}
    stopped |= {raw["attempt"] for raw in listed if raw.get("outcome") == "Stopped"}
    last_status = {s.attempt: s.status for s in steps}  # each attempt's last checkpoint
    known = {s.attempt for s in steps} | {raw["attempt"] for raw in listed} | {c.attempt for c in calls}
    numbers = {n for n in known if n is not None}
    newest = max(numbers, default=0)
    ended = {n for n in numbers if n < newest} | {raw["attempt"] for raw in listed if raw.get("endTime")}
    ended |= {n for n, last in last_status.items() if n == newest and last in _EXITED}
    run_stopped = status.get("phase") == "Stopped"
    if run_stopped:  # however it ended (a forced stop, a stop while it waited for an answer)
        stopped.add(newest)
    stop_versions = [s.version for s in steps if s.status == "stopped"]
    for call in calls:
        asked = call.requested_version or 0
        if call.outcome == "requested" and (run_stopped or any(v >= asked for v in stop_versions)):
            call.outcome = "cancelled"
        if call.outcome != "running":
            continue
        # A call that paused at its interrupt() starts again in the attempt that resumed the run: that one holds it.
        holder = newest if last_status.get(call.attempt) == "interrupted" else call.attempt
        if holder in stopped:
            call.outcome = "cancelled"
        elif last_status.get(holder) == "interrupted":
            call.outcome = "interrupted"
        elif holder in ended:
            call.outcome = "in_doubt"


def build(
    rows: ThreadRows,
    *,
    namespace: str,
    name: str,
    thread_id: str,
    uid: str | None = None,
    graph: str | None = None,
    status: Mapping[str, Any] | None = None,
) -> RunHistory:
    """The history of AgentRun ``namespace/name`` on ``thread_id`` from its rows and (optionally) its status."""
    status = status or {}
    attempt_starts = {int(r["attempt"]): float(r["at"]) for r in rows.inputs}
    for raw in status.get("attempts") or []:  # the store keeps only the latest attempt's inputs
        started = _epoch(raw.get("startTime"))
        if isinstance(raw.get("attempt"), int) and started is not None:
            attempt_starts.setdefault(raw["attempt"], started)
    ready = _ready(rows.states, rows.owner, uid)
    steps = _steps(rows.states, attempt_starts, ready)
    version_attempt = {s.version: s.attempt for s in steps}
    calls = _tool_calls(rows, thread_id, version_attempt)
    _node_durations(calls, steps, ready)
    _settle(calls, steps, status)
    last = rows.states[-1] if rows.states else None
    result = _loads(last.get("result")) if last else None
    history = RunHistory(
        namespace=namespace,
        name=name,
        uid=uid,
        thread_id=thread_id,
        graph=graph,
        phase=status.get("phase"),
        reason=status.get("reason"),
        message=status.get("message"),
        status=str(last["status"]) if last else None,
        version=int(last["version"]) if last else None,
        current_node=last.get("current_node") if last else None,
        attempts=_attempts(steps, calls, rows.inputs, status.get("attempts") or [], _pod_starts(attempt_starts, ready)),
        steps=steps,
        tool_calls=calls,
        tool_counts=_tool_counts(calls),
        interrupts=_interrupts(rows.states, rows.inputs),
        error=_error(last.get("error")) if last else None,
        result=_final(result),
        result_kind=_result_kind(result),
        recorded=not rows.empty,
        unreadable=list(rows.unreadable),
    )
    if rows.stop is not None:
        history.stop = StopRecord(reason=str(rows.stop["reason"]), requested_at=float(rows.stop["at"]))
    else:  # acknowledged and cleared: the checkpoint that stopped the run keeps the reason
        stopped = next((r for r in reversed(rows.states) if r.get("stop_reason")), None)
        if stopped is not None:
            reason = _loads(stopped["stop_reason"])
            history.stop = StopRecord(reason=str(reason or "stop requested"), requested_at=float(stopped["at"]))
    return history
