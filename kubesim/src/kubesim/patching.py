"""The three PATCH flavours of the Kubernetes API.

- ``application/merge-patch+json`` (RFC 7386: ``null`` deletes, lists replace):
  kopf's status and finalizer patches, ``kubectl patch --type merge``, and
  ``kubectl apply`` on custom resources.
- ``application/json-patch+json`` (RFC 6902, via ``jsonpatch``): kopf guards its
  writes with a ``test`` op on ``metadata.resourceVersion``; a failed test is a
  422, which kopf reads as "lost the race, retry".
- ``application/strategic-merge-patch+json``: built-in kinds only (a custom
  resource answers 415, like the real server). Lists with a patch merge key
  (containers and env by name, conditions by type, ...) are merged by that
  key, ``finalizers`` as a set; ``$patch: delete|replace`` and
  ``$deleteFromPrimitiveList`` are honoured, ``$setElementOrder`` and
  ``$retainKeys`` are accepted and ignored (ordering is not emulated).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer

from kubesim import apierrors

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# patchMergeKey of the list fields that have patchStrategy "merge" in the core API types.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "readinessGates": "conditionType",
    "resourceClaims": "name",
}
_MERGED_SETS = {"finalizers"}


def apply(current: dict[str, Any], content_type: str, patch: Any, *, custom: bool) -> dict[str, Any]:
    """The patched copy of ``current``; raises an ApiError the way the API server would."""
    media = content_type.split(";")[0].strip()
    if media == JSON:
        if not isinstance(patch, list):
            raise apierrors.bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        try:
            patched_doc: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(current), patch)
            return patched_doc
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
            raise apierrors.unprocessable(str(e)) from e
    if not isinstance(patch, dict):
        raise apierrors.bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
    if media == MERGE:
        merged: dict[str, Any] = merge(current, patch)
        return merged
    if media == STRATEGIC and not custom:
        patched: dict[str, Any] = strategic(current, patch)
        return patched
    raise apierrors.unsupported_media_type(content_type)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def strategic(target: Any, patch: Any, field: str = "") -> Any:
    """A strategic merge patch of ``target`` (``field``: where in the object, for list merge keys)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(("$setElementOrder/", "$retainKeys")) or key == "$patch":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, _MERGE_KEYS[key])
        elif isinstance(value, list) and key in _MERGED_SETS and isinstance(result.get(key), list):
            result[key] = result[key] + [v for v in value if v not in result[key]]
        else:
            merged = strategic(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    result = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            result.append(copy.deepcopy(item))
            continue
        index = next(
            (i for i, old in enumerate(result) if isinstance(old, dict) and old.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            result[index] = strategic(result[index], item)
    return result
