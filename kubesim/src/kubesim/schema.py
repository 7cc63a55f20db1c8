"""A CRD's structural OpenAPI v3 schema applied the way kube-apiserver applies it.

Order on every write, as in the real server: defaulting (``default``, top-down,
so ``default: {}`` on an object lets its children's defaults apply), pruning of
fields the schema does not know (unless ``x-kubernetes-preserve-unknown-fields``),
then validation. Validation maps the OpenAPI subset onto JSON Schema draft 4
(whose boolean ``exclusiveMinimum`` and ``type`` rules match OpenAPI 3.0) and
translates each failure into the field error the API server would report.

Limits, by design: CEL rules (``x-kubernetes-validations``) are not evaluated,
and only the ``date-time`` format is checked. The AgentRun CRD uses neither.
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema

from kubesim.apierrors import FieldError, go_value

_VENDOR_KEYS = ("x-kubernetes-", "description", "default", "example", "externalDocs", "nullable")


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Fill absent fields that have a ``default``; returns the (mutated) value."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if value.get(key, ...) is None and not sub.get("nullable"):
                del value[key]  # null of a non-nullable field is defaulted like an absent one
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, item in list(value.items()):
            if key in props:
                value[key] = apply_defaults(item, props[key])
            elif isinstance(schema.get("additionalProperties"), dict):
                value[key] = apply_defaults(item, schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def prune(value: Any, schema: dict[str, Any], path: str = "", *, root: bool = True) -> list[str]:
    """Drop unknown fields in place; returns their paths (for strict/warn field validation)."""
    dropped: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        if isinstance(value, dict) and "properties" in schema:
            for key, sub in schema["properties"].items():
                if key in value:
                    dropped += prune(value[key], sub, _join(path, key), root=False)
        return dropped
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key in list(value):
            if root and key in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and key in props:
                dropped += prune(value[key], props[key], _join(path, key), root=False)
            elif isinstance(extra, dict):
                dropped += prune(value[key], extra, _join(path, key), root=False)
            elif extra is True:
                continue
            elif props is not None or extra is False or schema.get("type") == "object":
                dropped.append(_join(path, key))
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            dropped += prune(item, schema["items"], f"{path}[{index}]", root=False)
    return dropped


def to_jsonschema(schema: dict[str, Any], *, strict: bool = False, _field: str = "") -> dict[str, Any]:
    """The OpenAPI v3 structural schema as a plain JSON Schema (draft 4) document.

    ``strict=True`` also rejects the fields the server would prune (what ``kubectl``'s
    default ``fieldValidation=Strict`` makes the server do); ``metadata`` stays open.
    """
    out: dict[str, Any] = {}
    for key, sub in schema.items():
        if key.startswith(_VENDOR_KEYS):
            continue
        if key in ("properties", "definitions"):
            out[key] = {name: to_jsonschema(s, strict=strict, _field=name) for name, s in sub.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(sub, dict):
            out[key] = to_jsonschema(sub, strict=strict)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_jsonschema(s, strict=strict) for s in sub]
        else:
            out[key] = sub
    closed = (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
        and _field != "metadata"
    )
    if strict and closed:
        out["additionalProperties"] = False
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


class SchemaValidator:
    """Validates objects against one CRD version's openAPIV3Schema."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        document = to_jsonschema(schema)
        # metadata is validated by the API machinery (name rules), not by the CRD schema body
        document.get("properties", {}).pop("metadata", None)
        self._validator = jsonschema.Draft4Validator(document, format_checker=format_checker())

    def errors(self, obj: dict[str, Any]) -> list[FieldError]:
        """What in ``obj`` the structural schema refuses, as field errors."""
        found: list[FieldError] = []
        for error in sorted(self._validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
            found.extend(translate(error))
        found.extend(_list_type_errors(obj, self.schema, ""))
        found.extend(_metadata_errors(obj, self.schema))
        return found


def translate(error: jsonschema.ValidationError) -> Iterator[FieldError]:
    """The field error(s) kube-apiserver reports for one JSON Schema failure."""
    path = _path(error.absolute_path)
    # The stubs allow "unset" for errors built by hand; one from iter_errors always
    # carries the offending value, the rule's value and the schema holding the rule.
    value: Any = error.instance
    rule: Any = error.validator_value
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    match error.validator:
        case "required":
            for name in rule:
                if isinstance(value, dict) and name not in value:
                    yield FieldError(_join(path, name), "FieldValueRequired", "Required value")
        case "type":
            expected = rule[0] if isinstance(rule, list) else rule
            yield FieldError(
                path,
                "FieldValueTypeInvalid",
                f'Invalid value: "{_type_name(value)}": {path} in body must be of type '
                f'{expected}: "{_type_name(value)}"',
            )
        case "enum":
            allowed = ", ".join(go_value(v) for v in rule)
            yield FieldError(
                path, "FieldValueNotSupported", f"Unsupported value: {go_value(value)}: supported values: {allowed}"
            )
        case "pattern":
            yield FieldError(
                path,
                "FieldValueInvalid",
                f"Invalid value: {go_value(value)}: {path} in body should match '{rule}'",
            )
        case "minimum" | "maximum":
            exclusive = schema.get("exclusiveMinimum" if error.validator == "minimum" else "exclusiveMaximum")
            word = "greater" if error.validator == "minimum" else "less"
            relation = f"{word} than" if exclusive else f"{word} than or equal to"
            yield FieldError(
                path,
                "FieldValueInvalid",
                f"Invalid value: {go_value(value)}: {path} in body should be {relation} {rule}",
            )
        case "minLength":
            yield FieldError(
                path,
                "FieldValueInvalid",
                f"Invalid value: {go_value(value)}: {path} in body should be at least {rule} chars long",
            )
        case "maxLength":
            yield FieldError(path, "FieldValueTooLong", f"Too long: may not be more than {rule} bytes")
        case "maxItems":
            yield FieldError(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {rule} items")
        case "minItems":
            yield FieldError(
                path,
                "FieldValueInvalid",
                f"Invalid value: {len(value)}: {path} in body should have at least {rule} items",
            )
        case "format":
            yield FieldError(
                path,
                "FieldValueInvalid",
                f"Invalid value: {go_value(value)}: {path} in body must be of type {rule}: {go_value(value)}",
            )
        case "oneOf":  # as kube-apiserver words it, with no field (<nil>)
            failing = {e.relative_schema_path[0] for e in error.context or ()}
            alternatives = error.validator_value if isinstance(error.validator_value, list) else []
            valid = len(alternatives) - len(failing)
            found = "none valid" if valid == 0 else f"{valid} valid alternatives"
            yield FieldError(
                "<nil>",
                "FieldValueInvalid",
                f'Invalid value: "": "{path}" must validate one and only one schema (oneOf). Found {found}',
            )
        case "anyOf" | "allOf" | "not":
            word = {
                "anyOf": "at least one schema (anyOf)",
                "allOf": "all the schemas (allOf)",
                "not": "not match the schema (not)",
            }[error.validator]
            yield FieldError(
                path, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {path} in body must validate {word}"
            )
        case _:
            yield FieldError(path, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {error.message}")


def _list_type_errors(value: Any, schema: dict[str, Any], path: str) -> Iterator[FieldError]:
    """``x-kubernetes-list-type`` map/set uniqueness, which JSON Schema cannot express."""
    if isinstance(value, dict):
        for key, item in value.items():
            sub = (schema.get("properties") or {}).get(key)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                yield from _list_type_errors(item, sub, _join(path, key))
    elif isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        seen: list[Any] = []
        for index, item in enumerate(value):
            if list_type == "map" and isinstance(item, dict):
                key = {k: item.get(k) for k in schema.get("x-kubernetes-list-map-keys", [])}
                if key in seen:
                    yield FieldError(f"{path}[{index}]", "FieldValueDuplicate", f"Duplicate value: {_go_map(key)}")
                seen.append(key)
            elif list_type == "set":
                if item in seen:
                    yield FieldError(f"{path}[{index}]", "FieldValueDuplicate", f"Duplicate value: {go_value(item)}")
                seen.append(item)
            if isinstance(schema.get("items"), dict):
                yield from _list_type_errors(item, schema["items"], f"{path}[{index}]")


def _metadata_errors(obj: dict[str, Any], schema: dict[str, Any]) -> Iterator[FieldError]:
    """A CRD may restrict metadata.name / generateName (and nothing else in metadata)."""
    meta_schema = (schema.get("properties") or {}).get("metadata") or {}
    meta = obj.get("metadata") or {}
    for field in ("name", "generateName"):
        rules = (meta_schema.get("properties") or {}).get(field)
        value = meta.get(field)
        if not rules or not isinstance(value, str):
            continue
        if "maxLength" in rules and len(value) > rules["maxLength"]:
            yield FieldError(
                f"metadata.{field}", "FieldValueTooLong", f"Too long: may not be more than {rules['maxLength']} bytes"
            )
        if "pattern" in rules and not re.search(rules["pattern"], value):
            yield FieldError(
                f"metadata.{field}",
                "FieldValueInvalid",
                f"Invalid value: {go_value(value)}: metadata.{field} in body should match '{rules['pattern']}'",
            )


def format_checker() -> jsonschema.FormatChecker:
    """The formats kube-apiserver checks that the AgentRun schema uses (``date-time``)."""
    checker = jsonschema.FormatChecker(formats=())
    checker.checks("date-time", raises=ValueError)(_check_date_time)
    return checker


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _check_date_time(value: object) -> bool:
    if isinstance(value, str):
        if not _RFC3339.match(value):
            raise ValueError(f"not an RFC 3339 date-time: {value!r}")
        datetime.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    return True


def _type_name(value: Any) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "boolean"
        case int():
            return "integer"
        case float():
            return "number"
        case str():
            return "string"
        case list():
            return "array"
        case _:
            return "object"


def _go_map(value: dict[str, Any]) -> str:
    return "{" + ", ".join(f'"{k}":{go_value(v)}' for k, v in value.items()) + "}"


def _path(parts: Any) -> str:
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    return path


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
