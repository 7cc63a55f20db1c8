"""Pure nodes computed ahead (``agentrun.ahead``): nothing of step N+1 escapes before step N is durable.

The child (``tests.postgres.drive_pure``) runs a chain of pure nodes ``n0..n7`` on PostgreSQL (alone and
behind the Redis hot cache) or SQLite;
each node also appends its name to a probe file, so the test counts how often each was computed. Guarantees:

- SIGKILLed at ``ahead_of_checkpoint:n3`` (n3's update computed while n2's checkpoint write is in flight):
  n3 was computed, yet no event of n2 or n3 reached the caller and no checkpoint past n2's step exists;
  a resume in a new process ends in the uninterrupted run's state;
- a check that acts before the node (here a preemption asked for on n2's event, after n3 was computed
  ahead) drops the held update: the checkpoint holds nothing of n3, and the resume computes it again.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun.checkpoint import Checkpointer
from agentrun.checkpoint.base import Checkpoint
from tests.conftest import ROOT
from tests.postgres.conftest import redis_url
from tests.postgres.drive_pure import NODES, open_store
from tests.postgres.helpers import server_done_with_the_dead

THREAD = "default/pure-ahead"
REFERENCE = list(range(NODES))  # what an uninterrupted run ends with


@dataclass(frozen=True)
class Store:
    """Where the child runs: a PostgreSQL DSN or ``sqlite:PATH``, with Redis (the hot cache) or not."""

    spec: str
    redis: str | None = None
    prefix: str = "agentrun"

    def args(self) -> list[str]:
        return [] if self.redis is None else ["--redis", self.redis, "--redis-prefix", self.prefix]

    def open(self) -> Checkpointer:
        return open_store(self.spec, redis=self.redis, redis_prefix=self.prefix)


def run_child(
    env: dict[str, str], store: Store, probe: Path, *args: str, fault: str | None = None
) -> tuple[int, str, str]:
    child_env = dict(env, AGENTRUN_FAULT_POINT=fault) if fault else env
    done = subprocess.run(
        [sys.executable, "-m", "tests.postgres.drive_pure", store.spec, THREAD, str(probe), *store.args(), *args],
        env=child_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def steps(stdout: str) -> list[str]:
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("STEP ")]


def computed(probe: Path) -> Counter[str]:
    return Counter(probe.read_text().split()) if probe.exists() else Counter()


async def server_done_with_the_dead_child(store: Store) -> None:
    """``server_done_with_the_dead`` for a PostgreSQL store; a SQLite child's writes die with its process."""
    if not store.spec.startswith("sqlite:"):
        await server_done_with_the_dead(store.spec)


async def latest(store: Store) -> Checkpoint:
    checkpointer = store.open()
    await checkpointer.setup()
    try:
        checkpoint = await checkpointer.aget(THREAD)
    finally:
        await checkpointer.aclose()
    assert checkpoint is not None
    return checkpoint


async def resume_to_the_end(env: dict[str, str], store: Store, probe: Path) -> list[str]:
    code, stdout, stderr = await asyncio.to_thread(run_child, env, store, probe)
    assert code == 0, f"the resume failed ({code}):\n{stdout}\n{stderr}"
    final = [line for line in stdout.splitlines() if line.startswith("FINAL ")]
    assert final == [f"FINAL {REFERENCE}"], (
        f"GUARANTEE BROKEN: the resumed run did not end in the uninterrupted run's state: {final}"
    )
    return steps(stdout)


@pytest.fixture(params=["postgres", "cached", "sqlite"])
def store(request: pytest.FixtureRequest, pg_dsn: str, tmp_path: Path) -> Store:
    if request.param == "sqlite":
        return Store(f"sqlite:{tmp_path / 'store.db'}")
    if request.param == "cached":
        return Store(pg_dsn, redis_url(), request.getfixturevalue("redis_prefix"))
    return Store(pg_dsn)


async def test_a_sigkill_with_the_next_step_computed_releases_nothing_of_it(
    store: Store, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    probe = tmp_path / "computed"
    code, stdout, stderr = await asyncio.to_thread(
        run_child, subprocess_env, store, probe, "--start", fault="ahead_of_checkpoint:n3"
    )
    assert code == -signal.SIGKILL, f"the child was to die at ahead_of_checkpoint:n3 ({code}):\n{stdout}\n{stderr}"
    assert "AGENTRUN-FAULT ahead_of_checkpoint:n3" in stderr
    assert computed(probe) == Counter(["n0", "n1", "n2", "n3"]), "n3 was to be computed, each node once"
    assert steps(stdout) == ["n0", "n1"], (
        f"GUARANTEE BROKEN: an event reached the caller before its step was durable: {steps(stdout)}"
    )
    await server_done_with_the_dead_child(store)
    checkpoint = await latest(store)
    # n2's write was in flight: committed or not, but nothing of n3 (whose step would name n4 next).
    assert checkpoint.current_node in ("n2", "n3"), (
        f"GUARANTEE BROKEN: a checkpoint past n2's step exists (next node {checkpoint.current_node})"
    )
    assert checkpoint.values["items"] == list(range(checkpoint.step))

    resumed = await resume_to_the_end(subprocess_env, store, probe)
    assert resumed == [f"n{i}" for i in range(checkpoint.step, NODES)]
    counts = computed(probe)
    assert counts["n3"] == 2, "n3 computed ahead before the kill, then once more by the resume"
    assert all(counts[f"n{i}"] == 1 for i in (0, 1, 4, 5, 6, 7)), counts


async def test_a_check_that_acts_before_the_node_drops_its_held_update(
    store: Store, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    probe = tmp_path / "computed"
    code, stdout, stderr = await asyncio.to_thread(
        run_child, subprocess_env, store, probe, "--start", "--preempt-after", "n2"
    )
    assert code == 6, f"the child was to end preempted ({code}):\n{stdout}\n{stderr}"
    assert steps(stdout) == ["n0", "n1", "n2"]
    assert computed(probe)["n3"] == 1, "n3 was to be computed ahead, during n2's checkpoint"
    checkpoint = await latest(store)
    assert (checkpoint.current_node, checkpoint.values["items"]) == ("n3", [0, 1, 2]), (
        f"GUARANTEE BROKEN: the preempted run kept a dropped update: {checkpoint.current_node} "
        f"{checkpoint.values['items']}"
    )

    resumed = await resume_to_the_end(subprocess_env, store, probe)
    assert resumed == [f"n{i}" for i in range(3, NODES)]
    assert computed(probe)["n3"] == 2
