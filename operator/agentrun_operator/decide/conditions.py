"""The status patch a decision becomes: only what changed, plus conditions on a phase change (pure).

Conditions follow the Kubernetes conventions (``type``, ``status``,
``reason``, ``message``, ``lastTransitionTime``, ``observedGeneration``): on
a phase change the new phase's condition turns True and the others False;
``lastTransitionTime`` moves only when a condition's status flips.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from .reasons import Phase
from .status import AgentRunStatus, Condition, StatusPatch, iso

PHASE_CONDITIONS = (
    Phase.RUNNING,
    Phase.INTERRUPTED,
    Phase.STOPPING,
    Phase.STOPPED,
    Phase.SUCCEEDED,
    Phase.FAILED,
)
MESSAGE_LIMIT = 1024
# Status fields that no printer column shows and nothing waits on: a patch of these alone is deferred
# (``deferrable``), so ``kubectl get ar -w`` does not print a row identical to the one before it. A
# decision's Events and metrics go out with the write, so they wait with it (they are derived again from
# the status not yet written, never lost). Not ``toolCalls``: a recorded call shows at once (``describe``,
# issue 24), and its growth is the metric's (the runner notifies at most once a second per thread).
QUIET = frozenset({"lastCheckpointTime", "step", "modelUsage"})
QUIET_SECONDS = 10.0


def with_conditions(current: AgentRunStatus, patch: StatusPatch, *, now: datetime, generation: int) -> None:
    """On a phase change, make the new phase's condition True and the others False (Kubernetes conventions)."""
    phase = patch.get("phase")
    if not phase or phase == current.phase:
        return
    conditions: dict[str, Condition] = {c["type"]: c for c in copy.deepcopy(current.conditions) if "type" in c}
    for kind in PHASE_CONDITIONS:
        active = kind == phase or (kind == Phase.RUNNING and phase == Phase.STOPPING)
        existing = conditions.get(kind)
        if existing is None and not active:
            continue
        status = "True" if active else "False"
        flipped = existing is None or existing.get("status") != status
        if flipped or active:
            conditions[kind] = {
                "type": kind,
                "status": status,
                "reason": patch.get("reason") or phase,
                "message": (patch.get("message") or "")[:MESSAGE_LIMIT],
                "lastTransitionTime": iso(now)
                if flipped or existing is None
                else existing.get("lastTransitionTime", iso(now)),
                "observedGeneration": generation,
            }
    patch["conditions"] = _ordered(conditions)


def _ordered(conditions: Mapping[str, Condition]) -> list[Condition]:
    """Phase conditions first (in lifecycle order), then the others (StoreAvailable, ...) as they came."""
    return [conditions[k] for k in PHASE_CONDITIONS if k in conditions] + [
        c for k, c in conditions.items() if k not in PHASE_CONDITIONS
    ]


def with_extra_conditions(
    current: AgentRunStatus,
    patch: StatusPatch,
    updates: Mapping[str, tuple[bool, str, str]],
    *,
    now: datetime,
    generation: int,
) -> None:
    """Set the conditions a decision names besides the phase's (``lastTransitionTime`` moves only on a flip)."""
    if not updates:
        return
    base = patch["conditions"] if "conditions" in patch else copy.deepcopy(current.conditions)
    conditions: dict[str, Condition] = {c["type"]: c for c in base if "type" in c}
    touched = False
    for kind, (active, reason, message) in updates.items():
        status = "True" if active else "False"
        message = " ".join(message.split())[:MESSAGE_LIMIT]
        existing = conditions.get(kind)
        if existing and (existing.get("status"), existing.get("reason"), existing.get("message")) == (
            status,
            reason,
            message,
        ):
            continue
        flipped = existing is None or existing.get("status") != status
        conditions[kind] = {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": iso(now)
            if flipped or existing is None
            else existing.get("lastTransitionTime", iso(now)),
            "observedGeneration": generation,
        }
        touched = True
    if touched:
        patch["conditions"] = _ordered(conditions)


def changed(current: Mapping[str, Any], desired: StatusPatch) -> StatusPatch:
    """The keys of ``desired`` whose value differs from ``current`` (the API's camelCase status)."""
    return cast(StatusPatch, {k: v for k, v in desired.items() if current.get(k) != v})


def status_patch(
    current: AgentRunStatus,
    desired: StatusPatch,
    *,
    now: datetime,
    generation: int,
    conditions: Mapping[str, tuple[bool, str, str]] | None = None,
) -> StatusPatch:
    """What to write for a decision's ``desired`` status: the changes, ``observedGeneration``, and conditions
    (the phase's on a phase change, plus ``conditions``: type -> (status, reason, message)). The verdict
    (``verdict.plan_write``) asks ``deferrable`` whether it may wait (and when it is due: ``QUIET_SECONDS``
    after the mirrored checkpoint), so that a quiet run still gets it written."""
    patch = changed(current.wire(), {**desired, "observedGeneration": generation})
    if "phase" in patch:
        with_conditions(current, patch, now=now, generation=generation)
    with_extra_conditions(current, patch, conditions or {}, now=now, generation=generation)
    return patch


def deferrable(current: AgentRunStatus, patch: StatusPatch, *, now: datetime) -> bool:
    """Whether ``patch`` may wait: it changes only ``QUIET`` fields, and the status mirrored a checkpoint less
    than ``QUIET_SECONDS`` ago. It is then written with the next shown change, or once that is stale."""
    if not patch or not set(patch) <= QUIET:
        return False
    last = current.last_checkpoint_time
    return last is not None and (now - last).total_seconds() < QUIET_SECONDS
