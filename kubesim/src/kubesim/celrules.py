"""CRD validation rules (``x-kubernetes-validations``), evaluated with a real CEL implementation.

The API server compiles every rule of a CRD's structural schema and, on each
write, evaluates the rules of every schema node present in the object, with
``self`` bound to the value at that node. This follows
``k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go`` as of
Kubernetes 1.32:

- A rule that mentions ``oldSelf`` is a transition rule: it runs only on
  updates, and only where the old object has a value at the same place
  (correlated through properties and maps, never through list items, which are
  correlated only in ``x-kubernetes-list-type: map`` lists, by their keys).
  ``optionalOldSelf: true`` rules also run without an old value (``oldSelf``
  is then an optional).
- Null values are not validated; rules on absent fields do not run.
- A failing rule is a field error at the node (or at ``fieldPath`` below it):
  ``<path>: Invalid value: <value>: <message>`` as kube-apiserver 1.37 prints
  it: a scalar value of the rule's node as Go does (``"thread-b"``, ``false``,
  ``3``), nothing for an object or a list (``<path>: Invalid value: <message>``;
  1.32 printed the schema type, ``"string"``, instead: seen on the real server),
  ``Forbidden: <message>`` / ``Required value: <message>`` with ``reason``;
  no ``message`` gives ``failed rule: <rule>``; ``messageExpression`` is used
  when it evaluates to a string.
- An evaluation error is reported as ``<error> evaluating rule: <rule>``
  (``no such key: x`` ...), an unparsable rule as ``rule compile error: ...``.
- Ratcheting (on by default since 1.30): an error of a non-transition rule at a
  node whose value did not change on an update is a warning, not an error.
- Rules do not run when the object already has a type error.

The CEL engine is ``common-expression-language`` (the Rust ``cel`` crate):
compiled once, no process-wide side effects. cel-python was the other
candidate; its ``Environment()`` resets ``sys.setrecursionlimit`` to 2500 on
every call, which would undo the bounded raise the emulator needs for the
10,000-level objects the real server accepts (see ``limits``).

Not emulated (hazards): the type checking of rules against the schema at CRD
creation (an unknown field in a rule is a runtime ``no such key`` here, a
rejected CRD on a real server), the cost budget, the Kubernetes CEL library
extensions (``isSorted``, ``url``, ``quantity``, ``format`` ...; the engine
has the CEL standard library only), and ``x-kubernetes-embedded-resource``
roots. Values nested deeper than ``MAX_CEL_DEPTH`` below ``self`` reach the
engine as opaque digests (equality still compares them correctly), because the
engine converts values recursively and would overflow the stack on the 10,000
levels a real server accepts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import cel

from kubesim.apierrors import FieldError, go_value

MAX_CEL_DEPTH = 64
_DEEP = "\x00emulator:deep-value:"
NOT_CHECKED = (
    'Invalid value: "null": some validation rules were not checked because the object was invalid; '
    "correct the existing errors to complete validation"
)


@dataclass(frozen=True)
class Rule:
    """One ``x-kubernetes-validations`` rule, compiled (or the compile error it gets instead)."""

    source: dict[str, Any]
    program: cel.Program | None
    message_program: cel.Program | None
    compile_error: str | None
    uses_old_self: bool

    @classmethod
    def compile(cls, source: dict[str, Any]) -> Rule:
        """The rule of ``source`` compiled, its ``messageExpression`` too; a compile error is kept, not raised."""
        text = str(source.get("rule", ""))
        try:
            program = cel.compile(text)
        except ValueError as e:
            return cls(source, None, None, str(e), False)
        message_program = None
        if source.get("messageExpression"):
            try:
                message_program = cel.compile(str(source["messageExpression"]))
            except ValueError as e:
                return cls(source, None, None, f"messageExpression compile error: {e}", False)
        return cls(source, program, message_program, None, "oldSelf" in program.variables())

    @property
    def error_string(self) -> str:
        """What kube-apiserver names the rule by in an error: its ``message``, else its source text."""
        return str(self.source.get("message") or "").strip() or str(self.source.get("rule", "")).strip()

    @property
    def message(self) -> str:
        """The message of a failed rule: its ``message``, else ``failed rule: <rule>``."""
        message = str(self.source.get("message") or "").strip()
        return message or f"failed rule: {self.error_string}"


@dataclass
class Node:
    """The rules of one schema node and of the nodes below it that have rules."""

    schema: dict[str, Any]
    rules: list[Rule] = field(default_factory=list)
    properties: dict[str, Node] = field(default_factory=dict)
    items: Node | None = None
    additional: Node | None = None

    @classmethod
    def build(cls, schema: dict[str, Any]) -> Node | None:
        """The rules of ``schema`` and its properties, or ``None`` when none of it has a rule."""
        node = cls(schema, [Rule.compile(r) for r in schema.get("x-kubernetes-validations") or []])
        for name, sub in (schema.get("properties") or {}).items():
            if (child := cls.build(sub)) is not None:
                node.properties[name] = child
        if isinstance(schema.get("items"), dict):
            node.items = cls.build(schema["items"])
        if isinstance(schema.get("additionalProperties"), dict):
            node.additional = cls.build(schema["additionalProperties"])
        if node.rules or node.properties or node.items or node.additional:
            return node
        return None


class Validator:
    """The ``x-kubernetes-validations`` of one CRD version's schema."""

    def __init__(self, root: Node) -> None:
        self.root = root

    @classmethod
    def for_schema(cls, schema: dict[str, Any]) -> Validator | None:
        """A validator of ``schema``'s rules, or ``None`` when it has none."""
        root = Node.build(schema)
        return cls(root) if root is not None else None

    def validate(
        self, obj: dict[str, Any], old: dict[str, Any] | None, prior: list[FieldError]
    ) -> tuple[list[FieldError], list[str]]:
        """Field errors and ratcheting warnings for a create (``old`` None) or an update."""
        if any(e.reason == "FieldValueTypeInvalid" for e in prior):
            return [FieldError("<nil>", "FieldValueInvalid", NOT_CHECKED)], []
        errors: list[FieldError] = []
        warnings: list[str] = []
        # Iterative over the schema's nodes with rules: the object may be 10,000 levels deep.
        stack: list[tuple[Node, Any, Any, str, bool]] = [(self.root, obj, old, "", old is not None)]
        while stack:
            node, value, old_value, path, correlated = stack.pop()
            if value is None:
                continue
            unchanged = correlated and old_value is not None and value == old_value
            for error in _evaluate(node, value, old_value if correlated else None, path):
                if error[1] and unchanged:
                    warnings.append(str(error[0]))
                else:
                    errors.append(error[0])
            stack.extend(reversed(list(_children(node, value, old_value, path, correlated))))
        return errors, warnings


