"""``spec.ttlSecondsAfterFinished``: delete a finished AgentRun once its time to live is over (Job parity).

Called from the periodic timer for runs at rest (the timer already visits
every run; a run not yet due costs no API call). The delete carries a uid
precondition, so a run re-created under the same name meanwhile is never
deleted in its predecessor's place. Deleting an AgentRun removes its pods
(``handlers.on_run``, on its DELETED event) and keeps its thread data in the store.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..decide import jobparity
from ..decide.status import AgentRunStatus
from .kube import Conflict, KubeClient, NotFound, run_path

log = logging.getLogger("agentrun_operator")


def ttl_of(body: Mapping[str, Any]) -> int | None:
    """``spec.ttlSecondsAfterFinished`` of a raw body (None when unset or not a non-negative integer)."""
    value = (body.get("spec") or {}).get("ttlSecondsAfterFinished")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


async def expire(kube: KubeClient, body: Mapping[str, Any], status: AgentRunStatus) -> bool:
    """Delete the run of ``body`` if it finished more than its ttl ago; True when it was deleted."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return False
    ttl = ttl_of(body)
    if not jobparity.expired(ttl, status, now=datetime.now(UTC)):
        return False
    options = {"propagationPolicy": "Background", "preconditions": {"uid": meta["uid"]}}
    try:
        await kube.request("DELETE", run_path(meta["namespace"], meta["name"]), options)
    except (NotFound, Conflict):  # gone already, or a new run under the same name (the precondition)
        return False
    log.info(
        "[%s/%s] %s %ss ago and spec.ttlSecondsAfterFinished is %s: deleted (its thread data is kept)",
        meta["namespace"],
        meta["name"],
        status.phase,
        int((datetime.now(UTC) - status.completion_time).total_seconds()) if status.completion_time else "?",
        ttl,
    )
    return True
