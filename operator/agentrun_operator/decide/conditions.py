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
    patch["conditions"] = [conditions[k] for k in PHASE_CONDITIONS if k in conditions]


def changed(current: Mapping[str, Any], desired: StatusPatch) -> StatusPatch:
    """The keys of ``desired`` whose value differs from ``current`` (the API's camelCase status)."""
    return cast(StatusPatch, {k: v for k, v in desired.items() if current.get(k) != v})


def status_patch(current: AgentRunStatus, desired: StatusPatch, *, now: datetime, generation: int) -> StatusPatch:
    """What to write for a decision's ``desired`` status: the changes, ``observedGeneration``, and conditions."""
    patch = changed(current.wire(), {**desired, "observedGeneration": generation})
    if "phase" in patch:
        with_conditions(current, patch, now=now, generation=generation)
    return patch
