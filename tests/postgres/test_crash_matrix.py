"""The crash matrix: the support example on PostgreSQL, SIGKILLed at every fault point and at random times.

Each case runs ``examples/support_agent.py`` in a child process that dies
by a real SIGKILL (at a named fault point of ``agentrun.faults``, or after a
seeded random delay), then a second process does what a restarted pod does
(``--auto``: start if nothing was committed, else resume) and must:

- reach exactly the final state of an uninterrupted run (roles, contents,
  tool calls and results; not random ids);
- charge once and send one receipt (the provider tables, deduplicated by
  the idempotency key, are what the customer experiences);
- run every tool whose result was recorded before the kill exactly once in
  total, and re-run only the documented window: a call whose intent was
  recorded but whose result was not runs once more, with the same key;
  a call that had not started runs once.

Cases share one database (one thread each) and the tool delay stretches the
tool node so random kills land inside it often.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from examples.support_agent import count_effects

from .conftest import redis_url
from .helpers import (
    REQUEST,
    SIDE_EFFECT_TOOLS,
    Driven,
    driver_args,
    fetch,
    finish,
    invocations,
    server_done_with_the_dead,
    spawn,
    wait_for_line,
)

ROOT = Path(__file__).resolve().parents[2]
TOOL_DELAY = "0.2"
RANDOM_CASES = 20
SEED = 4821


def child_env(effects: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRUN_", "SUPPORT_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["SUPPORT_EFFECTS_DB"] = str(effects)
    env["SUPPORT_TOOL_DELAY"] = TOOL_DELAY
    return env


@dataclass(frozen=True)
class Reference:
    final: list[dict[str, Any]]
    # Seconds from READY (the run starts) to the process exiting: the span random kills sample.
    run_seconds: float


@pytest.fixture(scope="module")
def reference(module_pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """An uninterrupted run of the same request: the state every crashed-and-resumed run must reach."""
    env = child_env(tmp_path_factory.mktemp("reference") / "effects.db")
    process = subprocess.Popen(
        driver_args(module_pg_dsn, "reference", text=REQUEST),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("READY"), first
    started = time.monotonic()
    stdout, stderr = process.communicate(timeout=60)
    run_seconds = time.monotonic() - started
    driven = Driven(process.returncode, first + stdout, stderr)
    assert driven.returncode == 0, str(driven)
    return Reference(driven.final(), run_seconds)


@dataclass(frozen=True)
class Cache:
    """The Redis hot cache a case runs with; ``url`` None: PostgreSQL alone."""

    url: str | None
    prefix: str


@dataclass
class Recorded:
    """What PostgreSQL held for the thread right after the kill."""

    ledger: set[str]
    intents: set[str]


async def recorded(dsn: str, thread_id: str) -> Recorded:
    ledger = await fetch(dsn, "SELECT tool_name FROM tool_executions WHERE thread_id = $1", thread_id)
    intents = await fetch(dsn, "SELECT tool_name FROM tool_intents WHERE thread_id = $1", thread_id)
    return Recorded({r["tool_name"] for r in ledger}, {r["tool_name"] for r in intents})


async def resume_and_check(
    dsn: str, thread_id: str, effects: Path, reference: Reference, crashed: Driven, cache: Cache
) -> dict[str, tuple[int, int]]:
    """Resume in a new process and assert every guarantee; returns {tool: (runs before, runs after)}."""
    await server_done_with_the_dead(dsn)  # a record on the wire at the kill still commits: read after it
    at_kill = await recorded(dsn, thread_id)
    before = {tool: invocations(str(effects), tool) for tool in SIDE_EFFECT_TOOLS}
    resume = driver_args(dsn, thread_id, auto=REQUEST, redis=cache.url, redis_prefix=cache.prefix)
    resumed = await finish(await spawn(child_env(effects), resume))
    assert resumed.returncode == 0, f"the resume failed\n{resumed}\n--- crashed run ---\n{crashed}"
    assert resumed.final() == reference.final, "the resumed run did not reach the state of an uninterrupted run"

    counts = count_effects(str(effects))
    assert (counts["charges"], counts["receipts"]) == (1, 1), f"GUARANTEE BROKEN: duplicate side effect: {counts}"
    runs = {}
    for tool in SIDE_EFFECT_TOOLS:
        runs[tool] = (before[tool], invocations(str(effects), tool))
        was, now = runs[tool]
        if tool in at_kill.ledger:
            assert (was, now) == (1, 1), f"GUARANTEE BROKEN: {tool} was recorded before the kill but ran {now} times"
        elif tool in at_kill.intents:
            assert was in (0, 1) and now == was + 1, (
                f"{tool} was in doubt (started, not recorded): it must re-run exactly once, ran {was} then {now}"
            )
        else:
            assert (was, now) == (0, 1), f"{tool} had not started before the kill: it must run once, ran {was}/{now}"

    versions = [
        r["version"]
        for r in await fetch(dsn, "SELECT version FROM states WHERE thread_id = $1 ORDER BY version", thread_id)
    ]
    assert versions == list(range(1, len(versions) + 1)), f"versions are not gapless: {versions}"
    status = await fetch(dsn, "SELECT status FROM states WHERE thread_id = $1 ORDER BY version DESC LIMIT 1", thread_id)
    assert status[0]["status"] == "completed"
    return runs


# (fault point, charge_card runs before the resume, after it). None: not pinned (a sibling's timing).
NAMED = [
    # Inside the first checkpoint transaction: nothing committed, the retry starts from scratch.
    pytest.param("in_checkpoint_txn", (0, 1), id="in-first-checkpoint-txn"),
    pytest.param("before_checkpoint:model", (0, 1), id="model-done-not-checkpointed"),
    # Inside the transaction that commits the model's tool request (version 2).
    pytest.param("in_checkpoint_txn:2", (0, 1), id="in-tool-request-checkpoint-txn"),
    pytest.param("after_checkpoint:model", (0, 1), id="between-model-and-tools"),
    pytest.param("before_tool:charge_card", (0, 1), id="charge-intent-recorded-not-started"),
    # The documented window: the charge returned, its result was not recorded; it re-runs with the same key.
    pytest.param("after_tool:charge_card", (1, 2), id="charge-returned-not-recorded"),
    pytest.param("after_ledger_record:charge_card", (1, 1), id="charge-recorded"),
    pytest.param("after_tool:send_receipt", None, id="receipt-returned-not-recorded"),
    pytest.param("before_checkpoint:tools", (1, 1), id="tools-done-not-checkpointed"),
    # Inside the transaction that commits the tool results (version 3): the ledger has them all.
    pytest.param("in_checkpoint_txn:3", (1, 1), id="in-tool-results-checkpoint-txn"),
    pytest.param("after_checkpoint:tools", (1, 1), id="between-tools-and-model"),
]


@pytest.mark.parametrize(("fault", "charge_runs"), NAMED)
async def test_sigkill_at_a_fault_point_then_resume_reaches_the_same_state_and_charges_once(
    module_pg_dsn: str,
    module_redis_prefix: str,
    reference: Reference,
    tmp_path: Path,
    fault: str,
    charge_runs: tuple[int, int] | None,
) -> None:
    thread_id = f"fault-{fault.replace(':', '-')}"
    effects = tmp_path / "effects.db"
    # The production configuration: PostgreSQL with the Redis hot cache (the crash and the resume).
    cache = Cache(redis_url(), module_redis_prefix)
    crashed = await finish(
        await spawn(
            child_env(effects),
            driver_args(module_pg_dsn, thread_id, text=REQUEST, redis=cache.url, redis_prefix=cache.prefix),
            fault=fault,
        )
    )
    assert crashed.returncode == -signal.SIGKILL, f"the run was supposed to die by SIGKILL at {fault}\n{crashed}"
    assert f"AGENTRUN-FAULT {fault if ':' in fault else fault + ':'}" in crashed.stderr
    runs = await resume_and_check(module_pg_dsn, thread_id, effects, reference, crashed, cache)
    if charge_runs is not None:
        assert runs["charge_card"] == charge_runs, (
            f"charge_card ran {runs['charge_card']} (before, after the resume); expected {charge_runs}"
        )


def kill_delays() -> Iterator[Any]:
    rng = random.Random(SEED)
    for index in range(RANDOM_CASES):
        # Every other case with the Redis cache, so both configurations see random kills.
        yield pytest.param(rng.random(), index % 2 == 0, id=f"random-{index:02d}-{'cache' if index % 2 == 0 else 'pg'}")


@pytest.mark.parametrize(("fraction", "with_cache"), list(kill_delays()))
async def test_sigkill_at_a_seeded_random_time_then_resume_reaches_the_same_state_and_charges_once(
    module_pg_dsn: str,
    module_redis_prefix: str,
    reference: Reference,
    tmp_path: Path,
    fraction: float,
    with_cache: bool,
    request: pytest.FixtureRequest,
) -> None:
    thread_id = request.node.callspec.id
    effects = tmp_path / "effects.db"
    cache = Cache(redis_url() if with_cache else None, module_redis_prefix)
    process = await spawn(
        child_env(effects),
        driver_args(module_pg_dsn, thread_id, text=REQUEST, redis=cache.url, redis_prefix=cache.prefix),
    )
    lines = await wait_for_line(process, "READY")
    # Up to 10% past the reference duration, so some kills find the run already finished.
    await asyncio.sleep(fraction * reference.run_seconds * 1.1)
    if process.returncode is None:
        process.send_signal(signal.SIGKILL)
    crashed = await finish(process)
    crashed.stdout = "\n".join(lines) + "\n" + crashed.stdout
    assert crashed.returncode in (0, -signal.SIGKILL), f"the run failed on its own\n{crashed}"
    runs = await resume_and_check(module_pg_dsn, thread_id, effects, reference, crashed, cache)
    print(f"killed after {fraction * reference.run_seconds * 1.1:.3f}s: tool runs {runs}", file=sys.stderr)


async def test_sigkill_mid_turn_then_the_same_request_with_the_same_input_charges_once(
    module_pg_dsn: str, module_redis_prefix: str, reference: Reference, tmp_path: Path
) -> None:
    """A re-applied AgentRun after its pod died: a new run uid, the same request key and input, the same thread.

    It must resume the request's turn (not start a second one): the charge recorded
    before the kill replays, every side-effect tool body ran once in total, and the
    final state is that of one uninterrupted run.
    """
    thread_id = "same-request-again"
    effects = tmp_path / "effects.db"
    cache = Cache(redis_url(), module_redis_prefix)
    key = "default/support-4821/0123456789abcdef"
    first = driver_args(
        module_pg_dsn,
        thread_id,
        text=REQUEST,
        attempt=1,
        run_uid="uid-first",
        redis=cache.url,
        redis_prefix=cache.prefix,
        request_key=key,
    )
    crashed = await finish(await spawn(child_env(effects), first, fault="after_ledger_record:charge_card"))
    assert crashed.returncode == -signal.SIGKILL, f"the run was supposed to die by SIGKILL\n{crashed}"
    at_kill = await recorded(module_pg_dsn, thread_id)
    receipts_before = invocations(str(effects), "send_receipt")
    second = driver_args(
        module_pg_dsn,
        thread_id,
        text=REQUEST,
        attempt=1,
        run_uid="uid-second",
        redis=cache.url,
        redis_prefix=cache.prefix,
        request_key=key,
    )
    again = await finish(await spawn(child_env(effects), second))
    assert again.returncode == 0, f"the same request sent again failed\n{again}"
    assert "(charge_card) from the ledger; not executed again" in again.stderr, str(again)
    assert again.final() == reference.final, "the request sent again did not reach the state of one uninterrupted run"
    assert invocations(str(effects), "charge_card") == 1, "GUARANTEE BROKEN: the same request charged again"
    # The sibling runs in parallel: once in total, or once more (same idempotency key) if it was in doubt.
    in_doubt = "send_receipt" in at_kill.intents and "send_receipt" not in at_kill.ledger
    assert invocations(str(effects), "send_receipt") == receipts_before + (1 if in_doubt or not receipts_before else 0)
    assert (count_effects(str(effects))["charges"], count_effects(str(effects))["receipts"]) == (1, 1)
    turns = await fetch(module_pg_dsn, "SELECT status, run_uid FROM turns WHERE thread_id = $1", thread_id)
    assert [(r["status"], r["run_uid"]) for r in turns] == [("completed", "uid-second")]
