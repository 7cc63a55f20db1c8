"""agentrun's parameters in a store URL (``checkpoint.pg_url``): what a pooled DSN turns off, and typos refused."""

from __future__ import annotations

import pytest

from agentrun.checkpoint import from_url, listen_dsn
from agentrun.checkpoint.pg_url import TRANSACTION, parse_store_url
from agentrun.checkpoint.postgres import PgCheckpointer


def test_a_transaction_pooler_url_keeps_no_session_state_and_asyncpg_never_sees_the_parameter() -> None:
    store = from_url("postgresql://u:pw@pgbouncer:6432/app?sslmode=disable&agentrun_pooler=transaction")
    assert isinstance(store, PgCheckpointer)
    assert store.dsn == "postgresql://u:pw@pgbouncer:6432/app?sslmode=disable"
    assert store.pooler == TRANSACTION and not store.listen_for_stops, "LISTEN cannot pass a transaction pooler"
    assert store._pool_kwargs["statement_cache_size"] == 0, "a named prepared statement would outlive its transaction"
    # PgBouncer refuses any startup parameter it does not track: the others travel as SET LOCAL.
    assert store._pool_kwargs["server_settings"] == {"application_name": "agentrun"}
    assert store._begin.startswith("BEGIN; SET LOCAL search_path = 'agentrun'; SET LOCAL lock_timeout = ")


def test_a_direct_url_keeps_its_session_settings_and_listens() -> None:
    store = from_url("postgresql://u@db/app?agentrun_pooler=session")
    assert isinstance(store, PgCheckpointer) and store.pooler is None and store.listen_for_stops
    assert store._begin == "BEGIN" and "search_path" in store._pool_kwargs["server_settings"]
    assert "statement_cache_size" not in store._pool_kwargs


def test_where_the_operator_may_listen() -> None:
    assert listen_dsn("postgresql://u@db/app?agentrun_pooler=transaction") is None
    assert listen_dsn("postgresql://u@db/app?agentrun_listen=off") == "postgresql://u@db/app"
    assert listen_dsn("postgresql://u@db/app?agentrun_pooler=none&x=1") == "postgresql://u@db/app?x=1"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://db/app?agentrun_pooler=statement", "agentrun_pooler"),
        ("postgresql://db/app?agentrun_poolr=transaction", "unknown store URL parameter 'agentrun_poolr'"),
        ("postgresql://db/app?agentrun_listen=maybe", "agentrun_listen"),
        ("postgresql://db/app?agentrun_ledger_window_ms=fast", "agentrun_ledger_window_ms"),
        ("postgresql://db/app?agentrun_ledger_window_ms=-1", "from 0 to 1000"),
        ("postgresql://db/app?agentrun_ledger_window_ms=5000", "from 0 to 1000"),
        ("postgresql://db/app?agentrun_ledger_window_ms=nan", "from 0 to 1000"),
    ],
)
def test_an_unknown_agentrun_parameter_or_value_is_refused(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        from_url(url)


def test_parameters_come_out_wherever_they_stand() -> None:
    parsed = parse_store_url("postgresql://db/app?agentrun_listen=off&agentrun_pooler=transaction#frag")
    assert (parsed.dsn, parsed.pooler, parsed.listen) == ("postgresql://db/app#frag", TRANSACTION, False)
    with pytest.raises(ValueError, match="pooler"):
        PgCheckpointer("postgresql://db/app", pooler="statement")


def test_the_ledger_group_window_is_2_ms_by_default_and_set_in_the_url_or_the_constructor() -> None:
    assert PgCheckpointer("postgresql://db/app").ledger_group_window == 0.002
    store = from_url("postgresql://db/app?agentrun_ledger_window_ms=5&sslmode=disable")
    assert isinstance(store, PgCheckpointer) and store.ledger_group_window == 0.005
    assert store.dsn == "postgresql://db/app?sslmode=disable", "asyncpg must never see agentrun's parameter"
    assert from_url("postgresql://db/app?agentrun_ledger_window_ms=0").ledger_group_window == 0, "0 turns it off"
    assert (
        PgCheckpointer("postgresql://db/app?agentrun_ledger_window_ms=5", ledger_group_window=0.01).ledger_group_window
        == 0.01
    )
