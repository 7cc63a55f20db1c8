"""``/openapi/v3``: the documents kubectl reads for ``explain`` and for field validation.

kubectl 1.32 fetches ``/openapi/v3`` (an index of group-versions) and then the
group-version document at its ``serverRelativeURL``. ``kubectl explain`` renders
the schema of a kind found by its ``x-kubernetes-group-version-kind``;
``kubectl apply/create`` checks that the PATCH operation of the kind accepts the
``fieldValidation`` query parameter and then leaves validation to the server
(``?fieldValidation=Strict``), as with a real API server since 1.27. Without
these documents kubectl falls back to ``/openapi/v2`` (protobuf) and refuses to
apply anything unless ``--validate=false``.

Custom resources are documented from their CRD schema (with ``metadata``
pointing at ObjectMeta, as the real server does); built-ins from the upstream
Kubernetes 1.32 definitions shipped with ``kubernetes-validate``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from typing import Any

from kubernetes_validate import utils as kv_utils

from kubesim.resources import KUBERNETES_VERSION, ResourceDef

_META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_REF = "#/components/schemas/"


@functools.cache
def upstream_definitions() -> dict[str, Any]:
    """The upstream OpenAPI definitions of the built-in kinds (from kubernetes-validate's schemas)."""
    versions = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) == KUBERNETES_VERSION]
    defs = kv_utils.schema_contents(
        f"kubernetes-json-schema/v{versions[-1]}-local/_definitions.json", KUBERNETES_VERSION
    )
    definitions: dict[str, Any] = _to_openapi(defs["$defs"])
    return definitions


def _to_openapi(node: Any) -> Any:
    """JSON Schema 2020-12 ($defs refs, nullable type lists) back to OpenAPI 3.0 style."""
    if isinstance(node, list):
        return [_to_openapi(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = _REF + value.rsplit("/", 1)[-1]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if len(types) == 1 else types
        elif key in ("properties", "$defs", "patternProperties"):
            out[key] = {k: _to_openapi(v) for k, v in value.items()}
        else:
            out[key] = _to_openapi(value)
    return out


def schema_name(rdef: ResourceDef, kind: str | None = None) -> str:
    """The OpenAPI schema name of ``rdef``'s kind (or ``kind``: its list), as kube-apiserver names it."""
    if not rdef.custom:
        # io.k8s.api.core.v1.Pod, io.k8s.api.coordination.v1.Lease,
        # io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition
        package = "core" if rdef.group == "" else rdef.group.split(".")[0]
        suffix = f".{package}.{rdef.version}.{kind or rdef.kind}"
        return _upstream_name(suffix) or f"io.k8s.api{suffix}"
    reversed_group = ".".join(reversed(rdef.group.split(".")))
    return f"{reversed_group}.{rdef.version}.{kind or rdef.kind}"


@functools.cache
def _upstream_name(suffix: str) -> str | None:
    """The first upstream definition named ``*suffix`` (a scan of every definition: once per name)."""
    return next((name for name in upstream_definitions() if name.endswith(suffix)), None)


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(_REF):
                found.add(value[len(_REF) :])
            else:
                found |= _refs(value)
    elif isinstance(node, list):
        for item in node:
            found |= _refs(item)
    return found


def _closure(schemas: dict[str, Any]) -> dict[str, Any]:
    upstream = upstream_definitions()
    pending = set().union(*(_refs(s) for s in schemas.values())) - set(schemas)
    while pending:
        name = pending.pop()
        if name in upstream and name not in schemas:
            schemas[name] = upstream[name]
            pending |= _refs(upstream[name]) - set(schemas)
    return schemas


def _gvk(rdef: ResourceDef, kind: str | None = None) -> list[dict[str, str]]:
    return [{"group": rdef.group, "version": rdef.version, "kind": kind or rdef.kind}]


def _kind_schema(rdef: ResourceDef) -> dict[str, Any]:
    if rdef.custom:
        schema = copy.deepcopy(rdef.schema or {"type": "object"})
        schema.setdefault("properties", {})["metadata"] = {
            "allOf": [{"$ref": f"{_REF}{_META}.ObjectMeta"}],
            "description": "Standard object's metadata. More info: "
            "https://git.k8s.io/community/contributors/devel/sig-architecture/"
            "api-conventions.md#metadata",
        }
    else:
        schema = copy.deepcopy(upstream_definitions()[schema_name(rdef)])
    schema["x-kubernetes-group-version-kind"] = _gvk(rdef)
    return schema


def _list_schema(rdef: ResourceDef) -> dict[str, Any]:
    return {
        "description": f"{rdef.list_kind} is a list of {rdef.kind}",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion defines the versioned schema of this representation of an object.",
            },
            "items": {
                "type": "array",
                "description": f"List of {rdef.plural}.",
                "items": {"$ref": _REF + schema_name(rdef)},
            },
            "kind": {
                "type": "string",
                "description": "Kind is a string value representing the REST resource this object represents.",
            },
            "metadata": {"allOf": [{"$ref": f"{_REF}{_META}.ListMeta"}], "description": "Standard list metadata."},
        },
        "x-kubernetes-group-version-kind": _gvk(rdef, rdef.list_kind),
    }