def _children(
    node: Node, value: Any, old: Any, path: str, correlated: bool
) -> Iterator[tuple[Node, Any, Any, str, bool]]:
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) and correlated else {}
        atomic = node.schema.get("x-kubernetes-map-type") == "atomic"
        for key, item in value.items():
            declared = key in (node.schema.get("properties") or {})
            child = node.properties.get(key) if declared else node.additional
            if child is not None:
                sub = f"{path}.{key}" if path else key
                yield child, item, old_map.get(key), sub, correlated and not atomic and key in old_map
    elif isinstance(value, list) and node.items is not None:
        keys = node.schema.get("x-kubernetes-list-map-keys") or []
        by_key: dict[str, Any] = {}
        if node.schema.get("x-kubernetes-list-type") == "map" and correlated and isinstance(old, list):
            by_key = {_map_key(item, keys): item for item in old if isinstance(item, dict)}
        for index, item in enumerate(value):
            old_item = by_key.get(_map_key(item, keys)) if isinstance(item, dict) else None
            yield node.items, item, old_item, f"{path}[{index}]", old_item is not None


def _map_key(item: dict[str, Any], keys: list[str]) -> str:
    return json.dumps([item.get(k) for k in keys])


def _evaluate(node: Node, value: Any, old: Any, path: str) -> Iterator[tuple[FieldError, bool]]:
    """(error, ratchetable) for each rule of the node that fails."""
    type_ = str(node.schema.get("type", ""))
    self_value = _bounded(value)
    old_value = _bounded(old) if old is not None else None
    for rule in node.rules:
        if rule.compile_error is not None:
            yield (
                FieldError(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {go_value(type_)}: rule compile error: {rule.compile_error}",
                ),
                False,
            )
            continue
        optional = bool(rule.source.get("optionalOldSelf"))
        if rule.uses_old_self and old is None and not optional:
            continue
        variables: dict[str, Any] = {"self": self_value}
        if rule.uses_old_self:
            variables["oldSelf"] = (
                cel.OptionalValue.of(old_value)
                if optional and old is not None
                else (cel.OptionalValue.none() if optional else old_value)
            )
        assert rule.program is not None
        try:
            result = rule.program.execute(variables)
        except Exception as e:  # the engine's runtime errors: KeyError, TypeError, ValueError, RuntimeError
            yield (
                FieldError(path, "FieldValueInvalid", f"Invalid value: {go_value(type_)}: {_runtime_error(e, rule)}"),
                False,
            )
            continue
        if result is True:
            continue
        detail = rule.message
        if rule.message_program is not None:
            try:
                evaluated = rule.message_program.execute(variables)
            except Exception:  # falls back to the static message, as the real server does
                evaluated = None
            if isinstance(evaluated, str) and evaluated.strip() and "\n" not in evaluated:
                detail = evaluated.strip()
        target = path + str(rule.source.get("fieldPath") or "")
        yield _field_error(target.lstrip("."), type_, value, detail, rule.source.get("reason")), not rule.uses_old_self


