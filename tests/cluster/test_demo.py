"""``make demo``, a newcomer's first command, runs as README says: charged exactly once across a SIGKILL.

The demo script itself (``examples/cluster_demo.py``): the emulated cluster, the real operator, runner pods as
local processes, real PostgreSQL and kubectl. It exits non-zero when the charge count or the phase is wrong,
or when a step times out; here it runs in a folder and a database of its own, not the checkout's ``.demo/``.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from tests.cluster.operator_harness import ROOT

pytestmark = pytest.mark.timeout(400)

ADMIN_DSN = os.environ.get("AGENTRUN_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


async def _drop(database: str) -> None:
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await admin.close()


def test_make_demo_charges_once_across_a_sigkill_and_stops_a_hung_run(tmp_path: Path) -> None:
    database = f"agentrun_demo_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "AGENTRUN_DEMO_DIR": str(tmp_path / "demo"), "AGENTRUN_DEMO_DATABASE": database}
    env.pop("AGENTRUN_FAULT_POINT", None)
    try:
        done = subprocess.run(
            [sys.executable, "examples/cluster_demo.py"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=380,
        )
    finally:
        asyncio.run(_drop(database))
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"make demo failed (exit {done.returncode}):\n{out[-4000:]}"
    assert "charged exactly once, across a SIGKILL and a new pod." in done.stdout, out[-4000:]
    assert re.search(r"^hung-order\s+Stopped\s", done.stdout, re.M), f"the hung run was not stopped:\n{out[-4000:]}"
    assert (tmp_path / "demo" / "effects.db").exists(), "the demo did not work in the folder it was given"
