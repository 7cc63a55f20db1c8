"""What io used to decide itself, now the verdict's inputs and outputs (decide.verdict), pure.

Guarantees: the previous attempt's answer that no checkpoint holds goes to the next attempt, and only when
the verdict has the record it asked for (it never guesses); a status patch of quiet fields alone is held back
until its due time and then written, one with Events or a shown change at once; a held-back patch's time
survives a reconcile with nothing to write; the counters grow only by what a written status added; after
the apply, a live run wakes at the earliest of its deadlines, the retry asked for and the held-back patch,
and a run at rest only for its ttl.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.checkpoint.base import Progress
from agentrun_operator.decide.classify import PodView
from agentrun_operator.decide.conditions import QUIET_SECONDS
from agentrun_operator.decide.decision import Decision
from agentrun_operator.decide.spec import InvalidSpec, parse_spec
from agentrun_operator.decide.status import AgentRunStatus, iso
from agentrun_operator.decide.thread import ThreadPeer
from agentrun_operator.decide.verdict import Inputs, after_apply, verdict

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=5)
RAW = {"graph": "examples.support_agent:app", "threadId": "order-4821"}
ANSWER = {"values": {"a1": {"approved": True}}}


def inputs(status: dict[str, Any], raw: dict[str, Any] | None = None, **fields: Any) -> Inputs:
    raw = dict(RAW if raw is None else raw)
    try:
        spec, error = parse_spec(raw), None
    except InvalidSpec as e:
        spec, error = None, e
    parsed = AgentRunStatus.parse(status)
    base = Inputs(
        run=ThreadPeer(name="run", uid="uid-me", phase=parsed.phase, attempt=parsed.attempt),
        raw_spec=raw,
        spec=spec,
        spec_error=error,
        status=parsed,
        deleting=False,
        now=NOW,
    )
    return replace(base, **fields)


def pod(attempt: int, phase: str, state: dict[str, Any], *, evicted: bool = False) -> PodView:
    conditions = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "x"}]
    return PodView.from_manifest(
        {
            "metadata": {"name": f"run-{attempt}", "namespace": "shop", "uid": "p", "creationTimestamp": iso(STARTED)},
            "status": {
                "phase": phase,
                "conditions": conditions if evicted else [],
                "containerStatuses": [{"name": "runner", "state": state}],
            },
        }
    )


def running_status(**fields: Any) -> dict[str, Any]:
    return {"phase": "Running", "attempt": 1, "startTime": iso(STARTED), "podName": "run-1", **fields}


def progress(status: str = "running", **fields: Any) -> Progress:
    base: dict[str, Any] = dict(
        thread_id="shop/order-4821",
        version=7,
        current_node="tools",
        step=3,
        status=status,
        updated_at=(NOW - timedelta(seconds=2)).timestamp(),
        tool_calls={"executed": 2, "replayed": 1},
    )
    return Progress(**{**base, **fields})


EVICTED = pod(1, "Failed", {"terminated": {"exitCode": 137, "reason": "Error"}}, evicted=True)
WAITING = progress("interrupted", interrupts=[{"id": "a1", "message": "approve?"}])
RUNNING = pod(1, "Running", {"running": {"startedAt": iso(STARTED)}})


# --- the previous attempt's answer ------------------------------------------------------------------------------------


def test_the_next_attempt_asks_for_its_predecessors_answer_before_it_is_created() -> None:
    asked = verdict(inputs(running_status(), pod=EVICTED, progress=WAITING))
    assert asked.create_attempt == 2 and asked.wants_earlier_answer and asked.resume is None
    read = verdict(inputs(running_status(), pod=EVICTED, progress=WAITING, earlier_answer_read=True))
    assert read.create_attempt == 2 and not read.wants_earlier_answer, "asked again after the record was read"


def test_an_answer_no_checkpoint_holds_is_carried_to_the_next_attempt_and_marked_for_the_log() -> None:
    d = verdict(
        inputs(running_status(), pod=EVICTED, progress=WAITING, earlier_answer=ANSWER, earlier_answer_read=True)
    )
    assert d.create_attempt == 2 and d.resume == ANSWER and d.carried


def test_an_answer_already_checkpointed_or_for_another_interrupt_is_not_carried() -> None:
    for seen in (progress("running"), progress("interrupted", interrupts=[{"id": "b2", "message": "other?"}])):
        d = verdict(
            inputs(running_status(), pod=EVICTED, progress=seen, earlier_answer=ANSWER, earlier_answer_read=True)
        )
        assert d.create_attempt == 2 and d.resume is None and not d.carried, seen


def test_a_first_attempt_or_no_attempt_asks_for_no_earlier_answer() -> None:
    fresh = verdict(inputs({}))
    assert fresh.create_attempt == 1 and not fresh.wants_earlier_answer
    steady = verdict(inputs(running_status(), pod=RUNNING, progress=progress()))
    assert steady.create_attempt is None and not steady.wants_earlier_answer


# --- the status write, held back or not ----------------------------------------------------------------------------


def mirrored(step: int, *, checkpoint: datetime, **fields: Any) -> dict[str, Any]:
    """A Running status that mirrors the store's progress as the operator wrote it."""
    seen = progress(step=step, updated_at=checkpoint.timestamp())
    return running_status(
        stateVersion=seen.version,
        currentNode=seen.current_node,
        step=step,
        lastCheckpointTime=iso(checkpoint),
        toolCalls={"executed": 2, "replayed": 1, "failed": 0, "inDoubt": 0, "unrecorded": 0},
        **fields,
    )


