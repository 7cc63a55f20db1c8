"""The real ``kubectl`` against the emulated cluster: what a user of AgentRun types."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim import EmulatedCluster
from kubesim.testing import python_pod
from tests.cluster.conftest import AGENTRUNS, EXAMPLE, EXPECTED_FIELD, INVALID_MANIFESTS, PODS
from tests.cluster.operator_harness import table

NAME = "support-order-4821"

# Every kubectl scenario marked real_server runs on kubesim too: these are what the emulator must answer as
# kube-apiserver does (discovery, printing, conflicts, garbage collection).
pytestmark = pytest.mark.kubesim_too


def apply_example(cluster: EmulatedCluster) -> dict[str, Any]:
    result = cluster.kubectl("apply", "-f", str(EXAMPLE))
    assert result.returncode == 0, f"kubectl apply of the example failed: {result.stderr}"
    obj = cluster.get("agentruns", NAME)
    assert obj is not None
    return obj


def set_status(cluster: EmulatedCluster, status: dict[str, Any]) -> dict[str, Any]:
    """What the operator does: a merge patch of the status subresource."""
    response = cluster.api(
        "PATCH", f"{AGENTRUNS}/{NAME}/status", {"status": status}, content_type="application/merge-patch+json"
    )
    assert response.status == 200, response.body
    body: dict[str, Any] = response.body
    return body


@pytest.mark.real_server
def test_kubectl_apply_creates_the_example_with_client_validation_on(cluster: EmulatedCluster, tmp_path: Path) -> None:
    # A cache of its own (the last --cache-dir wins): with the session's, warmed by earlier tests on the real
    # server, kubectl would not fetch the OpenAPI document this test looks for.
    result = cluster.kubectl("apply", "-f", str(EXAMPLE), "-v=6", f"--cache-dir={tmp_path / 'kubectl-cache'}")
    assert result.returncode == 0, result.stderr
    assert f"agentrun.agentrun.dev/{NAME} created" in result.stdout
    assert "/openapi/v3/apis/agentrun.dev/v1alpha1" in result.stderr, "kubectl did not read the OpenAPI document"
    assert "fieldValidation=Strict" in result.stderr, "kubectl's validation is off (it sends Strict when on)"
    assert "openapi/v2" not in result.stderr, "kubectl fell back to the legacy OpenAPI (its validation would fail)"

    obj = cluster.get("agentruns", NAME)
    assert obj is not None
    meta = obj["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"]
    assert obj["spec"]["restartPolicy"] == {
        "maxRestarts": 3,
        "backoffSeconds": 5,
        "imagePullTimeoutSeconds": 300,
        "storeUnavailableTimeoutSeconds": 900,
    }, "CRD defaults not applied"
    assert obj["spec"]["config"] == {
        "toolTimeoutSeconds": 60,
        "nodeTimeoutSeconds": 300,
        "durableCheckpointEveryStep": True,
        "recursionLimit": 50,
    }
    assert obj["spec"]["stop"] is False


@pytest.mark.real_server
def test_kubectl_apply_again_is_unchanged(cluster: EmulatedCluster) -> None:
    before = apply_example(cluster)
    result = cluster.kubectl("apply", "-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert f"agentrun.agentrun.dev/{NAME} unchanged" in result.stdout
    after = cluster.get("agentruns", NAME)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "a no-op wrote anyway"


@pytest.mark.real_server
@pytest.mark.parametrize("resource", ["ar", "agentruns", "agentrun", "agentruns.agentrun.dev"])
def test_kubectl_get_prints_phase_node_version_attempt(cluster: EmulatedCluster, resource: str) -> None:
    apply_example(cluster)
    set_status(
        cluster,
        {"phase": "Running", "currentNode": "tools", "stateVersion": 7, "attempt": 2, "toolSummary": "3 failed"},
    )
    result = cluster.kubectl("get", resource)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    header, row = table(result.stdout)
    assert header == ["NAME", "PHASE", "NODE", "VERSION", "ATTEMPT", "TOOLS", "WAITING", "AGE"]
    assert row[:7] == [NAME, "Running", "tools", "7", "2", "3 failed", ""]
    assert row[7].endswith("s"), f"AGE should be an age like 3s, got {row[7]!r}"
    # What a waiting run waits for (status.waitingFor, the operator's few words of status.interrupt).
    set_status(cluster, {"phase": "Interrupted", "waitingFor": "refund 49.99 for order 4821?"})
    header, row = table(cluster.kubectl("get", resource).stdout)
    assert row[header.index("WAITING")] == "refund 49.99 for order 4821?", row


@pytest.mark.real_server
def test_kubectl_get_wide_and_all_namespaces(cluster: EmulatedCluster) -> None:
    apply_example(cluster)
    set_status(
        cluster, {"phase": "Failed", "attempt": 4, "restarts": 3, "disruptions": 1, "reason": "BackoffLimitExceeded"}
    )
    header, row = table(cluster.kubectl("get", "ar", "-o", "wide").stdout)
    assert header == [
        "NAME",
        "PHASE",
        "NODE",
        "VERSION",
        "ATTEMPT",
        "TOOLS",
        "WAITING",
        "RESTARTS",
        "DISRUPTIONS",
        "THREAD",
        "REASON",
        "AGE",
    ]
    assert row[:11] == [NAME, "Failed", "", "", "4", "", "", "3", "1", "order-4821", "BackoffLimitExceeded"]
    header, row = table(cluster.kubectl("get", "ar", "-A").stdout)
    assert header[:3] == ["NAMESPACE", "NAME", "PHASE"] and row[:3] == ["default", NAME, "Failed"]


@pytest.mark.real_server
def test_kubectl_get_watch_prints_status_changes(cluster: EmulatedCluster) -> None:
    apply_example(cluster)
    with cluster.kubectl_popen("get", "ar", "-w") as watch:
        try:
            assert watch.stdout is not None
            assert watch.stdout.readline().split()[:2] == ["NAME", "PHASE"]
            assert watch.stdout.readline().split()[0] == NAME
            set_status(cluster, {"phase": "Running", "currentNode": "agent", "stateVersion": 1, "attempt": 1})
            assert watch.stdout.readline().split()[:5] == [NAME, "Running", "agent", "1", "1"]
            set_status(cluster, {"phase": "Succeeded", "currentNode": "__end__", "stateVersion": 4})
            assert watch.stdout.readline().split()[:4] == [NAME, "Succeeded", "__end__", "4"]
        finally:
            watch.terminate()
            watch.communicate(timeout=10)


@pytest.mark.real_server
def test_short_name_ar_is_unambiguous_in_discovery(cluster: EmulatedCluster) -> None:
    resources = cluster.api("GET", "/apis/agentrun.dev/v1alpha1").body["resources"]
    main, status = resources
    assert (main["name"], main["shortNames"], main["categories"]) == ("agentruns", ["ar"], ["agentrun"])
    assert status == {
        "name": "agentruns/status",
        "singularName": "",
        "namespaced": True,
        "kind": "AgentRun",
        "verbs": ["get", "patch", "update"],
    }
    result = cluster.kubectl("api-resources", "--api-group=agentrun.dev")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    header, row = table(result.stdout)
    assert header == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert row == ["agentruns", "ar", "agentrun.dev/v1alpha1", "true", "AgentRun"]


@pytest.mark.real_server
def test_kubectl_explain_shows_the_crd_descriptions(cluster: EmulatedCluster) -> None:
    result = cluster.kubectl("explain", "agentrun.spec.config")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "KIND:       AgentRun" in text and "FIELD: config <Object>" in text
    assert "recursionLimit\t<integer>" in text
    assert "The maximum number of steps of one attempt" in text
    assert "0 disables the deadline" in text
    spec = cluster.kubectl("explain", "ar.spec").stdout
    assert "graph\t<string> -required-" in spec and "threadId\t<string> -required-" in spec
    assert "module.path:attribute" in spec
    phase = cluster.kubectl("explain", "agentruns.status.phase").stdout
    assert "Interrupted" in phase and "Stopping" in phase


@pytest.mark.real_server
@pytest.mark.parametrize("path", INVALID_MANIFESTS, ids=lambda p: p.name)
def test_kubectl_rejects_invalid_manifest_naming_the_field(cluster: EmulatedCluster, path: Path) -> None:
    result = cluster.kubectl("apply", "-f", str(path))
    assert result.returncode != 0, f"{path.name} was accepted"
    field = EXPECTED_FIELD[path.name]
    assert field in result.stderr, f"the error does not name {field}: {result.stderr}"
    assert "Error from server" in result.stderr or "is invalid" in result.stderr
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    assert cluster.get("agentruns", name) is None, "a rejected object was stored"


@pytest.mark.real_server
def test_kubectl_patch_stop_bumps_generation_but_status_patch_does_not(cluster: EmulatedCluster) -> None:
    created = apply_example(cluster)
    status = cluster.kubectl(
        "patch",
        "ar",
        NAME,
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        '{"status":{"phase":"Running","attempt":1}}',
    )
    assert status.returncode == 0, status.stderr
    after_status = cluster.get("agentruns", NAME)
    assert after_status is not None
    assert after_status["status"] == {"phase": "Running", "attempt": 1}
    assert after_status["metadata"]["generation"] == 1, "a status write bumped metadata.generation"
    assert after_status["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]

    stop = cluster.kubectl("patch", "ar", NAME, "--type", "merge", "-p", '{"spec":{"stop":true}}')
    assert stop.returncode == 0 and "patched" in stop.stdout, stop.stderr
    stopped = cluster.get("agentruns", NAME)
    assert stopped is not None
    assert stopped["spec"]["stop"] is True
    assert stopped["metadata"]["generation"] == 2, "a spec change must bump metadata.generation"

    again = cluster.kubectl("patch", "ar", NAME, "--type", "merge", "-p", '{"spec":{"stop":true}}')
    assert "patched (no change)" in again.stdout
    unchanged = cluster.get("agentruns", NAME)
    assert unchanged is not None
    assert unchanged["metadata"]["resourceVersion"] == stopped["metadata"]["resourceVersion"]

    cluster.kubectl("patch", "ar", NAME, "--type", "merge", "-p", '{"status":{"phase":"Failed"}}')
    ignored = cluster.get("agentruns", NAME)
    assert ignored is not None
    assert ignored["status"]["phase"] == "Running", "the main resource must ignore status (status subresource)"


@pytest.mark.real_server
def test_stale_resource_version_is_a_conflict(cluster: EmulatedCluster, tmp_path: Path) -> None:
    apply_example(cluster)
    stale = tmp_path / "stale.json"
    stale.write_text(cluster.kubectl("get", "ar", NAME, "-o", "json").stdout)
    assert (
        cluster.kubectl(
            "patch", "ar", NAME, "--type", "merge", "-p", '{"spec":{"config":{"recursionLimit":60}}}'
        ).returncode
        == 0
    )
    edited = json.loads(stale.read_text())
    edited["spec"]["config"]["recursionLimit"] = 70
    stale.write_text(json.dumps(edited))
    result = cluster.kubectl("replace", "-f", str(stale))
    assert result.returncode != 0
    assert "the object has been modified; please apply your changes to the latest version" in result.stderr
    current = cluster.get("agentruns", NAME)
    assert current is not None
    assert current["spec"]["config"]["recursionLimit"] == 60, "a stale update overwrote a newer one"

    put = cluster.api("PUT", f"{AGENTRUNS}/{NAME}", edited)
    assert (put.status, put.body["reason"]) == (409, "Conflict")
    edited["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    fresh = cluster.api("PUT", f"{AGENTRUNS}/{NAME}", edited)
    assert fresh.status == 200 and fresh.body["spec"]["config"]["recursionLimit"] == 70
    assert fresh.body["metadata"]["generation"] == 3


@pytest.mark.real_server
def test_deleting_an_agentrun_garbage_collects_its_pods(cluster: EmulatedCluster) -> None:
    owner = apply_example(cluster)
    for pod in (
        python_pod(f"{NAME}-1", "pass", owner=owner, restricted=True),
        python_pod("unrelated", "pass", restricted=True),
    ):
        assert cluster.api("POST", PODS, pod).status == 201
    result = cluster.kubectl("delete", "ar", NAME)
    assert result.returncode == 0 and f'agentrun.agentrun.dev "{NAME}" deleted' in result.stdout
    # kube-controller-manager's garbage collector learns a CRD's resource at its discovery resync, up to 30 s
    # after the CRD is established (seen: 41 s on a fresh plane); kubesim's collects at once.
    cluster.wait_for(lambda: cluster.get("pods", f"{NAME}-1") is None, timeout=60, message="the owned pod is collected")
    assert cluster.get("pods", "unrelated") is not None, "the garbage collector removed a pod it does not own"
    assert cluster.get("agentruns", NAME) is None


@pytest.mark.real_server
def test_kubectl_create_namespace_and_delete_it_with_its_contents(cluster: EmulatedCluster) -> None:
    assert cluster.kubectl("create", "namespace", "team-a").returncode == 0
    result = cluster.kubectl("apply", "-n", "team-a", "-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    missing = cluster.kubectl("apply", "-n", "team-b", "-f", str(EXAMPLE))
    assert missing.returncode != 0 and 'namespaces "team-b" not found' in missing.stderr
    assert cluster.kubectl("delete", "namespace", "team-a", "--wait=false").returncode == 0
    cluster.wait_for(lambda: cluster.get("namespaces", "team-a", None) is None, message="namespace removed")
    assert cluster.get("agentruns", NAME, "team-a") is None


@pytest.mark.real_server
def test_kubectl_describe_agentrun(cluster: EmulatedCluster) -> None:
    apply_example(cluster)
    set_status(cluster, {"phase": "Interrupted", "interrupt": {"id": "int-1", "message": "approve the charge?"}})
    result = cluster.kubectl("describe", "ar", NAME)
    assert result.returncode == 0, result.stderr
    assert "Thread Id:" in result.stdout and "approve the charge?" in result.stdout


def test_the_crd_is_installed_and_can_be_reapplied_deleted_and_restored(cluster: EmulatedCluster) -> None:
    crd_file = EXAMPLE.parents[1] / "crds" / "agentrun.dev_agentruns.yaml"
    names = [row[0] for row in table(cluster.kubectl("get", "crd").stdout)[1:]]
    assert names == ["agentruns.agentrun.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
    reapplied = cluster.kubectl("apply", "-f", str(crd_file))
    assert reapplied.returncode == 0 and reapplied.stderr == "", reapplied.stderr
    crd = cluster.get("crds", "agentruns.agentrun.dev", None)
    assert crd is not None
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]} == {
        "NamesAccepted": "True",
        "Established": "True",
    }
    apply_example(cluster)
    assert cluster.kubectl("delete", "crd", "agentruns.agentrun.dev").returncode == 0
    assert cluster.api("GET", AGENTRUNS).status == 404, "a deleted CRD's resource is still served"
    assert cluster.kubectl("apply", "-f", str(crd_file)).returncode == 0
    assert cluster.api("GET", AGENTRUNS).body["items"] == [], "custom resources outlived their CRD"
    apply_example(cluster)


@pytest.mark.real_server
def test_kubectl_wait_for_a_phase_a_condition_and_deletion(cluster: EmulatedCluster) -> None:
    apply_example(cluster)
    with cluster.kubectl_popen(
        "wait", "--timeout=20s", "--for=jsonpath={.status.phase}=Succeeded", f"ar/{NAME}"
    ) as waiting:
        time.sleep(0.5)
        assert waiting.poll() is None, "kubectl wait returned before the phase was reached"
        set_status(
            cluster,
            {
                "phase": "Succeeded",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Completed",
                        "message": "the run completed",
                        "lastTransitionTime": "2025-01-01T00:00:00Z",
                        "observedGeneration": 1,
                    }
                ],
            },
        )
        out, err = waiting.communicate(timeout=20)
    assert waiting.returncode == 0 and "condition met" in out, err
    ready = cluster.kubectl("wait", "--for=condition=Ready", f"ar/{NAME}", "--timeout=5s")
    assert ready.returncode == 0, ready.stderr
    assert cluster.kubectl("delete", "ar", NAME, "--wait=false").returncode == 0
    gone = cluster.kubectl("wait", "--for=delete", f"ar/{NAME}", "--timeout=5s")
    assert gone.returncode == 0, gone.stderr


@pytest.mark.real_server
def test_run_names_leave_room_for_the_attempt_suffix_of_pod_names(cluster: EmulatedCluster) -> None:
    def run(name: str) -> dict[str, Any]:
        spec = {"graph": "examples.support_agent:app", "threadId": "t"}
        return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}

    assert cluster.api("POST", AGENTRUNS, run("r" * 240)).status == 201
    too_long = cluster.api("POST", AGENTRUNS, run("r" * 241))
    assert too_long.status == 422 and too_long.body["details"]["causes"][0]["field"] == "metadata.name"
    assert cluster.api("POST", PODS, python_pod("r" * 240 + "-10000", "pass", restricted=True)).status == 201
