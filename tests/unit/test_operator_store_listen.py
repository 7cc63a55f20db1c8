"""Where the operator LISTENs for a store's progress (``decide.storeconfig.listen_plan``): never through a pooler.

Guarantees: a store Secret whose ``postgresDsn`` goes through PgBouncer in transaction mode
(``agentrun_pooler=transaction``) is listened to on its ``postgresListenDsn`` (a direct DSN), or not at
all; a ``postgresListenDsn`` that is itself pooled, or no PostgreSQL URL, fails ``InvalidStore`` with a
message that quotes no password; the operator never hands agentrun's own URL parameters to asyncpg.
"""

from __future__ import annotations

import pytest

from agentrun_operator.decide.reasons import Reason
from agentrun_operator.decide.storeconfig import ListenPlan, StoreConfig, StoreProblem, listen_plan

POOLED = "postgresql://agentrun:Pw-Secret-1@pgbouncer:6432/agentrun?agentrun_pooler=transaction"
DIRECT = "postgresql://agentrun:Pw-Secret-1@postgres:5432/agentrun?sslmode=require"


def _listen_dsn(dsn: str, direct: str | None, redis_url: str | None) -> str | None:
    plan = listen_plan("shop", "s", StoreConfig(dsn, redis_url, direct))
    assert isinstance(plan, ListenPlan), plan
    return plan.dsn


def test_a_pooled_store_is_listened_to_on_its_direct_dsn_or_not_at_all() -> None:
    assert _listen_dsn(POOLED, DIRECT, None) == DIRECT
    assert _listen_dsn(POOLED, None, "redis://r:6379/0") is None
    assert _listen_dsn(POOLED, None, None) is None


def test_a_direct_store_is_listened_to_on_its_own_dsn_without_agentrun_parameters() -> None:
    assert _listen_dsn(DIRECT, None, None) == DIRECT
    off = "postgresql://agentrun@postgres:5432/agentrun?agentrun_listen=off"
    assert _listen_dsn(off, None, None) == "postgresql://agentrun@postgres:5432/agentrun"


@pytest.mark.parametrize("listen", [POOLED, "redis://agentrun:Pw-Secret-1@r:6379/0", DIRECT + "&agentrun_x=1"])
def test_a_listen_dsn_that_is_pooled_or_no_postgres_url_fails_invalid_store(listen: str) -> None:
    problem = listen_plan("shop", "s", StoreConfig(POOLED, None, listen))
    assert isinstance(problem, StoreProblem), problem
    assert problem.reason == Reason.INVALID_STORE and "postgresListenDsn" in problem.message, problem
    assert "Pw-Secret-1" not in problem.message, "the password leaked into the status message"
