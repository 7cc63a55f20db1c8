"""The Secret and image checks of ``decide.access``, with the Secret reads they need.

Run before every pod the operator creates (so a label removed later stops the
next attempt). Secrets come from the watch-fed ``caches.SecretCache``: read
from the API once per (namespace, name), then kept current by the Secret
watch, so labelling a Secret (or removing the label) takes effect with its
watch event, and a burst of runs referencing one Secret costs one read. Only
the labels (and a store Secret's two keys) are kept; other data is dropped.
"""

from __future__ import annotations

from ..decide.access import image_problem, referenced_secrets, secret_problem, store_secret_problem
from ..decide.podspec import RunRef, store_secret
from ..decide.spec import AgentRunSpec
from ..settings import OperatorSettings
from .caches import SecretCache


class AccessChecker:
    """Reads what ``decide.access`` needs: whether a Secret other than the default store may be used by runs."""

    def __init__(self, secrets: SecretCache, settings: OperatorSettings) -> None:
        self.secrets = secrets
        self.settings = settings

    async def _labels(self, namespace: str, name: str) -> dict[str, str] | None:
        view = await self.secrets.get(namespace, name)
        return dict(view.labels) if view.exists else None

    async def problem(self, run: RunRef, spec: AgentRunSpec) -> str | None:
        """Why the run may not get a pod (a Secret it may not reference, an image not allowed), or None."""
        if bad := image_problem(spec.image, self.settings.allowed_image_prefixes):
            return bad
        if bad := await self.store_problem(run, spec):
            return bad
        store = store_secret(spec, self.settings)
        for name in referenced_secrets(spec):
            labels = None if name == store else await self._labels(run.namespace, name)
            if bad := secret_problem(name, namespace=run.namespace, labels=labels, store_secret=store):
                return bad
        return None

    async def store_problem(self, run: RunRef, spec: AgentRunSpec) -> str | None:
        """Why the run may not use its store Secret (checked before the operator opens that store), or None."""
        name = store_secret(spec, self.settings)
        if name == self.settings.default_store_secret:
            return None
        return store_secret_problem(
            name,
            namespace=run.namespace,
            labels=await self._labels(run.namespace, name),
            default_store_secret=self.settings.default_store_secret,
        )
