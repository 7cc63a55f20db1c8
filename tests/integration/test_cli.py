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
        code = proc.wait(timeout=60)
        latency = time.monotonic() - asked
    finally:
        proc.kill()
        proc.wait()
    _, err = proc.communicate()
    assert code == 4, f"a stopped run exits 4, got {code}\n{err}"
    # Generous (the tools sleep an hour; the stop check's 1 s is proven on loop time, unit/test_stop.py): it
    # includes starting `agentrun stop` as a process.
    assert latency < 30, f"stop took {latency:.1f}s"
    state = json.loads(cli(env, "state", "--thread-id", "t-stop", "--json").stdout)
    assert state["status"] == "stopped" and state["current_node"] == "tools"
    assert state["stop_requested"] is None, "the stop request was not acknowledged"


def test_cli_bad_graph_reference_is_one_clear_line(env: dict[str, str]) -> None:
    for ref, expected in [
        ("examples.nope:app", "no module named 'examples.nope'"),
        ("examples.support_agent:nope", "module has no attribute 'nope'"),
        ("not a reference", "must look like 'package.module:attribute'"),
        ("examples.support_agent:ORDERS", "is a dict, not a StateGraph"),
        ("examples.langgraph_support_agent:app", "is a LangGraph graph: this command runs agentrun graphs"),
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


def test_cli_state_of_a_bare_id_suggests_the_namespaced_thread_an_agentrun_made(env: dict[str, str]) -> None:
    """An AgentRun's thread is ``<namespace>/<threadId>`` in the store: the bare id must lead the user there."""
    for thread in ("default/mine-crash", "team-a/mine-crash", "default/other"):
        assert cli(env, "run", GRAPH, "--thread-id", thread, "--input", REQUEST, "-q").returncode == 0
    for command in ("state", "stop"):
        missing = cli(env, command, "--thread-id", "mine-crash")
        assert missing.returncode == 2, missing
        [line] = missing.stderr.strip().splitlines()
        assert "thread 'mine-crash' not found" in line, line
        assert "did you mean 'default/mine-crash', 'team-a/mine-crash'?" in line, (
            f"the namespaced ids must be suggested, default first: {line}"
        )
        assert f"(agentrun {command} --thread-id default/mine-crash)" in line, line
    assert "did you mean" not in cli(env, "state", "--thread-id", "ghost").stderr, "no match, no suggestion"
    found = cli(env, "state", "--thread-id", "default/mine-crash")
    assert found.returncode == 0 and "thread:   default/mine-crash" in found.stdout, found


def test_cli_store_url_errors_are_clear(env: dict[str, str]) -> None:
    result = cli(dict(env, AGENTRUN_STORE="mysql://x"), "state", "--thread-id", "t")
    assert result.returncode == 2 and "unknown store URL scheme" in result.stderr


def test_cli_global_options_work_after_the_subcommand(tmp_path: Path, env: dict[str, str]) -> None:
    """`agentrun stop --thread-id t --store URL` is how users type it; --store must be honoured there."""
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert cli(env, "run", GRAPH, "--thread-id", "t-opt", "--input", REQUEST, "--store", other, "-q").returncode == 0
    here = cli(env, "state", "--thread-id", "t-opt", "--store", other, "--json")
    assert here.returncode == 0 and json.loads(here.stdout)["status"] == "completed", here.stderr
    before = cli(env, "--store", other, "state", "--thread-id", "t-opt")
    assert before.returncode == 0, "the option before the subcommand must keep working"
    default_store = cli(env, "state", "--thread-id", "t-opt")
    assert default_store.returncode == 2, "the run went to AGENTRUN_STORE although --store named another store"
    for command in ("run", "state", "stop"):
        assert "--store" in cli(env, command, "--help").stdout, f"`agentrun {command} --help` hides --store"


def test_cli_state_into_a_closed_pipe_is_not_a_traceback(env: dict[str, str]) -> None:
    assert cli(env, "run", GRAPH, "--thread-id", "t-pipe", "--input", REQUEST).returncode == 0
    shell = f"{sys.executable} -m agentrun.cli state --thread-id t-pipe | head -1"
    piped = subprocess.run(["bash", "-c", shell], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert piped.stdout.startswith("thread:"), piped.stdout
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr


def test_cli_input_json_is_spec_input_shaped(env: dict[str, str]) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": REQUEST}]})
    run = cli(env, "run", GRAPH, "--thread-id", "t-json", "--input-json", body)
    assert run.returncode == 0, run.stderr
    assert "charge_card(call_2)" in run.stdout
    bad = cli(env, "run", GRAPH, "--thread-id", "t-json2", "--input-json", "[1, 2]")
    assert bad.returncode == 2 and "must be a JSON object" in bad.stderr


def test_cli_unreachable_postgres_is_a_transient_exit_not_a_permanent_failure(env: dict[str, str]) -> None:
    closed = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
    result = cli(env, "state", "--thread-id", "t", "--store", closed, "--store-retry-seconds", "1")
    assert result.returncode == 8, f"store unavailable must exit 8 (try again), not 5 (failed for good)\n{result}"
    assert "store unavailable" in result.stderr


def test_cli_refuses_to_arm_a_stop_on_a_thread_with_nothing_running(env: dict[str, str]) -> None:
    """A stop kept for a completed thread would silently end its next turn."""
    assert cli(env, "run", GRAPH, "--thread-id", "t-done", "--input", REQUEST).returncode == 0
    stop = cli(env, "stop", "--thread-id", "t-done")
    assert stop.returncode == 2 and "nothing to stop" in stop.stderr, stop
    state = json.loads(cli(env, "state", "--thread-id", "t-done", "--json").stdout)
    assert state["stop_requested"] is None, "a refused stop left a request behind"


def invocations(effects_db: str) -> dict[str, int]:
    """Every invocation of each side-effect tool body, as the example logs it (not provider rows)."""
    import sqlite3

    conn = sqlite3.connect(effects_db)
    try:
        return dict(conn.execute("SELECT tool, COUNT(*) FROM tool_invocations GROUP BY tool").fetchall())
    finally:
        conn.close()


def test_cli_the_same_request_run_twice_executes_the_tools_once(env: dict[str, str]) -> None:
    """`--request-id`: repeating a request repeats its answer, not its side effects."""
    effects = env["SUPPORT_EFFECTS_DB"]
    args = ("run", GRAPH, "--thread-id", "t-req", "--input", REQUEST, "--request-id", "order-4821-charge")
    first = cli(env, *args)
    assert first.returncode == 0, first.stderr
    assert invocations(effects) == {"charge_card": 1, "send_receipt": 1}
    again = cli(env, *args)
    assert again.returncode == 0, again.stderr
    assert invocations(effects) == {"charge_card": 1, "send_receipt": 1}, (
        "GUARANTEE BROKEN: the same request charged the card again"
    )
    assert "already completed at version 4; not run again" in again.stderr, again.stderr
    assert "completed: thread t-req at version 4" in again.stdout, "the answer is the recorded turn's"
    assert "[step" not in again.stdout, "a completed request ran steps again"
    state = json.loads(cli(env, "state", "--thread-id", "t-req", "--json").stdout)
    assert state["version"] == 4 and state["meta"]["request_key"] == "order-4821-charge"
    assert state["meta"]["result"]["digest"].startswith("sha256:")
    other = cli(env, "run", GRAPH, "--thread-id", "t-req", "--input", REQUEST, "--request-id", "order-4821-again")
    assert other.returncode == 0, other.stderr
    assert invocations(effects) == {"charge_card": 2, "send_receipt": 2}, "a new request id must start a new turn"
    empty = cli(env, "run", GRAPH, "--thread-id", "t-req", "--input", REQUEST, "--request-id", " ")
    assert empty.returncode == 2 and "--request-id must not be empty" in empty.stderr
