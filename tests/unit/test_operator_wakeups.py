"""Scheduled deadlines instead of polling: ``decide.wake.next_wake`` and ``io.wakeups.Wakeups``.

The guarantee: a run whose decision changes with the clock alone is woken at that moment (not at the
next resync), and progress wakes a run at most once per coalescing window without losing the last step.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentrun_operator.decide.status import AgentRunStatus, iso
from agentrun_operator.decide.wake import next_wake, waits_for_a_human
from agentrun_operator.io.wakeups import Wakeups
from tests.unit.decisions_support import (
    LIMITS,
    NOW,
    RUNNING,
    decide,
    make_spec,
    manifest,
    progress,
    run_status,
    running,
    terminated,
    view,
    waiting,
)

STOPPING, PENDING, SUCCEEDED = "Stopping", "Pending", "Succeeded"


@pytest.mark.parametrize(
    ("spec", "status", "pod", "due", "acts"),
    [
        # backoff: the next attempt starts when nextAttemptTime comes
        ({}, run_status(PENDING, nextAttemptTime=iso(NOW + timedelta(seconds=5))), terminated(1), 5, "create"),
        # stop grace: a runner that did not stop is force-stopped
        ({"stop": True}, run_status(STOPPING, stopRequestedTime=iso(NOW)), running(), LIMITS.stop_grace, "delete"),
        # lost node
        (
            {},
            run_status(RUNNING, lostSince=iso(NOW)),
            manifest(phase="Unknown", state={"running": {}}),
            LIMITS.lost_node_timeout,
            "delete",
        ),
        # image pull timeout counts from the pod's creation
        (
            {"restartPolicy": {"imagePullTimeoutSeconds": 3720}},  # the pod was created an hour ago
            run_status(PENDING),
            waiting("ImagePullBackOff", "x"),
            None,
            "delete",
        ),
        # active deadline from startTime
        ({"activeDeadlineSeconds": 600}, run_status(RUNNING, startTime=iso(NOW)), running(), 600, "delete"),
    ],
    ids=["backoff", "stop-grace", "lost-node", "image-pull", "active-deadline"],
)
def test_the_wake_up_is_when_decide_first_acts(
    spec: dict[str, Any], status: dict[str, Any], pod: dict[str, Any], due: float | None, acts: str
) -> None:
    parsed = make_spec(**spec)
    pv = view(pod)
    wake = next_wake(spec=parsed, status=AgentRunStatus.parse(status), pod=pv, limits=LIMITS, now=NOW)
    assert wake is not None, "a deadline was not scheduled: the run would wait for the resync"
    if due is not None:
        assert wake == NOW + timedelta(seconds=due)
    before = decide(parsed, status, pv, progress(), wake - timedelta(seconds=1), LIMITS)
    at = decide(parsed, status, pv, progress(), wake, LIMITS)
    acted = {"create": lambda d: d.create_attempt is not None, "delete": lambda d: d.delete_pod is not None}[acts]
    assert not acted(before), "decide acted before the scheduled wake-up: the wake-up would be late"
    assert acted(at), "decide did not act at the scheduled wake-up: the deadline would be missed"


def test_a_past_deadline_is_not_scheduled_again_and_a_finished_run_wakes_only_for_its_ttl() -> None:
    status = AgentRunStatus.parse(run_status(PENDING, nextAttemptTime=iso(NOW - timedelta(seconds=1))))
    assert next_wake(spec=make_spec(), status=status, pod=None, limits=LIMITS, now=NOW) is None
    done = AgentRunStatus.parse(run_status(SUCCEEDED, completionTime=iso(NOW)))
    assert next_wake(spec=None, status=done, pod=None, limits=LIMITS, now=NOW, ttl=None) is None
    assert next_wake(spec=None, status=done, pod=None, limits=LIMITS, now=NOW, ttl=60) == NOW + timedelta(seconds=60)


@pytest.mark.looptime
async def test_progress_is_coalesced_but_the_last_step_is_never_dropped() -> None:
    loop = asyncio.get_running_loop()
    runs: list[float] = []

    async def run(uid: str) -> None:
        runs.append(loop.time())

    wakeups = Wakeups(resync=3600, coalesce=1.0, run=run)
    wakeups.track("u1", "ns/t")
    start = loop.time()
    for _ in range(10):  # ten commits within half a second
        wakeups.progress("ns/t")
        await asyncio.sleep(0.05)
    await asyncio.sleep(2)
    offsets = [round(t - start, 2) for t in runs]
    assert len(runs) == 2, f"expected one reconcile at once and one folded at the window's end, got {offsets}"
    assert offsets[0] < 0.1 and 0.9 <= offsets[1] <= 1.1, offsets
    wakeups.progress("ns/other")
    await asyncio.sleep(1)
    assert len(runs) == 2, "another thread's progress woke this run"
    await wakeups.aclose()


@pytest.mark.looptime
async def test_a_deadline_replaces_the_resync_and_a_newer_one_cancels_it() -> None:
    loop = asyncio.get_running_loop()
    runs: list[float] = []

    async def run(uid: str) -> None:
        runs.append(loop.time())

    wakeups = Wakeups(resync=30, coalesce=1.0, run=run)
    start = loop.time()
    wakeups.after("u1", wake=datetime.now(UTC) + timedelta(seconds=5), live=True)
    wakeups.after("u1", wake=None, live=True)  # a later reconcile found no deadline: the 5 s one is gone
    await asyncio.sleep(20)
    assert runs == [], "a superseded deadline fired"
    await asyncio.sleep(20)
    assert len(runs) == 1 and 22.5 <= runs[0] - start <= 37.5, "the resync did not come within 30 s ±25 %"
    await wakeups.aclose()


@pytest.mark.looptime
async def test_a_failed_reconcile_is_retried_with_backoff() -> None:
    loop = asyncio.get_running_loop()
    runs: list[float] = []

    async def run(uid: str) -> None:
        runs.append(loop.time())
        if len(runs) < 3:
            raise RuntimeError("API down")

    wakeups = Wakeups(resync=3600, coalesce=1.0, run=run)
    start = loop.time()
    wakeups.kick("u1")
    await asyncio.sleep(10)
    assert [round(t - start) for t in runs] == [0, 1, 3], "retries must follow 1 s, then 2 s"
    await wakeups.aclose()


@pytest.mark.looptime
async def test_a_run_waiting_for_a_human_is_resynced_at_the_waiting_interval_not_the_live_one() -> None:
    loop = asyncio.get_running_loop()
    runs: list[float] = []

    async def run(uid: str) -> None:
        runs.append(loop.time())

    wakeups = Wakeups(resync=30, waiting_resync=600, coalesce=1.0, run=run)
    start = loop.time()
    wakeups.after("u1", wake=None, live=True, waiting=True)
    await asyncio.sleep(400)
    assert runs == [], "a run waiting for approval was resynced at the live runs' pace"
    await asyncio.sleep(400)
    assert len(runs) == 1 and 450 <= runs[0] - start <= 750, "the waiting resync did not come within 600 s ±25 %"
    await wakeups.aclose()


def test_only_an_interrupted_run_with_its_interrupt_recorded_waits_for_a_human() -> None:
    interrupt = {"id": "i1", "message": "approve?", "ids": ["i1"]}
    assert waits_for_a_human(AgentRunStatus.parse({"phase": "Interrupted", "interrupt": interrupt}))
    # Not yet recorded (the store did not answer when the pod exited 3): the live resync fills it in.
    assert not waits_for_a_human(AgentRunStatus.parse({"phase": "Interrupted"}))
    assert not waits_for_a_human(AgentRunStatus.parse({"phase": "Running", "interrupt": interrupt}))
