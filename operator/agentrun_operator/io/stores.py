"""The operator's view of run stores: one ControlStore per store Secret, read for progress, written for stops.

An AgentRun names its store by Secret (``spec.store.secretRef``, keys
``postgresDsn`` and optional ``redisUrl``). The operator reads that Secret
in the run's namespace (RBAC: ``get`` on secrets, nothing more) and keeps
one connection pool per Secret version. Credentials never leave this module:
not in logs, not in status, not in events.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

from agentrun import checkpoint
from agentrun.checkpoint.base import ControlStore
from agentrun.errors import AgentRunError, StoreConfigError, StoreUnavailableError

from ..decide.decision import StoreProblem
from ..decide.reasons import Reason
from .kube import KubeClient, NotFound, secret_path

log = logging.getLogger("agentrun_operator.store")


# The operator's own store calls retry for this long at most (the runner's bound is a minute): a reconcile
# holds its run's lock meanwhile, and an outage shows as StoreAvailable=False rather than a stalled loop.
RETRY_SECONDS = 2.0
# asyncpg errors that no retry fixes, should one escape the store's own classification (by class name, so
# this module does not import asyncpg).
_CONFIG_ERRORS = frozenset(
    {
        "InvalidPasswordError",
        "InvalidAuthorizationSpecificationError",
        "InvalidCatalogNameError",
        "ClientConfigurationError",
    }
)


def open_store(dsn: str, redis_url: str | None) -> ControlStore:
    """The one place the operator constructs a store (from a store Secret's keys): the runner's factory."""
    return checkpoint.open_store(dsn, redis_url=redis_url, retry_timeout=RETRY_SECONDS)


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` without any of ``secrets`` (the DSN, the URL, their passwords), whatever quoted them."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _sensitive(*urls: str | None) -> list[str]:
    found: list[str] = []
    for url in urls:
        if not url:
            continue
        found.append(url)
        with contextlib.suppress(ValueError):
            password = urlsplit(url).password
            if password and len(password) >= 3:  # shorter would blank out ordinary words
                found += [password, unquote(password), quote(unquote(password), safe="")]
        found += [m.group(1) for m in re.finditer(r"password=([^&\s]+)", url) if len(m.group(1)) >= 3]
    return found


class StoreUnavailable(Exception):
    """The Secret is missing or unusable; ``problem`` says why, as a status reason and message."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.problem = StoreProblem(reason=reason, message=message)


@dataclass
class _Entry:
    version: str
    checkpointer: ControlStore
    secrets: list[str] = field(default_factory=list)  # what no message may quote


# A store URL one machine shares (settings.local_stores: agentrun-dev's single-machine cluster).
LOCAL_STORE = "sqlite:///"


class StoreRegistry:
    # Set from settings.local_stores: a sqlite:/// postgresDsn is accepted too.
    local_stores = False

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
        local = self.local_stores and dsn.startswith(LOCAL_STORE)
        if not dsn.startswith(("postgresql://", "postgres://")) and not local:
            # The factory would take a bare string for a SQLite path: no pod on another node could share it.
            raise StoreUnavailable(
                Reason.INVALID_STORE,
                f"{StoreConfigError.code}: store secret {namespace}/{secret}: postgresDsn is not a postgresql:// URL",
            )
        try:
            checkpointer = open_store(dsn, redis_url)
        except ValueError as e:  # an unknown scheme; the factory's message names the scheme only
            raise StoreUnavailable(
                Reason.INVALID_STORE,
                f"{StoreConfigError.code}: store secret {namespace}/{secret}: postgresDsn is not a store URL "
                f"({redact(str(e), _sensitive(dsn, redis_url))})",
            ) from None
        if entry is not None:
            await entry.checkpointer.aclose()
        self._stores[key] = _Entry(version, checkpointer, _sensitive(dsn, redis_url))
        log.info("store for secret %s/%s opened (secret version %s)", namespace, secret, version)
        return checkpointer

    def explain(self, namespace: str, secret: str, error: BaseException) -> StoreProblem | str:
        """A failed store call as ``InvalidStore`` (configuration: no retry helps) or the outage's cause (str).

        Neither quotes the DSN or a password.
        """
        entry = self._stores.get((namespace, secret))
        secrets = entry.secrets if entry is not None else []
        chain: list[BaseException] = []
        cause: BaseException | None = error
        while cause is not None and cause not in chain and len(chain) < 10:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        if isinstance(error, StoreConfigError) or any(type(e).__name__ in _CONFIG_ERRORS for e in chain):
            text = error.args[0] if isinstance(error, StoreConfigError) and error.args else type(error).__name__
            detail = redact(" ".join(str(text).split()), secrets)
            return StoreProblem(
                Reason.INVALID_STORE, f"{StoreConfigError.code}: {detail} (store secret {namespace}/{secret})"
            )
        code = getattr(error, "code", None) or StoreUnavailableError.code
        text = error.args[0] if isinstance(error, AgentRunError) and error.args else f"{type(error).__name__}: {error}"
        return f"{code}: " + redact(" ".join(str(text).split()), secrets)[:500]

    async def close(self) -> None:
        for entry in self._stores.values():
            await entry.checkpointer.aclose()
        self._stores.clear()
