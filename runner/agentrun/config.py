"""Run configuration: deadlines, checkpoint cadence, recursion limit.

Accepted as a plain dict (``{"thread_id": ..., "tool_timeout": 60}``), with
LangGraph's ``{"configurable": {...}}`` nesting also understood. Deadlines
follow one rule everywhere: ``None`` or a value <= 0 disables the deadline;
a value that is not a number logs a warning and the default is used, so a
typo in a manifest never turns a deadline off silently.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

log = logging.getLogger("agentrun.config")

# Above the model adapter's 600 s request timeout, so a slow model fails with
# its own error (MODEL_ERROR_...) rather than an anonymous node timeout.
DEFAULT_NODE_TIMEOUT = 900.0
DEFAULT_TOOL_TIMEOUT = 300.0
DEFAULT_RECURSION_LIMIT = 50
_UNSET = object()


def parse_timeout(name: str, value: Any, default: float) -> float | None:
    """Return the deadline in seconds, or ``None`` when disabled."""
    if value is _UNSET:
        return default
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        log.warning("%s=%r is not a number; using the default %ss", name, value, default)
        return default
    try:
        seconds = float(value)
    except ValueError:
        log.warning("%s=%r is not a number; using the default %ss", name, value, default)
        return default
    if math.isnan(seconds):
        log.warning("%s=%r is not a number; using the default %ss", name, value, default)
        return default
    if seconds <= 0 or math.isinf(seconds):
        return None
    return seconds


@dataclass(frozen=True)
class RunConfig:
    """A run's configuration, typed: the thread, the deadlines, how durable each step is, the stop poll."""

    thread_id: str
    node_timeout: float | None = DEFAULT_NODE_TIMEOUT
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT
    durable_checkpoint_every_step: bool = True
    recursion_limit: int = DEFAULT_RECURSION_LIMIT
    # The pod attempt that runs this, for fencing and log context (1 outside Kubernetes).
    attempt: int = 1
    # The AgentRun (or other caller) this turn belongs to; recorded in the checkpoint so a
    # rescheduled pod can tell "my turn already finished" from "a new turn to start".
    run_uid: str | None = None
    # How often a running node checks for a stop request; the contract is "at least once per second".
    stop_poll_interval: float = 0.5
    # The identity of the request this call serves (an AgentRun's spec.requestId or derived key, the
    # CLI's --request-id): a request that already completed on the thread is not run again, one
    # that is unfinished is resumed (``lifecycle``). ``None``: every new input starts a new turn.
    request_key: str | None = None
    # True: a failed tool call (raised, timed out, bad arguments) fails the run with ``ToolError``
    # instead of only telling the model (LangGraph's ToolNode behaviour, the default).
    fail_on_tool_error: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_any(cls, config: RunConfig | dict[str, Any] | None, *, default_thread: str | None = None) -> RunConfig:
        """``config`` as a ``RunConfig``: a dict (``configurable`` merged in) is checked; raises ``ConfigError``."""
        if isinstance(config, RunConfig):
            return config
        raw = dict(config or {})
        raw.update(raw.pop("configurable", None) or {})
        thread_id = raw.pop("thread_id", None) or default_thread
        if not thread_id or not isinstance(thread_id, str):
            raise ConfigError("a run needs a thread id: config={'thread_id': '...'}")
        recursion = raw.pop("recursion_limit", DEFAULT_RECURSION_LIMIT)
        if isinstance(recursion, bool) or not isinstance(recursion, int) or recursion < 1:
            log.warning("recursion_limit=%r is not a positive integer; using %s", recursion, DEFAULT_RECURSION_LIMIT)
            recursion = DEFAULT_RECURSION_LIMIT
        durable = raw.pop("durable_checkpoint_every_step", True)
        if not isinstance(durable, bool):
            log.warning("durable_checkpoint_every_step=%r is not a boolean; using true", durable)
            durable = True
        attempt = raw.pop("attempt", 1)
        run_uid = raw.pop("run_uid", None)
        poll = raw.pop("stop_poll_interval", 0.5)
        request_key = raw.pop("request_key", None)
        if request_key is not None and (not isinstance(request_key, str) or not request_key.strip()):
            raise ConfigError(f"request_key must be a non-empty string, not {request_key!r}")
        fail_on_tool_error = raw.pop("fail_on_tool_error", False)
        if not isinstance(fail_on_tool_error, bool):
            log.warning("fail_on_tool_error=%r is not a boolean; using false", fail_on_tool_error)
            fail_on_tool_error = False
        if not isinstance(poll, int | float) or not 0 < poll <= 1:
            log.warning("stop_poll_interval=%r must be in (0, 1]; using 0.5", poll)
            poll = 0.5
        return cls(
            thread_id=thread_id,
            node_timeout=parse_timeout("node_timeout", raw.pop("node_timeout", _UNSET), DEFAULT_NODE_TIMEOUT),
            tool_timeout=parse_timeout("tool_timeout", raw.pop("tool_timeout", _UNSET), DEFAULT_TOOL_TIMEOUT),
            durable_checkpoint_every_step=durable,
            recursion_limit=recursion,
            attempt=int(attempt),
            run_uid=str(run_uid) if run_uid is not None else None,
            stop_poll_interval=float(poll),
            request_key=request_key,
            fail_on_tool_error=fail_on_tool_error,
            extra=raw,
        )
