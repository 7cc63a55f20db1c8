"""API semantics of the emulated server that an operator (and kopf) depends on, over raw HTTP (on the test CRD)."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from typing import Any

import pytest

from kubesim import EmulatedCluster
from kubesim.testing import python_pod

WIDGETS = "/apis/kubesim.dev/v1/namespaces/default/widgets"
PODS = "/api/v1/namespaces/default/pods"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubesim.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"owner": f"owner-{name}", **spec},
    }


def create(cluster: EmulatedCluster, name: str, **spec: Any) -> dict[str, Any]:
    response = cluster.api("POST", WIDGETS, widget(name, **spec))
    assert response.status == 201, response.body
    return response.body  # type: ignore[no-any-return]


def watch(
    cluster: EmulatedCluster, path: str, params: dict[str, str], *, count: int, timeout: float = 5
) -> list[dict[str, Any]]:
    """Read up to ``count`` events from a watch (the server ends the stream at timeoutSeconds)."""
    url = urllib.parse.urlsplit(cluster.url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    query = urllib.parse.urlencode({"watch": "true", "timeoutSeconds": "3", **params})
    connection.request("GET", f"{path}?{query}")
    events = []
    try:
        with connection.getresponse() as response:
            assert response.status == 200
            for line in response:
                events.append(json.loads(line))
                if len(events) >= count:
                    break
    finally:
        connection.close()
    return events


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in events]


def test_lists_carry_kind_api_version_and_resource_version(cluster: EmulatedCluster) -> None:
    create(cluster, "b")
    create(cluster, "a")
    listing = cluster.api("GET", WIDGETS).body
    assert (listing["kind"], listing["apiVersion"]) == ("WidgetList", "kubesim.dev/v1")
    assert int(listing["metadata"]["resourceVersion"]) > 0
    assert [item["metadata"]["name"] for item in listing["items"]] == ["a", "b"]
    pods = cluster.api("GET", "/api/v1/pods").body
    assert (pods["kind"], pods["apiVersion"], pods["items"]) == ("PodList", "v1", [])


def test_label_and_field_selectors_and_pagination(cluster: EmulatedCluster) -> None:
    for name, labels in (("r1", {"kubesim.dev/run": "x"}), ("r2", {"kubesim.dev/run": "y"}), ("r3", {})):
        body = widget(name)
        body["metadata"]["labels"] = labels
        assert cluster.api("POST", WIDGETS, body).status == 201

    def names(params: dict[str, str]) -> list[str]:
        return [i["metadata"]["name"] for i in cluster.api("GET", WIDGETS, params=params).body["items"]]

    assert names({"labelSelector": "kubesim.dev/run=x"}) == ["r1"]
    assert names({"labelSelector": "kubesim.dev/run in (x,y)"}) == ["r1", "r2"]
    assert names({"labelSelector": "!kubesim.dev/run"}) == ["r3"]
    assert names({"fieldSelector": "metadata.name!=r2"}) == ["r1", "r3"]
    first = cluster.api("GET", WIDGETS, params={"limit": "2"}).body
    assert [i["metadata"]["name"] for i in first["items"]] == ["r1", "r2"]
    assert first["metadata"]["remainingItemCount"] == 1
    rest = cluster.api("GET", WIDGETS, params={"limit": "2", "continue": first["metadata"]["continue"]}).body
    assert [i["metadata"]["name"] for i in rest["items"]] == ["r3"] and "continue" not in rest["metadata"]


def test_watch_resumes_from_a_resource_version(cluster: EmulatedCluster) -> None:
    first = create(cluster, "w1")
    since = first["metadata"]["resourceVersion"]
    assert cluster.api("PATCH", f"{WIDGETS}/w1", {"spec": {"stop": True}}, content_type=MERGE).status == 200
    create(cluster, "w2")
    resumed = watch(cluster, WIDGETS, {"resourceVersion": since}, count=2)
    assert summary(resumed) == [("MODIFIED", "w1"), ("ADDED", "w2")]
    assert resumed[0]["object"]["spec"]["stop"] is True
    fresh = watch(cluster, WIDGETS, {}, count=2)
    assert summary(fresh) == [("ADDED", "w1"), ("ADDED", "w2")], "a watch without resourceVersion starts with ADDED"


def test_watch_with_a_selector_sees_objects_enter_and_leave(cluster: EmulatedCluster) -> None:
    create(cluster, "sel")
    rv = cluster.api("GET", WIDGETS).body["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: events.extend(
            watch(cluster, WIDGETS, {"resourceVersion": rv, "labelSelector": "tier=gold"}, count=3)
        )
    )
    reader.start()
    for labels in ({"tier": "gold"}, {"tier": "gold", "x": "1"}, {"tier": None}):
        assert (
            cluster.api("PATCH", f"{WIDGETS}/sel", {"metadata": {"labels": labels}}, content_type=MERGE).status == 200
        )
    reader.join(10)
    assert summary(events) == [("ADDED", "sel"), ("MODIFIED", "sel"), ("DELETED", "sel")]


def test_watch_from_an_expired_resource_version_is_gone(cluster: EmulatedCluster) -> None:
    cluster.call(
        lambda: cluster.emulator.registry._dropped_rv.__setitem__(  # type: ignore[union-attr]
            cluster.emulator.resource_def("wd").key, 100
        )
    )  # type: ignore[union-attr]
    response = cluster.api("GET", WIDGETS, params={"watch": "true", "resourceVersion": "5"})
    assert (response.status, response.body["reason"]) == (410, "Expired")


def test_finalizers_hold_a_deleted_object_until_removed(cluster: EmulatedCluster) -> None:
    body = widget("fin")
    body["metadata"]["finalizers"] = ["kubesim.dev/cleanup"]
    assert cluster.api("POST", WIDGETS, body).status == 201
    deleted = cluster.api("DELETE", f"{WIDGETS}/fin")
    assert deleted.status == 200 and deleted.body["metadata"]["deletionTimestamp"]
    held = cluster.get("widgets", "fin")
    assert held is not None and held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["generation"] == 2, "setting deletionTimestamp bumps the generation"
    more = cluster.api(
        "PATCH", f"{WIDGETS}/fin", {"metadata": {"finalizers": ["kubesim.dev/cleanup", "other"]}}, content_type=MERGE
    )
    assert more.status == 422 and "no new finalizers can be added" in more.body["message"]
    released = cluster.api("PATCH", f"{WIDGETS}/fin", {"metadata": {"finalizers": None}}, content_type=MERGE)
    assert released.status == 200
    assert cluster.get("widgets", "fin") is None


def test_json_patch_test_on_resource_version_is_kopfs_optimistic_lock(cluster: EmulatedCluster) -> None:
    obj = create(cluster, "jp")
    rv = obj["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["kubesim.dev/cleanup"]},
    ]
    assert cluster.api("PATCH", f"{WIDGETS}/jp", ops, content_type=JSON_PATCH).status == 200
    stale = cluster.api("PATCH", f"{WIDGETS}/jp", ops, content_type=JSON_PATCH)
    assert stale.status == 422, "a failed JSON-patch test must be 422 (kopf retries on it)"


def test_merge_patch_with_a_stale_resource_version_conflicts(cluster: EmulatedCluster) -> None:
    obj = create(cluster, "mp")
    stale = obj["metadata"]["resourceVersion"]
    newer = {"spec": {"size": 3}}
    assert cluster.api("PATCH", f"{WIDGETS}/mp", newer, content_type=MERGE).status == 200
    conflict = cluster.api(
        "PATCH",
        f"{WIDGETS}/mp",
        {"metadata": {"resourceVersion": stale}, "spec": {"size": 4}},
        content_type=MERGE,
    )
    assert (conflict.status, conflict.body["reason"]) == (409, "Conflict")
    assert "the object has been modified" in conflict.body["message"]


def test_update_of_a_custom_resource_needs_a_resource_version(cluster: EmulatedCluster) -> None:
    obj = create(cluster, "put")
    del obj["metadata"]["resourceVersion"]
    response = cluster.api("PUT", f"{WIDGETS}/put", obj)
    assert response.status == 422
    assert response.body["details"]["causes"][0]["field"] == "metadata.resourceVersion"


def test_status_subresource_writes_only_status_and_is_validated(cluster: EmulatedCluster) -> None:
    obj = create(cluster, "st")
    obj["spec"]["size"] = 9
    obj["status"] = {"phase": "Running"}
    written = cluster.api("PUT", f"{WIDGETS}/st/status", obj)
    assert written.status == 200
    assert written.body["status"] == {"phase": "Running", "seen": False} and written.body["spec"]["size"] == 1
    invalid = cluster.api(
        "PATCH", f"{WIDGETS}/st/status", {"status": {"phase": "Broken", "message": 7}}, content_type=MERGE
    )
    assert invalid.status == 422
    fields = {c["field"] for c in invalid.body["details"]["causes"]}
    # "<nil>": as kube-apiserver says, the CRD's CEL rules were not run on a schema-invalid object
    assert fields == {"status.phase", "status.message", "<nil>"}


def test_a_status_default_shows_from_creation_though_the_request_status_is_dropped(cluster: EmulatedCluster) -> None:
    # Upstream (kubernetes/kubernetes#129451): ``status: {default: {}}`` and a nested default show on every read,
    # so a watch's ADDED event already has them, while the status the create sent is still ignored.
    since = cluster.api("GET", WIDGETS).body["metadata"]["resourceVersion"]
    body = widget("fresh")
    body["status"] = {"phase": "Done", "seen": True}
    made = cluster.api("POST", WIDGETS, body)
    assert made.status == 201 and made.body["status"] == {"seen": False}, made.body
    (added,) = watch(cluster, WIDGETS, {"resourceVersion": since}, count=1)
    assert added["type"] == "ADDED" and added["object"]["status"] == {"seen": False}
    patched = cluster.api("PATCH", f"{WIDGETS}/fresh", {"spec": {"size": 3}}, content_type=MERGE)
    assert patched.body["status"] == {"seen": False}, "a write of the main resource keeps the status"


def test_field_validation_strict_warn_ignore(cluster: EmulatedCluster) -> None:
    body = widget("fv", retries=3)
    strict = cluster.api("POST", WIDGETS, body, params={"fieldValidation": "Strict"})
    assert strict.status == 400 and 'unknown field "spec.retries"' in strict.body["message"]
    warned = cluster.api("POST", WIDGETS, body)  # the server's default is Warn
    assert warned.status == 201 and "retries" not in warned.body["spec"]
    assert 'unknown field \\"spec.retries\\"' in warned.headers["Warning"]
    body["metadata"]["name"] = "fv2"
    ignored = cluster.api("POST", WIDGETS, body, params={"fieldValidation": "Ignore"})
    assert ignored.status == 201 and "Warning" not in ignored.headers


def test_create_conflicts_generate_name_and_dry_run(cluster: EmulatedCluster) -> None:
    create(cluster, "dup")
    again = cluster.api("POST", WIDGETS, widget("dup"))
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists"), "operators treat this as success"
    body = widget("generated")
    body["metadata"] = {"generateName": "run-"}
    generated = cluster.api("POST", WIDGETS, body)
    assert generated.status == 201 and generated.body["metadata"]["name"].startswith("run-")
    assert len(generated.body["metadata"]["name"]) == len("run-") + 5
    dry = cluster.api("POST", WIDGETS, widget("dry"), params={"dryRun": "All"})
    assert dry.status == 201 and cluster.get("widgets", "dry") is None
    missing_ns = cluster.api("POST", "/apis/kubesim.dev/v1/namespaces/nowhere/widgets", widget("x"))
    assert (missing_ns.status, missing_ns.body["message"]) == (404, 'namespaces "nowhere" not found')


def test_strategic_merge_patch_is_rejected_for_custom_resources(cluster: EmulatedCluster) -> None:
    create(cluster, "smp")
    response = cluster.api(
        "PATCH", f"{WIDGETS}/smp", {"spec": {"stop": True}}, content_type="application/strategic-merge-patch+json"
    )
    assert response.status == 415


def test_pods_get_api_defaults_and_a_token_unless_automount_is_off(cluster: EmulatedCluster) -> None:
    plain = python_pod("plain", "pass")
    del plain["spec"]["restartPolicy"]
    del plain["spec"]["automountServiceAccountToken"]
    created = cluster.api("POST", PODS, plain).body
    assert created["spec"]["restartPolicy"] == "Always", "the API default is Always: the operator must say Never"
    assert created["spec"]["terminationGracePeriodSeconds"] == 30
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    mounts = created["spec"]["containers"][0]["volumeMounts"]
    assert mounts[0]["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    tokenless = cluster.api("POST", PODS, python_pod("tokenless", "pass")).body
    assert "volumes" not in tokenless["spec"] and "volumeMounts" not in tokenless["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("port", "message"),
    [(0, "containerPort: Required value"), (70000, "must be between 1 and 65535, inclusive")],
)
def test_a_container_port_must_be_1_to_65535(cluster: EmulatedCluster, port: int, message: str) -> None:
    """As kube-apiserver words it (an operator sent port 0 for "metrics off": seen on the real server)."""
    pod = python_pod(f"port-{port}", "pass")
    pod["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port}]
    refused = cluster.api("POST", PODS, pod)
    assert refused.status == 422 and message in refused.body["message"], refused


def test_pod_spec_is_immutable_except_a_few_fields(cluster: EmulatedCluster) -> None:
    assert cluster.api("POST", PODS, python_pod("immutable", "pass")).status == 201
    changed = cluster.api("PATCH", f"{PODS}/immutable", {"spec": {"restartPolicy": "Always"}}, content_type=MERGE)
    assert changed.status == 422 and "pod updates may not change fields" in changed.body["message"]
    allowed = cluster.api("PATCH", f"{PODS}/immutable", {"spec": {"activeDeadlineSeconds": 30}}, content_type=MERGE)
    assert allowed.status == 200


RESTRICTED_SECURITY = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "container": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
}


@pytest.mark.parametrize("mode", ["enforce", "warn"])
def test_pod_security_admission_restricted(cluster: EmulatedCluster, mode: str) -> None:
    namespace = {"metadata": {"name": "runs", "labels": {f"pod-security.kubernetes.io/{mode}": "restricted"}}}
    assert cluster.api("POST", "/api/v1/namespaces", namespace).status == 201
    path = "/api/v1/namespaces/runs/pods"
    loose = cluster.api("POST", path, python_pod("loose", "pass"))
    if mode == "enforce":
        assert loose.status == 403
        message = loose.body["message"]
        assert 'violates PodSecurity "restricted:latest"' in message
        for check in (
            "allowPrivilegeEscalation != false",
            "unrestricted capabilities",
            "runAsNonRoot != true",
            "seccompProfile",
        ):
            assert check in message
    else:
        assert loose.status == 201 and "would violate PodSecurity" in loose.headers["Warning"]
    strict = python_pod("strict", "pass", securityContext=RESTRICTED_SECURITY["securityContext"])
    strict["spec"]["containers"][0]["securityContext"] = RESTRICTED_SECURITY["container"]
    accepted = cluster.api("POST", path, strict)
    assert accepted.status == 201 and "Warning" not in accepted.headers


def test_orphan_and_foreground_deletion(cluster: EmulatedCluster) -> None:
    for name in ("orphaner", "foreground"):
        owner = create(cluster, name)
        assert cluster.api("POST", PODS, python_pod(f"{name}-1", "pass", owner=owner)).status == 201
    orphan = cluster.api("DELETE", f"{WIDGETS}/orphaner", {"propagationPolicy": "Orphan"})
    assert orphan.status == 200
    kept = cluster.get("pods", "orphaner-1")
    assert kept is not None and "ownerReferences" not in kept["metadata"]
    foreground = cluster.api("DELETE", f"{WIDGETS}/foreground", {"propagationPolicy": "Foreground"})
    assert "foregroundDeletion" in foreground.body["metadata"]["finalizers"]
    cluster.wait_for(lambda: cluster.get("widgets", "foreground") is None, message="foreground deletion done")
    assert cluster.get("pods", "foreground-1") is None


def test_kopf_peering_and_lease_resources_are_served(cluster: EmulatedCluster) -> None:
    peering = cluster.api(
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "default"}},
    )
    assert peering.status == 201
    patched = cluster.api(
        "PATCH",
        "/apis/kopf.dev/v1/clusterkopfpeerings/default",
        {"status": {"op-1": {"priority": 0, "lastseen": "2025-01-01T00:00:00Z"}}},
        content_type=MERGE,
    )
    assert patched.status == 200 and patched.body["status"]["op-1"]["priority"] == 0
    leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    lease = cluster.api(
        "POST",
        leases,
        {"metadata": {"name": "an-operator"}, "spec": {"holderIdentity": "op-1", "leaseDurationSeconds": 15}},
    ).body
    stale = dict(lease, spec={**lease["spec"], "holderIdentity": "op-2"})
    assert cluster.api("PUT", f"{leases}/an-operator", stale).status == 200
    taken = cluster.api("PUT", f"{leases}/an-operator", dict(lease, spec={**lease["spec"], "holderIdentity": "op-3"}))
    assert taken.status == 409, "two candidates updating one Lease version: only the first may win"


def test_events_are_listed_by_involved_object(cluster: EmulatedCluster) -> None:
    run = create(cluster, "ev")
    event = {
        "metadata": {"generateName": "ev."},
        "type": "Normal",
        "reason": "PodCreated",
        "message": "pod ev-1",
        "involvedObject": {
            "kind": "Widget",
            "apiVersion": "kubesim.dev/v1",
            "name": "ev",
            "namespace": "default",
            "uid": run["metadata"]["uid"],
        },
    }
    assert cluster.api("POST", "/api/v1/namespaces/default/events", event).status == 201
    selector = f"involvedObject.name=ev,involvedObject.uid={run['metadata']['uid']}"
    listed = cluster.api("GET", "/api/v1/namespaces/default/events", params={"fieldSelector": selector}).body
    assert [e["reason"] for e in listed["items"]] == ["PodCreated"]
    described = cluster.kubectl("describe", "wd", "ev").stdout
    assert "PodCreated" in described


def test_openapi_v3_documents_the_crd_for_kubectl(cluster: EmulatedCluster) -> None:
    index = cluster.api("GET", "/openapi/v3").body["paths"]
    document = cluster.api("GET", index["apis/kubesim.dev/v1"]["serverRelativeURL"].split("?")[0]).body
    schema = document["components"]["schemas"]["dev.kubesim.v1.Widget"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "kubesim.dev", "version": "v1", "kind": "Widget"}]
    assert schema["properties"]["spec"]["properties"]["owner"]["maxLength"] == 63
    patch = document["paths"]["/apis/kubesim.dev/v1/namespaces/{namespace}/widgets/{name}"]["patch"]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]


GADGETS_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.probe.dev"},
    "spec": {
        "group": "probe.dev",
        "scope": "Namespaced",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                        },
                    }
                },
            }
        ],
    },
}


def test_a_default_added_to_a_crd_later_shows_on_objects_stored_before(cluster: EmulatedCluster) -> None:
    """kube-apiserver defaults what it reads from etcd with the schema it serves now (test_real.py and
    test_api.py check the same on both servers): an upgraded CRD's new defaults reach old objects,
    with no new resourceVersion."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert cluster.api("POST", crds, GADGETS_CRD).status == 201
    gadgets = "/apis/probe.dev/v1/namespaces/default/gadgets"
    body = {"apiVersion": "probe.dev/v1", "kind": "Gadget", "metadata": {"name": "old"}, "spec": {}}
    created = cluster.wait_for(
        lambda: (r := cluster.api("POST", gadgets, body)).status == 201 and r, message="the CRD served"
    )
    assert "status" not in created.body
    crd = cluster.api("GET", f"{crds}/gadgets.probe.dev").body
    properties = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    properties["spec"]["properties"]["size"]["default"] = 3
    properties["status"]["default"] = {"phase": "Pending"}
    assert cluster.api("PUT", f"{crds}/gadgets.probe.dev", crd).status == 200

    def defaulted() -> dict[str, Any] | None:
        found: dict[str, Any] = cluster.api("GET", f"{gadgets}/old").body
        return found if found.get("spec") == {"size": 3} else None

    old = cluster.wait_for(defaulted, message="the new default on the old object")
    assert old["status"] == {"phase": "Pending"}
    assert old["metadata"]["resourceVersion"] == created.body["metadata"]["resourceVersion"]
    listed = cluster.api("GET", gadgets).body["items"]
    assert [(g["spec"], g["status"]) for g in listed] == [({"size": 3}, {"phase": "Pending"})]


