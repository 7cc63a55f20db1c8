"""The AgentRun spec as a pydantic model.

The CRD schema is the first line of validation; this model is the second,
because an API server may run without the schema (old clusters, emulators)
and because some rules do not fit OpenAPI (a resume with several values
must name interrupt ids). Field names are the CRD's camelCase, but for
``spec.config``: ``contract.RunConfigSpec``, the run config's names aliased by
the CRD's keys (one model for the CRD, the operator and the runner). A unit
test holds this model and the CRD's schema to the same fields and bounds.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# spec.config's model is the pod contract's (one model for the CRD, the operator and the runner).
from agentrun.contract import ENV_PREFIX, Env, RunConfigSpec

from . import hostile

# module.path:attribute, the attribute itself a dotted path (an entry point's form: pkg.mod:factory.graph).
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
GRAPH_PATTERN = f"^{_DOTTED}:{_DOTTED}$"
# 189 = 253 (the store's thread id limit) - 63 (namespace) - 1 ("/"): the store key always fits.
THREAD_ID_MAX = 189
THREAD_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._:@-]*[A-Za-z0-9])?$"
REQUEST_ID_MAX = 253


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResumeSpec(_Model):
    """``spec.resume``: one answer (``value``) or answers by interrupt id (``values``)."""

    value: Any = None
    values: dict[str, Any] | None = None

    def digest(self) -> str:
        """Identifies this answer, so one spec.resume starts exactly one attempt."""
        raw = json.dumps(self.model_dump(), sort_keys=True, default=str)
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


class RestartPolicySpec(_Model):
    """``spec.restartPolicy``: how many reschedules, with what backoff, and the outage and image-pull bounds."""

    maxRestarts: int = Field(default=3, ge=0, le=100)
    backoffSeconds: float = Field(default=5, ge=0, le=3600)
    # A store outage (runner exit 8) is rescheduled with backoff, never counted as a restart; the run fails
    # StoreUnavailable only once the store has been unavailable this long (from the first unavailability).
    storeUnavailableTimeoutSeconds: float = Field(default=900, ge=0, le=86400)
    # ErrImagePull / ImagePullBackOff fail the run once the pod waited this long for its image.
    imagePullTimeoutSeconds: float = Field(default=300, ge=0, le=86400)


class SecretRef(_Model):
    """A Secret in the run's namespace, by name."""

    name: str = Field(min_length=1, max_length=253)


class StoreSpec(_Model):
    """``spec.store``: the store Secret (``postgresDsn``, optional ``redisUrl`` and ``postgresListenDsn``)."""

    secretRef: SecretRef


class EnvVar(_Model):
    """One ``spec.podTemplate.env`` variable; the contract's ``AGENTRUN_`` names are refused."""

    # Kubernetes' rule for a container's variable name (the CRD's): dots and dashes are allowed.
    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    valueFrom: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _not_the_contracts(cls, name: str) -> str:
        # Case-insensitive: the runner's settings read env names case-insensitively. The one AGENTRUN_
        # variable a user may set is crash-test fault injection (agentrun.faults): it can only make the
        # user's own runner kill itself at a named point.
        if name.upper().startswith(ENV_PREFIX) and name != Env.FAULT_POINT:
            raise ValueError(
                f"{name} is reserved: AGENTRUN_ variables are the operator's to set (the runner's contract); "
                "set the store with spec.store, the graph with spec.graph and run settings with spec.config"
            )
        return name


# Annotation prefixes that change how a container is confined (AppArmor, seccomp, runtime handler
# settings read by CRI-O, containerd or crun): the pod's confinement is the operator's, never the spec's.
CONFINEMENT_ANNOTATION_PREFIXES = (
    "container.apparmor.security.beta.kubernetes.io/",
    "apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "security.alpha.kubernetes.io/",
    "io.kubernetes.cri-o.",
    "io.containerd.",
    "run.oci.",
    "io.katacontainers.",
    "io.kubernetes.cri.",
)


def confinement_annotation(key: str) -> bool:
    """Whether an annotation key would change the pod's confinement (AppArmor, seccomp, ...): refused."""
    lowered = key.lower()
    return lowered.startswith(CONFINEMENT_ANNOTATION_PREFIXES) or ".security." in lowered.split("/")[0]


class PodTemplateSpec(_Model):
    """The safe subset: nothing here can add privileges, volumes or a service account."""

    resources: dict[str, Any] | None = None
    nodeSelector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = None
    env: list[EnvVar] | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None

    @field_validator("annotations")
    @classmethod
    def _no_confinement(cls, annotations: dict[str, str] | None) -> dict[str, str] | None:
        for key in annotations or {}:
            if confinement_annotation(key):
                raise ValueError(
                    f"annotation {key[:120]} would change the runner pod's confinement (AppArmor, seccomp or "
                    "container runtime settings), which the operator sets (the restricted Pod Security profile)"
                )
        return annotations


class AgentRunSpec(_Model):
    """An AgentRun's spec, validated as the operator reads it (the CRD's schema may not have)."""

    graph: str = Field(pattern=GRAPH_PATTERN)
    image: str | None = None
    threadId: str = Field(pattern=THREAD_PATTERN, min_length=1, max_length=THREAD_ID_MAX)
    userId: str | None = None
    input: dict[str, Any] | None = None
    config: RunConfigSpec = RunConfigSpec()
    stop: bool = False
    resume: ResumeSpec | None = None
    restartPolicy: RestartPolicySpec = RestartPolicySpec()
    store: StoreSpec | None = None
    podTemplate: PodTemplateSpec | None = None
    # The turn's identity on the thread (see decide.identity): a request that already completed is not run again.
    requestId: str | None = Field(default=None, min_length=1, max_length=REQUEST_ID_MAX)
    # Bumped by the user (kubectl patch) to re-open a Failed run; the next attempt resumes the same turn.
    retry: int = Field(default=0, ge=0, le=1000)
    # Job parity: the whole run's time bound from status.startTime, and how long a finished run is kept.
    activeDeadlineSeconds: int | None = Field(default=None, ge=1)
    ttlSecondsAfterFinished: int | None = Field(default=None, ge=0)

    def run_config(self) -> dict[str, Any]:
        """The runner's AGENTRUN_CONFIG: only what the user set, so the runtime's defaults apply."""
        return self.config.wire()


class InvalidSpec(ValueError):
    """A spec the operator refuses; the message names each offending field."""


def parse_spec(raw: dict[str, Any]) -> AgentRunSpec:
    # First, iteratively: a spec nested thousands of levels deep must not reach pydantic or json.dumps.
    """The spec, or ``InvalidSpec`` with what is wrong (a hostile shape is refused before it is parsed)."""
    if (bad := hostile.problem(raw)) is not None:
        raise InvalidSpec(bad)
    try:
        return AgentRunSpec.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"spec.{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors()
        )
        raise InvalidSpec(problems) from None


def thread_key(namespace: str, thread_id: str) -> str:
    """Threads are scoped by namespace in the store: two namespaces never share a thread."""
    return f"{namespace}/{thread_id}"
