"""``helm install``, ``helm upgrade`` and ``helm uninstall`` of helm/agentrun, on kubesim and on the real control plane.

Real Helm 4 (the Go SDK through ``helm_python``) talks to the emulator the way it talks to a real
API server: discovery, ``/openapi/v3`` for field validation, server-side apply of every object
(CRDs from ``crds/`` first), release records as protobuf Secrets, deletes on uninstall. The
cluster starts WITHOUT the AgentRun CRD here, so it must learn it from what Helm applies: a fresh
emulator per test, or on ``[real]`` a real control plane of the module's own (etcd, kube-apiserver,
kube-controller-manager) that each test leaves as it found it, where the same assertions hold against the
real server.

The second half tests server-side apply itself with the real ``kubectl apply --server-side``:
field ownership, conflicts between managers and ``--force-conflicts``, with the messages worded
as kube-apiserver words them (the ``[real]`` runs are the reference kubesim is held to).

The installed Deployment is an object only: no controller creates its pods (the kubelet stand-in
runs pods it is given, and these tests need none; the real plane runs no deployment controller).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from kubesim import EmulatedCluster
from kubesim.real import RealControlPlane
from tests.cluster.kubeconfigs import discovery_cache
from tests.cluster.servers import RealCluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun"
EXAMPLE = ROOT / "examples" / "agentrun.yaml"
RELEASE, NAMESPACE = "agentrun", "agentrun-system"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"

# On both: kubesim's server-side apply and Helm support are held to the real server's behaviour and words.
pytestmark = [pytest.mark.timeout(180), pytest.mark.real_server, pytest.mark.kubesim_too]

Cluster = EmulatedCluster | RealCluster


@pytest.fixture(scope="module")
def bare_real_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A real control plane of this module's own, started knowing no CRD; each test leaves it that way (``reset``).
    One plane for the module, not one per test: a start costs about 20 s of both cores under CI's load."""
    with RealControlPlane(tmp_path_factory.mktemp("plane"), bins=request.getfixturevalue("real_binaries")) as plane:
        yield RealCluster(plane, ())  # its baseline: the cluster-scoped objects of a fresh plane


