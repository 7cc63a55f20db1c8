"""The kopf handlers: every one of them funnels into ``Reconciler.reconcile``.

Registered on an explicit registry (``register``) rather than at import, so
the operator process, the tests and any embedding build their own.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from .decisions import TERMINAL
from .podspec import GROUP, MANAGED_BY, PLURAL, VERSION
from .reconcile import Reconciler
from .settings import OperatorSettings

log = logging.getLogger("agentrun_operator.handlers")


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, settings: OperatorSettings) -> None:
    runs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL, "registry": registry}

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = "agentrun.dev/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="agentrun.dev")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="agentrun.dev", key="last-handled-configuration"
        )
        settings.posting.enabled = False  # we post our own Events, one per transition
        settings.peering.standalone = True  # leadership comes from our Lease, not kopf peering
        settings.networking.error_backoffs = [1, 2, 5, 10]

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # An explicit registry has none of kopf's default login handlers: in-cluster first, then kubeconfig.
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(
            **kwargs
        )
        return info

    @kopf.on.create(**runs, backoff=2)
    @kopf.on.resume(**runs, backoff=2)
    @kopf.on.update(**runs, field="spec", backoff=2)
    async def on_change(body: kopf.Body, **_: Any) -> None:
        await reconciler.reconcile(_plain(body))

    @kopf.timer(**runs, interval=settings.reconcile_interval_seconds)
    async def on_timer(body: kopf.Body, status: kopf.Status, **_: Any) -> None:
        if status.get("phase") in TERMINAL:
            return
        await reconciler.reconcile(_plain(body))

    @kopf.on.event("", "v1", "pods", labels=dict(MANAGED_BY), registry=registry)
    async def on_pod(body: kopf.Body, **_: Any) -> None:
        for owner in body.metadata.get("ownerReferences") or []:
            if owner.get("kind") == "AgentRun" and owner.get("controller"):
                meta = {"namespace": body.metadata.namespace, "name": owner["name"], "uid": owner["uid"]}
                await reconciler.reconcile({"metadata": meta})

    @kopf.on.delete(**runs, backoff=2)
    async def on_delete(body: kopf.Body, **_: Any) -> None:
        await reconciler.delete_pods(str(body.metadata.namespace), str(body.metadata.name))
        reconciler.forget(body.metadata.uid)
        log.info(
            "[%s/%s] deleted: its pods are removed, its thread data is kept",
            body.metadata.namespace,
            body.metadata.name,
        )
