"""The AgentRun CRD's CEL rules, enforced by the emulated API server as a real one does.

Each rule is tried with the real ``kubectl`` (``apply`` of an edited manifest and
``patch``), and the refusal must read as a real API server's:
``The AgentRun "x" is invalid: <field>: Invalid value: "<type>": <message>``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim import EmulatedCluster, celrules
from kubesim.resources import crd_resources, load_crd_documents
from tests.cluster.conftest import AGENTRUNS

ROOT = Path(__file__).resolve().parents[2]
NAME = "cel-run"
MERGE = "application/merge-patch+json"

# Every rule on the real control plane, and on kubesim: its CEL must word refusals as kube-apiserver does.
pytestmark = [pytest.mark.real_server, pytest.mark.kubesim_too]


def manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": NAME, "namespace": "default"},
        "spec": {"graph": "examples.support_agent:app", "threadId": "thread-a", **spec},
    }


def apply(cluster: EmulatedCluster, obj: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / f"{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    return cluster.kubectl("apply", "-f", str(path))


def patch(cluster: EmulatedCluster, spec: dict[str, Any]) -> Any:
    return cluster.kubectl("patch", "agentrun", NAME, "--type", "merge", "-p", json.dumps({"spec": spec}))


def refused(result: Any, field: str, value: str | None, message: str) -> None:
    """The refusal as kube-apiserver 1.37 words it: a scalar value printed as Go does, a structured one not at all."""
    shown = f"Invalid value: {value}: {message}" if value is not None else f"Invalid value: {message}"
    expected = f'The AgentRun "{NAME}" is invalid: {field}: {shown}'
    assert result.returncode != 0, f"the API server accepted what a CEL rule forbids: {result.stdout}"
    assert expected in result.stderr, f"not the real API server's message:\n{result.stderr}"


def created(cluster: EmulatedCluster, tmp_path: Path, **spec: Any) -> dict[str, Any]:
    obj = manifest(**spec)
    result = apply(cluster, obj, tmp_path)
    assert result.returncode == 0, result.stderr
    return obj


IMMUTABLE = [
    ("threadId", "thread-b", "threadId is immutable; create a new AgentRun for another thread"),
    ("graph", "examples.other:app", "graph is immutable; create a new AgentRun to run another graph"),
    ("userId", "user-2", "userId is immutable; create a new AgentRun for another user"),
]


@pytest.mark.parametrize(("field", "value", "message"), IMMUTABLE)
def test_identity_fields_are_immutable_through_apply(
    cluster: EmulatedCluster, tmp_path: Path, field: str, value: str, message: str
) -> None:
    obj = created(cluster, tmp_path, userId="user-1")
    changed = copy.deepcopy(obj)
    changed["spec"][field] = value
    refused(apply(cluster, changed, tmp_path), f"spec.{field}", json.dumps(value), message)
    stored = cluster.get("agentruns", NAME)
    assert stored is not None and stored["spec"][field] == obj["spec"][field], "the refused change was stored"


@pytest.mark.parametrize(("field", "value", "message"), IMMUTABLE)
def test_identity_fields_are_immutable_through_patch(
    cluster: EmulatedCluster, tmp_path: Path, field: str, value: str, message: str
) -> None:
    created(cluster, tmp_path, userId="user-1")
    refused(patch(cluster, {field: value}), f"spec.{field}", json.dumps(value), message)


def test_user_id_cannot_be_added_or_removed_after_create(cluster: EmulatedCluster, tmp_path: Path) -> None:
    message = "userId is immutable; create a new AgentRun for another user"
    created(cluster, tmp_path)
    refused(patch(cluster, {"userId": "late"}), "spec.userId", None, message)
    cluster.kubectl("delete", "agentrun", NAME, check=True)
    created(cluster, tmp_path, userId="user-1")
    refused(patch(cluster, {"userId": None}), "spec.userId", None, message)


def test_unchanged_identity_and_other_fields_may_be_written(cluster: EmulatedCluster, tmp_path: Path) -> None:
    obj = created(cluster, tmp_path, userId="user-1")
    again = apply(cluster, obj, tmp_path)
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stderr
    assert patch(cluster, {"config": {"recursionLimit": 80}, "threadId": "thread-a"}).returncode == 0
    status = cluster.api("PATCH", f"{AGENTRUNS}/{NAME}/status", {"status": {"phase": "Running"}}, content_type=MERGE)
    assert status.status == 200, status.body


def test_stop_is_one_way(cluster: EmulatedCluster, tmp_path: Path) -> None:
    message = "stop cannot be undone; create a new AgentRun to run the thread again"
    obj = created(cluster, tmp_path)
    assert patch(cluster, {"stop": True}).returncode == 0, "stopping a run must be allowed"
    refused(patch(cluster, {"stop": False}), "spec.stop", "false", message)
    unchanged = apply(cluster, obj, tmp_path)  # the manifest does not mention stop: kubectl sends no change
    assert unchanged.returncode == 0 and "unchanged" in unchanged.stdout, unchanged.stderr
    obj["spec"]["stop"] = False
    refused(apply(cluster, obj, tmp_path), "spec.stop", "false", message)
    stored = cluster.get("agentruns", NAME)
    assert stored is not None and stored["spec"]["stop"] is True


STORE_MESSAGE = (
    "store is immutable: the thread's checkpoints and tool ledger stay in the store the run started with "
    "(another store would start the turn over and run its tools again); create a new AgentRun to use another store"
)
INPUT_MESSAGE = "input is immutable; create a new AgentRun (or a new requestId) for a new turn"


def test_store_and_input_are_immutable(cluster: EmulatedCluster, tmp_path: Path) -> None:
    """Issue 22 items 2 and 7: a patched store or input of a started run would start its turn over (charge twice)."""
    obj = created(cluster, tmp_path, store={"secretRef": {"name": "store-a"}}, input={"messages": ["charge"]})
    refused(patch(cluster, {"store": {"secretRef": {"name": "store-b"}}}), "spec.store", None, STORE_MESSAGE)
    refused(patch(cluster, {"store": None}), "spec.store", None, STORE_MESSAGE)
    refused(patch(cluster, {"input": {"messages": ["again"]}}), "spec.input", None, INPUT_MESSAGE)
    refused(patch(cluster, {"input": None}), "spec.input", None, INPUT_MESSAGE)
    assert apply(cluster, obj, tmp_path).returncode == 0, "an unchanged store and input may be re-applied"
    cluster.kubectl("delete", "agentrun", NAME, check=True)
    created(cluster, tmp_path)
    refused(patch(cluster, {"store": {"secretRef": {"name": "store-b"}}}), "spec.store", None, STORE_MESSAGE)
    refused(patch(cluster, {"input": {"messages": ["late"]}}), "spec.input", None, INPUT_MESSAGE)


def test_retry_cannot_reopen_a_stopped_run(cluster: EmulatedCluster, tmp_path: Path) -> None:
    message = (
        "retry cannot re-open a stopped run (spec.stop is one-way); "
        "create a new AgentRun on the same threadId to continue the thread"
    )
    created(cluster, tmp_path)
    assert patch(cluster, {"retry": 1}).returncode == 0, "retry of a run that is not stopped is allowed"
    assert patch(cluster, {"stop": True}).returncode == 0
    refused(patch(cluster, {"retry": 2}), "spec.retry", None, message)
    assert patch(cluster, {"stop": True, "retry": 1}).returncode == 0, "an unchanged retry may be re-sent"


def test_a_run_may_be_created_stopped(cluster: EmulatedCluster, tmp_path: Path) -> None:
    created(cluster, tmp_path, stop=True)  # transition rules never run on create


def test_resume_takes_value_xor_values(cluster: EmulatedCluster, tmp_path: Path) -> None:
    """A oneOf, not a CEL rule: kube-apiserver's CEL cannot see the untyped resume.value (found on the real server)."""

    def not_one(result: Any, found: str) -> None:
        expected = (
            f'<nil>: Invalid value: "": "spec.resume" must validate one and only one schema (oneOf). Found {found}'
        )
        assert result.returncode != 0 and expected in result.stderr, result.stderr

    not_one(
        apply(cluster, manifest(resume={"value": "yes", "values": {"i-1": "yes"}}), tmp_path), "2 valid alternatives"
    )
    not_one(apply(cluster, manifest(resume={}), tmp_path), "none valid")
    created(cluster, tmp_path, resume={"value": {"approved": True}})
    not_one(patch(cluster, {"resume": {"values": {"i-1": "no"}}}), "2 valid alternatives")
    assert patch(cluster, {"resume": {"value": None, "values": {"i-1": "no"}}}).returncode == 0, "switching is allowed"


