"""``spec.ttlSecondsAfterFinished``: delete a finished AgentRun once its time to live is over (Job parity).

The verdict decides it (``Decision.expire``, from ``jobparity.expired``) when a run at rest is reconciled,
which its ttl deadline does (``decide.wake.next_wake``). The delete carries a uid precondition, so a run
re-created under the same name meanwhile is never deleted in its predecessor's place. Deleting an AgentRun
removes its pods (``Handlers.on_run``, on its DELETED event) and keeps its thread data in the store.
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


async def expire(kube: KubeClient, body: Mapping[str, Any], status: AgentRunStatus) -> bool:
    """Delete the finished run of ``body`` (its ttl is over); True when it was deleted."""
    meta = body["metadata"]
    ttl = jobparity.ttl_of(body.get("spec"))
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
