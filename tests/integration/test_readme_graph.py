"""README's "Writing a graph" example, run as a user runs it: the block saved as a module, run as a real process.

A README example that does not run is the first thing a new user meets (issue 24 item 7: it used an
undefined ``my_model``); this test reads the block from README.md itself, so the two cannot drift.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(120)


def readme_graph() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Writing a graph\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README's 'Writing a graph' section must open with a python block"
    return match.group(1)


def python(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_readme_graph_example_runs_as_written(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    (tmp_path / "my_agent.py").write_text(readme_graph())
    env = {k: v for k, v in subprocess_env.items() if k != "AGENTRUN_STORE"}
    ran = python(env, tmp_path, "my_agent.py")
    assert ran.returncode == 0, f"README's graph example does not run as written:\n{ran.stderr}"
    assert "done: " in ran.stdout and '"status": "charged"' in ran.stdout, ran.stdout
    assert (tmp_path / "agentrun.db").exists(), "the example's own SQLite store must hold the thread"

    # The CLI line README gives next to it; its default store is the module's own file: nothing to warn about.
    cli = ("-m", "agentrun.cli", "run", "my_agent:app", "--thread-id", "order-4821", "--input", "charge order 4821")
    again = python(env, tmp_path, *cli)
    assert again.returncode == 0 and "WARNING" not in again.stderr, again.stderr
    other = python(env, tmp_path, *cli, "--store", f"sqlite:///{tmp_path / 'other.db'}")
    assert other.returncode == 0, other.stderr
    assert "compiled with its own checkpointer (SqliteCheckpointer agentrun.db)" in other.stderr, (
        f"a --store that replaces the module's checkpointer must say so: {other.stderr}"
    )
