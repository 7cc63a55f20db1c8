"""What the emulated API server serves: resources learned from CRD files plus a few built-ins.

A ``ResourceDef`` carries everything the server needs about one resource:
discovery names, scope, subresources, printer columns (for ``kubectl get``)
and the schema its objects are defaulted, pruned and validated against. Custom
resources take all of it from their ``CustomResourceDefinition`` (the storage
version); built-ins use the upstream JSON schemas of Kubernetes 1.32 shipped
with ``kubernetes-validate``, so a misspelt pod field from the operator is
caught here as it would be by a real cluster.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kmock
import referencing
import yaml
from kubernetes_validate import utils as kv_utils

from kubesim import tables
from kubesim.celrules import Validator as CelValidator
from kubesim.schema import SchemaValidator
from kubesim.tables import Column

KUBERNETES_VERSION = "1.32"
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass
class ResourceDef:
    """A served resource: its group, version, names, scope, subresources, verbs, columns and schema."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ALL_VERBS
    columns: list[Column] = field(default_factory=list)
    schema: dict[str, Any] | None = None  # openAPIV3Schema (custom resources only)
    custom: bool = False
    has_generation: bool = False

    @property
    def api_version(self) -> str:
        """``group/version`` (or ``version`` for the core group)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``agentruns.agentrun.dev`` / ``pods``: how error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> kmock.resource:
        """The resource as kmock keys it."""
        return kmock.resource(self.group, self.version, self.plural)

    @property
    def list_kind(self) -> str:
        """The kind of its lists."""
        return f"{self.kind}List"

    @functools.cached_property
    def validator(self) -> SchemaValidator | None:
        """The validator of its structural schema (custom resources), or ``None``."""
        return SchemaValidator(self.schema) if self.schema is not None else None

    @functools.cached_property
    def cel_validator(self) -> CelValidator | None:
        """The schema's ``x-kubernetes-validations`` (None when it has none)."""
        return CelValidator.for_schema(self.schema) if self.schema is not None else None

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The API path of the resource (in ``namespace``), or of one object (``name``)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        ns = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{prefix}{ns}/{self.plural}" + (f"/{name}" if name else "")