@pytest.fixture
def bare_cluster(request: pytest.FixtureRequest, api_server: str, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster that knows no CRD (Helm has to install it): an emulator, or the module's real control plane."""
    if api_server == "real":
        real: RealCluster = request.getfixturevalue("bare_real_plane")
        assert not real.list_objects("customresourcedefinitions"), "the last test left a CRD behind"
        for resource in ("serviceaccounts", "configmaps"):  # history(), as kubesim keeps it
            real.watch(resource)
        cache = discovery_cache(real.url)
        shutil.rmtree(cache, ignore_errors=True)  # the last test's discovery, with its CRD
        try:
            yield real
        finally:
            real.reset()  # namespaces, CRDs, cluster roles: back to the fresh plane's
            real.wait_for(
                lambda: not real.list_objects("customresourcedefinitions"), timeout=60, message="the CRDs are gone"
            )
            shutil.rmtree(cache, ignore_errors=True)
        return
    emulated = EmulatedCluster(tmp_path / "cluster", crd_files=()).start()
    cache = discovery_cache(emulated.url)
    shutil.rmtree(cache, ignore_errors=True)  # another emulator's, from an earlier run on this port
    try:
        yield emulated
    finally:
        emulated.stop()
        shutil.rmtree(cache, ignore_errors=True)
    assert not emulated.internal_errors, f"the emulator failed while serving: {emulated.internal_errors!r}"


@pytest.fixture
def helm(bare_cluster: Cluster) -> Iterator[helm_python.Config]:
    with helm_python.Config(kubeconfig_path=bare_cluster.kubeconfig, namespace=NAMESPACE) as config:
        yield config


def install(helm: helm_python.Config, values: dict[str, Any] | None = None) -> dict[str, Any]:
    return helm.install(CHART, RELEASE, values, namespace=NAMESPACE, create_namespace=True, timeout=60)


def manifest_objects(release: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of a release, as Helm rendered them (its ``manifest``)."""
    return [doc for doc in yaml.safe_load_all(release["manifest"]) if doc]


def stored(cluster: Cluster, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The live object a manifest names (its resource found by discovery, as a client finds it), or None."""
    group_version = obj["apiVersion"]
    prefix = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
    resources = cluster.api("GET", prefix).body["resources"]
    resource = next(r for r in resources if r["kind"] == obj["kind"] and "/" not in r["name"])
    namespace = obj["metadata"].get("namespace", NAMESPACE)
    scope = f"/namespaces/{namespace}" if resource["namespaced"] else ""
    found = cluster.api("GET", f"{prefix}{scope}/{resource['name']}/{obj['metadata']['name']}")
    live: dict[str, Any] | None = found.body if found.status == 200 else None
    return live


def describe(obj: dict[str, Any]) -> str:
    return f"{obj['kind']} {obj['metadata']['name']}"


# --- helm install / upgrade / uninstall ------------------------------------------------------------


def test_helm_install_creates_every_rendered_object_with_the_chart_labels(
    bare_cluster: Cluster, helm: helm_python.Config
) -> None:
    release = install(helm)
    objects = manifest_objects(release)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} <= kinds, kinds
    for obj in objects:
        live = stored(bare_cluster, obj)
        assert live is not None, f"helm install did not create {describe(obj)}"
        labels = live["metadata"].get("labels") or {}
        assert obj["metadata"].get("labels", {}).items() <= labels.items(), f"{describe(obj)} lost its labels"
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", f"{describe(obj)} is not labelled as Helm's"
        assert labels.get("app.kubernetes.io/instance") == RELEASE
        annotations = live["metadata"].get("annotations") or {}
        assert annotations.get("meta.helm.sh/release-name") == RELEASE, f"{describe(obj)} has no release owner"
        (entry,) = live["metadata"]["managedFields"]
        assert entry["operation"] == "Apply", f"{describe(obj)} was not server-side applied: {entry}"

    deployment = bare_cluster.get("deployments", "agentrun-operator", NAMESPACE)
    assert deployment is not None and deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["generation"] == 1
    shown = bare_cluster.kubectl("get", "deploy,svc,sa,pdb,role,rolebinding", "-n", NAMESPACE)
    assert shown.returncode == 0, shown.stderr
    assert "deployment.apps/agentrun-operator" in shown.stdout and "0/2" in shown.stdout, shown.stdout
    assert bare_cluster.kubectl("get", "clusterrole,clusterrolebinding", "agentrun-operator").returncode == 0
    secrets = bare_cluster.list_objects("secrets", NAMESPACE)
    records = [s for s in secrets if s["metadata"].get("labels", {}).get("owner") == "helm"]
    assert [s["metadata"]["name"] for s in records] == ["sh.helm.release.v1.agentrun.v1"]
    assert records[0]["metadata"]["labels"]["status"] == "deployed"
    assert [r["name"] for r in helm.list()] == [RELEASE]


def test_helm_install_with_namespaced_rbac_network_policies_and_the_dev_store(
    bare_cluster: Cluster, helm: helm_python.Config
) -> None:
    values = {"watchNamespaces": ["default"], "networkPolicy": {"enabled": True}, "devStore": {"enabled": True}}
    objects = manifest_objects(install(helm, values))
    kinds = {o["kind"] for o in objects}
    assert {"Role", "RoleBinding", "NetworkPolicy", "Secret"} <= kinds and "ClusterRoleBinding" not in kinds, kinds
    # Cluster-wide only the user roles aggregated into view/edit/admin, which grant nothing by themselves.
    cluster_roles = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole")
    assert cluster_roles == ["agentrun-edit", "agentrun-view"], cluster_roles
    missing = [describe(o) for o in objects if stored(bare_cluster, o) is None]
    assert missing == [], f"helm install did not create: {missing}"


def test_helm_install_of_a_kind_the_cluster_does_not_serve_fails_as_on_a_real_cluster(
    bare_cluster: Cluster, helm: helm_python.Config
) -> None:
    """The ServiceMonitor needs Prometheus Operator's CRDs: Helm refuses before creating anything."""
    with pytest.raises(helm_python.HelmError) as failure:
        install(helm, {"metrics": {"serviceMonitor": {"enabled": True}}})
    assert 'no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1"' in str(failure.value)
    assert "ensure CRDs are installed first" in str(failure.value)
    assert bare_cluster.get("deployments", "agentrun-operator", NAMESPACE) is None


def test_the_crd_from_the_chart_is_learned_and_kubectl_serves_agentruns(
    bare_cluster: Cluster, helm: helm_python.Config
) -> None:
    assert bare_cluster.kubectl("get", "ar", "-A").returncode != 0, "the emulator knew AgentRuns before Helm"
    install(helm)

    crd = bare_cluster.get("customresourcedefinitions", "agentruns.agentrun.dev", None)
    assert crd is not None and crd["metadata"]["managedFields"][0]["operation"] == "Apply"
    discovery = bare_cluster.api("GET", "/apis/agentrun.dev/v1alpha1")
    assert discovery.status == 200 and "agentruns" in [r["name"] for r in discovery.body["resources"]]
    empty = bare_cluster.kubectl("get", "ar", "-A")
    assert empty.returncode == 0, empty.stderr
    assert "No resources found" in empty.stderr
    explain = bare_cluster.kubectl("explain", "agentrun.spec")
    assert explain.returncode == 0, explain.stderr
    assert "FIELDS:" in explain.stdout and "graph" in explain.stdout, explain.stdout

    applied = bare_cluster.kubectl("apply", "--server-side", "-f", str(EXAMPLE))
    assert applied.returncode == 0, applied.stderr
    listed = bare_cluster.kubectl("get", "ar", "-A")
    assert listed.returncode == 0 and "NAME" in listed.stdout, listed.stderr
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    assert name in listed.stdout


def test_helm_upgrade_with_a_changed_value_updates_the_deployment(
    bare_cluster: Cluster, helm: helm_python.Config
) -> None:
    install(helm, {"operator": {"podAnnotations": {"example.com/scrape": "yes"}}})
    before = bare_cluster.get("deployments", "agentrun-operator", NAMESPACE)
    assert before is not None
    assert before["spec"]["template"]["metadata"]["annotations"] == {"example.com/scrape": "yes"}

    service = bare_cluster.get("services", "agentrun-operator-metrics", NAMESPACE)
    assert service is not None
    cluster_ip = service["spec"]["clusterIP"]
    assert cluster_ip.startswith("10.") and service["spec"]["ports"][0]["targetPort"] == "metrics"
    helm_owns = next(e for e in service["metadata"]["managedFields"] if e["operation"] == "Apply")["fieldsV1"]
    assert "f:clusterIP" not in helm_owns["f:spec"], "a value the server allocated is not the applier's"

    values = {"operator": {"replicas": 3, "podDisruptionBudget": {"enabled": False}}}
    release = helm.upgrade(CHART, RELEASE, values, namespace=NAMESPACE, timeout=60)
    assert release["revision"] == 2 and release["status"] == "deployed"
    after = bare_cluster.get("deployments", "agentrun-operator", NAMESPACE)
    assert after is not None
    assert after["spec"]["replicas"] == 3, "helm upgrade did not change the replicas"
    assert "annotations" not in after["spec"]["template"]["metadata"], (
        "a field Helm no longer applies must be removed by server-side apply"
    )
    assert bare_cluster.get("poddisruptionbudgets", "agentrun-operator", NAMESPACE) is None, (
        "helm upgrade did not delete the object the new values no longer render"
    )
    assert after["metadata"]["uid"] == before["metadata"]["uid"], "the Deployment was replaced, not updated"
    assert after["metadata"]["generation"] == 2
    (entry,) = after["metadata"]["managedFields"]
    assert entry["operation"] == "Apply" and "f:replicas" in entry["fieldsV1"]["f:spec"]
    service = bare_cluster.get("services", "agentrun-operator-metrics", NAMESPACE)
    assert service is not None and service["spec"]["clusterIP"] == cluster_ip, "the allocated cluster IP changed"
    # An object the upgrade did not change is not written again.
    account = bare_cluster.get("serviceaccounts", "agentrun-operator", NAMESPACE)
    assert account is not None and len(bare_cluster.history("serviceaccounts", "agentrun-operator", NAMESPACE)) == 1
    statuses = {
        s["metadata"]["name"]: s["metadata"]["labels"]["status"]
        for s in bare_cluster.list_objects("secrets", NAMESPACE)
        if s["metadata"].get("labels", {}).get("owner") == "helm"
    }
    assert statuses == {"sh.helm.release.v1.agentrun.v1": "superseded", "sh.helm.release.v1.agentrun.v2": "deployed"}


def test_helm_upgrade_conflicts_with_a_field_another_manager_changed(
    bare_cluster: Cluster, helm: helm_python.Config
) -> None:
    """Helm 4 applies without forcing: a field someone else took is a 409 the upgrade reports."""
    install(helm)
    scaled = bare_cluster.kubectl(
        "patch", "deployment", "agentrun-operator", "-n", NAMESPACE, "--type", "merge", "-p", '{"spec":{"replicas":5}}'
    )
    assert scaled.returncode == 0, scaled.stderr

    with pytest.raises(helm_python.HelmError) as failure:
        helm.upgrade(CHART, RELEASE, {"operator": {"replicas": 3}}, namespace=NAMESPACE, timeout=60)
    assert 'Apply failed with 1 conflict: conflict with "kubectl-patch" using apps/v1' in str(failure.value)
    assert ".spec.replicas" in str(failure.value)
    deployment = bare_cluster.get("deployments", "agentrun-operator", NAMESPACE)
    assert deployment is not None and deployment["spec"]["replicas"] == 5


def test_helm_uninstall_removes_the_release_objects_but_keeps_the_crd(
    bare_cluster: Cluster, helm: helm_python.Config
) -> None:
    objects = manifest_objects(install(helm))
    result = helm.uninstall(RELEASE, timeout=60)
    assert result["release"]["status"] == "uninstalled"

    left = [describe(o) for o in objects if stored(bare_cluster, o) is not None]
    assert left == [], f"helm uninstall left objects of the release behind: {left}"
    records = [
        s for s in bare_cluster.list_objects("secrets", NAMESPACE) if s["metadata"].get("labels", {}).get("owner")
    ]
    assert records == [], "helm uninstall left its release records"
    assert bare_cluster.get("customresourcedefinitions", "agentruns.agentrun.dev", None) is not None, (
        "Helm keeps CRDs from crds/ on uninstall; the emulator lost it"
    )
    assert bare_cluster.kubectl("get", "ar", "-A").returncode == 0
    assert helm.list() == []


# --- server-side apply with the real kubectl -------------------------------------------------------


@pytest.fixture
def ssa_cluster(cluster: Cluster) -> Cluster:
    """The tier's cluster (on [real] the session's control plane), its ConfigMaps' versions recorded."""
    if isinstance(cluster, RealCluster):
        cluster.watch("configmaps")
    return cluster


def config_map(**data: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data})


