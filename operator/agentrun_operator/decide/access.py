"""What an AgentRun may reach (pure): Secrets by namespace permission, images by the operator's allow-list.

The operator creates runner pods with its own rights, so without these checks
anyone allowed to create an AgentRun could read every Secret in the namespace
through ``spec.podTemplate.env[].valueFrom.secretKeyRef`` (a confused deputy).
The rules:

- a Secret may be referenced only when it is labelled ``agentrun.dev/runner-access: "true"``
  (the namespace's owners opt each Secret in);
- the run's store Secret never: it reaches the runner only through the operator's own
  ``secretKeyRef`` for the store variables;
- a store Secret named by ``spec.store.secretRef`` is held to the same label, since its DSN
  reaches the runner pod (and the operator would open that database): only the operator's
  default store Secret, which the cluster admin chose, needs no label;
- ``spec.image`` must start with one of the operator's allowed image prefixes (an empty list
  allows any image).

A violation ends the run Failed ``InvalidSpec`` before any pod exists. Trust
model: whoever can create an AgentRun can run code with the Secrets the
namespace allows, as whoever can create a Job can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .spec import AgentRunSpec

RUNNER_ACCESS_LABEL = "agentrun.dev/runner-access"


def referenced_secrets(spec: AgentRunSpec) -> list[str]:
    """The Secret names ``spec.podTemplate.env`` references, in order, without repeats."""
    names: list[str] = []
    for var in (spec.podTemplate.env or []) if spec.podTemplate else []:
        ref = (var.valueFrom or {}).get("secretKeyRef")
        name = ref.get("name") if isinstance(ref, Mapping) else None
        if isinstance(name, str) and name not in names:
            names.append(name)
    return names


def secret_problem(name: str, *, namespace: str, labels: Mapping[str, str] | None, store_secret: str) -> str | None:
    """Why ``name`` may not be referenced (``labels`` None: the Secret does not exist), or None."""
    allow = f'kubectl label secret -n {namespace} {name} {RUNNER_ACCESS_LABEL}="true"'
    if name == store_secret:
        return (
            f"spec.podTemplate.env references Secret {namespace}/{name}, the run's store Secret: it reaches the "
            "runner only through the operator's own store variables and cannot be referenced"
        )
    if labels is None:
        return (
            f"spec.podTemplate.env references Secret {namespace}/{name}, which does not exist; create it "
            f'labelled {RUNNER_ACCESS_LABEL}: "true"'
        )
    if labels.get(RUNNER_ACCESS_LABEL) != "true":
        return (
            f"spec.podTemplate.env references Secret {namespace}/{name}, which is not labelled "
            f'{RUNNER_ACCESS_LABEL}: "true"; to let AgentRuns use it: {allow}'
        )
    return None


def image_problem(image: str | None, allowed_prefixes: Sequence[str]) -> str | None:
    """Why ``spec.image`` is refused, or None (unset: the operator's default image; no prefixes: any image)."""
    if not image or not allowed_prefixes or any(image.startswith(prefix) for prefix in allowed_prefixes):
        return None
    return (
        f"spec.image {image[:200]!r} is not allowed by this operator; allowed image prefixes: "
        f"{', '.join(allowed_prefixes)}"
    )


def store_secret_problem(
    name: str, *, namespace: str, labels: Mapping[str, str] | None, default_store_secret: str
) -> str | None:
    """Why ``spec.store.secretRef`` may not name ``name`` (``labels`` None: it does not exist), or None.

    A missing Secret is the store check's to report (it says which key is missing or which Secret to create).
    """
    if name == default_store_secret or labels is None or labels.get(RUNNER_ACCESS_LABEL) == "true":
        return None
    return (
        f"spec.store.secretRef names Secret {namespace}/{name}, which is not labelled "
        f'{RUNNER_ACCESS_LABEL}: "true" (its postgresDsn would reach the runner pod); to let AgentRuns use it '
        f'as their store: kubectl label secret -n {namespace} {name} {RUNNER_ACCESS_LABEL}="true"'
    )