def load_crd_documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in these YAML files (multi-document files allowed), each a fresh copy."""
    return [json.loads(doc) for path in paths for doc in _crd_documents(path.read_text())]


@functools.lru_cache(maxsize=16)
def _crd_documents(text: str) -> tuple[str, ...]:
    # Parsed once per file content (an emulator starts per test: PyYAML's pure-Python parse of the CRD was 7 % of
    # a cluster test module's CPU), kept as JSON so that each emulator gets objects of its own.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = yaml.load_all(text, Loader=loader)  # a safe loader: libyaml's when PyYAML has it
    return tuple(json.dumps(d) for d in docs if d and d.get("kind") == "CustomResourceDefinition")


def crd_resources(crd: dict[str, Any]) -> list[ResourceDef]:
    """The resources a CRD serves (one per served version)."""
    spec = crd["spec"]
    names = spec["names"]
    defs = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        columns = [
            Column(
                "Name",
                "string",
                "",
                "Name must be unique within a namespace. Is required when "
                "creating resources, although some resources may allow a client to request the "
                "generation of an appropriate name automatically.",
                0,
                "name",
            )
        ]
        printer = version.get("additionalPrinterColumns")
        if printer is None:
            printer = [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        for col in printer:
            columns.append(
                Column(
                    col["name"],
                    col["type"],
                    col["jsonPath"],
                    col.get("description", ""),
                    col.get("priority", 0),
                    col.get("format", ""),
                )
            )
        defs.append(
            ResourceDef(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                singular=names.get("singular", names["kind"].lower()),
                namespaced=spec["scope"] == "Namespaced",
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                subresources=frozenset(version.get("subresources", {}) or {}),
                columns=columns,
                schema=version["schema"]["openAPIV3Schema"],
                custom=True,
                has_generation=True,
            )
        )
    return defs


def _age() -> Column:
    return Column(
        "Age",
        "date",
        ".metadata.creationTimestamp",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    )


def _name() -> Column:
    return Column("Name", "string", ".metadata.name", "Name must be unique within a namespace.", 0, "name")


def builtin_resources() -> list[ResourceDef]:
    """The built-in resources an operator, a kubelet and kubectl need here."""
    return [
        ResourceDef(
            "",
            "v1",
            "pods",
            "Pod",
            "pod",
            True,
            ("po",),
            ("all",),
            frozenset({"status", "binding", "eviction", "log"}),
            columns=tables.pod_columns(),
        ),
        ResourceDef("", "v1", "events", "Event", "event", True, ("ev",), columns=tables.event_columns()),
        ResourceDef(
            "",
            "v1",
            "secrets",
            "Secret",
            "secret",
            True,
            columns=[
                _name(),
                Column("Type", "string", ".type"),
                Column("Data", "integer", compute=lambda o: len(o.get("data") or {})),
                _age(),
            ],
        ),
        ResourceDef(
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            "configmap",
            True,
            ("cm",),
            columns=[
                _name(),
                Column("Data", "integer", compute=lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
                _age(),
            ],
        ),
        ResourceDef(
            "",
            "v1",
            "namespaces",
            "Namespace",
            "namespace",
            False,
            ("ns",),
            subresources=frozenset({"status", "finalize"}),
            verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
            columns=[_name(), Column("Status", "string", ".status.phase"), _age()],
        ),
        ResourceDef(
            "",
            "v1",
            "nodes",
            "Node",
            "node",
            False,
            ("no",),
            subresources=frozenset({"status"}),
            columns=[
                _name(),
                Column("Status", "string", compute=tables.node_status),
                Column("Roles", "string", compute=lambda o: "<none>"),
                _age(),
                Column("Version", "string", ".status.nodeInfo.kubeletVersion"),
            ],
        ),
        ResourceDef(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            "serviceaccount",
            True,
            ("sa",),
            columns=[_name(), Column("Secrets", "integer", compute=lambda o: len(o.get("secrets") or [])), _age()],
        ),
        ResourceDef(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            "lease",
            True,
            columns=[_name(), Column("Holder", "string", ".spec.holderIdentity"), _age()],
        ),
        *_workload_resources(),
        ResourceDef(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            "customresourcedefinition",
            False,
            ("crd", "crds"),
            ("api-extensions",),
            subresources=frozenset({"status"}),
            columns=[_name(), Column("Created At", "date", compute=lambda o: o["metadata"]["creationTimestamp"])],
        ),
    ]


def _workload_resources() -> list[ResourceDef]:
    """What a Helm chart of an operator installs: Deployments, Services, RBAC, PDBs, NetworkPolicies.

    Served and stored with their upstream schemas; no controller acts on them (no ReplicaSets, no
    endpoints, no cluster IP allocation): a Deployment is an object here, not pods.
    """

    def rbac(kind: str, plural: str, namespaced: bool, columns: list[Column]) -> ResourceDef:
        return ResourceDef("rbac.authorization.k8s.io", "v1", plural, kind, kind.lower(), namespaced, columns=columns)

    binding_columns = [
        _name(),
        Column("Role", "string", compute=lambda o: f"{o['roleRef']['kind']}/{o['roleRef']['name']}"),
        _age(),
    ]
    return [
        ResourceDef(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            "deployment",
            True,
            ("deploy",),
            ("all",),
            frozenset({"status"}),
            columns=[
                _name(),
                Column(
                    "Ready",
                    "string",
                    compute=lambda o: f"{o.get('status', {}).get('readyReplicas', 0)}/{o['spec'].get('replicas', 1)}",
                ),
                Column("Up-to-date", "integer", compute=lambda o: o.get("status", {}).get("updatedReplicas", 0)),
                Column("Available", "integer", compute=lambda o: o.get("status", {}).get("availableReplicas", 0)),
                _age(),
            ],
            has_generation=True,
        ),
        ResourceDef(
            "",
            "v1",
            "services",
            "Service",
            "service",
            True,
            ("svc",),
            ("all",),
            frozenset({"status"}),
            columns=[
                _name(),
                Column("Type", "string", ".spec.type"),
                Column("Cluster-IP", "string", ".spec.clusterIP"),
                Column(
                    "Port(s)",
                    "string",
                    compute=lambda o: ",".join(
                        f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in o["spec"].get("ports") or []
                    ),
                ),
                _age(),
            ],
        ),
        rbac(
            "ClusterRole", "clusterroles", False, [_name(), Column("Created At", "date", ".metadata.creationTimestamp")]
        ),
        rbac("ClusterRoleBinding", "clusterrolebindings", False, binding_columns),
        rbac("Role", "roles", True, [_name(), Column("Created At", "date", ".metadata.creationTimestamp")]),
        rbac("RoleBinding", "rolebindings", True, binding_columns),
        ResourceDef(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            "poddisruptionbudget",
            True,
            ("pdb",),
            subresources=frozenset({"status"}),
            columns=[
                _name(),
                Column("Min Available", "string", ".spec.minAvailable"),
                Column("Max Unavailable", "string", ".spec.maxUnavailable"),
                Column("Allowed Disruptions", "integer", ".status.disruptionsAllowed"),
                _age(),
            ],
            has_generation=True,
        ),
        ResourceDef(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            "networkpolicy",
            True,
            ("netpol",),
            columns=[_name(), Column("Pod-Selector", "string", compute=_pod_selector), _age()],
            has_generation=True,
        ),
    ]


def _pod_selector(obj: dict[str, Any]) -> str:
    labels = (obj.get("spec", {}).get("podSelector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in labels.items()) or "<none>"


class BuiltinSchemas:
    """Upstream JSON schemas of the built-in kinds (strict: unknown fields are reported). Read-only: one per
    process (``builtin_schemas``), shared by every emulator."""

    def __init__(self, version: str = KUBERNETES_VERSION) -> None:
        versions = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) == version]
        self._dir = f"kubernetes-json-schema/v{versions[-1]}-local-strict"
        self._version = version
        defs = kv_utils.schema_contents(f"{self._dir}/_definitions.json", version)
        self._registry: referencing.Registry[Any] = referencing.Resource.from_contents(defs) @ referencing.Registry()

    @functools.cache  # noqa: B019 (one instance per server, kept for its lifetime)
    def validator(self, kind: str, api_version: str) -> jsonschema.Draft202012Validator | None:
        """The upstream schema validator of a built-in ``kind`` at ``api_version``, or ``None`` when there is none."""
        group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # coordination.k8s.io/v1
        name = f"{self._dir}/{kind.lower()}-{group_version}.json"
        try:
            schema = kv_utils.schema_contents(name, self._version)
        except FileNotFoundError:
            return None
        return jsonschema.Draft202012Validator(schema, registry=self._registry)


@functools.cache
def builtin_schemas(version: str = KUBERNETES_VERSION) -> BuiltinSchemas:
    """The process's ``BuiltinSchemas``: an emulator starts per test, and each read the definitions and resolved
    their references anew."""
    return BuiltinSchemas(version)
