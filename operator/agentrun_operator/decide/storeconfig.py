"""A run's store Secret, and the store's failures, as the operator reads them (pure).

Secret data in (its keys as the watch-fed cache keeps them, still base64), a ``StoreConfig`` or a
``StoreProblem`` (a status reason and a message for people) out; a failed store call in, ``InvalidStore``
(configuration: no retry helps) or the outage's cause out. The keys (contract.py): ``postgresDsn``,
optional ``redisUrl`` and ``postgresListenDsn`` (a direct DSN for the progress LISTEN when ``postgresDsn``
goes through a pooler in transaction mode). No message quotes a DSN, a URL or a password (``redact``):
they go to status and Events, which anyone who may read the run reads. ``io/stores.py`` opens the
pools and listeners these decide on.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from agentrun.checkpoint.pg_url import listen_dsn
from agentrun.contract import POSTGRES_DSN_KEY, POSTGRES_LISTEN_DSN_KEY, REDIS_URL_KEY
from agentrun.errors import AgentRunError, StoreConfigError, StoreUnavailableError

from .decision import StoreProblem
from .reasons import Reason

# A store URL one machine shares (settings.local_stores: agentrun-dev's single-machine cluster).
LOCAL_STORE = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
# asyncpg errors that no retry fixes, should one escape the store's own classification (by class name, so
# decide/ does not import asyncpg).
CONFIG_ERRORS = frozenset(
    {
        "InvalidPasswordError",
        "InvalidAuthorizationSpecificationError",
        "InvalidCatalogNameError",
        "ClientConfigurationError",
    }
)
POOLED = "it goes through a transaction pooler"
CAUSE_LIMIT = 500


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` without any of ``secrets`` (the DSN, the URL, their passwords), whatever quoted them."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def sensitive(*urls: str | None) -> list[str]:
    """What no message may quote of ``urls``: each URL and its password, as written, decoded and encoded."""
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


@dataclass(frozen=True)
class StoreConfig:
    """A usable store Secret: the DSN, the Redis URL and the direct LISTEN DSN (decoded)."""

    dsn: str
    redis_url: str | None = None
    listen_dsn: str | None = None  # postgresListenDsn as the Secret gives it
    local: bool = False  # a sqlite:/// store of a single-machine cluster: nothing to LISTEN on

    @property
    def secrets(self) -> list[str]:
        """What no message about this store may quote."""
        return sensitive(self.dsn, self.redis_url, self.listen_dsn)


@dataclass(frozen=True)
class ListenPlan:
    """Where the operator LISTENs for the store's progress (``dsn`` None: nowhere) and, if nowhere, why."""

    dsn: str | None
    note: str = ""  # for the log when there is no LISTEN


def _invalid(namespace: str, secret: str, what: str) -> StoreProblem:
    return StoreProblem(Reason.INVALID_STORE, f"{StoreConfigError.code}: store secret {namespace}/{secret}: {what}")


def store_config(
    namespace: str, secret: str, data: Mapping[str, str] | None, *, local_stores: bool = False
) -> StoreConfig | StoreProblem:
    """The store Secret ``namespace/secret`` as a ``StoreConfig``, or why it cannot be used.

    ``data``: the Secret's store keys, base64 (None: the Secret does not exist). ``local_stores``: a
    ``sqlite:///`` postgresDsn is accepted too (a single-machine cluster); otherwise only PostgreSQL URLs,
    since the factory would take a bare string for a SQLite path that no pod on another node could share.
    """
    if data is None:
        return StoreProblem(Reason.STORE_SECRET_NOT_FOUND, f"store secret {namespace}/{secret} does not exist")
    if POSTGRES_DSN_KEY not in data:
        return StoreProblem(
            Reason.STORE_SECRET_INVALID, f"store secret {namespace}/{secret} has no key {POSTGRES_DSN_KEY}"
        )
    try:
        dsn = base64.b64decode(data[POSTGRES_DSN_KEY]).decode()
        redis_url = base64.b64decode(data[REDIS_URL_KEY]).decode() if data.get(REDIS_URL_KEY) else None
        direct = base64.b64decode(data[POSTGRES_LISTEN_DSN_KEY]).decode() if data.get(POSTGRES_LISTEN_DSN_KEY) else None
    except ValueError:
        return StoreProblem(Reason.STORE_SECRET_INVALID, f"store secret {namespace}/{secret} is not valid base64 text")
    local = local_stores and dsn.startswith(LOCAL_STORE)
    if not dsn.startswith(POSTGRES_SCHEMES) and not local:
        return _invalid(namespace, secret, "postgresDsn is not a postgresql:// URL")
    return StoreConfig(dsn, redis_url, direct, local)


def not_a_store_url(namespace: str, secret: str, config: StoreConfig, error: ValueError) -> StoreProblem:
    """The store factory refused the DSN (an unknown scheme or parameter; its message names no credential)."""
    return _invalid(namespace, secret, f"postgresDsn is not a store URL ({redact(str(error), config.secrets)})")


def listen_plan(namespace: str, secret: str, config: StoreConfig) -> ListenPlan | StoreProblem:
    """Where to LISTEN for the store's progress: ``postgresListenDsn``, else ``postgresDsn`` unless pooled.

    A ``postgresListenDsn`` that is no direct PostgreSQL URL is ``InvalidStore`` (a LISTEN through a
    transaction pooler hears nothing). A malformed ``postgresDsn`` is left to the store's factory to name.
    """
    if config.local:
        return ListenPlan(None)  # SQLite cannot notify: the resync finds its progress
    direct = config.listen_dsn
    try:
        listen = listen_dsn(direct if direct is not None else config.dsn)
    except ValueError as e:
        listen, problem = None, redact(str(e), config.secrets)
    else:
        problem = POOLED if listen is None else ""
    if direct is not None and (problem or not direct.startswith(POSTGRES_SCHEMES)):
        return _invalid(
            namespace,
            secret,
            f"{POSTGRES_LISTEN_DSN_KEY} must be a direct postgresql:// URL ({problem or 'another scheme'})",
        )
    if listen is None and problem == POOLED:
        by = "Redis pub/sub" if config.redis_url else "(no redisUrl)"
        return ListenPlan(
            None,
            f"store of secret {namespace}/{secret}: no LISTEN (postgresDsn goes through a transaction pooler and the "
            f"Secret has no {POSTGRES_LISTEN_DSN_KEY}); its progress arrives by {by}, pod events and the resync",
        )
    return ListenPlan(listen)


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def explain(namespace: str, secret: str, error: BaseException, secrets: Sequence[str]) -> StoreProblem | str:
    """A failed store call as ``InvalidStore`` (configuration: no retry helps) or the outage's cause (str).

    A ``StoreConfigError``, or an authentication or catalogue error anywhere in its chain, is configuration;
    anything else is an outage, its cause prefixed with the error's code. Neither quotes ``secrets``.
    """
    if isinstance(error, StoreConfigError) or any(type(e).__name__ in CONFIG_ERRORS for e in _chain(error)):
        text = error.args[0] if isinstance(error, StoreConfigError) and error.args else type(error).__name__
        detail = redact(" ".join(str(text).split()), secrets)
        return StoreProblem(
            Reason.INVALID_STORE, f"{StoreConfigError.code}: {detail} (store secret {namespace}/{secret})"
        )
    code = getattr(error, "code", None) or StoreUnavailableError.code
    text = error.args[0] if isinstance(error, AgentRunError) and error.args else f"{type(error).__name__}: {error}"
    return f"{code}: " + redact(" ".join(str(text).split()), secrets)[:CAUSE_LIMIT]
