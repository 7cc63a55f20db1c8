"""The object semantics of the API server: what a write does, apart from HTTP.

kmock's emulator stores what it is sent and merges patches as plain dicts. A
controller is only tested if the server pushes back the way a real one does,
so this registry implements the API machinery contracts an operator depends
on (kept in kmock's ``objects`` store, one history entry per write):

- ``metadata``: ``uid``, ``creationTimestamp``, ``generateName``, a cluster-wide
  increasing ``resourceVersion`` on every write; ``generation`` (custom
  resources) bumped only when something other than metadata (and, with a
  status subresource, status) changed; a write that changes nothing is a
  no-op (same resourceVersion, no watch event).
- Optimistic concurrency: an update or patch carrying a stale
  ``metadata.resourceVersion`` is a 409 Conflict; a custom resource update
  without one is a 422; a JSON-patch ``test`` failure is a 422.
- Status subresource: writes to the main resource ignore ``status``, writes to
  ``/status`` ignore everything else.
- Custom resources: defaulting (also of ``status`` on create, as upstream's
  read-time defaulting shows it), pruning, ``fieldValidation`` (Strict -> 400,
  Warn -> ``Warning`` header, Ignore), schema validation (422) and the CRD's
  CEL rules (``x-kubernetes-validations``, transition rules on updates; see
  ``celrules``).
  Built-ins: the upstream schemas plus the admission rules in ``admission``.
- Deletion: finalizers hold an object with ``deletionTimestamp`` set (and its
  generation bumped) until they are removed; new finalizers cannot be added
  then. Pods bound to a node are deleted gracefully (``deletionTimestamp`` in
  the future, ``deletionGracePeriodSeconds``) and disappear only when the
  kubelet confirms with a zero grace period; unbound or terminated pods go at
  once. ``preconditions`` (uid, resourceVersion) are checked.
- Garbage collection (asynchronous, like the real controller): an object all
  of whose owners (by ``ownerReferences`` uid) are gone is deleted
  (background propagation); ``Foreground`` holds the owner with the
  ``foregroundDeletion`` finalizer until its dependents are gone; ``Orphan``
  strips the owner references. Terminating namespaces are emptied.
- Size: an object whose stored form exceeds etcd's request limit (1.5 MiB) is
  refused as a real server refuses it (500 "etcdserver: request is too large";
  see ``limits``).
- Every change is logged with its resourceVersion so watches can resume from
  a resourceVersion (410 Gone when it fell out of the window).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import datetime
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import kmock

from kubesim import admission, apierrors, fieldmanager, limits, patching
from kubesim import schema as crd_schema
from kubesim.apierrors import ApiError, FieldError
from kubesim.resources import ResourceDef, builtin_schemas

_READONLY_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "name",
    "namespace",
    "selfLink",
)
NAMESPACES = kmock.resource("", "v1", "namespaces")
PODS = kmock.resource("", "v1", "pods")


def now() -> str:
    """The time now as the API server writes it (UTC, seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Change:
    """One write, as watch streams see it: ADDED, MODIFIED or DELETED."""

    rv: int
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclass
class WriteResult:
    """A write's outcome: the stored (or dry-run) object, its warnings, whether it was created."""

    obj: dict[str, Any]
    warnings: list[str]
    created: bool = False


class Registry:
    """The stored objects and what a write does to them (admission, validation, versions, the watch log)."""

    def __init__(self, defs: Iterable[ResourceDef], objects: kmock.ObjectsArray, *, history: int = 5000) -> None:
        self.defs = {d.key: d for d in defs}
        self.objects = objects
        self.rv = 0
        self.builtin_schemas = builtin_schemas()
        self._log: dict[kmock.resource, collections.deque[Change]] = collections.defaultdict(
            lambda: collections.deque(maxlen=history)
        )
        self._dropped_rv: dict[kmock.resource, int] = {}
        self._waiters: set[asyncio.Future[None]] = set()
        self._gc_wanted = False
        self.on_change: Callable[[ResourceDef, str, dict[str, Any]], None] | None = None

    # --- reading ---------------------------------------------------------------------------------

    def get(self, rdef: ResourceDef, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The live object, or ``None`` (absent or deleted)."""
        key = (rdef.key, namespace if rdef.namespaced else None, name)
        if key in self.objects and not self.objects[key].deleted:
            return self.objects[key].raw
        return None

    def require(self, rdef: ResourceDef, namespace: str | None, name: str) -> dict[str, Any]:
        """The live object, or a 404."""
        obj = self.get(rdef, namespace, name)
        if obj is None:
            raise apierrors.not_found(rdef.group_resource, name)
        return obj

    def items(self, rdef: ResourceDef, namespace: str | None = None) -> list[dict[str, Any]]:
        """The live objects of ``rdef`` (in ``namespace``, or all), by namespace and name."""
        found = [
            (ns or "", name, obj.raw)
            for (res, ns, name), obj in self.objects.items()
            if res == rdef.key and not obj.deleted and (namespace is None or ns == namespace)
        ]
        return [raw for _, _, raw in sorted(found, key=lambda item: (item[0], item[1]))]

    def default_stored(self, rdef: ResourceDef) -> None:
        """Default the stored objects of a custom resource again, with the schema it has now.

        kube-apiserver defaults every object it reads from etcd with the schema it serves: a default
        added to a CRD later shows on objects stored before it, with no new resourceVersion and no
        watch event. Called when a CRD changes, this gives the same reads.
        """
        if rdef.schema is None:
            return
        for (res, _, _), stored in list(self.objects.items()):
            if res != rdef.key or stored.deleted:
                continue
            before = stored.raw
            after = crd_schema.apply_defaults(copy.deepcopy(before), rdef.schema)
            for key in before.keys() - after.keys():
                del stored[key]
            for key, value in after.items():
                if before.get(key, ...) != value:
                    stored[key] = value  # in the latest version, as kube-apiserver's read shows it

    def all_live(self) -> Iterable[tuple[ResourceDef, dict[str, Any]]]:
        """Every live object with its resource."""
        for (res, _, _), obj in list(self.objects.items()):
            if not obj.deleted and res in self.defs:
                yield self.defs[res], obj.raw

    # --- watch log -------------------------------------------------------------------------------

    def changes_since(self, resource: kmock.resource, rv: int) -> list[Change]:
        """The changes of ``resource`` after ``rv``; 410 Expired when the log no longer reaches back to ``rv``."""
        dropped = self._dropped_rv.get(resource, 0)
        if rv < dropped:
            raise apierrors.gone(f"too old resource version: {rv} ({dropped})")
        return [change for change in self._log[resource] if change.rv > rv]

    def wait_for_change(self) -> asyncio.Future[None]:
        """A future that completes at the next write (``wake_watchers``)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(future)
        future.add_done_callback(self._waiters.discard)
        return future

    def wake_watchers(self) -> None:
        """Complete every waiting ``wait_for_change`` future."""
        for future in list(self._waiters):
            if not future.done():
                future.set_result(None)

    def _record(self, rdef: ResourceDef, type_: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        log = self._log[rdef.key]
        if len(log) == log.maxlen:
            self._dropped_rv[rdef.key] = log[0].rv
        log.append(Change(self.rv, type_, obj, old))
        self.wake_watchers()
        if type_ != "ADDED":
            self._gc_wanted = True
        if self.on_change is not None:
            self.on_change(rdef, type_, obj)

    def drop_all(self, rdef: ResourceDef) -> None:
        """Remove every object of a resource at once (its CRD was deleted)."""
        for obj in self.items(rdef):
            meta = obj["metadata"]
            key = (rdef.key, meta.get("namespace") if rdef.namespaced else None, meta["name"])
            self._remove(rdef, key, obj, obj)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    # --- writing ---------------------------------------------------------------------------------

    def create(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        body: Any,
        *,
        field_validation: str = "Warn",
        dry_run: bool = False,
        manager: str | None = None,
        operation: str = fieldmanager.UPDATE,
    ) -> WriteResult:
        """Create ``body``, admitted and validated as kube-apiserver does; ``ApiError`` for a refusal."""
        if not isinstance(body, dict):
            raise apierrors.bad_request("the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        self._check_type_meta(rdef, obj)
        name = self._creation_meta(rdef, meta, namespace)
        # An applier owns what it sent; an Update owner all it created, defaults included (as upstream).
        applied = fieldmanager.on_create(rdef, obj, manager, operation=operation) if manager else None

        warnings = self._admit_schema(rdef, obj, field_validation, name)
        if rdef.custom and "status" in rdef.subresources:
            obj.pop("status", None)
            if rdef.schema is not None:
                # The request's status is dropped, but a default for ``status`` (``default: {}``) still shows:
                # upstream defaults again on every read from etcd; the emulator stores the defaulted object
                # instead, and defaults the stored objects again when the CRD's schema changes (emulator.py).
                crd_schema.apply_defaults(obj, rdef.schema)
        if not rdef.custom:
            admission.prepare_create(rdef.kind, obj)
        errors = admission.name_errors(rdef.kind, name, label=rdef.kind == "Namespace")
        errors += admission.annotation_errors(obj)
        errors += self._validate(rdef, obj)
        errors += self._validate_rules(rdef, obj, None, warnings, errors)
        if rdef.kind == "Pod":
            errors += admission.pod_errors(obj)
        errors = list(dict.fromkeys(errors))  # upstream schema and admission may report the same field
        if errors:
            raise apierrors.invalid(rdef.kind, rdef.group, name, errors)
        if rdef.namespaced:
            warnings += self._admit_in_namespace(rdef, obj, namespace, name)
        if self.get(rdef, namespace, name) is not None:
            raise apierrors.already_exists(rdef.group_resource, name)

        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        if rdef.has_generation:
            meta["generation"] = 1
        if manager:
            managed = applied if operation == fieldmanager.APPLY else fieldmanager.on_create(rdef, obj, manager)
            if managed:
                meta["managedFields"] = managed
        if dry_run:
            return WriteResult(obj, warnings, created=True)
        self._check_stored_size(rdef, obj)
        meta["resourceVersion"] = self._next_rv()
        self.objects[rdef.key, namespace if rdef.namespaced else None, name] = obj
        self._record(rdef, "ADDED", obj, None)
        return WriteResult(obj, warnings, created=True)

    @staticmethod
    def _creation_meta(rdef: ResourceDef, meta: dict[str, Any], namespace: str | None) -> Any:
        """A created object's metadata as the server takes it (namespace, generated name, no read-only fields).

        Returns its name as sent (validated later); raises a ``BadRequest`` as kube-apiserver does.
        """
        if rdef.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise apierrors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise apierrors.bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + admission.random_suffix()
        for field in _READONLY_META:
            if field not in ("name", "namespace"):
                meta.pop(field, None)
        meta.pop("managedFields", None)
        return meta.get("name") or ""

    def _admit_in_namespace(
        self, rdef: ResourceDef, obj: dict[str, Any], namespace: str | None, name: str
    ) -> list[str]:
        """Refuse a create in a missing or terminating namespace, or a pod its Pod Security level forbids.

        Returns the Pod Security warnings.
        """
        ns = self.get(self.defs[NAMESPACES], None, namespace or "")
        if ns is None:
            raise apierrors.not_found("namespaces", namespace or "")
        if ns.get("metadata", {}).get("deletionTimestamp"):
            raise apierrors.forbidden(
                rdef.group_resource,
                name,
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )
        if rdef.kind != "Pod":
            return []
        error, pod_warnings = admission.pod_security(obj, ns)
        if error:
            raise admission.forbidden_pod(name, error)
        return list(pod_warnings)

    def update(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        field_validation: str = "Warn",
        dry_run: bool = False,
        manager: str | None = None,
    ) -> WriteResult:
        """Replace the object (or its ``subresource``) with ``body``; ``ApiError`` for a conflict or a refusal."""
        if not isinstance(body, dict):
            raise apierrors.bad_request("the body of the request was in an unknown format")
        current = self.require(rdef, namespace, name)
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise apierrors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        sent_rv = (body.get("metadata") or {}).get("resourceVersion")
        if not sent_rv and rdef.custom:
            raise apierrors.invalid(
                rdef.kind,
                rdef.group,
                name,
                [
                    FieldError(
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0: must be specified for an update",
                    )
                ],
            )
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise apierrors.conflict(rdef.group_resource, name)
        return self._write(rdef, current, copy.deepcopy(body), subresource, field_validation, dry_run, manager=manager)

    def patch(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        field_validation: str = "Warn",
        dry_run: bool = False,
        manager: str | None = None,
    ) -> WriteResult:
        """Patch the object (``content_type``: JSON, merge, strategic or apply); ``ApiError`` for a refusal."""
        current = self.require(rdef, namespace, name)
        patched = patching.apply(current, content_type, patch, custom=rdef.custom)
        if not isinstance(patched, dict):
            raise apierrors.bad_request("the patch produced a non-object")
        sent_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise apierrors.conflict(rdef.group_resource, name)
        return self._write(rdef, current, patched, subresource, field_validation, dry_run, manager=manager)

    def apply(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        manager: str,
        force: bool = False,
        field_validation: str = "Strict",
        dry_run: bool = False,
    ) -> WriteResult:
        """Server-side apply: create, or merge with field ownership and conflicts (see ``fieldmanager``)."""
        if not isinstance(body, dict):
            raise apierrors.bad_request("the body of the request was in an unknown format")
        body = copy.deepcopy(body)
        body_meta = body.setdefault("metadata", {})
        if body_meta.get("name") and body_meta["name"] != name:
            raise apierrors.bad_request(
                f"the name of the object ({body_meta['name']}) does not match the name on the URL ({name})"
            )
        body_meta["name"] = name
        body_meta.pop("managedFields", None)
        current = self.get(rdef, namespace, name)
        if current is None:
            return self.create(
                rdef,
                namespace,
                body,
                field_validation=field_validation,
                dry_run=dry_run,
                manager=manager,
                operation=fieldmanager.APPLY,
            )
        self._check_type_meta(rdef, body)
        sent_rv = body_meta.get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise apierrors.conflict(rdef.group_resource, name)
        new, managed = fieldmanager.apply(rdef, current, body, manager=manager, force=force)
        return self._write(rdef, current, new, None, field_validation, dry_run, managed=managed)

    def _write(  # noqa: C901 -- update and patch: every admission step of a write, in upstream's order
        self,
        rdef: ResourceDef,
        current: dict[str, Any],
        new: dict[str, Any],
        subresource: str | None,
        field_validation: str,
        dry_run: bool,
        *,
        manager: str | None = None,
        managed: list[dict[str, Any]] | bool | None = False,
    ) -> WriteResult:
        """Store ``new`` over ``current``; ``managed`` is the apply's managedFields, else ``manager``'s Update is."""
        name = current["metadata"]["name"]
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(current)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif subresource:
            raise apierrors.method_not_allowed()
        elif "status" in rdef.subresources:
            new.pop("status", None)
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
        new.setdefault("apiVersion", current.get("apiVersion"))
        new.setdefault("kind", current.get("kind"))
        self._check_type_meta(rdef, new)
        meta = new.setdefault("metadata", {})
        for field in _READONLY_META:
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
            else:
                meta.pop(field, None)
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]

        warnings = self._admit_schema(rdef, new, field_validation, name)
        errors = admission.annotation_errors(new) + self._validate(rdef, new)
        errors += self._validate_rules(rdef, new, current, warnings, errors)
        if not rdef.custom:
            admission.prepare_update(rdef.kind, current, new)
            if rdef.kind == "Pod" and subresource != "status":
                errors += admission.pod_update_errors(current, new)
        old_finalizers = set(current["metadata"].get("finalizers") or [])
        if current["metadata"].get("deletionTimestamp") and set(meta.get("finalizers") or []) - old_finalizers:
            errors.append(
                FieldError(
                    "metadata.finalizers",
                    "FieldValueForbidden",
                    "Forbidden: no new finalizers can be added if the object is being deleted",
                )
            )
        if errors:
            raise apierrors.invalid(rdef.kind, rdef.group, name, errors)

        if managed is not False:
            meta["managedFields"] = managed
        elif manager:
            meta["managedFields"] = fieldmanager.on_update(rdef, current, new, manager, subresource)
        else:
            meta["managedFields"] = current["metadata"].get("managedFields")
        if meta["managedFields"] is None:
            del meta["managedFields"]
        if _without_times(new) == _without_times(current):  # timestamps of ownership alone are no change
            return WriteResult(current, warnings)
        if rdef.has_generation and _spec_part(rdef, new) != _spec_part(rdef, current):
            meta["generation"] = current["metadata"].get("generation", 0) + 1
        if dry_run:
            return WriteResult(new, warnings)
        self._check_stored_size(rdef, new)
        meta["resourceVersion"] = self._next_rv()
        key = (rdef.key, meta.get("namespace") if rdef.namespaced else None, name)
        if meta.get("deletionTimestamp") and not _finalizers(rdef, new) and not self._graceful_pending(rdef, new):
            self._remove(rdef, key, new, current)
        else:
            self.objects[key].history.append(new)
            self._record(rdef, "MODIFIED", new, current)
        return WriteResult(new, warnings)

    def delete(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Delete the object as kube-apiserver does (finalizers, grace periods); returns what the DELETE answers."""
        options = options or {}
        current = self.require(rdef, namespace, name)
        meta = current["metadata"]
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise apierrors.conflict(
                rdef.group_resource,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise apierrors.conflict(
                rdef.group_resource,
                name,
                f"Precondition failed: ResourceVersion in "
                f"precondition: {pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        if dry_run:
            return current
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"])

        grace = self._grace_period(rdef, current, options.get("gracePeriodSeconds"))
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and "foregroundDeletion" not in finalizers and not meta.get("deletionTimestamp"):
            finalizers.append("foregroundDeletion")
        key = (rdef.key, namespace if rdef.namespaced else None, name)
        if not finalizers and not _finalizers(rdef, current) and grace == 0:
            if rdef.kind == "Pod" and not meta.get("deletionTimestamp"):
                # A pod's deletion is always graceful upstream, a zero grace period included: the pod is
                # written with deletionTimestamp and deletionGracePeriodSeconds 0 (MODIFIED), then removed
                # (DELETED, carrying both), and the DELETE answers with that pod.
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = datetime.datetime.now(datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                marked["metadata"]["resourceVersion"] = self._next_rv()
                self.objects[key].history.append(marked)
                self._record(rdef, "MODIFIED", marked, current)
                return self._remove(rdef, key, marked, marked)
            return self._remove(rdef, key, current, current)

        new = copy.deepcopy(current)
        new_meta = new["metadata"]
        if meta.get("deletionTimestamp"):
            # Already terminating: only a shorter grace period changes anything (kubectl delete --grace-period=1).
            if grace is None or grace >= (meta.get("deletionGracePeriodSeconds") or 0):
                return current
        else:
            new_meta["finalizers"] = finalizers
            if rdef.has_generation:
                new_meta["generation"] = meta.get("generation", 0) + 1
        stamp = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace or 0)
        new_meta["deletionTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        new_meta["deletionGracePeriodSeconds"] = grace or 0
        if rdef.kind == "Namespace":
            new.setdefault("status", {})["phase"] = "Terminating"
        new_meta["resourceVersion"] = self._next_rv()
        self.objects[key].history.append(new)
        self._record(rdef, "MODIFIED", new, current)
        return new

    def _remove(self, rdef: ResourceDef, key: Any, last: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        gone = copy.deepcopy(last)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key].history.append(gone)
        self.objects[key].delete()
        self._record(rdef, "DELETED", gone, old)
        return gone

    def _grace_period(self, rdef: ResourceDef, obj: dict[str, Any], requested: Any) -> int | None:
        """Pods bound to a node and still running are deleted gracefully; all else at once."""
        if rdef.kind != "Pod":
            return 0
        spec, phase = obj.get("spec", {}), obj.get("status", {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        if requested is None:
            return int(spec.get("terminationGracePeriodSeconds", 30))
        return max(int(requested), 0)

    def _graceful_pending(self, rdef: ResourceDef, obj: dict[str, Any]) -> bool:
        """A terminating pod stays until the kubelet deletes it with grace 0 (or it ends)."""
        return rdef.kind == "Pod" and bool(obj["metadata"].get("deletionGracePeriodSeconds"))

    # --- pods: binding and eviction --------------------------------------------------------------

    def bind(self, namespace: str, name: str, binding: dict[str, Any]) -> None:
        """Bind the pod to a node (``pods/binding``); 422 without a target, 409 if it is bound already."""
        rdef = self.defs[PODS]
        pod = self.require(rdef, namespace, name)
        node = ((binding or {}).get("target") or {}).get("name")
        if not node:
            raise apierrors.invalid(
                "Binding", "", name, [FieldError("target.name", "FieldValueRequired", "Required value")]
            )
        if pod["spec"].get("nodeName"):
            raise apierrors.conflict(
                "pods", name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            )
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        _set_condition(new, {"type": "PodScheduled", "status": "True"})
        new["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[rdef.key, namespace, name].history.append(new)
        self._record(rdef, "MODIFIED", new, pod)

    def evict(self, namespace: str, name: str, eviction: dict[str, Any]) -> None:
        """The Eviction API: mark the pod with DisruptionTarget, then delete it gracefully."""
        rdef = self.defs[PODS]
        pod = self.require(rdef, namespace, name)
        if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed") and pod["spec"].get("nodeName"):
            status = copy.deepcopy(pod.get("status", {}))
            marked = {"status": status}
            _set_condition(
                marked,
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                },
            )
            self.patch(rdef, namespace, name, patching.MERGE, {"status": marked["status"]}, subresource="status")
        self.delete(rdef, namespace, name, (eviction or {}).get("deleteOptions"))

    # --- garbage collection ----------------------------------------------------------------------

    def collect_garbage(self) -> bool:
        """One sweep of the garbage collector and namespace controller; True if it changed anything."""
        if not self._gc_wanted:
            return False
        self._gc_wanted = False
        live = list(self.all_live())
        uids = {obj["metadata"]["uid"]: (rdef, obj) for rdef, obj in live}
        changed = False
        dependents: dict[str, list[tuple[ResourceDef, dict[str, Any]]]] = collections.defaultdict(list)
        for rdef, obj in live:
            meta = obj["metadata"]
            owners = meta.get("ownerReferences") or []
            for ref in owners:
                dependents[ref.get("uid", "")].append((rdef, obj))
            present = [
                ref
                for ref in owners
                if ref.get("uid") in uids and _same_scope(obj, uids[ref["uid"]][1], uids[ref["uid"]][0])
            ]
            owner_foreground = any(
                "foregroundDeletion" in (uids[ref["uid"]][1]["metadata"].get("finalizers") or []) for ref in present
            )
            if owners and (not present or owner_foreground) and not meta.get("deletionTimestamp"):
                changed |= self._delete_quietly(rdef, meta)
        for rdef, obj in live:
            meta = obj["metadata"]
            if "foregroundDeletion" in (meta.get("finalizers") or []) and not any(
                self.get(d, dobj["metadata"].get("namespace"), dobj["metadata"]["name"])
                for d, dobj in dependents.get(meta["uid"], [])
            ):
                rest = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
                self.patch(
                    rdef,
                    meta.get("namespace"),
                    meta["name"],
                    patching.MERGE,
                    {"metadata": {"finalizers": rest or None}},
                )
                changed = True
            if rdef.kind == "Namespace" and meta.get("deletionTimestamp"):
                changed |= self._empty_namespace(obj)
        if changed:
            self._gc_wanted = True
        return changed

    def _empty_namespace(self, namespace: dict[str, Any]) -> bool:
        name = namespace["metadata"]["name"]
        contents = [
            (rdef, obj) for rdef, obj in self.all_live() if rdef.namespaced and obj["metadata"].get("namespace") == name
        ]
        for rdef, obj in contents:
            if not obj["metadata"].get("deletionTimestamp"):
                self._delete_quietly(rdef, obj["metadata"])
        if contents:
            return any(not obj["metadata"].get("deletionTimestamp") for _, obj in contents)
        if namespace.get("spec", {}).get("finalizers"):
            ns_def = self.defs[NAMESPACES]
            self.patch(ns_def, None, name, patching.MERGE, {"spec": {"finalizers": None}})
            return True
        return False

    def _delete_quietly(self, rdef: ResourceDef, meta: dict[str, Any]) -> bool:
        try:
            self.delete(rdef, meta.get("namespace"), meta["name"])
        except ApiError:  # raced with another deletion in the same sweep
            return False
        return True

    def _orphan_dependents(self, uid: str) -> None:
        for rdef, obj in list(self.all_live()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                rest = [ref for ref in refs if ref.get("uid") != uid]
                self.patch(
                    rdef,
                    obj["metadata"].get("namespace"),
                    obj["metadata"]["name"],
                    patching.MERGE,
                    {"metadata": {"ownerReferences": rest or None}},
                )

    # --- schema and validation -------------------------------------------------------------------

    def _check_type_meta(self, rdef: ResourceDef, obj: dict[str, Any]) -> None:
        obj.setdefault("apiVersion", rdef.api_version)
        obj.setdefault("kind", rdef.kind)
        if obj["apiVersion"] != rdef.api_version:
            raise apierrors.bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the "
                f"expected API version ({rdef.api_version})"
            )
        if obj["kind"] != rdef.kind:
            raise apierrors.bad_request(
                f'{obj["kind"]} in version "{rdef.version}" cannot be handled as a '
                f"{rdef.kind}: the kind in the data does not match the expected kind"
            )

    def _admit_schema(self, rdef: ResourceDef, obj: dict[str, Any], directive: str, name: str) -> list[str]:
        """Defaulting and pruning; unknown fields fail (Strict), warn (Warn) or vanish (Ignore)."""
        if rdef.custom and rdef.schema is not None:
            crd_schema.apply_defaults(obj, rdef.schema)
            unknown = crd_schema.prune(obj, rdef.schema)
        else:
            unknown = self._builtin_unknown_fields(rdef, obj)
        if unknown and directive == "Strict":
            fields = ", ".join(f'unknown field "{field}"' for field in unknown)
            raise apierrors.bad_request(
                f'{rdef.kind} in version "{rdef.version}" cannot be handled as a '
                f"{rdef.kind}: strict decoding error: {fields}"
            )
        return [f'unknown field "{field}"' for field in unknown] if directive != "Ignore" else []

    def _builtin_unknown_fields(self, rdef: ResourceDef, obj: dict[str, Any]) -> list[str]:
        validator = self.builtin_schemas.validator(rdef.kind, rdef.api_version)
        if validator is None:
            return []
        unknown: list[tuple[list[Any], str]] = []
        for error in validator.iter_errors(obj):
            if error.validator == "additionalProperties" and isinstance(error.instance, dict):
                known = set(error.schema.get("properties") or {})
                unknown += [(list(error.absolute_path), key) for key in error.instance if key not in known]
            elif error.validator in ("type", "format"):
                path = _dotted(list(error.absolute_path))
                raise apierrors.bad_request(
                    f'{rdef.kind} in version "{rdef.version}" cannot be handled as a {rdef.kind}: json: cannot '
                    f"unmarshal {_json_type(error.instance)} into Go struct field {path} of type "
                    f"{error.validator_value}"
                )
        for parent, key in unknown:
            holder: Any = obj
            for part in parent:
                holder = holder[part]
            holder.pop(key, None)
        return [_dotted([*parent, key]) for parent, key in unknown]

    def _check_stored_size(self, rdef: ResourceDef, obj: dict[str, Any]) -> None:
        """etcd's request limit, on the object as stored (see ``limits``)."""
        meta = obj["metadata"]
        parts = ["registry", rdef.group, rdef.plural, meta.get("namespace") if rdef.namespaced else None, meta["name"]]
        if limits.stored_size(obj, "/" + "/".join(p for p in parts if p)) > limits.MAX_STORED_BYTES:
            raise limits.too_large_for_etcd()

    def _validate_rules(
        self,
        rdef: ResourceDef,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        warnings: list[str],
        prior: list[FieldError],
    ) -> list[FieldError]:
        """The CRD's CEL rules (after the schema, as the real server runs them); ratcheted ones warn."""
        validator = rdef.cel_validator if rdef.custom else None
        if validator is None:
            return []
        errors, ratcheted = validator.validate(obj, old, prior)
        warnings += ratcheted
        return errors

    def _validate(self, rdef: ResourceDef, obj: dict[str, Any]) -> list[FieldError]:
        if rdef.validator is not None:
            return rdef.validator.errors(obj)
        validator = self.builtin_schemas.validator(rdef.kind, rdef.api_version)
        if validator is None:
            return []
        errors: list[FieldError] = []
        for error in validator.iter_errors(obj):
            if error.validator in ("required", "enum", "minimum", "maximum", "pattern"):
                errors.extend(crd_schema.translate(error))
        return errors


def _without_times(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {**meta, "managedFields": fieldmanager.without_times(meta["managedFields"])}}


def _finalizers(rdef: ResourceDef, obj: dict[str, Any]) -> list[str]:
    """Finalizers that hold a deleted object (a namespace also has spec.finalizers)."""
    held = list(obj["metadata"].get("finalizers") or [])
    if rdef.kind == "Namespace":
        held += obj.get("spec", {}).get("finalizers") or []
    return held


def _spec_part(rdef: ResourceDef, obj: dict[str, Any]) -> dict[str, Any]:
    """What bumps metadata.generation: all but metadata (and status, with a status subresource)."""
    skip = {"metadata", "status"} if "status" in rdef.subresources else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}


def _same_scope(dependent: dict[str, Any], owner: dict[str, Any], owner_def: ResourceDef) -> bool:
    """A namespaced dependent sees owners in its namespace or cluster-scoped ones only."""
    return not owner_def.namespaced or owner["metadata"].get("namespace") == dependent["metadata"].get("namespace")


def _set_condition(obj: dict[str, Any], condition: dict[str, Any]) -> None:
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    condition = {"lastProbeTime": None, "lastTransitionTime": now(), **condition}
    for i, old in enumerate(conditions):
        if old.get("type") == condition["type"]:
            if old.get("status") == condition["status"]:
                condition["lastTransitionTime"] = old.get("lastTransitionTime", condition["lastTransitionTime"])
            conditions[i] = condition
            return
    conditions.append(condition)


def _dotted(parts: list[Any]) -> str:
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else (f"{path}.{part}" if path else str(part))
    return path


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "bool", int: "number", float: "number"}.get(
        type(value), "null"
    )


def encode_continue(namespace: str, name: str) -> str:
    """A list's ``continue`` token: the last namespace and name returned."""
    return base64.urlsafe_b64encode(json.dumps([namespace, name]).encode()).decode()


def decode_continue(token: str) -> tuple[str, str]:
    """The namespace and name of a ``continue`` token; 400 for one this server did not make."""
    try:
        namespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError) as e:
        raise apierrors.bad_request(f"continue key is not valid: {e}") from e
    return str(namespace), str(name)
