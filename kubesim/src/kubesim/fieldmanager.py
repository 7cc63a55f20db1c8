"""Server-side apply and field ownership (``metadata.managedFields``), as kube-apiserver does them.

Helm 4 installs and upgrades with server-side apply (``PATCH`` with
``Content-Type: application/apply-patch+yaml``), and ``kubectl apply
--server-side`` does the same. What the real server does, and this module
with it (after the Kubernetes "Server-Side Apply" documentation and
structured-merge-diff):

- Every write by a named field manager is recorded in ``managedFields``: an
  entry per (manager, operation, subresource) with ``apiVersion``, ``time``,
  ``fieldsType: FieldsV1`` and the owned fields as a ``fieldsV1`` trie
  (``f:<field>``, ``k:<json key>`` for items of associative lists, ``v:<json>``
  for set items, ``.`` for a node owned as a whole that also has children).
  The manager is ``?fieldManager=`` or, for non-apply writes without it, the
  User-Agent up to the first ``/`` (the real server's default).
- Non-apply writes (create, update, patch) are ``Update`` operations: the
  writer takes the fields it changed (from every other manager), removed
  fields leave every manager; no conflicts.
- An ``Apply`` owns exactly the fields of the applied configuration. A field
  another manager owns and the applied configuration sets to a different value
  is a conflict: ``409 Conflict`` with the real message (``Apply failed with 1
  conflict: conflict with "kubectl" using apps/v1: .spec.replicas``) and one
  ``FieldManagerConflict`` cause per field, unless ``force=true``, which takes
  the fields away from their managers. Setting the same value shares the field.
- Fields the applier owned before and no longer applies are removed from the
  object unless another manager still owns them.
- Merging follows the type: maps merge, associative lists (``listType: map``
  with ``listMapKeys``) merge item by item, sets by value, all other lists and
  scalars are replaced (atomic). Types come from the CRD's structural schema,
  or for built-ins from the upstream Kubernetes definitions (the same
  ``x-kubernetes-list-type``/``list-map-keys`` the real server's types carry);
  ``metadata`` is ObjectMeta for every kind.
- Struct fields that an apply leaves holding nothing it owns are pruned with
  the rest (upstream's EnsureNamedFieldsAreMembers): dropping the last pod
  annotation from a chart removes ``annotations`` itself.
- ``metadata`` identity fields (name, namespace, uid, resourceVersion, ...) and,
  where a status subresource exists, ``status`` on the main resource are never
  owned; status writes are owned with ``subresource: status``.
- Applying requires ``fieldManager`` (422 otherwise); ``force`` on a non-apply
  patch is a 422; a write that changes neither the object nor any ownership
  (only timestamps) is a no-op.
- Upgrading from client-side apply: an apply by the ``kubectl`` manager may
  take, without a conflict, the fields in the object's
  ``kubectl.kubernetes.io/last-applied-configuration`` (upstream's
  lastAppliedManager), and that annotation follows what ``kubectl`` applies
  (lastAppliedUpdater); kubectl then rewrites managedFields itself.
- ``managedFields`` a non-apply write changes are taken as given (kubectl
  moves ownership from ``kubectl-client-side-apply`` to ``kubectl`` so on
  the first ``apply --server-side``; ``[{}]`` resets tracking).

Left out (hazards for tests): apply to subresources (``kubectl apply
--subresource``); managedFields in an applied configuration (dropped; upstream
refuses them); converting ownership between API versions (one version per
resource here); ``null`` in an applied configuration (dropped, as if absent);
atomic maps and structs (``x-kubernetes-map-type: atomic``: every map is
granular here); defaulted key fields other than ``protocol``; fields nested
deeper than ``MAX_TRACKED_DEPTH`` (100) are owned as one field at that depth
(upstream tracks to the leaf, so an object nested 10,000 levels would get
managedFields deeper than kubectl decodes); writes the server makes itself
(garbage collector, namespace controller, eviction, binding) are not
attributed to a manager.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubesim import apierrors, openapi
from kubesim.apierrors import ApiError, FieldError
from kubesim.resources import ResourceDef

Path = tuple[str, ...]
APPLY = "Apply"
UPDATE = "Update"
KUBECTL = "kubectl"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# Identity fields of metadata the field manager strips before computing ownership.
_UNOWNED_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "selfLink",
        "managedFields",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generateName",
    }
)
_MISSING: Any = object()
# Ownership deeper than this is of the whole subtree: managedFields must not nest past what clients
# decode (kubectl refuses JSON deeper than 10,000 levels, and the object itself may be that deep).
MAX_TRACKED_DEPTH = 100


@dataclass(frozen=True)
class ListType:
    """How server-side apply merges a list field: as a map by ``keys``, as a set, or atomically."""

    kind: str  # "map", "set" or "atomic"
    keys: tuple[str, ...] = ()


def now() -> str:
    """The time now as the API server writes it (UTC, seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- who is writing ------------------------------------------------------------------------------


def manager_from(params: dict[str, str], user_agent: str) -> str:
    """``?fieldManager=`` or the User-Agent's first word, as the real server defaults it."""
    return params.get("fieldManager") or user_agent.split("/", 1)[0][:128]


def check_patch_options(*, apply: bool, manager: str | None, force: bool) -> None:
    """The validation of ``PatchOptions`` for apply and non-apply patches (422 ``PatchOptions.meta.k8s.io``)."""
    errors = []
    if apply and not manager:
        errors.append(FieldError("fieldManager", "FieldValueRequired", "Required value: is required for apply patch"))
    if force and not apply:
        errors.append(FieldError("force", "FieldValueForbidden", "Forbidden: may not be specified for non-apply patch"))
    if errors:
        raise apierrors.invalid("PatchOptions", "meta.k8s.io", "", errors)


# --- schema: how lists merge ---------------------------------------------------------------------


class _Schema:
    """Walks the type of an object along a path: the CRD's structural schema, or the upstream definitions.

    Both carry what merging needs: ``properties`` (struct fields) against ``additionalProperties`` (map
    keys), and ``x-kubernetes-list-type``/``x-kubernetes-list-map-keys`` on lists. ``metadata`` is
    always the upstream ObjectMeta (a CRD's schema leaves it untyped; the real server does the same).
    """

    def __init__(self, rdef: ResourceDef, node: dict[str, Any] | None = None) -> None:
        self.rdef = rdef
        if node is None:
            root = (rdef.schema if rdef.custom else _definitions().get(openapi.schema_name(rdef))) or {}
            properties = {**(root.get("properties") or {}), "metadata": {"$ref": _OBJECT_META}}
            node = {**root, "properties": properties}
        self.node = _resolve(node)

    def field(self, name: str) -> _Schema:
        child = (self.node.get("properties") or {}).get(name)
        if child is None and isinstance(self.node.get("additionalProperties"), dict):
            child = self.node["additionalProperties"]
        return _Schema(self.rdef, child or {})

    def is_named(self, name: str) -> bool:
        """A struct's field (owned as such) rather than a key of a map."""
        return name in (self.node.get("properties") or {})

    def items(self) -> _Schema:
        return _Schema(self.rdef, self.node.get("items") or {})

    def list_type(self) -> ListType:
        kind = self.node.get("x-kubernetes-list-type")
        keys = tuple(self.node.get("x-kubernetes-list-map-keys") or ())
        if kind is None and self.node.get("x-kubernetes-patch-strategy", "").startswith("merge"):
            merge_key = self.node.get("x-kubernetes-patch-merge-key")
            kind, keys = ("map", (merge_key,)) if merge_key else ("set", ())
        return ListType(kind or "atomic", keys)


_OBJECT_META = "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def _definitions() -> dict[str, Any]:
    return openapi.upstream_definitions()


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    for _ in range(16):
        ref = node.get("$ref")
        if ref is None and len(node.get("allOf") or []) == 1:
            ref = node["allOf"][0].get("$ref")
        if not isinstance(ref, str):
            break
        node = _definitions().get(ref.rsplit("/", 1)[-1]) or {}
    return node


def _item_key(item: Any, list_type: ListType) -> str | None:
    if not isinstance(item, dict):
        return None
    key = {k: item[k] for k in list_type.keys if k in item}
    if "protocol" in list_type.keys and "protocol" not in key:
        key["protocol"] = "TCP"  # a defaulted key field counts with its default upstream (ports)
    return "k:" + json.dumps(key, separators=(",", ":"), sort_keys=True) if key else None


def _value_key(item: Any) -> str:
    return "v:" + json.dumps(item, separators=(",", ":"), sort_keys=True)


# --- field sets ----------------------------------------------------------------------------------


def _top(rdef: ResourceDef, obj: dict[str, Any], subresource: str | None) -> dict[str, Any]:
    """What ownership is computed over: identity metadata stripped, status split by subresource."""
    view = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _UNOWNED_META}
    view["metadata"] = meta
    if not meta:
        view.pop("metadata")
    if "status" in rdef.subresources:
        if subresource == "status":
            return {"status": obj["status"]} if "status" in obj else {}
        view.pop("status", None)
    return view


