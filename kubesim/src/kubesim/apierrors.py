"""Kubernetes API errors as the real API server shapes them (a ``v1 Status``).

Clients branch on ``code`` and ``reason`` (kopf retries a 409, treats a 422 on a
JSON-patch ``test`` as a lost race; kubectl prints ``message``), so these keep
the real server's codes, reasons and message formats. Field errors follow
``k8s.io/apimachinery/pkg/util/validation/field``: ``<path>: <detail>``, several
joined as ``[a, b]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import attrs
import kmock


@attrs.frozen
class ApiError(kmock.KubernetesError):
    """A failure answered as a ``Status`` object; ``details`` is the Status details."""

    status: int = 500
    reason: str | None = "InternalError"
    message: str | None = None
    details: Any | None = None
    headers: Any | None = None

    def as_status(self) -> dict[str, Any]:
        """The error as the ``v1 Status`` body kube-apiserver answers with."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message or "",
            "reason": self.reason or "",
            "code": self.status,
        }
        if not self.reason:  # StatusReasonUnknown: the real server leaves the field out
            del body["reason"]
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class FieldError:
    """One invalid field: ``field`` is the dotted path, ``detail`` the text after it."""

    field: str
    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, ...
    detail: str

    def __str__(self) -> str:
        return f"{self.field}: {self.detail}" if self.field else self.detail


def go_value(value: Any) -> str:
    """A value the way the field errors print it (strings quoted, containers by type)."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(status=400, reason="BadRequest", message=message)


def not_found(group_resource: str, name: str) -> ApiError:
    """404 NotFound for ``name`` of ``group_resource``."""
    return ApiError(
        status=404,
        reason="NotFound",
        message=f'{group_resource} "{name}" not found',
        details={"name": name, **_gr_details(group_resource)},
    )


def unauthorized() -> ApiError:
    """What kube-apiserver answers when authentication fails (the body says no more, on purpose)."""
    return ApiError(status=401, reason="Unauthorized", message="Unauthorized")


def resource_not_found() -> ApiError:
    """404 for a resource the server does not serve."""
    return ApiError(
        status=404,
        reason="NotFound",
        message="the server could not find the requested resource",
        details={"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
    )


def already_exists(group_resource: str, name: str) -> ApiError:
    """409 AlreadyExists for ``name`` of ``group_resource``."""
    return ApiError(
        status=409,
        reason="AlreadyExists",
        message=f'{group_resource} "{name}" already exists',
        details={"name": name, **_gr_details(group_resource)},
    )


def conflict(group_resource: str, name: str, why: str | None = None) -> ApiError:
    """409 Conflict for ``name`` (by default: the resourceVersion the write was based on is stale)."""
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(
        status=409,
        reason="Conflict",
        message=f'Operation cannot be fulfilled on {group_resource} "{name}": {why}',
        details={"name": name, **_gr_details(group_resource)},
    )


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid, e.g. ``AgentRun.agentrun.dev "x" is invalid: spec.graph: Required value``."""
    qualified = f"{kind}.{group}" if group else kind
    text = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    return ApiError(
        status=422,
        reason="Invalid",
        message=f'{qualified} "{name}" is invalid: {text}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": e.reason, "message": e.detail, "field": e.field} for e in errors],
        },
    )


def unprocessable(message: str) -> ApiError:
    """422 for a JSON patch that cannot be applied (e.g. a failed ``test`` op)."""
    return ApiError(status=422, reason="Invalid", message=message)


def forbidden(group_resource: str, name: str, why: str) -> ApiError:
    """403 Forbidden for ``name`` of ``group_resource``, saying ``why``."""
    return ApiError(
        status=403,
        reason="Forbidden",
        message=f'{group_resource} "{name}" is forbidden: {why}',
        details={"name": name, **_gr_details(group_resource)},
    )


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(status=405, reason="MethodNotAllowed", message=message)


def unsupported_media_type(detail: str) -> ApiError:
    """415 UnsupportedMediaType."""
    return ApiError(
        status=415,
        reason="UnsupportedMediaType",
        message=f"the body of the request was in an unknown format - accepted media types include: "
        f"application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml ({detail})",
    )


def gone(message: str) -> ApiError:
    """410 Expired (a watch or list from a resourceVersion too old to serve)."""
    return ApiError(status=410, reason="Expired", message=message)


def _gr_details(group_resource: str) -> dict[str, str]:
    plural, _, group = group_resource.partition(".")
    return {"group": group, "kind": plural}