def test_delete_answers_as_kube_apiserver_a_pod_with_its_deletion_stamp_other_kinds_a_status(
    cluster: EmulatedCluster,
) -> None:
    """test_real.py checks the same on the real server: a pod's deletion is graceful even at zero
    seconds (MODIFIED with deletionTimestamp and grace 0, then DELETED, and the DELETE answers with
    that pod); a ConfigMap removed at once is answered with a Status naming it."""
    pods = "/api/v1/namespaces/default/pods"
    created = cluster.api("POST", pods, python_pod("unbound", "print(1)", nodeSelector={"disk": "none"}))
    assert created.status == 201
    deleted = cluster.api("DELETE", f"{pods}/unbound")
    assert deleted.status == 200 and deleted.body["kind"] == "Pod"
    assert deleted.body["metadata"]["deletionTimestamp"] and deleted.body["metadata"]["deletionGracePeriodSeconds"] == 0
    versions = cluster.history("pods", "unbound")
    assert versions[-1] is None
    marked = versions[-2]
    assert marked is not None and marked["metadata"]["deletionGracePeriodSeconds"] == 0
    configmaps = "/api/v1/namespaces/default/configmaps"
    made = cluster.api("POST", configmaps, {"metadata": {"name": "gone"}})
    answer = cluster.api("DELETE", f"{configmaps}/gone")
    assert answer.status == 200
    assert answer.body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "gone", "kind": "configmaps", "uid": made.body["metadata"]["uid"]},
    }


def test_a_client_hanging_up_mid_response_is_not_an_emulator_fault() -> None:
    import aiohttp

    from kubesim.cluster import emulator_faults

    hung_up = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    bug = KeyError("metadata")
    assert emulator_faults([hung_up, bug, ConnectionResetError("reset by peer")]) == [bug]
