"""The ``agentrun`` CLI as a user runs it: real processes, a real SQLite file, a fresh virtualenv."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from examples.support_agent import count_effects
from tests.conftest import ROOT

REQUEST = "charge my saved card for order 4821 and email me the receipt"
GRAPH = "examples.support_agent:app"


def cli(
    env: dict[str, str], *args: str, timeout: float = 60, exe: str | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [exe] if exe else [sys.executable, "-m", "agentrun.cli"]
    return subprocess.run([*cmd, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def env(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, str]:
    return dict(subprocess_env, AGENTRUN_STORE=f"sqlite:///{tmp_path / 'agentrun.db'}")


@pytest.mark.timeout(600)
def test_cli_from_a_fresh_virtualenv_runs_the_example(tmp_path: Path, env: dict[str, str]) -> None:
    """`pip install .` into an empty virtualenv gives a working `agentrun` command."""
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    pip = subprocess.run(
        [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    exe = str(target / "bin" / "agentrun")
    # The fresh install must not see the repo's runner/ sources: only the repo root (for examples/).
    clean = dict(env, PYTHONPATH=str(ROOT))
    run = cli(clean, "run", GRAPH, "--thread-id", "order-4821", "--input", REQUEST, exe=exe)
    assert run.returncode == 0, run.stderr
    assert "calls lookup_order(call_1), charge_card(call_2), send_receipt(call_3)" in run.stdout
    assert "completed: thread order-4821 at version 4" in run.stdout
    where = cli(clean, "state", "--thread-id", "order-4821", "--json", exe=exe)
    assert where.returncode == 0, where.stderr
    state = json.loads(where.stdout)
    assert state["status"] == "completed" and state["version"] == 4
    assert sorted(e["tool"] for e in state["ledger"]) == ["charge_card", "lookup_order", "send_receipt"]
    imported = subprocess.run(
        [str(target / "bin" / "python"), "-c", "import agentrun; print(agentrun.__file__)"],
        capture_output=True,
        text=True,
        env=clean,
        cwd=tmp_path,
    )
    assert str(target) in imported.stdout, "the fresh virtualenv imported agentrun from somewhere else"
    assert count_effects(env["SUPPORT_EFFECTS_DB"])["charges"] == 1


def test_cli_stop_ends_a_run_hung_in_a_tool(env: dict[str, str]) -> None:
    """`agentrun stop` from another process ends a run whose tool blocks for an hour; state is persisted."""
    hung = dict(env, SUPPORT_TOOL_DELAY="3600")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrun.cli", "run", GRAPH, "--thread-id", "t-stop", "--input", REQUEST],
        env=hung,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = cli(env, "state", "--thread-id", "t-stop", "--json")
            if state.returncode == 0 and json.loads(state.stdout)["current_node"] == "tools":
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never reached the tool node")
        time.sleep(0.5)  # the tools are now inside their hour-long sleep
        asked = time.monotonic()
        stop = cli(env, "stop", "--thread-id", "t-stop")
        assert stop.returncode == 0, stop.stderr
        code = proc.wait(timeout=15)
        latency = time.monotonic() - asked
    finally:
        proc.kill()
        proc.wait()
    _, err = proc.communicate()
    assert code == 4, f"a stopped run exits 4, got {code}\n{err}"
    assert latency < 10, f"stop took {latency:.1f}s"
    state = json.loads(cli(env, "state", "--thread-id", "t-stop", "--json").stdout)
    assert state["status"] == "stopped" and state["current_node"] == "tools"
    assert state["stop_requested"] is None, "the stop request was not acknowledged"


def test_cli_bad_graph_reference_is_one_clear_line(env: dict[str, str]) -> None:
    for ref, expected in [
        ("examples.nope:app", "no module named 'examples.nope'"),
        ("examples.support_agent:nope", "module has no attribute 'nope'"),
        ("not a reference", "must look like 'package.module:attribute'"),
        ("examples.support_agent:ORDERS", "is a dict, not a StateGraph"),
    ]:
        result = cli(env, "run", ref, "--thread-id", "t", "--input", "hi")
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.stderr


def test_cli_missing_thread_and_nothing_to_resume(env: dict[str, str]) -> None:
    missing = cli(env, "state", "--thread-id", "ghost")
    assert missing.returncode == 2 and "thread 'ghost' not found" in missing.stderr
    resume = cli(env, "run", GRAPH, "--thread-id", "ghost")
    assert resume.returncode == 2 and "does not exist" in resume.stderr
    assert cli(env, "run", GRAPH, "--thread-id", "done", "--input", REQUEST).returncode == 0
    again = cli(env, "run", GRAPH, "--thread-id", "done")
    assert again.returncode == 2 and "no unfinished run" in again.stderr
    bad_json = cli(env, "run", GRAPH, "--thread-id", "done", "--resume", "{oops")
    assert bad_json.returncode == 2 and "--resume is not valid JSON" in bad_json.stderr


def test_cli_store_url_errors_are_clear(env: dict[str, str]) -> None:
    result = cli(dict(env, AGENTRUN_STORE="mysql://x"), "state", "--thread-id", "t")
    assert result.returncode == 2 and "unknown store URL scheme" in result.stderr
