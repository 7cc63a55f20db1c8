"""The AgentRun CRD as a document: a valid apiextensions/v1 object with a structural,
fully described schema, validated directly with jsonschema (no server involved)."""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from agentrun.engine import CompiledGraph
from agentrun.loader import is_langgraph, load_target
from kubesim.schema import SchemaValidator, apply_defaults, format_checker, prune, to_jsonschema
from tests.cluster.conftest import CRD_FILE, EXAMPLE, EXPECTED_FIELD, INVALID_MANIFESTS, ROOT


def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())  # type: ignore[no-any-return]


def version() -> dict[str, Any]:
    (only,) = crd()["spec"]["versions"]
    return only  # type: ignore[no-any-return]


def schema() -> dict[str, Any]:
    return version()["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def strict_errors(obj: dict[str, Any]) -> list[jsonschema.ValidationError]:
    """Direct jsonschema validation, rejecting unknown fields like kubectl's default (strict) validation."""
    validator = jsonschema.Draft4Validator(to_jsonschema(schema(), strict=True), format_checker=format_checker())
    return list(validator.iter_errors(obj))


def agentrun(**spec: Any) -> dict[str, Any]:
    base = {"graph": "examples.support_agent:app", "threadId": "order-4821"}
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "run"},
        "spec": {**base, **spec},
    }


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, sub in (node.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield f"{path}[]", node["items"]
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")


def test_crd_is_a_valid_apiextensions_v1_object() -> None:
    document = crd()
    assert document["apiVersion"] == "apiextensions.k8s.io/v1"
    assert document["kind"] == "CustomResourceDefinition"
    assert document["metadata"]["name"] == "agentruns.agentrun.dev", "a CRD's name must be <plural>.<group>"
    kubernetes_validate.validate(document, "1.32", strict=True)  # raises ValidationError with the field


def test_crd_names_scope_and_version() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "agentrun.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "AgentRun",
        "listKind": "AgentRunList",
        "plural": "agentruns",
        "singular": "agentrun",
        "shortNames": ["ar"],
        "categories": ["agentrun"],
    }
    (only,) = spec["versions"]
    assert (only["name"], only["served"], only["storage"]) == ("v1alpha1", True, True)
    assert only["subresources"] == {"status": {}}, "the operator writes status through the status subresource"


