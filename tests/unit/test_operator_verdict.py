"""The whole verdict of one reconcile (decide.verdict): the rules io used to apply itself, seen in one place."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun_operator.decide.decision import StoreProblem
from agentrun_operator.decide.reasons import Phase, Reason
from agentrun_operator.decide.spec import InvalidSpec, parse_spec
from agentrun_operator.decide.status import AgentRunStatus
from agentrun_operator.decide.thread import ThreadPeer
from agentrun_operator.decide.verdict import Inputs, verdict
from tests.unit.decisions_support import LIMITS, NOW, RUN, progress, run_status, running, view

RAW = {"graph": "examples.support_agent:app", "threadId": "order-4821"}


def inputs(status: dict[str, Any] | None = None, raw: dict[str, Any] | None = None, **fields: Any) -> Inputs:
    raw = dict(RAW if raw is None else raw)
    try:
        spec, error = parse_spec(raw), None
    except InvalidSpec as e:
        spec, error = None, e
    parsed = AgentRunStatus.parse(status or {})
    base = Inputs(
        run=ThreadPeer(name=RUN, uid="uid-me", phase=parsed.phase, attempt=parsed.attempt),
        raw_spec=raw,
        spec=spec,
        spec_error=error,
        status=parsed,
        deleting=False,
        now=NOW,
        limits=LIMITS,
    )
    return replace(base, **fields)


def test_an_ended_run_and_a_deleted_one_are_at_rest() -> None:
    assert verdict(inputs({"phase": "Succeeded", "attempt": 1})).at_rest
    assert verdict(inputs(run_status(), deleting=True)).at_rest
    reopened = verdict(inputs({"phase": "Failed", "attempt": 1}, raw={**RAW, "retry": 1}))
    assert not reopened.at_rest, "spec.retry re-opens a Failed run"


def test_a_refused_spec_fails_invalid_spec_without_a_pod() -> None:
    d = verdict(inputs(raw={**RAW, "threadId": "bad id!"}))
    assert d.status["phase"] == Phase.FAILED and d.status["reason"] == Reason.INVALID_SPEC and d.create_attempt is None


def test_a_store_secret_the_run_may_not_use_is_refused_before_the_first_attempt_only() -> None:
    refused = verdict(inputs(store_access="not labelled"))
    assert refused.status["reason"] == Reason.INVALID_SPEC and refused.create_attempt is None
    started = verdict(inputs(run_status(), store_access="not labelled", pod=view(running()), progress=progress()))
    assert "reason" not in started.status or started.status["reason"] != Reason.INVALID_SPEC


def test_a_pod_is_not_created_for_a_run_whose_secrets_or_image_are_refused() -> None:
    d = verdict(inputs(access="spec.image is not allowed"))
    assert d.create_attempt is None and d.status["reason"] == Reason.INVALID_SPEC
    assert verdict(inputs(run_status(), access="x", pod=view(running()), progress=progress())).create_attempt is None


def test_a_created_pod_gets_its_name_in_the_status() -> None:
    d = verdict(inputs())
    assert d.create_attempt == 1 and d.status["podName"] == f"{RUN}-1"


def test_no_pod_while_the_store_does_not_answer() -> None:
    d = verdict(inputs(store_down="STORAGE_UNAVAILABLE_001: connection refused"))
    assert d.create_attempt is None and d.status["reason"] == Reason.STORE_UNAVAILABLE
    assert d.conditions["StoreAvailable"][0] is False


def test_a_stop_the_store_cannot_take_shows_stopping_at_once_and_is_asked_again_soon() -> None:
    raw = {**RAW, "stop": True}
    d = verdict(inputs(run_status(), raw=raw, pod=view(running()), store_down="STORAGE_UNAVAILABLE_001: down"))
    assert d.status["phase"] == Phase.STOPPING and "store is unavailable" in d.status["message"]
    assert not d.request_stop and "stopRequestedTime" not in d.status, "the stop grace starts at the delivery"
    assert d.retry_after is not None and d.retry_after <= 1.0
    assert d.conditions["StoreAvailable"][0] is False
    delivered = verdict(inputs(run_status(), raw=raw, pod=view(running())))
    assert delivered.request_stop and "stopRequestedTime" in delivered.status


@pytest.mark.parametrize("stop", [False, True])
def test_an_unusable_store_fails_the_run_unless_it_is_being_stopped(stop: bool) -> None:
    problem = StoreProblem(Reason.INVALID_STORE, "STORAGE_CONFIG_001: authentication failed")
    d = verdict(inputs(run_status(), raw={**RAW, "stop": stop}, pod=view(running()), store_problem=problem))
    assert (d.status.get("phase") == Phase.FAILED) is not stop
