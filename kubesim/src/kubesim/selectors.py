"""``labelSelector`` and ``fieldSelector`` query parameters of list and watch requests.

Label selectors support the full set-based syntax (``a=b``, ``a!=b``, ``a in (x,y)``,
``a notin (x)``, ``a``, ``!a``). Field selectors compare any dotted field path
(``metadata.name``, ``status.phase``, ``involvedObject.uid``, ...) with ``=``,
``==`` or ``!=``; the real server allows only a per-kind list of fields, a
superset is harmless for tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kubesim import apierrors

Predicate = Callable[[dict[str, Any]], bool]

_SET_EXPR = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_EXPR = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")


def _split(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


def label_selector(selector: str | None) -> Predicate:
    """A predicate for a label selector (``a=b``, ``a!=b``, ``a in (x,y)``, ``!a``, ...); all objects when empty."""
    if not selector:
        return lambda obj: True
    checks = [_label_requirement(term) for term in _split(selector)]

    def predicate(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return predicate


def _label_requirement(term: str) -> Callable[[dict[str, str]], bool]:
    if match := _EQ_EXPR.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _SET_EXPR.match(term):
        negate, key, op, values = match.groups()
        options = {v.strip() for v in (values or "").split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in options
        if op == "notin":
            return lambda labels: labels.get(key) not in options
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise apierrors.bad_request(f"unable to parse requirement: {term!r}")


def field_selector(selector: str | None) -> Predicate:
    """A predicate for a field selector (``metadata.name=x``, ...); all objects when empty."""
    if not selector:
        return lambda obj: True
    checks = [_field_requirement(term) for term in _split(selector)]
    return lambda obj: all(check(obj) for check in checks)


def _field_requirement(term: str) -> Predicate:
    match = re.match(r"^\s*([A-Za-z0-9._\[\]-]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
    if match is None:
        raise apierrors.bad_request(f"invalid selector: {term!r}; can't understand {term!r}")
    path, op, value = match.groups()
    if op == "!=":
        return lambda obj: _field(obj, path) != value
    return lambda obj: _field(obj, path) == value


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
