"""The runner pod (``python -m agentrun.runner``) against a store that goes away or is misconfigured.

Guarantees: a PostgreSQL restart in the middle of a run is ridden out (exit
0, no recorded tool call executed again, no false ``StaleStateError``); a
store down for longer than ``AGENTRUN_STORE_RETRY_SECONDS`` ends the attempt
with exit 8 (a disruption, not a crash) and a later attempt finishes the run;
a misconfigured store (malformed DSN, wrong password, missing database) exits
5 at once with a ``STORAGE_CONFIG_001`` line, and the password appears in no
output. The termination message is one "CODE: message" line, and it is the
last stderr line too (what a kubelet shows with ``FallbackToLogsOnError``).

RESTARTS POSTGRESQL: the outage tests stop and start a *private* server
(``private_postgres``: initdb in a temp dir, ``pg_ctl`` as the Debian cluster
scripts use it), never the shared one other tests run against.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from agentrun.contract import Env, ExitCode
from agentrun_dev.servers import PrivatePostgres, free_port
from tests.conftest import ROOT

from .helpers import fetch, fetchval, invocations, wait_until

THREAD = "default/order-4821"
INPUT = '{"messages": [{"role": "user", "content": "charge my saved card for order 4821 and email me the receipt"}]}'
PASSWORD = "S3cret-pw-9f1c"


def pod_env(subprocess_env: dict[str, str], tmp_path: Path, dsn: str, **extra: str) -> dict[str, str]:
    return {
        **subprocess_env,
        Env.GRAPH: "examples.support_agent:app",
        Env.THREAD_ID: THREAD,
        Env.RUN_NAME: "order-4821",
        Env.RUN_UID: "uid-1",
        Env.ATTEMPT: "1",
        Env.INPUT: INPUT,
        Env.POSTGRES_DSN: dsn,
        Env.METRICS_PORT: "0",
        Env.TERMINATION_LOG: str(tmp_path / "termination-log"),
        **extra,
    }


async def start(env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrun.runner",
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(proc: asyncio.subprocess.Process, within: float = 120) -> tuple[int, str, str]:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def termination_message(env: dict[str, str]) -> str:
    return Path(env[Env.TERMINATION_LOG]).read_text()


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


async def side_effects_started(dsn: str) -> None:
    """Both side-effect tools recorded their intents: they are inside their calls now."""

    async def started() -> bool:
        try:
            count = await fetchval(dsn, "SELECT count(*) FROM tool_intents WHERE thread_id = $1", THREAD)
        except asyncpg.UndefinedTableError:
            return False  # the runner has not created the schema yet
        return bool(count == 2)

    await wait_until(started, within=60, what="the side-effect tools to start")


# -- outages: RESTART a private PostgreSQL ---------------------------------------------------------


async def test_a_postgres_restart_mid_run_is_ridden_out_without_re_executing_a_tool(
    private_postgres: PrivatePostgres, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """RESTARTS a private PostgreSQL while both side-effect tools run; they finish while it is down."""
    dsn = private_postgres.dsn
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    proc = await start(pod_env(subprocess_env, tmp_path, dsn, SUPPORT_TOOL_DELAY="1.5"))
    try:
        await side_effects_started(dsn)
        began = time.monotonic()
        await asyncio.to_thread(private_postgres.stop)
        await asyncio.sleep(3)  # the tools return meanwhile: their ledger records meet the outage
        await asyncio.to_thread(private_postgres.start)
        restart = time.monotonic() - began
    finally:
        if private_postgres.data.joinpath("postmaster.pid").exists() is False:
            await asyncio.to_thread(private_postgres.start)
    code, _, err = await finish(proc)
    print(f"PostgreSQL was down for {restart:.1f}s (stop -m fast, 3 s, start); runner exit {code}")
    assert code == ExitCode.COMPLETED, f"GUARANTEE BROKEN: a store restart must not fail the run\n{err}"
    assert "PostgreSQL unavailable during" in err and "PostgreSQL reachable again" in err, err
    assert "STORAGE_CONFLICT_001" not in err and "StaleStateError" not in err, f"a false conflict on retry\n{err}"
    assert "could not be recorded" not in err, f"a ledger record was lost to the outage\n{err}"
    assert (invocations(effects, "charge_card"), invocations(effects, "send_receipt")) == (1, 1), (
        "GUARANTEE BROKEN: a tool ran again after the restart"
    )
    assert await fetchval(dsn, "SELECT count(*) FROM tool_executions WHERE thread_id = $1", THREAD) == 3
    rows = await fetch(dsn, "SELECT status FROM states WHERE thread_id = $1 ORDER BY version DESC LIMIT 1", THREAD)
    assert rows[0]["status"] == "completed"


async def test_postgres_down_past_the_retry_bound_exits_8_and_the_next_attempt_finishes(
    private_postgres: PrivatePostgres, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """STOPS a private PostgreSQL for longer than AGENTRUN_STORE_RETRY_SECONDS, then starts it again."""
    dsn = private_postgres.dsn
    effects = subprocess_env["SUPPORT_EFFECTS_DB"]
    env = pod_env(subprocess_env, tmp_path, dsn, SUPPORT_TOOL_DELAY="1", **{Env.STORE_RETRY_SECONDS: "3"})
    proc = await start(env)
    try:
        await side_effects_started(dsn)
        await asyncio.to_thread(private_postgres.stop)
        began = time.monotonic()
        code, _, err = await finish(proc, within=60)
        waited = time.monotonic() - began
    finally:
        await asyncio.to_thread(private_postgres.start)
    assert code == ExitCode.STORE_UNAVAILABLE, f"a store outage must end the attempt as a disruption (8)\n{err}"
    assert waited < 30, f"the runner waited {waited:.0f}s for a 3 s retry bound"
    termination = termination_message(env)
    assert termination.startswith("STORAGE_UNAVAILABLE_001: ") and "\n" not in termination, termination
    assert last_line(err) == termination, "the last stderr line must be the termination message, unprefixed"

    code, _, err = await finish(await start({**env, Env.ATTEMPT: "2"}))
    assert code == ExitCode.COMPLETED, err
    assert _charges(effects) == 1, "GUARANTEE BROKEN: the card was charged twice"


def _charges(effects: str) -> int:
    from examples.support_agent import count_effects

    return count_effects(effects)["charges"]


# -- configuration errors: exit 5 at once, no secret anywhere -----------------------------------


@pytest.fixture
def password_postgres() -> PrivatePostgres:
    """A private PostgreSQL where role ``app`` must log in over TCP with ``PASSWORD`` (scram)."""
    server = PrivatePostgres()
    try:
        server.init()
        hba = server.data / "pg_hba.conf"
        rules = hba.read_text()
        hba.write_text("host all app 127.0.0.1/32 scram-sha-256\n" + rules)
        server.start()
        server.sql(f"CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'")
    except BaseException:
        server.destroy()
        raise
    return server


async def run_to_exit(env: dict[str, str], within: float = 30) -> tuple[int, str, str, float]:
    began = time.monotonic()
    code, out, err = await finish(await start(env), within=within)
    return code, out, err, time.monotonic() - began


@pytest.mark.parametrize("problem", ["malformed DSN", "wrong password", "missing database"])
async def test_a_misconfigured_store_fails_at_once_with_storage_config_001_and_never_shows_the_password(
    problem: str, subprocess_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if problem == "malformed DSN":
        dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:notaport/agentrun"
    elif problem == "missing database":
        dsn = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/agentrun_no_such_database"
    else:
        server: PrivatePostgres = request.getfixturevalue("password_postgres")
        request.addfinalizer(server.destroy)
        dsn = f"postgresql://app:wrong-{PASSWORD}@127.0.0.1:{server.port}/postgres"
    env = pod_env(subprocess_env, tmp_path, dsn)
    code, out, err, took = await run_to_exit(env)
    termination = termination_message(env)
    assert code == ExitCode.FAILED, f"{problem}: a configuration error is not a crash or an outage\n{err}"
    # Retried, it would take the store's 60 s retry bound; the bound leaves room for the process's start.
    assert took < 30, f"{problem}: took {took:.0f}s; a configuration error must not be retried"
    assert termination.startswith("STORAGE_CONFIG_001: "), termination
    assert last_line(err) == termination, "the last stderr line must be the termination message, unprefixed"
    for where, text in (("stdout", out), ("stderr", err), ("termination message", termination)):
        assert PASSWORD not in text, f"SECRET LEAKED: the password appears in the {where}"
        assert dsn not in text, f"SECRET LEAKED: the DSN appears in the {where}"
    print(f"{problem}: exit {code} in {took:.1f}s: {termination}")


async def test_an_unreachable_store_is_an_outage_not_a_configuration_error(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:{free_port()}/agentrun"  # nothing listens: connection refused
    env = pod_env(subprocess_env, tmp_path, dsn, **{Env.STORE_RETRY_SECONDS: "1"})
    code, out, err, _ = await run_to_exit(env)
    termination = termination_message(env)
    assert code == ExitCode.STORE_UNAVAILABLE, err
    assert termination.startswith("STORAGE_UNAVAILABLE_001: ") and PASSWORD not in out + err + termination
