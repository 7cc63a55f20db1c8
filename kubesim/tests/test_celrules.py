"""CEL validation rules (``x-kubernetes-validations``), evaluated as kube-apiserver does.

The rule engine on its own (messages, reasons, ratcheting, deep values), then
the test CRD's rules through the real ``kubectl``: the refusal must read as a
real API server's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from kubesim import EmulatedCluster, celrules

NAME = "cel-widget"


def schema_validator(**extra: Any) -> celrules.Validator:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "x-kubernetes-validations": [{"rule": "self < 10", **extra}]},
                    "deep": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
                "x-kubernetes-validations": [{"rule": "self.deep == oldSelf.deep", "message": "deep is immutable"}],
            }
        },
    }
    validator = celrules.Validator.for_schema(schema)
    assert validator is not None
    return validator


def test_rule_defaults_reasons_and_ratcheting() -> None:
    errors, _ = schema_validator().validate({"spec": {"n": 12}}, None, [])
    assert [str(e) for e in errors] == ["spec.n: Invalid value: 12: failed rule: self < 10"]
    errors, _ = schema_validator(reason="FieldValueForbidden", message="too big").validate(
        {"spec": {"n": 12}}, None, []
    )
    assert [str(e) for e in errors] == ["spec.n: Forbidden: too big"]
    errors, warnings = schema_validator().validate({"spec": {"n": 12, "deep": {}}}, {"spec": {"n": 12, "deep": {}}}, [])
    assert errors == [] and warnings == ["spec.n: Invalid value: 12: failed rule: self < 10"], "not ratcheted"
    errors, _ = schema_validator().validate({"spec": {"n": 1}}, {"spec": {"n": 1}}, [])
    assert [str(e) for e in errors] == [
        'spec: Invalid value: "object": no such key: deep evaluating rule: deep is immutable'
    ]


def test_rules_see_values_nested_far_deeper_than_the_engine_can_take() -> None:
    deep: Any = "leaf"
    for _ in range(9_990):
        deep = {"a": deep}
    validator = schema_validator()
    assert validator.validate({"spec": {"deep": deep}}, {"spec": {"deep": copy.deepcopy(deep)}}, []) == ([], [])
    changed: Any = "other"
    for _ in range(9_990):
        changed = {"a": changed}
    errors, _ = validator.validate({"spec": {"deep": changed}}, {"spec": {"deep": deep}}, [])
    assert [str(e) for e in errors] == ["spec: Invalid value: deep is immutable"]


def widget(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubesim.dev/v1",
        "kind": "Widget",
        "metadata": {"name": NAME, "namespace": "default"},
        "spec": {"owner": "me", **spec},
    }


def apply(cluster: EmulatedCluster, obj: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / "widget.yaml"
    path.write_text(yaml.safe_dump(obj))
    return cluster.kubectl("apply", "-f", str(path))


def test_a_transition_rule_refuses_a_change_through_apply_and_patch(cluster: EmulatedCluster, tmp_path: Path) -> None:
    assert apply(cluster, widget(), tmp_path).returncode == 0
    applied = apply(cluster, widget(owner="you"), tmp_path)
    assert applied.returncode != 0
    assert f'The Widget "{NAME}" is invalid: spec.owner: Forbidden: owner is immutable' in applied.stderr
    patched = cluster.kubectl("patch", "widget", NAME, "--type", "merge", "-p", json.dumps({"spec": {"owner": "x"}}))
    assert patched.returncode != 0 and "spec.owner: Forbidden: owner is immutable" in patched.stderr
    assert (cluster.get("widgets", NAME) or {})["spec"]["owner"] == "me"


def test_a_one_way_field_and_rules_on_list_items(cluster: EmulatedCluster, tmp_path: Path) -> None:
    assert apply(cluster, widget(stop=True), tmp_path).returncode == 0
    restarted = apply(cluster, widget(stop=False), tmp_path)
    assert restarted.returncode != 0
    assert "spec: Invalid value: a stopped widget cannot be started again" in restarted.stderr
    long_value = apply(cluster, widget(stop=True, labels=[{"name": "a", "value": "v" * 21}]), tmp_path)
    assert long_value.returncode != 0
    assert "spec.labels[0]: Invalid value: a label value has at most 20 characters" in long_value.stderr
