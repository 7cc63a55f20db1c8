"""The pod contract between the operator and the runner: one home for what two processes share.

The operator starts one runner pod per attempt and talks to it only through
environment variables (in), the store, and the exit code plus termination
log (out). Both sides import this module; nothing else spells an
``AGENTRUN_*`` name or an exit code as a literal, so the two cannot drift.

- ``ExitCode``: what the runner's exit status means (DESIGN.md section 3).
- ``Env``: the environment variable names, one per ``RunnerInputs`` field
  plus the two store variables that arrive by ``secretKeyRef``.
- ``RunnerInputs``: the typed inputs; the operator renders them into the pod
  with ``to_env()``, the runner reads them back with ``from_environ()``.
- ``RunConfigSpec``: the run config on the wire (``spec.config``, the JSON of
  ``AGENTRUN_CONFIG``): the CRD's camelCase keys, each the alias of the
  ``config.RunConfig`` field it sets. The operator validates ``spec.config``
  with it and the runner maps its keys with it; a unit test checks the CRD's
  schema and ``RunConfig`` against it.

HAZARD: a rename here is a protocol change between an operator and runner
images of another version. Add fields with defaults; never repurpose a code.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENV_PREFIX = "AGENTRUN_"


class ExitCode(enum.IntEnum):
    """The runner's exit status, and what the operator does with it."""

    COMPLETED = 0  # phase Succeeded
    CRASH = 1  # any code not listed here is a crash too: rescheduled with backoff, counted as a restart
    USAGE = 2  # the CLI only: bad arguments, unknown thread, bad JSON
    INTERRUPTED = 3  # phase Interrupted: waiting for spec.resume
    STOPPED = 4  # phase Stopped
    FAILED = 5  # phase Failed, no retry: bad graph, bad input, recursion limit, a node raising
    PREEMPTED = 6  # SIGTERM, reached a safe point, checkpointed: rescheduled as a disruption
    # Another attempt or another AgentRun owns the thread; this pod did nothing. The operator only
    # ever classifies the current attempt's pod, and the current attempt is the run's newest, so
    # for it FENCED means another AgentRun claimed the thread: phase Failed, reason Superseded.
    FENCED = 7
    # The store stayed unreachable past the runner's bounded retries (StoreUnavailableError): rescheduled
    # with backoff as a disruption; Failed StoreUnavailable only after storeUnavailableTimeoutSeconds.
    STORE_UNAVAILABLE = 8

    @property
    def on_purpose(self) -> str | None:
        """Why this exit is no failure, for a pod that ended on purpose (a kubelet shows it as ``Error``)."""
        return _ON_PURPOSE.get(self)

    @classmethod
    def describe(cls, code: int | None) -> str:
        """``"exit 7 (FENCED)"``; a code outside the table reads as a crash."""
        if code is None:
            return "no exit code"
        try:
            return f"exit {code} ({cls(code).name})"
        except ValueError:
            return f"exit {code} (crash)"


# Appended to the termination message of a pod that ended on purpose: ``kubectl get pods`` shows any
# non-zero exit as Error, ``kubectl describe pod`` shows this message with it.
_ON_PURPOSE: dict[ExitCode, str] = {
    ExitCode.INTERRUPTED: "exit 3 is no failure: the run waits for spec.resume, a new pod resumes it",
    ExitCode.STOPPED: "exit 4 is no failure: the run was stopped on request",
    ExitCode.PREEMPTED: "exit 6 is no failure: checkpointed after SIGTERM, a new pod resumes the run",
    ExitCode.FENCED: "exit 7: this pod wrote nothing, a newer attempt or another AgentRun owns the thread",
}


