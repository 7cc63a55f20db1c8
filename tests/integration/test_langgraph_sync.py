"""A sync LangGraph program on ``AgentrunSaver`` with a SQLite store, each way a user sets the saver up (issue 31).

Guarantee protected: ``saver.setup()`` from sync code, ``asyncio.run(saver.setup())``
(how LangGraph's async savers are set up), ``with AgentrunSaver.from_url(...)``,
``asyncio.run(saver.asetup())`` and no setup at all each run the program on a
fresh SQLite file: two turns, and a replay answered from the ledger. Before,
skipping setup failed with ``no such table: lg_checkpoints``. Each program runs
in a new process: the bug is about event loops, and a test's own loop would
hide it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.drive_langgraph_sync import EXPECTED, run_program


@pytest.mark.parametrize("setup", ["setup", "asyncio-run-setup", "with", "asyncio-run-asetup", "none"])
def test_a_sync_langgraph_program_runs_on_a_fresh_sqlite_file_whichever_way_it_sets_the_saver_up(
    setup: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    done, final = run_program(subprocess_env, f"sqlite:///{tmp_path / 'agentrun.db'}", setup)
    assert done.returncode == 0 and final == EXPECTED, (
        f"GUARANTEE BROKEN: a sync program that sets the saver up with {setup!r} did not run on SQLite "
        f"(exit {done.returncode}, printed {final}):\n{done.stderr[-3000:]}"
    )
    assert "never awaited" not in done.stderr, done.stderr[-3000:]
