"""Messages for people (pure): a runner's termination line in, ``"CODE: text"`` and the status reason out.

The runner writes one line, ``"CODE: message"``, to its termination log. A
kubelet may hand the operator the tail of the container log instead
(``terminationMessagePolicy: FallbackToLogsOnError``), whose last line is a
log record (``2026-12-03 06:19:03,280 ERROR agentrun.runner: exit 5:
[GRAPH_UPDATE_001] ...``, or a JSON record). ``human`` strips what a log adds
(timestamp, level, logger, the ``exit N:`` prefix, the bracketed code) so
``status.message`` reads the same either way, on one line, so that
``kubectl describe`` shows the cause of a Failed run in one line.

``REASON_BY_CODE`` is the one table from a runner error code to the status
reason of a run that failed with it; a code not listed is ``RunFailed``.
"""

from __future__ import annotations

import json
import re

from agentrun.errors import StoreConfigError, ToolError

from .reasons import Reason

MESSAGE_LIMIT = 1024

# Error code (agentrun.errors) -> the reason of a run the runner failed with it.
REASON_BY_CODE: dict[str, Reason] = {
    StoreConfigError.code: Reason.INVALID_STORE,
    ToolError.code: Reason.TOOL_ERROR,
}

_CODE = r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_\d{3}"
_LOG_PREFIX = re.compile(
    r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+"  # timestamp
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+"  # level
    r"[\w.\-]+:\s*"  # logger
)
_EXIT_PREFIX = re.compile(r"^exit \d+:\s*")
_BRACKETED = re.compile(rf"^\[({_CODE})\]\s*")
_CODED = re.compile(rf"^({_CODE}):\s*")


def _from_json_record(line: str) -> str:
    if not line.startswith("{"):
        return line
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return line
    if isinstance(record, dict) and isinstance(record.get("message"), str):
        return str(record["message"])
    return line


def human(text: str | None) -> str:
    """The last non-empty line of ``text`` as ``"CODE: message"`` (or as is when it carries no code), one line."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    line = _from_json_record(lines[-1]).strip()
    line = _LOG_PREFIX.sub("", line, count=1)
    line = _EXIT_PREFIX.sub("", line, count=1)
    code = None
    if match := _CODED.match(line):
        code, line = match.group(1), line[match.end() :]
    if (match := _BRACKETED.match(line)) and (code is None or match.group(1) == code):
        code, line = match.group(1), line[match.end() :]
    line = " ".join(line.split())  # one line, whatever the message held
    text = f"{code}: {line}" if code else line
    return text[:MESSAGE_LIMIT]


def error_code(message: str | None) -> str | None:
    """The error code a ``human`` message starts with, if any."""
    match = _CODED.match(message or "")
    return match.group(1) if match else None


def reason_for(message: str | None, default: Reason = Reason.RUN_FAILED) -> Reason:
    """The status reason of a run that failed with ``message`` (by its leading error code)."""
    return REASON_BY_CODE.get(error_code(message) or "", default)


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """Whitespace (newlines included) collapsed, bounded: a message ``kubectl describe`` prints on one line."""
    return " ".join(text.split())[:limit]