class Env(enum.StrEnum):
    """The runner's environment variable names."""

    GRAPH = "AGENTRUN_GRAPH"
    THREAD_ID = "AGENTRUN_THREAD_ID"
    RUN_NAME = "AGENTRUN_RUN_NAME"
    RUN_UID = "AGENTRUN_RUN_UID"
    USER_ID = "AGENTRUN_USER_ID"
    ATTEMPT = "AGENTRUN_ATTEMPT"
    CONFIG = "AGENTRUN_CONFIG"
    INPUT = "AGENTRUN_INPUT"
    RESUME = "AGENTRUN_RESUME"
    REQUEST_KEY = "AGENTRUN_REQUEST_KEY"
    INPUTS_IN_STORE = "AGENTRUN_INPUTS_IN_STORE"
    TAKE_OVER_FROM = "AGENTRUN_TAKE_OVER_FROM"
    METRICS_PORT = "AGENTRUN_METRICS_PORT"
    # From the store Secret by secretKeyRef, never inline (keys in STORE_SECRET_KEYS).
    POSTGRES_DSN = "AGENTRUN_POSTGRES_DSN"
    REDIS_URL = "AGENTRUN_REDIS_URL"
    # Local use only (the CLI, demos): a store URL such as sqlite:///agentrun.db.
    STORE = "AGENTRUN_STORE"
    PREEMPT_FINISH_SECONDS = "AGENTRUN_PREEMPT_FINISH_SECONDS"
    STORE_RETRY_SECONDS = "AGENTRUN_STORE_RETRY_SECONDS"
    LOG_FORMAT = "AGENTRUN_LOG_FORMAT"
    TERMINATION_LOG = "AGENTRUN_TERMINATION_LOG"
    # Crash tests only (agentrun.faults); the one AGENTRUN_ variable a user may set in podTemplate.
    FAULT_POINT = "AGENTRUN_FAULT_POINT"


# Store Secret key -> the variable it fills in the runner pod.
STORE_SECRET_KEYS: dict[Env, str] = {Env.POSTGRES_DSN: "postgresDsn", Env.REDIS_URL: "redisUrl"}
POSTGRES_DSN_KEY, REDIS_URL_KEY = STORE_SECRET_KEYS[Env.POSTGRES_DSN], STORE_SECRET_KEYS[Env.REDIS_URL]
# Optional, never in a runner pod: a direct DSN of the same database, on which the operator (and the
# history server) LISTEN for progress when postgresDsn goes through a pooler in transaction mode
# (agentrun_pooler=transaction), where LISTEN cannot work. Without it such a store's progress reaches the
# operator by Redis pub/sub (redisUrl), pod events and the resync.
POSTGRES_LISTEN_DSN_KEY = "postgresListenDsn"
# Every key the operator reads from a store Secret.
OPERATOR_STORE_KEYS = (*STORE_SECRET_KEYS.values(), POSTGRES_LISTEN_DSN_KEY)

# The AgentRun resource (crds/agentrun.dev_agentruns.yaml): the operator, the kubectl plugin and the
# history server address it by these.
GROUP, VERSION, PLURAL, KIND = "agentrun.dev", "v1alpha1", "agentruns", "AgentRun"
API_VERSION = f"{GROUP}/{VERSION}"
# The variables the operator never sets inline (they come from the Secret) or never sets at all.
_NOT_RENDERED = {
    "postgres_dsn",
    "redis_url",
    "store",
    "termination_log",
    "log_format",
    "preempt_finish_seconds",
    "store_retry_seconds",
}


class RunConfigSpec(BaseModel):
    """``spec.config``: the run's deadlines, durability, recursion limit and tool-error policy.

    Each field is named as ``config.RunConfig``'s and aliased by the CRD's camelCase key; unset fields
    are left out of ``AGENTRUN_CONFIG`` so the runtime's defaults apply (``None`` for the timeouts here).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    tool_timeout: float | None = Field(default=None, ge=0, alias="toolTimeoutSeconds")
    node_timeout: float | None = Field(default=None, ge=0, alias="nodeTimeoutSeconds")
    durable_checkpoint_every_step: bool = Field(default=True, alias="durableCheckpointEveryStep")
    # config.DEFAULT_RECURSION_LIMIT (a unit test holds them equal: this module imports nothing of the runtime)
    recursion_limit: int = Field(default=50, ge=1, le=10000, alias="recursionLimit")
    # A failed tool call fails the run (exit 5, ToolError.RAISED, reason ToolError) instead of becoming a
    # tool error message for the model (LangGraph ToolNode's default, and ours).
    fail_on_tool_error: bool = Field(default=False, alias="failOnToolError")

    def wire(self) -> dict[str, Any]:
        """The camelCase keys the user set, as ``AGENTRUN_CONFIG`` carries them."""
        return self.model_dump(by_alias=True, exclude_unset=True)


# A wire key (the CRD's camelCase) -> the ``RunConfig`` field it sets.
RUN_CONFIG_KEYS: dict[str, str] = {info.alias or name: name for name, info in RunConfigSpec.model_fields.items()}


class InvalidEnvironment(ValueError):
    """The pod's ``AGENTRUN_*`` variables do not make ``RunnerInputs``; the message names each variable."""