def apply(cluster: Cluster, manifest: str, *args: str) -> Any:
    return cluster.kubectl("apply", "--server-side", "-f", "-", *args, input=manifest)


def owners(cluster: Cluster) -> dict[str, dict[str, Any]]:
    obj = cluster.get("configmaps", "ssa")
    assert obj is not None
    return {f"{e['manager']}/{e['operation']}": e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


def test_server_side_apply_creates_and_records_the_applier_as_owner(ssa_cluster: Cluster) -> None:
    result = apply(ssa_cluster, config_map(a="1", b="2"))
    assert result.returncode == 0, result.stderr
    assert "serverside-applied" in result.stdout
    assert owners(ssa_cluster) == {"kubectl/Apply": {"f:data": {"f:a": {}, "f:b": {}}}}
    again = apply(ssa_cluster, config_map(a="1", b="2"))
    assert again.returncode == 0
    assert len(ssa_cluster.history("configmaps", "ssa")) == 1, "applying the same configuration wrote the object"


def test_server_side_apply_conflict_between_two_managers_and_force(ssa_cluster: Cluster) -> None:
    assert apply(ssa_cluster, config_map(a="1", b="2")).returncode == 0

    conflict = apply(ssa_cluster, config_map(a="changed"), "--field-manager=other")
    assert conflict.returncode != 0, "a conflicting apply by another manager succeeded"
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .data.a' in conflict.stderr, conflict.stderr
    obj = ssa_cluster.get("configmaps", "ssa")
    assert obj is not None and obj["data"] == {"a": "1", "b": "2"}

    raw = ssa_cluster.api(
        "PATCH",
        f"{CONFIGMAPS}/ssa",
        yaml.safe_dump(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "x", "b": "z"}}
        ),
        content_type="application/apply-patch+yaml",
        params={"fieldManager": "other"},
    )
    assert raw.status == 409 and raw.body["reason"] == "Conflict"
    assert raw.body["message"] == 'Apply failed with 2 conflicts: conflicts with "kubectl":\n- .data.a\n- .data.b'
    assert raw.body["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "kubectl"', "field": ".data.a"},
        {"reason": "FieldManagerConflict", "message": 'conflict with "kubectl"', "field": ".data.b"},
    ]

    forced = apply(ssa_cluster, config_map(a="changed"), "--field-manager=other", "--force-conflicts")
    assert forced.returncode == 0, forced.stderr
    obj = ssa_cluster.get("configmaps", "ssa")
    assert obj is not None and obj["data"] == {"a": "changed", "b": "2"}
    assert owners(ssa_cluster) == {
        "kubectl/Apply": {"f:data": {"f:b": {}}},
        "other/Apply": {"f:data": {"f:a": {}}},
    }, "force did not move the field to its new manager"


