"""The Secret and image checks of ``decide.access``, with the Secret reads they need.

Run before every pod the operator creates (so a label removed later stops the
next attempt). A Secret is read through the operator's own client (RBAC: it
already has ``get`` on Secrets for the store) and only its labels are kept,
cached per (namespace, name) together with its resourceVersion for
``secret_cache_seconds``, so a burst of runs referencing one Secret costs one
read. Only a grant is cached: a Secret that was refused is read again on the
next attempt, so labelling it takes effect at once, and removing the label
within ``secret_cache_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..decide.access import RUNNER_ACCESS_LABEL, image_problem, referenced_secrets, secret_problem
from ..decide.podspec import RunRef, store_secret
from ..decide.spec import AgentRunSpec
from ..settings import OperatorSettings
from .kube import KubeClient, NotFound, secret_path


@dataclass(frozen=True)
class _Seen:
    labels: dict[str, str] | None  # None: the Secret does not exist
    resource_version: str
    read_at: float


class AccessChecker:
    def __init__(self, kube: KubeClient, settings: OperatorSettings) -> None:
        self.kube = kube
        self.settings = settings
        self._seen: dict[tuple[str, str], _Seen] = {}

    async def _labels(self, namespace: str, name: str) -> dict[str, str] | None:
        key = (namespace, name)
        seen = self._seen.get(key)
        fresh = seen is not None and time.monotonic() - seen.read_at < self.settings.secret_cache_seconds
        if seen is not None and fresh and (seen.labels or {}).get(RUNNER_ACCESS_LABEL) == "true":
            return seen.labels
        try:
            body = await self.kube.get(secret_path(namespace, name))
        except NotFound:
            self._seen.pop(key, None)
            return None
        meta = body.get("metadata") or {}
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        self._seen[key] = _Seen(labels, str(meta.get("resourceVersion", "")), time.monotonic())
        return labels  # the Secret's data is dropped here: only its labels are kept

    async def problem(self, run: RunRef, spec: AgentRunSpec) -> str | None:
        """Why the run may not get a pod (a Secret it may not reference, an image not allowed), or None."""
        if bad := image_problem(spec.image, self.settings.allowed_image_prefixes):
            return bad
        store = store_secret(spec, self.settings)
        for name in referenced_secrets(spec):
            labels = None if name == store else await self._labels(run.namespace, name)
            if bad := secret_problem(name, namespace=run.namespace, labels=labels, store_secret=store):
                return bad
        return None
