"""``kubectl agentrun``'s pure parts: ages as kubectl prints them, what a run waits for, --value parsing.

The commands themselves run through the real kubectl in tests/cluster/test_kubectl_plugin.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentrun_operator.decide.status import AgentRunStatus
from agentrun_operator.kubectl_plugin import PluginError, _value, age, duration, parser, waiting_for

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (59, "59s"), (119, "119s"), (120, "2m"), (7199, "119m"), (7200, "2h"), (86400, "1d"), (-5, "0s")],
)
def test_age_reads_like_kubectls(seconds: int, shown: str) -> None:
    assert age(NOW - timedelta(seconds=seconds), NOW) == shown
    assert age(None, NOW) == "<unknown>"


def test_duration() -> None:
    assert duration(NOW, NOW + timedelta(seconds=3.4)) == "3s"
    assert duration(NOW, NOW + timedelta(minutes=5)) == "5.0m"
    assert duration(NOW, None) == "-"


def test_waiting_for_names_the_interrupt_message_and_how_many() -> None:
    one = AgentRunStatus.parse(
        {"phase": "Interrupted", "interrupt": {"id": "a", "ids": ["a"], "message": "approve a refund?"}}
    )
    assert waiting_for(one) == "approve a refund?"
    two = AgentRunStatus.parse({"phase": "Interrupted", "interrupt": {"id": "a", "ids": ["a", "b"], "message": "x"}})
    assert waiting_for(two) == "2 interrupts: x"
    assert waiting_for(AgentRunStatus.parse({"phase": "Running"})) == ""


def test_value_is_json_or_a_clear_error() -> None:
    assert _value(None, True) is True
    assert _value('{"amount": 120}', None) == {"amount": 120}
    assert _value('"yes"', None) == "yes"
    with pytest.raises(PluginError, match=r"--value is not JSON .*quote strings as JSON"):
        _value("yes", None)


def test_namespace_flags_go_before_or_after_the_command() -> None:
    assert parser().parse_args(["-n", "shop", "list"]).namespace == "shop"
    assert parser().parse_args(["list", "-n", "shop"]).namespace == "shop"
    assert parser().parse_args(["--context", "kind", "describe", "r"]).context == "kind"
    assert parser().parse_args(["logs", "r", "--attempt", "2", "-f"]).attempt == 2
