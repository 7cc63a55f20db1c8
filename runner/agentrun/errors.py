"""Every error agentrun raises, each with a stable code.

The codes are part of the contract: logs, metrics labels and AgentRun status
reasons reuse them, so never renumber one. This module is their one home:
code elsewhere names a code by its class (``ToolError.code``, ``ModelError.HTTP``),
never as a literal (``hack/error_codes.py`` in ``make lint`` refuses one). Stop and interrupt signals derive
from ``BaseException`` so that a tool's broad ``except Exception`` cannot
swallow them (the same choice asyncio made for ``CancelledError``).
"""

from __future__ import annotations

from typing import Any


class AgentRunError(Exception):
    """Base of all agentrun errors; ``code`` is stable across releases."""

    code = "AGENTRUN_000"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"[{self.code}] {super().__str__()}"


class ConfigError(AgentRunError):
    """A run config value that cannot be used (an unknown key, a wrong type)."""

    code = "CONFIG_INVALID_001"


class RunnerInputError(AgentRunError):
    """The runner pod's inputs cannot be used (a missing or malformed environment variable, no store)."""

    code = "RUNNER_INPUT_001"


class GraphDefinitionError(AgentRunError):
    """The graph is malformed (unknown node, missing entry point, bad edge)."""

    code = "GRAPH_DEFINITION_001"


class GraphReferenceError(AgentRunError):
    """A ``module:attribute`` graph reference cannot be imported or is not a graph."""

    code = "GRAPH_REFERENCE_001"


class GraphRecursionError(AgentRunError):
    """The run took more steps than ``recursion_limit`` allows."""

    code = "GRAPH_RECURSION_001"


class InvalidUpdateError(AgentRunError):
    """A node returned something that is not a state update, or a key that is not a channel."""

    code = "GRAPH_UPDATE_001"


class NodeError(AgentRunError):
    """A node raised; the original exception is the ``__cause__``."""

    code = "NODE_ERROR_001"

    def __init__(self, message: str, *, node: str) -> None:
        super().__init__(message)
        self.node = node


class NodeTimeoutError(AgentRunError):
    """A deadline passed. ``NODE_TIMEOUT_001``: a node; ``NODE_TIMEOUT_002``: a tool call."""

    code = "NODE_TIMEOUT_001"
    NODE = "NODE_TIMEOUT_001"
    TOOL = "NODE_TIMEOUT_002"

    def __init__(self, message: str, *, code: str = "NODE_TIMEOUT_001", timeout: float) -> None:
        super().__init__(message, code=code)
        self.timeout = timeout


class StaleStateError(AgentRunError):
    """Another writer advanced the thread since this run loaded it (optimistic concurrency)."""

    code = "STORAGE_CONFLICT_001"

    def __init__(self, thread_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"thread {thread_id!r}: expected to write after version {expected}, "
            f"but the store is at version {actual}; another process advanced this thread"
        )
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual


class FencedError(AgentRunError):
    """A newer attempt registered for the thread; this (older) attempt may not write."""

    code = "STORAGE_FENCED_001"


class StorageError(AgentRunError):
    """The store failed in a way that is not a conflict (I/O, connection, corrupt row)."""

    code = "STORAGE_IO_001"


class MigrationError(StorageError):
    """A schema migration failed; the schema stays at the last version that completed."""

    code = "STORAGE_MIGRATION_001"


class StoreUnavailableError(StorageError):
    """The store stayed unreachable past the bounded retries; a later attempt may well succeed.

    The runner exits ``ExitCode.STORE_UNAVAILABLE``; the operator reschedules it as a disruption.
    """

    code = "STORAGE_UNAVAILABLE_001"


class StoreConfigError(StorageError):
    """The store is misconfigured (malformed DSN, authentication failed, database missing).

    Retrying cannot help: the runner exits ``ExitCode.FAILED`` and the operator reports
    ``InvalidStore``. The message names the problem, never the credentials.
    """

    code = "STORAGE_CONFIG_001"


class ToolError(AgentRunError):
    """A tool call failed and the run config says tool errors fail the run (``fail_on_tool_error``).

    The class constants are also the codes of a failed call in ``last_tool_error``
    (a timed-out call has ``NodeTimeoutError.TOOL``).
    """

    code = "TOOL_ERROR_001"
    RAISED = "TOOL_ERROR_001"  # the tool raised
    ARGUMENTS = "TOOL_ERROR_002"  # the model's arguments do not fit the tool
    UNKNOWN = "TOOL_ERROR_003"  # the model called a tool the node does not have

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool


class ThreadStateError(AgentRunError):
    """The thread is not in a state that allows the requested call (e.g. resume a finished run)."""

    code = "THREAD_STATE_001"


class ThreadNotFoundError(ThreadStateError):
    """``agentrun state``/``stop`` of a thread the store does not know."""

    code = "THREAD_NOT_FOUND_001"


class DeterminismError(AgentRunError):
    """A ledger entry recorded for this call id belongs to a different tool.

    Returning it would hand one tool's result to another; the replay is not
    the same program that recorded it.
    """

    code = "LEDGER_DETERMINISM_001"


class ModelError(AgentRunError):
    """A model endpoint failed (HTTP error, bad response, timeout).

    The class constants are the codes the model adapters (``agentrun.models``) raise it with; a
    provider's own error with no better match keeps ``code``.
    """

    code = "MODEL_ERROR_001"
    HTTP = "MODEL_HTTP_001"  # an HTTP error status, with the status and the provider's message
    TIMEOUT = "MODEL_TIMEOUT_001"  # the request's own timeout, below the node's
    CONNECTION = "MODEL_CONNECTION_001"  # no HTTP response
    RESPONSE = "MODEL_RESPONSE_001"  # a body that is not a chat completion
    CONFIG = "MODEL_CONFIG_001"  # the adapter's configuration cannot be used (an unreadable key file)


class RunStopped(AgentRunError):
    """Raised to the caller of ``ainvoke``/``astream`` when the run ended on a stop request.

    The stopped state is already persisted when this is raised.
    """

    code = "RUN_STOPPED_001"

    def __init__(self, thread_id: str, *, node: str | None, version: int, reason: str = "") -> None:
        super().__init__(f"thread {thread_id!r} stopped at node {node!r} (version {version}) {reason}".strip())
        self.thread_id = thread_id
        self.node = node
        self.version = version
        self.reason = reason


class RunPreempted(AgentRunError):
    """Raised to the caller when the run was preempted (SIGTERM): it stopped at a safe point.

    The thread stays resumable: its status is still ``running`` and the next
    process resumes it from ``current_node``.
    """

    code = "RUN_PREEMPTED_001"


class Preempted(BaseException):
    """Internal: delivered into a node to cancel it because the process must go away."""


class StopRequested(BaseException):
    """Internal: delivered into a node to end it because a stop was requested."""


class GraphInterrupt(BaseException):
    """Internal: a node or tool called ``interrupt()`` and the run must pause.

    ``BaseException`` so that tools wrapping their body in ``except Exception``
    still pause instead of turning the pause into an error message.
    """

    def __init__(self, interrupts: list[Any]) -> None:
        super().__init__(interrupts)
        self.interrupts = interrupts