def settled(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` after the verdict's own first patch (observedGeneration, conditions): nothing left to write."""
    return {**status, **verdict(inputs(status, pod=RUNNING, progress=progress(), generation=1)).write}


def _write_after(status: dict[str, Any], seen: Progress, **fields: Any) -> Decision:
    return verdict(inputs(settled(status), pod=RUNNING, progress=seen, generation=1, **fields))


def test_a_quiet_step_is_held_back_until_its_due_time_then_written() -> None:
    checkpoint = NOW - timedelta(seconds=2)
    status = mirrored(3, checkpoint=checkpoint)
    quiet = _write_after(status, progress(step=4, updated_at=NOW.timestamp()))
    assert quiet.write == {} and quiet.deferred == checkpoint + timedelta(seconds=QUIET_SECONDS), quiet.write
    step = progress(step=4, updated_at=NOW.timestamp())
    stale = replace(inputs(settled(status), pod=RUNNING, progress=step), now=checkpoint + timedelta(seconds=11))
    written = verdict(stale)
    assert written.write.get("step") == 4 and written.deferred is None, "a quiet change past its time was held back"


def test_a_shown_change_is_written_at_once_and_counts_only_the_growth() -> None:
    status = mirrored(3, checkpoint=NOW - timedelta(seconds=2))
    grown = progress(step=4, tool_calls={"executed": 3, "replayed": 1}, current_node="agent")
    d = _write_after(status, grown, deferred=NOW + timedelta(seconds=5))
    assert d.write.get("currentNode") == "agent" and d.deferred is None, "a held-back patch goes out with this one"
    assert d.tool_growth == {"executed": 1}, d.tool_growth


def test_nothing_to_write_keeps_the_held_back_patch_time() -> None:
    due = NOW + timedelta(seconds=7)
    status = mirrored(3, checkpoint=NOW - timedelta(seconds=2))
    d = _write_after(status, progress(step=3, updated_at=(NOW - timedelta(seconds=2)).timestamp()), deferred=due)
    assert d.write == {} and d.deferred == due
    at_rest = verdict(inputs({"phase": "Succeeded", "attempt": 1}, deferred=due))
    assert at_rest.at_rest and at_rest.deferred == due and at_rest.write == {}


# --- when to wake the run next -------------------------------------------------------------------------------------


def test_a_live_run_wakes_at_the_earliest_of_its_deadline_its_retry_and_its_held_back_patch() -> None:
    backoff = NOW + timedelta(seconds=20)
    status = AgentRunStatus.parse(running_status(nextAttemptTime=iso(backoff)))
    i = inputs(running_status(), pod=RUNNING, progress=progress())
    d = Decision()
    assert after_apply(i, d, status=status, pod=None).wake == backoff
    assert after_apply(i, replace(d, retry_after=1.0), status=status, pod=None).wake == NOW + timedelta(seconds=1)
    held = replace(d, deferred=NOW + timedelta(seconds=8))
    assert after_apply(i, held, status=status, pod=None).wake == NOW + timedelta(seconds=8)
    past = replace(d, deferred=NOW - timedelta(seconds=1))
    assert after_apply(i, past, status=status, pod=None).wake == backoff, "a due time already past woke it again"
    assert after_apply(i, d, status=status, pod=None).live


def test_a_run_that_ended_or_whose_spec_is_refused_is_at_rest_and_wakes_only_for_its_ttl() -> None:
    done = AgentRunStatus.parse({"phase": "Succeeded", "attempt": 1, "completionTime": iso(NOW)})
    i = inputs(running_status(), raw={**RAW, "ttlSecondsAfterFinished": 60}, pod=RUNNING, progress=progress())
    ended = after_apply(i, replace(Decision(), retry_after=1.0), status=done, pod=None)
    assert not ended.live and ended.wake == NOW + timedelta(seconds=60)
    deleting = after_apply(replace(i, deleting=True), Decision(at_rest=True), status=done, pod=None)
    assert not deleting.live and deleting.wake is None
    refused = inputs(running_status(), raw={**RAW, "threadId": "bad id!"})
    assert not after_apply(refused, Decision(), status=AgentRunStatus.parse(running_status()), pod=None).live