# The fields ``to_env`` renders as JSON: the object-valued ones.
JSON_FIELDS = frozenset({"config", "input", "resume"})


class RunnerInputs(BaseModel):
    """What the operator tells one runner attempt; each field is the variable ``AGENTRUN_<FIELD>``."""

    model_config = ConfigDict(extra="ignore")

    graph: str
    thread_id: str  # namespace-qualified: <namespace>/<threadId>
    run_name: str = ""
    run_uid: str = ""  # marks the turn in the store and scopes fencing to the AgentRun
    user_id: str | None = None
    attempt: int = 1  # registered for fencing
    config: dict[str, Any] = {}  # the run config: CRD camelCase keys or snake_case
    input: dict[str, Any] | None = None  # starts a new turn
    resume: dict[str, Any] | None = None  # {"value": v} or {"values": {interrupt_id: v}}
    # The turn's identity on the thread (spec.requestId, or derived from the run and its input):
    # a request that already completed is not run again, one in progress is resumed.
    request_key: str = ""
    # True: input and resume are not in the environment (Linux caps one variable at 128 KiB) but in
    # the store, written by the operator before it created the pod, keyed by (thread, run uid, attempt).
    inputs_in_store: bool = False
    # The uid of a deleted AgentRun whose unfinished turn this run may close before it starts its own: the
    # operator sets it only once that run's AgentRun and pods are gone (decide.thread.orphaned_turn).
    take_over_from: str = ""
    postgres_dsn: str | None = None
    redis_url: str | None = None
    store: str | None = None
    metrics_port: int = 9090  # 0 = off
    preempt_finish_seconds: float = 5.0  # after SIGTERM, how long the current node may finish
    # How long the store may be unreachable before the runner exits STORE_UNAVAILABLE (a disruption).
    store_retry_seconds: float = 60.0
    log_format: str = "text"
    termination_log: str = "/dev/termination-log"

    def to_env(self) -> list[dict[str, str]]:
        """The inline ``env`` entries of the runner container (store credentials excluded)."""
        env: list[dict[str, str]] = []
        for field in type(self).model_fields:
            value = getattr(self, field)
            if field in _NOT_RENDERED or (not value and field in ("user_id", "resume", "take_over_from")):
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, dict) or value is None:
                text = json.dumps(value)
            else:
                text = str(value)
            env.append({"name": env_name(field).value, "value": text})
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Self:
        """The inverse of ``to_env``: the inputs in ``environ``; ``InvalidEnvironment`` naming every bad variable.

        Read by hand rather than with pydantic-settings: that package costs every pod ~16 ms of imports
        before its first step, for reading a dozen variables whose format this module defines.
        """
        values: dict[str, Any] = {}
        problems = []
        for field in cls.model_fields:
            name = ENV_PREFIX + field.upper()
            if name not in environ:
                continue
            text = environ[name]
            if field in JSON_FIELDS:
                try:
                    values[field] = json.loads(text)
                except ValueError as e:
                    problems.append(f"{name}: not valid JSON ({e})")
                    continue
            else:
                values[field] = text
        try:
            inputs = cls.model_validate(values)
        except ValidationError as e:
            problems += [f"{ENV_PREFIX}{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}" for err in e.errors()]
            raise InvalidEnvironment("; ".join(problems)) from None
        if problems:
            raise InvalidEnvironment("; ".join(problems))
        return inputs


def env_name(field: str) -> Env:
    """The variable of a ``RunnerInputs`` field."""
    return Env(ENV_PREFIX + field.upper())
