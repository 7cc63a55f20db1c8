"""Operator configuration: environment variables prefixed ``AGENTRUN_OPERATOR_`` (or flags in ``__main__``)."""

from __future__ import annotations

import json
import socket
from typing import Annotated, Any

from pydantic import field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class OperatorSettings(BaseSettings):
    """The operator's settings (``AGENTRUN_OPERATOR_*``, or the Helm chart's values through them)."""

    model_config = SettingsConfigDict(env_prefix="AGENTRUN_OPERATOR_", extra="ignore")

    # Namespaces to watch (comma-separated or JSON list); empty: the whole cluster.
    namespaces: Annotated[list[str], NoDecode] = []
    default_image: str = "ghcr.io/agentrun/agentrun:0.1.0"
    # Store secret used when an AgentRun names none (keys postgresDsn, redisUrl), looked up in the run's namespace.
    default_store_secret: str = "agentrun-store"
    # The runner command inside the image.
    runner_command: Annotated[list[str], NoDecode] = ["python", "-m", "agentrun.runner"]
    image_pull_policy: str = "IfNotPresent"
    log_format: str = "text"
    # The runner pods' log format (AGENTRUN_LOG_FORMAT in their environment): "text" or "json" (a JSON object
    # per line, with thread_id and attempt as fields); empty: the same as log_format.
    runner_log_format: str = ""
    metrics_port: int = 8080
    # Leader election (coordination.k8s.io Lease).
    leader_election: bool = True
    lease_name: str = "agentrun-operator"
    lease_namespace: str = "default"
    lease_duration_seconds: float = 15.0
    identity: str = socket.gethostname()
    # Run policy.
    # Event-driven: runs are reconciled on their own changes, their pods' watch events, their store's progress
    # (LISTEN/NOTIFY) and their due deadlines; this slow safety resync (jittered by ±25 %) catches anything missed.
    resync_interval_seconds: float = 30.0
    # A run waiting for a human (Interrupted, its interrupt recorded) changes only through its spec (a resume or a
    # stop: watch events), its pod's events, its thread's progress and its deadlines, each of which wakes it; the
    # safety resync visits it this rarely instead (10,000 waiting runs at 30 s cost 330 store reads a second).
    waiting_resync_interval_seconds: float = 600.0
    # At most this many reconciles at once (controller-runtime's MaxConcurrentReconciles). A new leader with
    # 10,000 runs otherwise starts all of them at once: 10,000 status patches in flight (the API server answers
    # none within the client's timeout, and every one is retried) and the memory of each held until the end.
    max_concurrent_reconciles: int = 32
    # Store progress wakes a run at most once per this many seconds (the status mirror's coalescing).
    progress_coalesce_seconds: float = 1.0
    # Objects per page of the initial listings (the API's limit/continue): a new leader decodes one page's
    # answer at a time, not every AgentRun and pod in one response (client-go's informers list 500 at a time).
    list_page_size: int = 500
    # A store's connection pool (and its LISTEN connection) is closed once no live run used it for this long.
    store_idle_seconds: float = 300.0
    stop_grace_seconds: float = 30.0
    pod_grace_seconds: int = 30
    lost_node_timeout_seconds: float = 60.0
    max_disruptions: int = 50
    max_backoff_seconds: float = 300.0
    runner_metrics_port: int = 9090
    # /healthz fails once the event loop's heartbeat is this late (io/health.py).
    liveness_timeout_seconds: float = 30.0
    # Debug hook, off (0) by default: this signal number blocks the event loop for debug_freeze_seconds,
    # as a blocking call in a coroutine would (the liveness test uses it; see io/health.py).
    debug_freeze_signal: int = 0
    debug_freeze_seconds: float = 10.0
    # Debug hook, off (0) by default: this signal number writes where the operator's memory is (RSS, objects by
    # type, and tracemalloc's top sites when PYTHONTRACEMALLOC is set) to debug_memory_path (io/memory.py).
    debug_memory_signal: int = 0
    debug_memory_path: str = "/tmp/agentrun-operator-memory.txt"
    # Runner container resources when spec.podTemplate.resources is absent (JSON: {"requests": ..., "limits": ...}),
    # so runner pods are not BestEffort (first evicted under node pressure). {} leaves them unset.
    runner_resources: dict[str, dict[str, str]] = {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    # Image prefixes spec.image must start with (comma-separated or JSON list), e.g.
    # "ghcr.io/acme/,registry.internal/agents/"; empty: any image (the default image is always allowed).
    allowed_image_prefixes: Annotated[list[str], NoDecode] = []
    # Accept a store Secret whose postgresDsn is a sqlite:/// URL: for a one-machine cluster only (agentrun-dev,
    # make cluster), where the operator and every runner share one filesystem. Off: PostgreSQL only.
    local_stores: bool = False

    @field_validator("namespaces", "runner_command", "allowed_image_prefixes", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value
