"""PostgreSQL going away mid-run, on a private server the test stops and starts with pg_ctl.

The step that cannot reach the database fails cleanly (``StorageError``, no
partial version), and a resumed run completes without charging twice: the
in-doubt policy re-runs only the calls whose results were not recorded, with
the same idempotency key.
"""

from __future__ import annotations

import asyncio

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.contract import Env
from agentrun_dev.servers import PrivatePostgres
from examples.support_agent import count_effects

from .helpers import REQUEST, drive, driver_args, fetch, fetchval, finish, invocations, spawn, wait_for_line, wait_until

EXIT_STORAGE = 9


async def side_effects_started(dsn: str) -> None:
    """Both side-effect tools of thread ``t`` recorded their intents: they are inside their calls now."""

    async def started() -> bool:
        return bool(await fetchval(dsn, "SELECT count(*) FROM tool_intents WHERE thread_id = 't'") == 2)

    await wait_until(started, what="the side-effect tools to start")


async def test_postgres_down_during_a_step_fails_it_cleanly_and_the_resumed_run_charges_once(
    private_postgres: PrivatePostgres, subprocess_env: dict[str, str]
) -> None:
    dsn = private_postgres.dsn
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    reference = await drive(
        dict(subprocess_env, SUPPORT_EFFECTS_DB=effects + ".ref"), driver_args(dsn, "reference", text=REQUEST)
    )
    assert reference.returncode == 0, str(reference)

    # A short retry bound: the outage outlasts it, so the step fails (StoreUnavailableError is a StorageError).
    env = dict(subprocess_env, SUPPORT_TOOL_DELAY="1.5", **{Env.STORE_RETRY_SECONDS: "2"})
    run = await spawn(env, driver_args(dsn, "t", text=REQUEST, attempt=1))
    try:
        await wait_for_line(run, "STEP model")

        await side_effects_started(dsn)
        private_postgres.stop()  # the tools are sleeping; their records and the step's checkpoint cannot land
        failed = await finish(run)
    finally:
        if run.returncode is None:
            run.kill()
            await run.wait()
    assert failed.returncode == EXIT_STORAGE, f"the step must fail with StorageError when PostgreSQL is gone\n{failed}"
    assert "COMPLETED but could not be recorded" in failed.stderr, "the lost ledger records must be reported"
    assert count_effects(effects)["charges"] == 1

    private_postgres.start()
    states = [
        (r["version"], r["current_node"], r["status"])
        for r in await fetch(
            dsn, "SELECT version, current_node, status FROM states WHERE thread_id = 't' ORDER BY version"
        )
    ]
    assert states == [(1, "model", "running"), (2, "tools", "running")], f"a partial step landed: {states}"

    resumed = await drive(subprocess_env, driver_args(dsn, "t", attempt=2))
    assert resumed.returncode == 0, str(resumed)
    assert resumed.final() == reference.final(), "the resumed run did not reach the uninterrupted run's state"
    counts = count_effects(effects)
    assert (counts["charges"], counts["receipts"]) == (1, 1), f"GUARANTEE BROKEN: duplicate side effect {counts}"
    # The calls whose results were lost re-ran once, under the same idempotency key (the documented window).
    assert (invocations(effects, "charge_card"), invocations(effects, "send_receipt")) == (2, 2)


async def test_postgres_restarted_between_statements_the_run_continues_on_new_connections(
    private_postgres: PrivatePostgres, subprocess_env: dict[str, str]
) -> None:
    dsn = private_postgres.dsn
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    run = await spawn(dict(subprocess_env, SUPPORT_TOOL_DELAY="2"), driver_args(dsn, "t", text=REQUEST, attempt=1))
    try:
        await wait_for_line(run, "STEP model")

        await side_effects_started(dsn)
        await asyncio.to_thread(private_postgres.stop)
        await asyncio.to_thread(private_postgres.start)  # back before the tools return
        done = await finish(run)
    finally:
        if run.returncode is None:
            run.kill()
            await run.wait()
    assert done.returncode == 0, f"a restart while no statement ran must not fail the run\n{done}"
    assert "COMPLETED but could not be recorded" not in done.stderr
    assert (invocations(effects, "charge_card"), invocations(effects, "send_receipt")) == (1, 1)
    assert await fetchval(dsn, "SELECT count(*) FROM tool_executions WHERE thread_id = 't'") == 3


async def test_ledger_records_sent_while_the_server_shuts_down_all_land_after_the_restart(
    private_postgres: PrivatePostgres,
) -> None:
    """Idle pooled connections get the server's goodbye during a fast shutdown; a record sent on one of them
    (asyncpg: "cannot switch to state 12; another operation (2) is in progress") is retried like any lost
    connection, never dropped as "COMPLETED but could not be recorded" (found by the fault campaign, make chaos)."""
    store = PgCheckpointer(private_postgres.dsn)
    await store.setup()
    try:
        await store.register_attempt("t", 1, run_uid="u")
        # Warm several pool connections, so idle ones are there when the server goes away.
        await asyncio.gather(*(store.ledger_put("t", f"warm{i}", "x", i, attempt=1, run_uid="u") for i in range(8)))
        outcomes: dict[int, str] = {}

        async def record(i: int) -> None:
            await asyncio.sleep(i * 0.01)
            try:
                await store.ledger_put("t", f"k{i}", "x", i, attempt=1, run_uid="u")
                outcomes[i] = "recorded"
            except Exception as e:  # the failure is what the test reports
                outcomes[i] = f"{type(e).__name__}: {e}"

        calls = [asyncio.create_task(record(i)) for i in range(40)]
        await asyncio.to_thread(private_postgres.stop)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(private_postgres.start)
        await asyncio.gather(*calls)
    finally:
        await store.aclose()
    failures = {i: outcome for i, outcome in outcomes.items() if outcome != "recorded"}
    assert not failures, f"GUARANTEE BROKEN: ledger records lost across a PostgreSQL restart: {failures}"
    assert await fetchval(private_postgres.dsn, "SELECT count(*) FROM agentrun.tool_executions") == 48