def test_server_side_apply_shares_equal_values_and_removes_fields_no_longer_applied(
    ssa_cluster: Cluster,
) -> None:
    assert apply(ssa_cluster, config_map(a="1", b="2", c="3")).returncode == 0
    shared = apply(ssa_cluster, config_map(a="1"), "--field-manager=other")
    assert shared.returncode == 0, f"the same value by another manager is not a conflict: {shared.stderr}"

    assert apply(ssa_cluster, config_map(c="3")).returncode == 0
    obj = ssa_cluster.get("configmaps", "ssa")
    assert obj is not None
    assert obj["data"] == {"a": "1", "c": "3"}, "b (kubectl's alone) must go; a (shared with other) must stay"
    assert owners(ssa_cluster) == {"kubectl/Apply": {"f:data": {"f:c": {}}}, "other/Apply": {"f:data": {"f:a": {}}}}


def test_an_update_takes_ownership_and_a_later_apply_conflicts_with_it(ssa_cluster: Cluster) -> None:
    assert apply(ssa_cluster, config_map(a="1")).returncode == 0
    patched = ssa_cluster.kubectl("patch", "configmap", "ssa", "--type", "merge", "-p", '{"data":{"a":"2"}}')
    assert patched.returncode == 0, patched.stderr
    assert owners(ssa_cluster)["kubectl-patch/Update"] == {"f:data": {"f:a": {}}}
    assert "kubectl/Apply" not in owners(ssa_cluster), "the patch did not take the field from the applier"

    conflict = apply(ssa_cluster, config_map(a="3"))
    assert conflict.returncode != 0
    assert 'conflict with "kubectl-patch" using v1: .data.a' in conflict.stderr, conflict.stderr


