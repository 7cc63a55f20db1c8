"""The operator's view of run stores: one ControlStore per store Secret, read for progress, written for stops.

An AgentRun names its store by Secret (``spec.store.secretRef``, keys
``postgresDsn`` and optional ``redisUrl``). The operator reads that Secret
in the run's namespace (RBAC: ``get`` on secrets, nothing more) and keeps
one connection pool per Secret version. Credentials never leave this module:
not in logs, not in status, not in events.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass

from agentrun import checkpoint
from agentrun.checkpoint.base import ControlStore

from ..decide.decision import StoreProblem
from ..decide.reasons import Reason
from .kube import KubeClient, NotFound, secret_path

log = logging.getLogger("agentrun_operator.store")


def open_store(dsn: str, redis_url: str | None) -> ControlStore:
    """The one place the operator constructs a store (from a store Secret's keys): the runner's factory."""
    return checkpoint.open_store(dsn, redis_url=redis_url)


class StoreUnavailable(Exception):
    """The Secret is missing or unusable; ``problem`` says why, as a status reason and message."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.problem = StoreProblem(reason=reason, message=message)


@dataclass
class _Entry:
    version: str
    checkpointer: ControlStore


class StoreRegistry:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._stores: dict[tuple[str, str], _Entry] = {}

    async def get(self, namespace: str, secret: str) -> ControlStore:
        try:
            body = await self.kube.get(secret_path(namespace, secret))
        except NotFound:
            raise StoreUnavailable(
                Reason.STORE_SECRET_NOT_FOUND, f"store secret {namespace}/{secret} does not exist"
            ) from None
        version = str(body.get("metadata", {}).get("resourceVersion", ""))
        key = (namespace, secret)
        entry = self._stores.get(key)
        if entry is not None and entry.version == version:
            return entry.checkpointer
        data = body.get("data") or {}
        if "postgresDsn" not in data:
            raise StoreUnavailable(
                Reason.STORE_SECRET_INVALID, f"store secret {namespace}/{secret} has no key postgresDsn"
            )
        try:
            dsn = base64.b64decode(data["postgresDsn"]).decode()
            redis_url = base64.b64decode(data["redisUrl"]).decode() if data.get("redisUrl") else None
        except ValueError:
            raise StoreUnavailable(
                Reason.STORE_SECRET_INVALID, f"store secret {namespace}/{secret} is not valid base64 text"
            ) from None
        checkpointer = open_store(dsn, redis_url)
        if entry is not None:
            await entry.checkpointer.aclose()
        self._stores[key] = _Entry(version, checkpointer)
        log.info("store for secret %s/%s opened (secret version %s)", namespace, secret, version)
        return checkpointer

    async def close(self) -> None:
        for entry in self._stores.values():
            await entry.checkpointer.aclose()
        self._stores.clear()
