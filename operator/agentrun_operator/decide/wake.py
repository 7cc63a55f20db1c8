"""When the clock alone changes a run's decision (pure): the deadlines the operator schedules instead of polling.

``decide`` compares times with ``now`` in a few places; nothing else wakes a
run at those moments (no pod event, no progress, no spec change), so the
operator schedules one wake-up per run at the earliest of them
(``io/wakeups.py``) and a slow resync as the safety net:

- ``status.nextAttemptTime``: the backoff after a crash or a store outage ends;
- ``stopRequestedTime + stop_grace``: a runner that did not stop has its pod deleted;
- ``lostSince + lost_node_timeout``: a pod on a lost node is replaced;
- a terminating pod's ``deletionTimestamp + lost_node_timeout``: a pod whose node never confirms it;
- a pod waiting for its image since ``creationTimestamp + imagePullTimeoutSeconds``;
- ``startTime + activeDeadlineSeconds`` (``jobparity``);
- ``storeUnavailableSince + storeUnavailableTimeoutSeconds`` (``outage``);
- ``completionTime + ttlSecondsAfterFinished`` of a finished run (``jobparity``).

A time that turns out not to matter in the run's state costs one reconcile that changes nothing; a time
that matters and is missing here would leave the run waiting for the resync, so the list errs on the side
of waking. Times in status have whole seconds (``iso``): a wake-up at one of them is never late.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from . import jobparity
from .classify import PodView
from .decision import Limits
from .podstart import IMAGE_PULL
from .reasons import TERMINAL, Phase
from .spec import AgentRunSpec
from .status import AgentRunStatus


def waits_for_a_human(status: AgentRunStatus) -> bool:
    """Interrupted with its interrupt in status: only a spec change, a pod event, its thread's progress or a
    deadline can change its decision (each wakes it), so the safety resync may come rarely (settings)."""
    return status.phase == Phase.INTERRUPTED and bool(status.interrupt)


def next_wake(
    *,
    spec: AgentRunSpec | None,
    status: AgentRunStatus,
    pod: PodView | None,
    limits: Limits,
    now: datetime,
    ttl: int | None = None,
) -> datetime | None:
    """The earliest moment after ``now`` at which ``decide`` may answer differently for the same inputs, or None.

    ``status`` is the run's status after the reconcile that ran at ``now``; ``spec`` None when the spec was
    refused. Times not after ``now`` are left out: that reconcile already judged them.
    """
    if status.phase in TERMINAL:
        expires = jobparity.expires_at(ttl, status)
        return expires if expires is not None and expires > now else None
    due: list[datetime] = []
    if status.next_attempt_time is not None:
        due.append(status.next_attempt_time)
    if status.stop_requested_time is not None:
        due.append(status.stop_requested_time + timedelta(seconds=limits.stop_grace))
    if status.lost_since is not None:
        due.append(status.lost_since + timedelta(seconds=limits.lost_node_timeout))
    if pod is not None and pod.deletion_deadline is not None:
        due.append(pod.deletion_deadline + timedelta(seconds=limits.lost_node_timeout))
    if spec is not None:
        policy = spec.restartPolicy
        if pod is not None and pod.waiting_reason in IMAGE_PULL and pod.created is not None:
            due.append(pod.created + timedelta(seconds=policy.imagePullTimeoutSeconds))
        if (deadline := jobparity.deadline(spec, status)) is not None:
            due.append(deadline)
        if status.store_unavailable_since is not None:
            due.append(status.store_unavailable_since + timedelta(seconds=policy.storeUnavailableTimeoutSeconds))
    future = [moment for moment in due if moment > now]
    return min(future) if future else None