def _field_error(path: str, type_: str, value: Any, detail: str, reason: Any) -> FieldError:
    match reason:
        case "FieldValueForbidden":
            return FieldError(path, "FieldValueForbidden", f"Forbidden: {detail}")
        case "FieldValueRequired":
            return FieldError(path, "FieldValueRequired", f"Required value: {detail}")
        case "FieldValueDuplicate":
            return FieldError(path, "FieldValueDuplicate", f"Duplicate value: {go_value(type_)}")
        case _:
            if isinstance(value, dict | list):  # kube-apiserver omits a structured value
                return FieldError(path, "FieldValueInvalid", f"Invalid value: {detail}")
            return FieldError(path, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {detail}")


def _runtime_error(error: Exception, rule: Rule) -> str:
    if isinstance(error, KeyError):
        return f"no such key: {error.args[0] if error.args else ''} evaluating rule: {rule.error_string}"
    text = str(error)
    if text.lower().startswith("no such overload"):
        return (
            f"'no such overload': call arguments did not match a supported operator, function or macro "
            f"signature for rule: {rule.error_string}"
        )
    return f"{text} evaluating rule: {rule.error_string}"


def _bounded(value: Any) -> Any:
    """``value`` with containers deeper than MAX_CEL_DEPTH replaced by a digest of their content."""
    if not isinstance(value, (dict, list)):
        return value
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
    while stack:
        item, holder, slot, depth = stack.pop()
        if isinstance(item, dict | list) and depth >= MAX_CEL_DEPTH:
            digest = hashlib.sha256(json.dumps(item, sort_keys=True).encode()).hexdigest()
            holder[slot] = _DEEP + digest
        elif isinstance(item, dict):
            copied: dict[str, Any] = {}
            holder[slot] = copied
            stack.extend((v, copied, k, depth + 1) for k, v in item.items())
        elif isinstance(item, list):
            items: list[Any] = [None] * len(item)
            holder[slot] = items
            stack.extend((v, items, i, depth + 1) for i, v in enumerate(item))
        else:
            holder[slot] = item
    return root[0]
