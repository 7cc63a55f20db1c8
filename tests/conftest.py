"""Shared test configuration: tiers by directory, an event-loop leak guard, hermetic env.

Tiers (the marker is added from the directory, so a test cannot end up untiered):
- tests/unit:        pure, in-process, no services, no subprocesses.
- tests/integration: real SQLite files, real subprocesses and signals, local HTTP servers.
- tests/postgres:    the real PostgreSQL and Redis of this machine (own database / key prefix).
- tests/cluster:     the emulated Kubernetes cluster with the real kubectl (so are kubesim/tests,
                     the emulator's self-tests, which `make test` collects too).
- tests/node:        real containers: the images built here (podman) and a real node (kubelet, containerd).

A parameter may carry its own tier: the ``backend``/``checkpointer`` fixtures
(one store per test, once per backend listed in tests/support/checkpointers.py)
mark their PostgreSQL parameter ``postgres``, wherever the test lives.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrun.checkpoint import Checkpointer

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `examples` is importable from tests, as from the CLI in the repo root

# The store contract's tests live in a support module that two tiers collect (unit, and postgres with Redis):
# pytest rewrites their asserts as a test module's, so a failure shows its values.
pytest.register_assert_rewrite("tests.support.checkpointer_contract")
from agentrun_dev import ast_race  # noqa: E402
from agentrun_dev.databases import throwaway_database  # noqa: E402
from tests.support.checkpointers import BACKENDS, Backend, postgres_unavailable  # noqa: E402

# CPython 3.11.7's ast.parse races with another thread's (gh-106905): pytest showing a failure then crashed.
ast_race.install()

_TIERS = {
    "unit": "unit",
    "integration": "integration",
    "postgres": "postgres",
    "cluster": "cluster",
    "e2e": "e2e",
    "node": "node",
}


def pytest_configure(config: pytest.Config) -> None:
    # pytest-asyncio 1.5 asks asyncio.get_event_loop() for "the current loop" around each async
    # test; with none set yet, that call creates a loop nobody closes, and its ResourceWarning later
    # fails whichever test is running when it is collected (pytest-asyncio#724, fixed upstream by
    # #1430). Marking "no current loop" as set makes the call raise instead, which it handles.
    asyncio.set_event_loop(None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if path.is_relative_to(ROOT / "tests"):
            parts = path.relative_to(ROOT / "tests").parts
        else:
            parts = ("cluster",) if path.is_relative_to(ROOT / "kubesim") else ()
        # A parameter may carry its own tier (the postgres backend of the shared checkpointer
        # suite in tests/unit): it keeps that tier, so `-m unit` never needs a server.
        if parts and parts[0] in _TIERS and not any(item.get_closest_marker(name) for name in _TIERS.values()):
            item.add_marker(getattr(pytest.mark, _TIERS[parts[0]]))
        # First in line, so it is torn down after every other fixture (servers, sessions) of the test.
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            item.fixturenames.insert(0, "no_leaked_tasks")


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """An async test that leaves asyncio tasks running on its loop fails (kopf's hygiene rule)."""
    yield
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    if pending:  # the loop's own finalizer of an abandoned async generator (athrow) ends by itself: a moment
        await asyncio.wait(pending, timeout=1.0)
        pending = [t for t in pending if not t.done()]
    assert not pending, f"test leaked asyncio tasks: {pending}"


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """One store per test, once per checkpointer backend (tests/support/checkpointers.py lists them)."""
    if request.param == "postgres":
        if reason := postgres_unavailable():
            pytest.skip(reason)
        if request.node.get_closest_marker("looptime"):
            pytest.skip("looptime fakes the loop clock, which breaks real network I/O (connect timeouts)")
    store = Backend(request.param, tmp_path)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def checkpointer(backend: Backend) -> Checkpointer:
    """A set-up checkpointer of the current backend; ``backend.open()`` gives a second one on the same store."""
    return await backend.open()


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    """A fresh PostgreSQL database for a whole module (the operator tests: one thread per case); dropped after."""
    with throwaway_database() as database:
        yield database


@pytest.fixture
def subprocess_env(tmp_path: Path) -> dict[str, str]:
    """Environment for child processes: the repo importable, no inherited fault points."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRUN_", "SUPPORT_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["SUPPORT_EFFECTS_DB"] = str(tmp_path / "effects.db")
    return env