def test_apply_requires_a_field_manager_and_force_only_applies(ssa_cluster: Cluster) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}})
    missing = ssa_cluster.api("PATCH", f"{CONFIGMAPS}/ssa", body, content_type="application/apply-patch+yaml")
    assert missing.status == 422
    assert missing.body["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
    )
    created = ssa_cluster.api(
        "PATCH", f"{CONFIGMAPS}/ssa", body, content_type="application/apply-patch+yaml", params={"fieldManager": "t"}
    )
    assert created.status == 201, created.body
    forced = ssa_cluster.api(
        "PATCH",
        f"{CONFIGMAPS}/ssa",
        {"data": {"a": "1"}},
        content_type="application/merge-patch+json",
        params={"force": "true"},
    )
    assert forced.status == 422
    assert "force: Forbidden: may not be specified for non-apply patch" in forced.body["message"]


def deployment(*env: str, image: str = "busybox:1") -> str:
    container = {"name": "app", "image": image, "env": [{"name": e, "value": "1"} for e in env]}
    return yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "ssa", "labels": {"app": "ssa"}},
            "spec": {
                "selector": {"matchLabels": {"app": "ssa"}},
                "template": {"metadata": {"labels": {"app": "ssa"}}, "spec": {"containers": [container]}},
            },
        }
    )


