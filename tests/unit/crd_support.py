"""The CRD as the unit tier reads it, and where a pydantic model and the CRD's schema disagree.

The CRD (``crds/agentrun.dev_agentruns.yaml``) is the API server's validation; the operator's models
are the second line. Where they drift, the API server prunes what the model expects (a model field
the CRD does not declare) or the operator refuses what the API server accepted (a CRD field the model
forbids, a bound the model states tighter): ``drift`` names each such place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from agentrun.contract import VERSION

CRD = Path(__file__).resolve().parents[2] / "crds" / "agentrun.dev_agentruns.yaml"
# The bounds compared where both sides state one.
BOUNDS = ("minimum", "maximum", "minLength", "maxLength", "pattern", "default")


def crd_schema(*path: str) -> dict[str, Any]:
    """The CRD's openAPIV3Schema of the served version, or the property at ``path`` (``"spec", "config"``)."""
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)["schema"]
    schema = schema["openAPIV3Schema"]
    for key in path:
        schema = schema["properties"][key]
    return schema


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without its ``$ref`` and its ``Optional`` (``anyOf`` with null): what a present value must be."""
    if "$ref" in schema:
        schema = {**defs[schema["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in schema.items() if k != "$ref"}}
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(options) == 1:
        schema = {**_resolve(options[0], defs), **{k: v for k, v in schema.items() if k != "anyOf"}}
    return schema


def _same_type(model: str | None, crd: str | None) -> bool:
    # A model taking any number accepts the CRD's integer; no type on one side (Any, preserved fields) is no claim.
    return model is None or crd is None or model == crd or (model, crd) == ("number", "integer")


def drift(model: type[BaseModel], crd: dict[str, Any], where: str) -> list[str]:
    """Each disagreement between ``model`` (by alias) and the CRD schema ``crd`` at ``where``, in words."""
    schema = model.model_json_schema(by_alias=True)
    return _compare(schema, crd, where, schema.get("$defs", {}))


def _compare(model: dict[str, Any], crd: dict[str, Any], where: str, defs: dict[str, Any]) -> list[str]:
    found = []
    fields, declared = model.get("properties", {}), crd.get("properties", {})
    found += [
        f"{where}.{name}: in the model, not in the CRD (the API server prunes it)" for name in fields.keys() - declared
    ]
    if model.get("additionalProperties") is False:
        found += [
            f"{where}.{name}: in the CRD, refused by the model (extra fields forbidden)"
            for name in declared.keys() - fields
        ]
    if set(model.get("required", [])) != set(crd.get("required", [])):
        found.append(
            f"{where}: required {sorted(model.get('required', []))} in the model, {crd.get('required', [])} in the CRD"
        )
    for name in fields.keys() & declared.keys():
        field, theirs = _resolve(fields[name], defs), declared[name]
        if not _same_type(field.get("type"), theirs.get("type")):
            found.append(f"{where}.{name}: type {field.get('type')} in the model, {theirs.get('type')} in the CRD")
        for bound in BOUNDS:
            if bound == "default" and field.get("type") == "object":
                continue  # the CRD defaults an object to {} and its fields one by one; the model builds it whole
            if bound in field and bound in theirs and field[bound] != theirs[bound]:
                found.append(f"{where}.{name}: {bound} {field[bound]!r} in the model, {theirs[bound]!r} in the CRD")
        if field.get("type") == "object" and "properties" in field:
            found += _compare(field, theirs, f"{where}.{name}", defs)
        elif field.get("type") == "array" and "properties" in _resolve(field.get("items", {}), defs):
            found += _compare(_resolve(field["items"], defs), theirs.get("items", {}), f"{where}.{name}[]", defs)
    return found
