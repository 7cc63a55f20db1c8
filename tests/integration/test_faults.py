"""Fault points are inert unless armed: production code paths must never kill themselves."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

POINTS = ("before_tool", "after_tool", "after_ledger_record", "before_checkpoint", "after_checkpoint")


def _call_every_point(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = (
        "from agentrun.faults import fault_point\n"
        f"for point in {POINTS!r}:\n"
        "    fault_point(point, 'charge_card')\n"
        "print('survived')\n"
    )
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)


def test_an_unarmed_fault_point_never_fires() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGENTRUN_FAULT_POINT"}
    result = _call_every_point(env)
    assert result.returncode == 0 and "survived" in result.stdout, f"an unarmed fault point fired\n{result}"


def test_an_armed_point_fires_only_for_its_detail() -> None:
    other_tool = _call_every_point(dict(os.environ, AGENTRUN_FAULT_POINT="after_tool:send_receipt"))
    assert other_tool.returncode == 0, "a point armed for another tool fired"
    armed = _call_every_point(dict(os.environ, AGENTRUN_FAULT_POINT="after_tool:charge_card"))
    assert armed.returncode == -9, f"the armed point must SIGKILL the process\n{armed}"
    assert "AGENTRUN-FAULT after_tool:charge_card" in armed.stderr


def test_a_point_armed_for_one_attempt_fires_in_that_attempt_only() -> None:
    """``@<attempt>``: through the operator the variable reaches every attempt; only the named one crashes."""
    spec = "after_tool:charge_card@2"
    later = _call_every_point(dict(os.environ, AGENTRUN_FAULT_POINT=spec, AGENTRUN_ATTEMPT="3"))
    assert later.returncode == 0, f"a point armed for attempt 2 fired in attempt 3\n{later}"
    named = _call_every_point(dict(os.environ, AGENTRUN_FAULT_POINT=spec, AGENTRUN_ATTEMPT="2"))
    assert named.returncode == -9 and "AGENTRUN-FAULT after_tool:charge_card" in named.stderr, named