def _operation(rdef: ResourceDef, action: str, params: list[str], *, sub: str = "") -> dict[str, Any]:
    op_id = f"{action}{rdef.kind}{sub.title()}"
    return {
        "operationId": op_id,
        "description": f"{action} {rdef.kind}{' ' + sub if sub else ''}",
        "parameters": [
            {"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": True} for name in params
        ],
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": {"$ref": _REF + schema_name(rdef)}}},
            }
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rdef)[0],
    }


_WRITE_PARAMS = ["dryRun", "fieldManager", "fieldValidation"]


def _paths(rdef: ResourceDef) -> dict[str, Any]:
    ns = "/namespaces/{namespace}" if rdef.namespaced else ""
    base = (f"/apis/{rdef.group}/{rdef.version}" if rdef.group else f"/api/{rdef.version}") + ns
    collection = f"{base}/{rdef.plural}"
    item = f"{collection}/{{name}}"
    paths = {
        collection: {
            "get": _operation(rdef, "list", ["labelSelector", "fieldSelector", "limit", "continue", "watch"]),
            "post": _operation(rdef, "post", _WRITE_PARAMS),
            "delete": _operation(rdef, "deletecollection", ["labelSelector", "fieldSelector"]),
        },
        item: {
            "get": _operation(rdef, "get", []),
            "put": _operation(rdef, "put", _WRITE_PARAMS),
            "patch": _operation(rdef, "patch", [*_WRITE_PARAMS, "force"]),
            "delete": _operation(rdef, "delete", ["gracePeriodSeconds", "propagationPolicy"]),
        },
    }
    if "status" in rdef.subresources:
        paths[f"{item}/status"] = {
            "get": _operation(rdef, "get", [], sub="status"),
            "put": _operation(rdef, "put", _WRITE_PARAMS, sub="status"),
            "patch": _operation(rdef, "patch", [*_WRITE_PARAMS, "force"], sub="status"),
        }
    return paths


def group_version_document(defs: list[ResourceDef]) -> dict[str, Any]:
    """The ``/openapi/v3`` document of one group version: its kinds' schemas and paths."""
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for rdef in defs:
        schemas[schema_name(rdef)] = _kind_schema(rdef)
        schemas[schema_name(rdef, rdef.list_kind)] = _list_schema(rdef)
        paths.update(_paths(rdef))
    for name in (f"{_META}.ObjectMeta", f"{_META}.ListMeta"):
        schemas.setdefault(name, upstream_definitions()[name])
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kubesim emulated cluster)", "version": f"v{KUBERNETES_VERSION}.0"},
        "paths": paths,
        "components": {"schemas": _closure(schemas)},
    }


def group_versions(defs: list[ResourceDef]) -> dict[str, list[ResourceDef]]:
    """``api/v1`` / ``apis/<group>/<version>`` -> the resources documented there."""
    result: dict[str, list[ResourceDef]] = {}
    for rdef in defs:
        key = f"apis/{rdef.group}/{rdef.version}" if rdef.group else f"api/{rdef.version}"
        result.setdefault(key, []).append(rdef)
    return result


def index(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``/openapi/v3`` index: each group version's document URL, with its hash."""
    return {
        "paths": {key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest(doc)}"} for key, doc in documents.items()}
    }


def digest(doc: dict[str, Any]) -> str:
    """The hash of a document, as its URL carries it."""
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:128].upper()