def fieldset(
    rdef: ResourceDef, obj: dict[str, Any], subresource: str | None = None, *, containers: bool = False
) -> set[Path]:
    """The fields of ``obj``: leaves, list items and (with ``containers``) every non-empty map too."""
    found: set[Path] = set()
    _walk(_top(rdef, obj, subresource), (), _Schema(rdef), found, containers)
    return found


def _walk(node: dict[str, Any], path: Path, schema: _Schema, found: set[Path], containers: bool) -> None:
    """Leaves, atomic lists and list items; with ``containers`` (an Update's view) maps and lists too."""
    for name, value in node.items():
        child = (*path, f"f:{name}")
        sub = schema.field(name)
        if len(child) >= MAX_TRACKED_DEPTH:  # owned as a whole from here down (see the module docstring)
            found.add(child)
        elif isinstance(value, dict):
            if containers:
                found.add(child)
            _walk(value, child, sub, found, containers)
        elif isinstance(value, list):
            list_type = sub.list_type()
            if list_type.kind == "atomic":
                found.add(child)
                continue
            if containers:
                found.add(child)
            for item in value:
                key = _value_key(item) if list_type.kind == "set" else _item_key(item, list_type)
                if key is None:  # an item without its key: the list is owned as a whole
                    found.add(child)
                    continue
                found.add((*child, key))
                if list_type.kind == "map" and isinstance(item, dict):
                    _walk(item, (*child, key), sub.items(), found, containers)
        else:
            found.add(child)


