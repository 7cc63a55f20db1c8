"""Two processes writing one thread at once: each version has exactly one writer and nothing committed is lost."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agentrun.checkpoint.postgres import PgCheckpointer

from .helpers import drive, fetch, fetchval

WRITES = 60


async def test_two_processes_racing_on_one_thread_each_version_has_one_writer_and_no_commit_is_lost(
    pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    setup = PgCheckpointer(pg_dsn)
    await setup.setup()  # migrate once, so both racers start writing at the same moment
    await setup.aclose()
    start_at = f"{time.time() + 1.5:.3f}"
    runs = await asyncio.gather(
        *(
            drive(
                subprocess_env,
                [sys.executable, "-m", "tests.postgres.workers", "race", pg_dsn, "t", name, str(WRITES), start_at],
            )
            for name in ("a", "b")
        )
    )
    for run in runs:
        assert run.returncode == 0, str(run)
    results = {name: json.loads(run.stdout.strip().splitlines()[-1]) for name, run in zip("ab", runs, strict=True)}

    versions = {name: [v for v, _ in r["committed"]] for name, r in results.items()}
    assert not set(versions["a"]) & set(versions["b"]), "GUARANTEE BROKEN: two processes committed the same version"
    assert sorted(versions["a"] + versions["b"]) == list(range(1, 2 * WRITES + 1)), "versions must be gapless"
    conflicts = results["a"]["conflicts"] + results["b"]["conflicts"]
    assert conflicts, "the racers never collided; the test proved nothing (start them closer together)"
    assert all(actual > expected for expected, actual in conflicts), conflicts

    # Nothing a winner wrote is lost: each committed version's row is that writer's, and its message
    # sits at the index it wrote, in the thread's final message list.
    rows = {
        r["version"]: r["content"]
        for r in await fetch(pg_dsn, "SELECT version, meta->>'content' AS content FROM states WHERE thread_id = 't'")
    }
    messages = [
        r["content"]
        for r in await fetch(
            pg_dsn, "SELECT body->>'content' AS content FROM messages WHERE thread_id = 't' ORDER BY idx"
        )
    ]
    for result in results.values():
        for version, content in result["committed"]:
            assert rows[version] == content, f"version {version} does not hold what its committer wrote"
            assert messages[version - 1] == content, f"the message committed at version {version} was lost"
    assert len(messages) == 2 * WRITES
    assert (
        await fetchval(
            pg_dsn,
            "SELECT count(*) FROM pg_indexes WHERE schemaname = 'agentrun' AND tablename = 'states' "
            "AND indexdef LIKE 'CREATE UNIQUE INDEX % ON agentrun.states USING btree (thread_id, version)'",
        )
        == 1
    ), "the UNIQUE (thread_id, version) index is missing"
