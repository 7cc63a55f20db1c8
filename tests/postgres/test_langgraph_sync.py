"""A sync LangGraph program on ``AgentrunSaver`` with a PostgreSQL store, each way a user sets the saver up (issue 31).

Guarantee protected: ``saver.setup()`` from sync code, ``asyncio.run(saver.setup())``
(how LangGraph's async savers are set up; before, ``invoke`` then failed with
``RuntimeError: Event loop is closed``), ``with AgentrunSaver.from_url(...)`` and
no setup at all each run the program on a fresh database: two turns, and a
replay answered from the ledger. A program that set the store up in a loop it
closed (``asyncio.run(saver.asetup())``) is told what to call instead, not
"Event loop is closed". Each program runs in a new process: the bug is about
event loops, and a test's own loop would hide it.
"""

from __future__ import annotations

import pytest

from tests.support.drive_langgraph_sync import EXPECTED, run_program


@pytest.mark.parametrize("setup", ["setup", "asyncio-run-setup", "with", "none"])
def test_a_sync_langgraph_program_runs_on_a_fresh_postgres_database_whichever_way_it_sets_the_saver_up(
    setup: str, pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    done, final = run_program(subprocess_env, pg_dsn, setup)
    assert done.returncode == 0 and final == EXPECTED, (
        f"GUARANTEE BROKEN: a sync program that sets the saver up with {setup!r} did not run on PostgreSQL "
        f"(exit {done.returncode}, printed {final}):\n{done.stderr[-3000:]}"
    )
    assert "never awaited" not in done.stderr, done.stderr[-3000:]


def test_a_sync_program_whose_postgres_store_was_set_up_in_a_closed_loop_is_told_what_to_call_instead(
    pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    done, final = run_program(subprocess_env, pg_dsn, "asyncio-run-asetup")
    assert done.returncode != 0 and final is None, "a store whose connections' loop closed cannot have run the graph"
    last = done.stderr.strip().splitlines()[-1]
    assert "set up in an event loop that has closed since" in last and "call saver.setup()" in last, (
        f"the error must say why and what to call instead, not only 'Event loop is closed':\n{done.stderr[-3000:]}"
    )