def test_printer_columns_show_phase_node_version_attempt_tools_waiting_age() -> None:
    columns = [
        (c["name"], c["type"], c["jsonPath"]) for c in version()["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert columns == [
        ("Phase", "string", ".status.phase"),
        ("Node", "string", ".status.currentNode"),
        ("Version", "integer", ".status.stateVersion"),
        ("Attempt", "integer", ".status.attempt"),
        ("Tools", "string", ".status.toolSummary"),
        ("Waiting", "string", ".status.waitingFor"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    undescribed = [
        path
        for path, sub in walk(schema())
        if not path.endswith(("[]", ".*")) and not sub.get("description") and not path.startswith(".metadata")
    ]  # the server documents metadata as ObjectMeta
    undescribed += [
        path
        for path, sub in walk(schema())
        if path.endswith("[]") and sub.get("type") == "object" and not sub.get("description")
    ]
    assert not undescribed, f"fields without a description (kubectl explain shows nothing): {undescribed}"


def test_schema_is_structural() -> None:
    """Every field typed (or int-or-string / preserve-unknown) and defaults that validate (CEL rules: test_cel)."""
    for path, sub in walk(schema()):
        typed = (
            "type" in sub or sub.get("x-kubernetes-int-or-string") or sub.get("x-kubernetes-preserve-unknown-fields")
        )
        assert typed, f"{path} has no type: a structural schema needs one"
        assert not ("properties" in sub and "additionalProperties" in sub), f"{path}: properties or a map, not both"
        if "default" in sub:
            default = apply_defaults(copy.deepcopy(sub["default"]), sub)
            errors = list(jsonschema.Draft4Validator(to_jsonschema(sub, strict=True)).iter_errors(default))
            assert not errors, f"the default of {path} is invalid: {errors[0].message}"


def test_example_manifest_is_valid_and_names_a_real_graph() -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    assert strict_errors(manifest) == [], "examples/agentrun.yaml violates the CRD schema"
    spec = manifest["spec"]
    assert spec["threadId"] == "order-4821"
    assert spec["store"] == {"secretRef": {"name": "agentrun-store"}}
    assert spec["input"]["messages"][0]["content"] == "charge my saved card for order 4821 and email me the receipt"
    module, attribute = spec["graph"].split(":")
    source = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    assigned = {
        target.id
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert attribute in assigned, f"{spec['graph']}: {source} assigns no {attribute!r}"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_manifest_is_valid_and_names_a_graph_that_loads(path: Path) -> None:
    """Each examples/*.yaml is an AgentRun the CRD accepts, whose spec.graph imports to a graph here."""
    manifest = yaml.safe_load(path.read_text())
    assert strict_errors(manifest) == [], f"{path.name} violates the CRD schema"
    graph = load_target(manifest["spec"]["graph"])  # imported as the runner does (the MCP example lists its tools)
    assert isinstance(graph, CompiledGraph) or is_langgraph(graph), f"{path.name}: {graph!r} is no compiled graph"


def _error_fields(errors: list[jsonschema.ValidationError]) -> set[str]:
    fields = set()
    for error in errors:
        path = ".".join(str(p) for p in error.absolute_path)
        if error.validator == "required":
            fields |= {f"{path}.{name}" for name in error.validator_value if name not in error.instance}
        elif error.validator == "additionalProperties":
            fields |= {f"{path}.{name}" for name in error.instance if name not in error.schema.get("properties", {})}
        else:
            fields.add(path)
    return fields


def test_every_invalid_manifest_is_covered() -> None:
    assert {p.name for p in INVALID_MANIFESTS} == set(EXPECTED_FIELD)


@pytest.mark.parametrize("path", INVALID_MANIFESTS, ids=lambda p: p.name)
def test_invalid_manifest_fails_jsonschema_on_its_field(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    fields = _error_fields(strict_errors(manifest))
    assert fields == {EXPECTED_FIELD[path.name]}, f"{path.name}: expected exactly one error at the field"


@pytest.mark.parametrize("path", [p for p in INVALID_MANIFESTS if "unknown" not in p.name], ids=lambda p: p.name)
def test_invalid_manifest_fails_the_servers_validator_on_its_field(path: Path) -> None:
    """The emulated API server (defaulting + pruning + validation) reports the same field."""
    manifest = yaml.safe_load(path.read_text())
    apply_defaults(manifest, schema())
    prune(manifest, schema())
    errors = SchemaValidator(schema()).errors(manifest)
    assert [e.field for e in errors] == [EXPECTED_FIELD[path.name]]


def test_unknown_fields_are_pruned_by_the_server_schema() -> None:
    manifest = agentrun(retries=3, podTemplate={"serviceAccountName": "admin", "nodeSelector": {"a": "b"}})
    dropped = prune(manifest, schema())
    assert sorted(dropped) == ["spec.podTemplate.serviceAccountName", "spec.retries"]
    assert manifest["spec"]["podTemplate"] == {"nodeSelector": {"a": "b"}}


@pytest.mark.parametrize("graph", ["examples.support_agent:app", "agent:app", "pkg.mod:factory.graph", "_m:_g1"])
def test_graph_reference_accepts_module_colon_attribute(graph: str) -> None:
    assert strict_errors(agentrun(graph=graph)) == []


@pytest.mark.parametrize(
    "graph",
    [
        "examples.support_agent",
        "examples/support_agent.py:app",
        ":app",
        "mod:",
        "mod:app:x",
        "1mod:app",
        "mod: app",
        "mod.:app",
    ],
)
def test_graph_reference_rejects_anything_else(graph: str) -> None:
    assert _error_fields(strict_errors(agentrun(graph=graph))) == {"spec.graph"}


@pytest.mark.parametrize(
    ("thread", "valid"),
    [
        ("o", True),
        ("order-4821", True),
        ("tenant:42@eu.west_1", True),
        ("x" * 189, True),
        ("", False),
        ("x" * 190, False),
        ("order 4821", False),
        ("a/b", False),
        ("-leading", False),
        ("trailing-", False),
    ],
)
def test_thread_id_is_1_to_189_safe_characters(thread: str, valid: bool) -> None:
    assert (strict_errors(agentrun(threadId=thread)) == []) is valid


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"toolTimeoutSeconds": 0, "nodeTimeoutSeconds": 0}, None),  # 0 disables a deadline
        ({"toolTimeoutSeconds": 0.5}, None),
        ({"nodeTimeoutSeconds": -1}, "spec.config.nodeTimeoutSeconds"),
        ({"recursionLimit": 0}, "spec.config.recursionLimit"),
        ({"recursionLimit": 10001}, "spec.config.recursionLimit"),
        ({"durableCheckpointEveryStep": "yes"}, "spec.config.durableCheckpointEveryStep"),
    ],
)
def test_config_bounds(config: dict[str, Any], field: str | None) -> None:
    assert _error_fields(strict_errors(agentrun(config=config))) == ({field} if field else set())


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"maxRestarts": 0, "backoffSeconds": 0}, None),
        ({"maxRestarts": 100, "backoffSeconds": 3600}, None),
        ({"maxRestarts": -1}, "spec.restartPolicy.maxRestarts"),
        ({"backoffSeconds": 3601}, "spec.restartPolicy.backoffSeconds"),
    ],
)
def test_restart_policy_bounds(policy: dict[str, Any], field: str | None) -> None:
    assert _error_fields(strict_errors(agentrun(restartPolicy=policy))) == ({field} if field else set())