def value_at(rdef: ResourceDef, obj: Any, path: Path) -> Any:
    """The value at a field path, or ``_MISSING``."""
    node, schema, name = obj, _Schema(rdef), ""
    for element in path:
        if element.startswith("f:"):
            name = element[2:]
            if not isinstance(node, dict) or name not in node:
                return _MISSING
            node, schema = node[name], schema.field(name)
        elif isinstance(node, list):
            list_type = schema.list_type()
            if element.startswith("v:"):
                return node if any(_value_key(i) == element for i in node) else _MISSING
            match = [i for i in node if _item_key(i, list_type) == element]
            if not match:
                return _MISSING
            node, schema = match[0], schema.items()
        else:
            return _MISSING
    return node


def _remove(rdef: ResourceDef, obj: dict[str, Any], path: Path) -> None:
    parent = value_at(rdef, obj, path[:-1]) if len(path) > 1 else obj
    last = path[-1]
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif isinstance(parent, list):
        name = path[-2][2:] if path[-2].startswith("f:") else ""
        holder = value_at(rdef, obj, path[:-2]) if len(path) > 2 else obj
        list_type = _schema_at(rdef, path[:-1]).list_type()
        kept = [i for i in parent if (_value_key(i) if last.startswith("v:") else _item_key(i, list_type)) != last]
        if isinstance(holder, dict):
            if kept:
                holder[name] = kept
            else:
                holder.pop(name, None)


