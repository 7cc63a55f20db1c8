"""A minimal kopf operator used to prove kopf's own flows against the emulated cluster.

It only exercises what any kopf operator does — create and
field handlers patching the status subresource, a finalizer, a delete handler, events,
peering keep-alives — so a failure here is the emulator's, not the operator's.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import kopf

GROUP, VERSION, PLURAL = "kubesim.dev", "v1", "widgets"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = "kubesim.dev/kopf-smoke"
    settings.watching.server_timeout = 30
    settings.peering.lifetime = 10


@kopf.on.create(GROUP, VERSION, PLURAL)
def created(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    patch.status["phase"] = "Running"
    kopf.info(body, reason="Started", message="started by the smoke operator")  # a Kubernetes Event


@kopf.on.field(GROUP, VERSION, PLURAL, field="spec.stop")
def stopped(new: Any, patch: kopf.Patch, **_: Any) -> None:
    if new:
        patch.status["phase"] = "Stopped"


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(name: str, **_: Any) -> None:
    pathlib.Path(os.environ["KOPF_SMOKE_MARKER"]).write_text(name)