def test_defaults_fill_config_restart_policy_and_stop() -> None:
    manifest = apply_defaults(agentrun(), schema())
    assert manifest["spec"]["restartPolicy"] == {
        "maxRestarts": 3,
        "backoffSeconds": 5,
        "imagePullTimeoutSeconds": 300,
        "storeUnavailableTimeoutSeconds": 900,
    }
    assert manifest["spec"]["config"] == {"durableCheckpointEveryStep": True, "recursionLimit": 50}
    assert manifest["spec"]["stop"] is False
    explicit = apply_defaults(agentrun(restartPolicy={"maxRestarts": 7}), schema())
    assert explicit["spec"]["restartPolicy"] == {
        "maxRestarts": 7,
        "backoffSeconds": 5,
        "imagePullTimeoutSeconds": 300,
        "storeUnavailableTimeoutSeconds": 900,
    }


def test_resume_takes_any_json_value_or_one_per_interrupt_id() -> None:
    for resume in (
        {"value": {"approved": True}},
        {"value": "yes"},
        {"value": 3},
        {"values": {"int-1": True, "int-2": {"note": "ok"}}},
    ):
        assert strict_errors(agentrun(resume=resume)) == [], resume


@pytest.mark.parametrize(
    "forbidden",
    [
        "serviceAccountName",
        "securityContext",
        "command",
        "volumes",
        "hostNetwork",
        "image",
        "automountServiceAccountToken",
    ],
)
def test_pod_template_rejects_fields_outside_the_safe_subset(forbidden: str) -> None:
    errors = strict_errors(agentrun(podTemplate={forbidden: "x"}))
    assert _error_fields(errors) == {f"spec.podTemplate.{forbidden}"}


def test_pod_template_accepts_the_safe_subset() -> None:
    template = {
        "labels": {"team": "support"},
        "annotations": {"note": "x"},
        "resources": {"limits": {"cpu": "1", "memory": "512Mi"}, "requests": {"cpu": "250m", "memory": 268435456}},
        "nodeSelector": {"pool": "agents"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"}],
        "env": [
            {"name": "LOG_LEVEL", "value": "debug"},
            {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "model", "key": "apiKey"}}},
            {"name": "REGION", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "region"}}},
        ],
    }
    assert strict_errors(agentrun(podTemplate=template)) == []


@pytest.mark.parametrize(
    ("env", "field"),
    [
        (
            [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "spec.podTemplate.env.0.valueFrom",
        ),
        ([{"name": "X", "valueFrom": {}}], "spec.podTemplate.env.0.valueFrom"),
        (
            [
                {
                    "name": "X",
                    "valueFrom": {
                        "secretKeyRef": {"name": "s", "key": "k"},
                        "configMapKeyRef": {"name": "c", "key": "k"},
                    },
                }
            ],
            "spec.podTemplate.env.0.valueFrom",
        ),
        ([{"name": "1X=", "value": "v"}], "spec.podTemplate.env.0.name"),
        ([{"value": "v"}], "spec.podTemplate.env.0.name"),
    ],
)
def test_pod_template_env_is_a_value_or_a_secret_or_configmap_key(env: list[Any], field: str) -> None:
    fields = _error_fields(strict_errors(agentrun(podTemplate={"env": env})))
    assert field in fields


def test_duplicate_env_names_are_rejected_by_the_list_map_semantics() -> None:
    manifest = agentrun(podTemplate={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]})
    errors = SchemaValidator(schema()).errors(manifest)
    assert [(e.field, e.reason) for e in errors] == [("spec.podTemplate.env[1]", "FieldValueDuplicate")]


def test_a_full_status_validates_and_phase_is_an_enum() -> None:
    status = {
        "phase": "Interrupted",
        "stateVersion": 12,
        "currentNode": "tools",
        "step": 5,
        "attempt": 2,
        "restarts": 1,
        "disruptions": 0,
        "podName": "run-2",
        "lastCheckpointTime": "2025-01-01T10:00:00Z",
        "toolCalls": {"executed": 3, "replayed": 2, "failed": 1},
        "toolSummary": "3 run, 2 replayed, 1 failed",
        "interrupt": {"id": "int-1", "ids": ["int-1", "int-2"], "message": "approve?", "payload": {"amount": 49.99}},
        "waitingFor": "2 interrupts: approve?",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "WaitingForResume",
                "message": "m",
                "lastTransitionTime": "2025-01-01T10:00:00Z",
                "observedGeneration": 3,
            }
        ],
        "observedGeneration": 3,
        "startTime": "2025-01-01T09:59:00Z",
        "reason": "Interrupted",
        "message": "waiting",
    }
    assert strict_errors({**agentrun(), "status": status}) == []
    bad = {
        **agentrun(),
        "status": {"phase": "Done", "conditions": [{"type": "Ready"}], "lastCheckpointTime": "yesterday"},
    }
    fields = _error_fields(strict_errors(bad))
    # A condition is a metav1.Condition: every one of its six fields is required (issue 8, Job parity).
    required = {f"status.conditions.0.{f}" for f in ("status", "reason", "message", "lastTransitionTime")}
    required.add("status.conditions.0.observedGeneration")
    assert fields == {"status.phase", "status.lastCheckpointTime"} | required