def _schema_at(rdef: ResourceDef, path: Path) -> _Schema:
    schema = _Schema(rdef)
    for element in path:
        schema = schema.field(element[2:]) if element.startswith("f:") else schema.items()
    return schema


def _with_named_fields(rdef: ResourceDef, paths: set[Path]) -> set[Path]:
    """The set with every struct field that holds a member (upstream's EnsureNamedFieldsAreMembers)."""
    result = set(paths)
    for path in paths:
        schema = _Schema(rdef)
        for i, element in enumerate(path[:-1]):
            if element.startswith("f:"):
                if schema.is_named(element[2:]):
                    result.add(path[: i + 1])
                schema = schema.field(element[2:])
            else:
                schema = schema.items()
    return result


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    """The ``fieldsV1`` trie of a set of paths (``.`` marks an owned node that has children)."""
    members = set(paths)
    tree: dict[str, Any] = {}
    for path in sorted(members):
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    for path in members:
        node = tree
        for element in path:
            node = node[element]
        if node and "." not in node:
            node["."] = {}
    return _dot_first(tree)


def _dot_first(node: dict[str, Any]) -> dict[str, Any]:
    """``.`` leads its siblings, the rest sorted, as upstream serializes the trie."""
    ordered: dict[str, Any] = {".": {}} if "." in node else {}
    ordered.update({k: _dot_first(v) for k, v in sorted(node.items()) if k != "."})
    return ordered


def from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    """The field paths a ``fieldsV1`` tree names."""
    paths: set[Path] = set()
    for element, sub in tree.items():
        if element == ".":
            paths.add(prefix)
        elif not sub:
            paths.add((*prefix, element))
        else:
            paths |= from_fields_v1(sub, (*prefix, element))
    return paths


def path_string(path: Path) -> str:
    """A path the way conflicts print it: ``.spec.containers[name="app"].image``."""
    text = ""
    for element in path:
        kind, value = element[:2], element[2:]
        if kind == "f:":
            text += f".{value}"
        elif kind == "k:":
            pairs = json.loads(value)
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in pairs.items()) + "]"
        else:
            text += f"[={value}]"
    return text


# --- managedFields entries -----------------------------------------------------------------------


