"""An AgentRun without spec.input on a new thread (found by ``cluster/test_fuzzed_specs``): the reason names spec.input.

The runner used to answer ``InputMissing: AGENTRUN_INPUT is required to start a run``: a variable
the user never sets (the operator renders it), so the status did not say what to fix.
"""

from __future__ import annotations

import pytest

from agentrun.contract import ExitCode
from agentrun.runner import RunnerSettings, plan

pytestmark = pytest.mark.unit


def test_a_new_thread_without_input_fails_saying_spec_input() -> None:
    settings = RunnerSettings(graph="examples.support_agent:app", thread_id="ns/t", run_uid="uid-1")
    decided = plan(None, settings)
    assert decided.exit_code == ExitCode.FAILED
    assert decided.reason is not None and decided.reason.startswith("InputMissing: ")
    assert "spec.input" in decided.reason, decided.reason