def test_server_side_apply_merges_associative_lists_item_by_item(ssa_cluster: Cluster) -> None:
    """containers and env are keyed by name: an item someone else added survives an apply without it."""
    assert apply(ssa_cluster, deployment("A", "B")).returncode == 0
    added = ssa_cluster.kubectl("set", "env", "deployment/ssa", "EXTRA=1")
    assert added.returncode == 0, added.stderr
    result = apply(ssa_cluster, deployment("A", image="busybox:2"))
    assert result.returncode == 0, result.stderr

    obj = ssa_cluster.get("deployments", "ssa")
    assert obj is not None
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "busybox:2"
    assert [e["name"] for e in container["env"]] == ["A", "EXTRA"], "B (applied before, not now) must go"
    applied = next(e for e in obj["metadata"]["managedFields"] if e["manager"] == "kubectl")
    fields = applied["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"app"}']
    assert set(fields) == {".", "f:env", "f:image", "f:name"}
    assert set(fields["f:env"]) == {'k:{"name":"A"}'}
    listed = ssa_cluster.kubectl("get", "deployments")
    assert listed.returncode == 0 and "ssa" in listed.stdout and "READY" in listed.stdout, listed.stderr


def test_kubectl_moves_client_side_apply_ownership_to_server_side_apply(ssa_cluster: Cluster) -> None:
    """``kubectl apply`` then ``kubectl apply --server-side``: kubectl rewrites managedFields, no conflict."""
    created = ssa_cluster.kubectl("apply", "-f", "-", input=config_map(a="1"))
    assert created.returncode == 0, created.stderr
    assert set(owners(ssa_cluster)) == {"kubectl-client-side-apply/Update"}

    result = apply(ssa_cluster, config_map(a="2"))
    assert result.returncode == 0, f"the upgrade to server-side apply conflicted: {result.stderr}"
    obj = ssa_cluster.get("configmaps", "ssa")
    assert obj is not None and obj["data"] == {"a": "2"}
    assert owners(ssa_cluster)["kubectl/Apply"] == {"f:data": {"f:a": {}}}
    assert "kubectl-client-side-apply/Update" not in owners(ssa_cluster)
    last_applied = json.loads(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last_applied["data"] == {"a": "2"}, "the client-side annotation did not follow the server-side apply"
