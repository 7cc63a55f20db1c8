"""kopf's last-handled-configuration without the run's free-form values (``spec.input``, ``spec.resume``).

kopf keeps an AgentRun's "essence" (its spec, labels and annotations) in an
annotation, to tell what changed since it last handled the object. An input of
1 MiB would make that annotation 1 MiB: a real API server refuses annotations
over 256 KiB in total, and the object itself would double towards its 1.5 MiB
limit. A value nested thousands of levels deep would also be encoded, diffed
and decoded on every event. So the free-form values are kept as digests: a
changed ``spec.resume`` still changes the essence (the update handler still
fires at once), and the annotation stays small whatever the run carries.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

import kopf

DIGESTED = ("input", "resume")


def digest(value: Any) -> str:
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(raw.encode("utf-8", errors="surrogatepass")).hexdigest()


class DigestedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """``AnnotationsDiffBaseStorage`` whose essence holds digests of ``spec.input`` and ``spec.resume``."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        essence = cast(dict[str, Any], super().build(body=body, extra_fields=extra_fields))
        spec = essence.get("spec")
        if isinstance(spec, dict):
            for field in DIGESTED:
                if field in spec:
                    try:
                        spec[field] = digest(spec[field])
                    except (ValueError, RecursionError):
                        spec[field] = "unencodable"  # the reconcile refuses such a spec (decide.hostile)
        return cast(kopf.BodyEssence, essence)