@dataclass
class Entry:
    """One ``managedFields`` entry: who set which fields, by which operation, on which subresource."""

    manager: str
    operation: str
    api_version: str
    time: str
    fields: set[Path]
    subresource: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """What identifies the entry: manager, operation, subresource."""
        return self.manager, self.operation, self.subresource

    def as_json(self) -> dict[str, Any]:
        """The entry as ``metadata.managedFields`` holds it."""
        entry: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(self.fields),
        }
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry

    def describe(self) -> str:
        """How a conflict names the manager (``printManager`` upstream).

        Upstream prints "at <time>" only when the manager's key carries a time, and the key it
        builds never does: kube-apiserver 1.37 says ``"kubectl-patch" using v1``, no time."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == UPDATE:
            text += f" using {self.api_version}"
        return text


def entries(obj: dict[str, Any]) -> list[Entry]:
    """The ``managedFields`` entries of ``obj``."""
    return [
        Entry(
            e.get("manager", ""),
            e.get("operation", UPDATE),
            e.get("apiVersion", ""),
            e.get("time", ""),
            from_fields_v1(e.get("fieldsV1") or {}),
            e.get("subresource", ""),
        )
        for e in (obj.get("metadata") or {}).get("managedFields") or []
    ]


def _store(found: list[Entry]) -> list[dict[str, Any]] | None:
    kept = [e.as_json() for e in found if e.fields]
    return kept or None


def without_times(managed: Any) -> Any:
    """managedFields compared for a no-op write: timestamps alone are not a change."""
    if not isinstance(managed, list):
        return managed
    return [{k: v for k, v in e.items() if k != "time"} for e in managed if isinstance(e, dict)]


def on_create(
    rdef: ResourceDef, obj: dict[str, Any], manager: str, *, operation: str = UPDATE
) -> list[dict[str, Any]] | None:
    """The managedFields of a new object: its creator owns what it sent."""
    owned = fieldset(rdef, obj, containers=operation == UPDATE)
    return _store([Entry(manager, operation, rdef.api_version, now(), owned)])


def on_update(
    rdef: ResourceDef, old: dict[str, Any], new: dict[str, Any], manager: str, subresource: str | None
) -> list[dict[str, Any]] | None:
    """An ``Update`` takes the fields it changed from everyone; removed fields leave every manager."""
    before = fieldset(rdef, old, subresource, containers=True)
    after = fieldset(rdef, new, subresource, containers=True)
    changed = _changed_paths(rdef, old, new, after)
    removed = before - after
    # managedFields the writer changed are taken as given (kubectl moves client-side apply ownership
    # to its server-side manager so; [{}] resets tracking), then this write is tracked on top of them.
    sent = (new.get("metadata") or {}).get("managedFields")
    given = subresource is None and isinstance(sent, list) and sent and sent != old["metadata"].get("managedFields")
    found = [e for e in entries(new if given else old) if e.manager and e.fields]
    for entry in found:
        entry.fields -= changed | removed
    sub = subresource or ""
    mine = next((e for e in found if e.key == (manager, UPDATE, sub)), None)
    if changed:
        if mine is None:
            mine = Entry(manager, UPDATE, rdef.api_version, now(), set(), sub)
            found.append(mine)
        mine.fields |= changed
        mine.time = now()
    return _store(found)


def _changed_paths(rdef: ResourceDef, old: dict[str, Any], new: dict[str, Any], paths: Iterable[Path]) -> set[Path]:
    """The paths of ``new`` whose value is new or differs from ``old``'s. A path under a field (one or two levels
    down) equal in both cannot differ: those are skipped without a walk from the root each (a status patch left the
    whole spec to compare, path by path; this was a tenth of a cluster test's CPU)."""
    same: dict[Path, bool] = {}

    def unchanged_under(path: Path) -> bool:
        for prefix in (path[:1], path[:2]):
            if len(prefix) == len(path):
                return False
            if prefix not in same:
                before = value_at(rdef, old, prefix)
                same[prefix] = before is not _MISSING and before == value_at(rdef, new, prefix)
            if same[prefix]:
                return True
        return False

    return {p for p in paths if not unchanged_under(p) and _changed(rdef, old, new, p)}


def _changed(rdef: ResourceDef, old: dict[str, Any], new: dict[str, Any], path: Path) -> bool:
    before = value_at(rdef, old, path)
    return before is _MISSING or (_is_leaf(rdef, new, path) and before != value_at(rdef, new, path))


def _is_leaf(rdef: ResourceDef, obj: dict[str, Any], path: Path) -> bool:
    value = value_at(rdef, obj, path)
    return not path[-1].startswith(("k:", "v:")) and not (isinstance(value, dict) and value)


# --- apply ---------------------------------------------------------------------------------------


def apply(
    rdef: ResourceDef, live: dict[str, Any], applied: dict[str, Any], *, manager: str, force: bool
) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """The object after ``manager`` applies ``applied`` to ``live``, and its managedFields.

    Raises the 409 an apply conflict is, unless ``force``.
    """
    applied = _drop_nulls(applied)
    owned = fieldset(rdef, applied)
    found = entries(live)
    mine = next((e for e in found if e.key == (manager, APPLY, "")), None)
    conflicts: list[tuple[Entry, Path]] = []
    for entry in found:
        if entry is mine:  # the applier's own Update entry is another manager upstream, and can conflict
            continue
        for path in sorted(owned & entry.fields):
            if _is_leaf(rdef, applied, path) and value_at(rdef, live, path) != value_at(rdef, applied, path):
                conflicts.append((entry, path))
    if conflicts and not force and manager == KUBECTL:
        # Upstream's lastAppliedManager: kubectl upgrading an object from client-side apply may take the
        # fields its last-applied-configuration holds; only the others still conflict.
        allowed = _last_applied_fields(rdef, live)
        conflicts_left = [(e, p) for e, p in conflicts if p not in allowed]
        force = not conflicts_left
        conflicts = conflicts if force else conflicts_left
    if conflicts and not force:
        raise conflict_error(conflicts)
    for entry, path in conflicts:
        entry.fields.discard(path)
    others: set[Path] = set().union(*(e.fields for e in found if e is not mine))
    new = copy.deepcopy(live)
    if mine is not None:
        # Upstream prunes what the applier owned, and no longer applies, that no one else owns; a struct
        # field left holding nothing it applies goes too (an emptied ``annotations:`` is removed).
        before, now_owned = _with_named_fields(rdef, mine.fields), _with_named_fields(rdef, owned)
        gone = {p for p in before - now_owned if not _owned_below(p, others)}
        # A list item goes as a whole: its own fields are not removed first (that would lose its key).
        for path in [p for p in gone if not any(p[:i] in gone for i in range(1, len(p)))]:
            _remove(rdef, new, path)
    new = _merge(new, applied, _Schema(rdef), "")
    if manager == KUBECTL and LAST_APPLIED in ((live.get("metadata") or {}).get("annotations") or {}):
        new["metadata"]["annotations"][LAST_APPLIED] = _last_applied(applied)
    if mine is None:
        mine = Entry(manager, APPLY, rdef.api_version, now(), set())
        found.append(mine)
    mine.fields, mine.time, mine.api_version = owned, now(), rdef.api_version
    return new, _store(found)


def _last_applied(applied: dict[str, Any]) -> str:
    """Upstream's lastAppliedUpdater: kubectl's server-side apply keeps the client-side annotation in step."""
    obj = copy.deepcopy(applied)
    annotations = obj.get("metadata", {}).get("annotations") or {}
    annotations.pop(LAST_APPLIED, None)
    if not annotations:
        obj.get("metadata", {}).pop("annotations", None)
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _last_applied_fields(rdef: ResourceDef, live: dict[str, Any]) -> set[Path]:
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    try:
        last_applied = json.loads(annotations.get(LAST_APPLIED, ""))
    except ValueError:
        return set()
    return fieldset(rdef, last_applied) if isinstance(last_applied, dict) else set()


def _owned_below(path: Path, others: set[Path]) -> bool:
    """Another manager owns this field or something inside it: it stays."""
    return any(p[: len(path)] == path for p in others)


def conflict_error(conflicts: list[tuple[Entry, Path]]) -> ApiError:
    """The 409 of an apply that conflicts with other managers' fields (one cause per field)."""
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {e.describe()}", "field": path_string(p)}
        for e, p in conflicts
    ]
    if len(conflicts) == 1:
        entry, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {entry.describe()}: {path_string(path)}"
    else:
        by_manager: dict[str, list[Path]] = {}
        for entry, path in conflicts:
            by_manager.setdefault(entry.describe(), []).append(path)
        lines = []
        for described in sorted(by_manager):
            lines.append(f"conflicts with {described}:")
            lines += [f"- {path_string(p)}" for p in by_manager[described]]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(status=409, reason="Conflict", message=message, details={"causes": causes})


def _drop_nulls(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_nulls(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_nulls(v) for v in node]
    return node


def _merge(live: Any, applied: Any, schema: _Schema, name: str) -> Any:
    if isinstance(applied, dict) and isinstance(live, dict):
        result = dict(live)
        for key, value in applied.items():
            result[key] = _merge(live.get(key, _MISSING), value, schema.field(key), key)
        return result
    if isinstance(applied, list) and isinstance(live, list):
        list_type = schema.list_type()
        if list_type.kind == "set":
            return live + [copy.deepcopy(v) for v in applied if v not in live]
        if list_type.kind == "map":
            result_list = list(live)
            for item in applied:
                key = _item_key(item, list_type)
                index = next((i for i, old in enumerate(result_list) if key and _item_key(old, list_type) == key), None)
                if index is None:
                    result_list.append(copy.deepcopy(item))
                else:
                    result_list[index] = _merge(result_list[index], item, schema.items(), "")
            return result_list
    return copy.deepcopy(applied)
