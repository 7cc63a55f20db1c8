"""The real operator under the Helm chart's own RBAC, on kubesim with its RBAC authorizer and on the real
kube-apiserver with its own.

The chart is installed by real Helm (``helm install`` through helm_python, default values): its
ServiceAccount, ClusterRole, ClusterRoleBinding and leader-election Role and RoleBinding are the
release's (``chart_rbac()`` checks the rendered set), so these tests follow ``agentrun.namespacedRules``
in ``_helpers.tpl`` directly; its Deployment stays an object (no controller runs its pods here), the
operator process runs beside it with the ServiceAccount's token. kubesim's RBAC
authorization is on (``kubesim.rbac``): the operator authenticates with a bearer token mapped to
``system:serviceaccount:agentrun-system:agentrun-operator`` and every request it makes is checked
against those rules; a missing verb is a 403 for it. kubectl and the kubelet stand-in send no
credentials over http and stay all-powerful (the emulator's default ``anonymous_user``).

Each test drives a run through what needs the rules: pod create and watch, status patches,
Events, the store Secret's get and watch, the Lease in the release namespace, a stop, and the
deletion of a finished run past ``spec.ttlSecondsAfterFinished`` (found missing once: the
ClusterRole had no ``delete`` on agentruns).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from kubesim import EmulatedCluster, KubeletThread
from kubesim.access import ApiAccess
from kubesim.rbac import service_account
from tests.cluster.kubeconfigs import discovery_cache, kubeconfig_doc, write_yaml
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    progress,
    run_events,
    start_operator,
    wait_node,
    wait_phase,
)
from tests.cluster.servers import RealCluster

# On kubesim with its RBAC authorizer and on the real kube-apiserver with its own (a ServiceAccount token there).
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.real_server,
    pytest.mark.kubesim_too,
]  # kubesim's RBAC authorizer too

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun"
RELEASE, NAMESPACE, ACCOUNT = "agentrun", "agentrun-system", "agentrun-operator"  # the chart's defaults
OPERATOR_TOKEN = "agentrun-operator-token"
RBAC_TEMPLATES = ("templates/serviceaccount.yaml", "templates/rbac.yaml")


def chart_rbac() -> list[dict[str, Any]]:
    """The operator's ServiceAccount and RBAC objects, as ``helm install`` with default values creates them."""
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values={}, name=RELEASE, namespace=NAMESPACE)
    documents = [
        doc
        for path, text in sorted(rendered.items())
        if path.endswith(RBAC_TEMPLATES)
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    kinds = sorted(doc["kind"] for doc in documents)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"], kinds
    return documents


def operator_call(cluster: EmulatedCluster | RealCluster, path: str, token: str) -> int:
    """The HTTP status of a GET with the operator's token."""
    if isinstance(cluster, RealCluster):
        access = ApiAccess(cluster.url, ca_file=cluster.plane.ca.pair.cert, token=token)
        return cluster.api("GET", path, access=access).status
    request = urllib.request.Request(cluster.url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        with e:
            return e.code


def operator_token(cluster: EmulatedCluster | RealCluster) -> str:
    """The chart's ServiceAccount's token: a real TokenRequest on the real server, a static token on kubesim."""
    if isinstance(cluster, RealCluster):
        made = cluster.kubectl("create", "token", ACCOUNT, "-n", NAMESPACE, "--duration=1h")
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()

    def enforce() -> None:
        assert cluster.emulator is not None
        cluster.emulator.token_users = {OPERATOR_TOKEN: service_account(NAMESPACE, ACCOUNT)}
        cluster.emulator.authorization = True

    cluster.call(enforce)
    return OPERATOR_TOKEN


@pytest.fixture
def operator(
    cluster: EmulatedCluster | RealCluster, kubelet: KubeletThread, dsn: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator as the chart's ServiceAccount, with RBAC enforced and its Lease in the release namespace."""
    chart_rbac()  # the objects the release must hold
    shutil.rmtree(discovery_cache(cluster.url), ignore_errors=True)  # another server's on this port, if any
    with helm_python.Config(kubeconfig_path=cluster.kubeconfig, namespace=NAMESPACE) as helm:
        release = helm.install(CHART, RELEASE, {}, namespace=NAMESPACE, create_namespace=True, timeout=60)
    assert release["status"] == "deployed", release
    installed = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(release["manifest"]) if d}
    missing = {(d["kind"], d["metadata"]["name"]) for d in chart_rbac()} - installed
    assert not missing, f"helm install did not create {missing}"
    secret = cluster.kubectl("create", "secret", "generic", "agentrun-store", f"--from-literal=postgresDsn={dsn}")
    assert secret.returncode == 0, secret.stderr
    token = operator_token(cluster)
    # Enforced, and narrow: the operator's token may read its AgentRuns but not ConfigMaps.
    assert operator_call(cluster, "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns", token) == 200
    assert operator_call(cluster, "/api/v1/namespaces/default/configmaps", token) == 403
    if isinstance(cluster, RealCluster):
        access = ApiAccess(cluster.url, ca_file=cluster.plane.ca.pair.cert, token=token)
        kubeconfig = cluster.plane.write_kubeconfig(tmp_path / "operator-kubeconfig", access)
    else:
        kubeconfig = write_yaml(tmp_path / "operator-kubeconfig", kubeconfig_doc(cluster.url, {"token": token}))
    process = start_operator(cluster, tmp_path, KUBECONFIG=str(kubeconfig), AGENTRUN_OPERATOR_LEASE_NAMESPACE=NAMESPACE)
    try:
        yield process
    finally:
        process.stop()
    log = process.log()
    # "forbidden" in any case: the operator's ApiError ("403 Forbidden: ... is forbidden") and kopf's
    # APIForbiddenError. Not "403" alone: log timestamps have milliseconds (",403").
    assert "forbidden" not in log.lower(), f"the operator was refused under the chart's RBAC:\n{log[-4000:]}"


def test_a_run_succeeds_under_the_charts_rbac(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    apply(cluster, agentrun("rbac-ok", thread="rbac-ok", effects=tmp_path / "effects.db"))
    final = wait_phase(cluster, operator, "rbac-ok", "Succeeded")
    assert final["podName"] == "rbac-ok-1" and final["attempt"] == 1, json.dumps(final)
    stored = progress(dsn, "default/rbac-ok")
    assert stored is not None and stored.status == "completed"
    reasons = {e["reason"] for e in run_events(cluster, "rbac-ok")}
    assert {"PodCreated", "Completed"} <= reasons, reasons
    lease = cluster.get("leases", "agentrun-operator", NAMESPACE)
    assert lease is not None and lease["spec"]["holderIdentity"] == operator.identity


def test_a_stop_ends_a_run_hung_in_a_tool_under_the_charts_rbac(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    apply(
        cluster,
        agentrun("rbac-hung", thread="rbac-hung", effects=tmp_path / "e.db", env={"SUPPORT_TOOL_DELAY": "3600"}),
    )
    wait_node(dsn, "default/rbac-hung", "tools")
    time.sleep(0.5)  # inside the tool now
    patched = cluster.kubectl("patch", "ar", "rbac-hung", "--type", "merge", "-p", '{"spec":{"stop":true}}')
    assert patched.returncode == 0, patched.stderr
    final = wait_phase(cluster, operator, "rbac-hung", "Stopped", timeout=30)
    assert final["reason"] == "Stopped", json.dumps(final)
    assert progress(dsn, "default/rbac-hung").status == "stopped"  # type: ignore[union-attr]


def test_the_operator_deletes_a_run_past_its_ttl_under_the_charts_rbac(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    apply(cluster, agentrun("rbac-ttl", thread="rbac-ttl", effects=tmp_path / "e.db", ttlSecondsAfterFinished=1))
    wait_phase(cluster, operator, "rbac-ttl", "Succeeded")
    try:
        cluster.wait_for(lambda: cluster.get("agentruns", "rbac-ttl") is None, timeout=20, message="rbac-ttl deleted")
    except AssertionError:
        raise AssertionError(f"the run outlived its ttl; operator log (tail):\n{operator.log()[-4000:]}") from None
    stored = progress(dsn, "default/rbac-ttl")
    assert stored is not None and stored.status == "completed"


def test_a_secret_without_the_runner_access_label_is_refused_under_the_charts_rbac(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    """The operator reads a Secret's labels with the chart's rights alone, and refuses the run before any pod."""
    made = cluster.kubectl("create", "secret", "generic", "api-key", "--from-literal=token=tok-123")
    assert made.returncode == 0, made.stderr
    manifest = agentrun("rbac-secret", thread="rbac-secret", effects=tmp_path / "e.db")
    manifest["spec"]["podTemplate"]["env"].append(
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api-key", "key": "token"}}}
    )
    apply(cluster, manifest)
    refused = wait_phase(cluster, operator, "rbac-secret", "Failed", timeout=30)
    assert refused["reason"] == "InvalidSpec" and "default/api-key" in refused["message"], refused
    assert cluster.get("pods", "rbac-secret-1") is None, "GUARANTEE BROKEN: a pod for a run refused its Secret"
