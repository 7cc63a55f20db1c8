"""Where the operator LISTENs for a store's progress (``io/stores.py``): never through a transaction pooler.

Guarantees: a store Secret whose ``postgresDsn`` goes through PgBouncer in transaction mode
(``agentrun_pooler=transaction``) is listened to on its ``postgresListenDsn`` (a direct DSN), or not at
all; a ``postgresListenDsn`` that is itself pooled, or no PostgreSQL URL, fails ``InvalidStore`` with a
message that quotes no password; the operator never hands agentrun's own URL parameters to asyncpg.
"""

from __future__ import annotations

import pytest

from agentrun_operator.decide.reasons import Reason
from agentrun_operator.io.stores import StoreRegistry, StoreUnavailable

POOLED = "postgresql://agentrun:Pw-Secret-1@pgbouncer:6432/agentrun?agentrun_pooler=transaction"
DIRECT = "postgresql://agentrun:Pw-Secret-1@postgres:5432/agentrun?sslmode=require"


def test_a_pooled_store_is_listened_to_on_its_direct_dsn_or_not_at_all() -> None:
    assert StoreRegistry._listen_dsn("shop", "s", POOLED, DIRECT, None) == DIRECT
    assert StoreRegistry._listen_dsn("shop", "s", POOLED, None, "redis://r:6379/0") is None
    assert StoreRegistry._listen_dsn("shop", "s", POOLED, None, None) is None


def test_a_direct_store_is_listened_to_on_its_own_dsn_without_agentrun_parameters() -> None:
    assert StoreRegistry._listen_dsn("shop", "s", DIRECT, None, None) == DIRECT
    off = "postgresql://agentrun@postgres:5432/agentrun?agentrun_listen=off"
    assert StoreRegistry._listen_dsn("shop", "s", off, None, None) == "postgresql://agentrun@postgres:5432/agentrun"


@pytest.mark.parametrize("listen", [POOLED, "redis://agentrun:Pw-Secret-1@r:6379/0", DIRECT + "&agentrun_x=1"])
def test_a_listen_dsn_that_is_pooled_or_no_postgres_url_fails_invalid_store(listen: str) -> None:
    with pytest.raises(StoreUnavailable) as caught:
        StoreRegistry._listen_dsn("shop", "s", POOLED, listen, None)
    problem = caught.value.problem
    assert problem.reason == Reason.INVALID_STORE and "postgresListenDsn" in problem.message, problem
    assert "Pw-Secret-1" not in problem.message, "the password leaked into the status message"
