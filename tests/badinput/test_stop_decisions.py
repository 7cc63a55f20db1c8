"""Operator decisions on bad input (pure; found by ``cluster/test_fuzzed_specs`` and ``cluster/test_bad_input_runs``).

- a stop while the runner pod waits for a node or its image: such a pod has
  no runner to ask through the store; the operator used to wait out the stop
  grace and then force-delete it, reporting ``ForcedStop`` ("the runner did
  not stop within 15s") for a runner that never ran;
- an interrupt message of 10 MB: it went whole into status, and every status
  patch then failed 413 (over the API server's request limit), the run stuck
  Running for good.
"""

from __future__ import annotations

import json

import pytest

from agentrun_operator.decide.run import PAYLOAD_LIMIT
from tests.unit.decisions_support import (
    LIMITS,
    NOW,
    PENDING,
    STOPPED,
    STOPPING,
    applied,
    decide,
    interrupted_progress,
    later,
    make_spec,
    run_status,
    terminated,
    view,
    waiting,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff"])
def test_a_stop_while_the_pod_waits_for_its_image_deletes_it_and_stops_at_once(reason: str) -> None:
    pod = view(waiting(reason, 'Back-off pulling image "registry.invalid/unknown:1"'))
    d = decide(make_spec(stop=True), run_status(PENDING), pod, None, NOW, LIMITS)
    assert d.status["phase"] == STOPPED and d.status["reason"] == "StoppedBeforeStart", d.status
    assert d.delete_pod == pod.name and d.delete_grace is None, "the pod must go, gracefully"
    assert reason in d.status["message"] and "did not stop" not in d.status["message"]


def test_a_stop_asked_while_creating_then_stuck_on_the_image_stops_without_waiting_out_the_grace() -> None:
    spec = make_spec(stop=True)
    first = decide(spec, run_status(PENDING), view(waiting("ContainerCreating", "")), None, NOW, LIMITS)
    assert first.request_stop and first.status["phase"] == STOPPING, "a runner about to start is asked first"
    status = applied(run_status(PENDING), first)
    d = decide(spec, status, view(waiting("ImagePullBackOff", "back-off")), None, later(2), LIMITS)
    assert d.status["phase"] == STOPPED and d.status["reason"] == "StoppedBeforeStart", d.status
    assert d.clear_stop, "the stop request left in the store would end the thread's next turn at once"


def test_a_stop_while_no_node_can_take_the_pod_deletes_it_and_stops_at_once() -> None:
    pod_manifest = waiting("ContainerCreating", "")
    pod_manifest["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}],
    }
    pod = view(pod_manifest)
    d = decide(make_spec(stop=True), run_status(PENDING), pod, None, NOW, LIMITS)
    assert d.status["phase"] == STOPPED and d.status["reason"] == "StoppedBeforeStart", d.status
    assert d.delete_pod == pod.name and "Unschedulable" in d.status["message"]


def test_an_interrupt_message_of_10_mb_is_truncated_in_status_like_its_payload() -> None:
    """Found by ``cluster/test_bad_input_runs``: the whole message went into status and every patch failed 413."""
    big = "m" * (10 << 20)
    ask = {"id": "i1", "message": big, "payload": {"document": big}}
    d = decide(make_spec(), run_status(), view(terminated(3)), interrupted_progress(ask), NOW, LIMITS)
    assert d.status["phase"] == "Interrupted", d.status
    assert len(d.status["interrupt"]["message"]) <= PAYLOAD_LIMIT + 20
    assert len(d.status["message"]) <= PAYLOAD_LIMIT + 20
    assert len(json.dumps(d.status)) < 16 << 10