def test_env_takes_value_xor_value_from(cluster: EmulatedCluster, tmp_path: Path) -> None:
    message = "set exactly one of value or valueFrom"
    ref = {"secretKeyRef": {"name": "creds", "key": "token"}}
    both = manifest(
        podTemplate={"env": [{"name": "OK", "value": "1"}, {"name": "TOKEN", "value": "x", "valueFrom": ref}]}
    )
    refused(apply(cluster, both, tmp_path), "spec.podTemplate.env[1]", None, message)
    created(cluster, tmp_path, podTemplate={"env": [{"name": "TOKEN", "valueFrom": ref}]})
    result = patch(cluster, {"podTemplate": {"env": [{"name": "EMPTY"}]}})
    refused(result, "spec.podTemplate.env[0]", None, message)


def test_rule_errors_list_every_failing_rule(cluster: EmulatedCluster, tmp_path: Path) -> None:
    created(cluster, tmp_path, userId="user-1")
    result = patch(cluster, {"threadId": "thread-b", "graph": "examples.other:app"})
    assert result.returncode != 0
    assert 'spec.graph: Invalid value: "examples.other:app": graph is immutable' in result.stderr
    assert 'spec.threadId: Invalid value: "thread-b": threadId is immutable' in result.stderr
    body = cluster.api("PATCH", f"{AGENTRUNS}/{NAME}", {"spec": {"threadId": "thread-b"}}, content_type=MERGE).body
    assert body["code"] == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "thread-b": threadId is immutable; create a new AgentRun for another thread',
            "field": "spec.threadId",
        }
    ]


def test_every_rule_of_the_crd_compiles() -> None:
    for document in load_crd_documents(sorted((ROOT / "crds").glob("*.yaml"))):
        for rdef in crd_resources(document):
            assert rdef.schema is not None
            node = celrules.Node.build(rdef.schema)
            stack = [node] if node else []
            while stack:
                current = stack.pop()
                for rule in current.rules:
                    assert rule.compile_error is None, (rule.source, rule.compile_error)
                stack += [*current.properties.values(), *(n for n in (current.items, current.additional) if n)]
