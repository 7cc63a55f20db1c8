"""A run's store Secret and the store's failures as the operator reads them (decide.storeconfig), pure.

Guarantees: Secret data in, a usable store or a problem with its status reason out (a missing Secret, a
missing key, bad base64 and a URL that is no PostgreSQL one each say which, and what to fix); a failed store
call is ``InvalidStore`` only when no retry can help; no message quotes a DSN, a URL or a password.
"""

from __future__ import annotations

import base64

import pytest

from agentrun.errors import StoreConfigError, StoreUnavailableError
from agentrun_operator.decide.decision import StoreProblem
from agentrun_operator.decide.reasons import Reason
from agentrun_operator.decide.storeconfig import (
    ListenPlan,
    StoreConfig,
    explain,
    listen_plan,
    not_a_store_url,
    store_config,
)

PASSWORD = "Pw-Secret-1"
DSN = f"postgresql://agentrun:{PASSWORD}@db:5432/agentrun"
POOLED = f"postgresql://agentrun:{PASSWORD}@pgbouncer:6432/agentrun?agentrun_pooler=transaction"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("data", "local", "reason", "says"),
    [
        (None, False, Reason.STORE_SECRET_NOT_FOUND, "shop/store does not exist"),
        ({}, False, Reason.STORE_SECRET_INVALID, "has no key postgresDsn"),
        ({"redisUrl": b64("redis://r:6379/0")}, False, Reason.STORE_SECRET_INVALID, "has no key postgresDsn"),
        ({"postgresDsn": "%%%not base64"}, False, Reason.STORE_SECRET_INVALID, "not valid base64 text"),
        ({"postgresDsn": b64(f"mysql://u:{PASSWORD}@h/d")}, False, Reason.INVALID_STORE, "not a postgresql:// URL"),
        ({"postgresDsn": b64("sqlite:///tmp/x.db")}, False, Reason.INVALID_STORE, "not a postgresql:// URL"),
        ({"postgresDsn": b64("/tmp/x.db")}, True, Reason.INVALID_STORE, "not a postgresql:// URL"),
    ],
)
def test_an_unusable_store_secret_is_a_problem_naming_its_reason_and_never_the_password(
    data: dict[str, str] | None, local: bool, reason: Reason, says: str
) -> None:
    problem = store_config("shop", "store", data, local_stores=local)
    assert isinstance(problem, StoreProblem), problem
    assert problem.reason is reason and says in problem.message, problem
    assert PASSWORD not in problem.message, "the password leaked into the status message"


def test_a_usable_secret_is_its_decoded_keys_and_a_local_sqlite_store_only_where_allowed() -> None:
    data = {"postgresDsn": b64(DSN), "redisUrl": b64("redis://r:6379/0"), "postgresListenDsn": b64(DSN)}
    assert store_config("shop", "store", data) == StoreConfig(DSN, "redis://r:6379/0", DSN, local=False)
    local = store_config("shop", "store", {"postgresDsn": b64("sqlite:///tmp/x.db")}, local_stores=True)
    assert local == StoreConfig("sqlite:///tmp/x.db", local=True)
    assert listen_plan("shop", "store", local) == ListenPlan(None), "SQLite cannot be listened to"


def test_a_pooled_store_without_a_direct_dsn_is_not_listened_to_and_says_how_progress_arrives() -> None:
    plan = listen_plan("shop", "store", StoreConfig(POOLED, "redis://r:6379/0"))
    assert isinstance(plan, ListenPlan) and plan.dsn is None and "Redis pub/sub" in plan.note
    assert PASSWORD not in plan.note
    direct = listen_plan("shop", "store", StoreConfig(POOLED, None, DSN))
    assert direct == ListenPlan(DSN)
    refused = listen_plan("shop", "store", StoreConfig(POOLED, None, POOLED))
    assert isinstance(refused, StoreProblem) and refused.reason is Reason.INVALID_STORE
    assert "postgresListenDsn" in refused.message and PASSWORD not in refused.message


def test_a_dsn_the_store_factory_refuses_is_invalid_store_without_its_credentials() -> None:
    config = StoreConfig(f"postgresql://u:{PASSWORD}@h/d?agentrun_x=1")
    problem = not_a_store_url("shop", "store", config, ValueError(f"unknown parameter in {config.dsn}"))
    assert problem.reason is Reason.INVALID_STORE and problem.message.startswith(StoreConfigError.code)
    assert PASSWORD not in problem.message and "shop/store" in problem.message


class InvalidCatalogNameError(Exception):
    """asyncpg's, by name: decide/ never imports asyncpg."""


def _wrapped(inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as e:
            raise RuntimeError("pool failed") from e
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    ("error", "config"),
    [
        (StoreConfigError(f"malformed PostgreSQL DSN: {DSN}"), True),
        (_wrapped(InvalidCatalogNameError('database "agentrun" does not exist')), True),
        (StoreUnavailableError(f"down; dsn {DSN}"), False),
        (ConnectionRefusedError(f"connect to {DSN} refused"), False),
        (_wrapped(TimeoutError("no answer")), False),
    ],
)
def test_a_failed_store_call_is_invalid_store_only_when_no_retry_helps(error: Exception, config: bool) -> None:
    explained = explain("shop", "store", error, [DSN, PASSWORD])
    if config:
        assert isinstance(explained, StoreProblem) and explained.reason is Reason.INVALID_STORE, explained
        assert explained.message.startswith(f"{StoreConfigError.code}: ") and "shop/store" in explained.message
        text = explained.message
    else:
        assert isinstance(explained, str) and explained.split(":")[0] == StoreUnavailableError.code, explained
        text = explained
    assert PASSWORD not in text and DSN not in text, "a credential leaked into the status"
