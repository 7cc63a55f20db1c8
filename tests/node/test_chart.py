"""The chart installed for real on the node (issue 35 item 3), and its operator pods replaced mid-run (item 4 g).

``helm install`` (real Helm 4) of helm/agentrun with the images built here: kube-scheduler puts the
operator's two replicas and the history server on the node, containerd and runc run them under the
restricted Pod Security profile, the operator acts with its ServiceAccount's token and the chart's
RBAC, and the history server holds no token at all. What each pod is and may do is read from inside
it (``kubectl exec`` through the real kubelet) and asked of the API server's authorizer, not read
from the manifests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from examples.support_agent import count_effects
from tests.node.support import (
    OPERATOR_SELECTOR,
    RELEASE_NAMESPACE,
    ROOT,
    InstalledChart,
    KeptFiles,
    dump,
    release_objects,
)

pytestmark = pytest.mark.timeout(600)

SA = "/var/run/secrets/kubernetes.io/serviceaccount"
# Run inside a chart pod: who its token says it is (a SelfSubjectReview through the `kubernetes` Service).
WHO_AM_I = f"""
import json, os, ssl, urllib.request
token = "{SA}/token"
if not os.path.exists(token):
    print(json.dumps({{"token": False, "uid": os.getuid()}}))
    raise SystemExit(0)
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
review = json.dumps({{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}}).encode()
request = urllib.request.Request(
    f"https://{{host}}:{{port}}/apis/authentication.k8s.io/v1/selfsubjectreviews", data=review, method="POST",
    headers={{"Authorization": "Bearer " + open(token).read(), "Content-Type": "application/json"}})
with urllib.request.urlopen(request, context=ssl.create_default_context(cafile="{SA}/ca.crt"), timeout=10) as r:
    user = json.load(r)["status"]["userInfo"]["username"]
print(json.dumps({{"token": True, "uid": os.getuid(), "user": user}}))
"""


def _exec_json(chart: InstalledChart, pod: str, script: str) -> dict[str, Any]:
    done = chart.kubectl("exec", "-n", RELEASE_NAMESPACE, pod, "--", "python", "-c", script)
    assert done.returncode == 0, f"kubectl exec {pod}: {done.stderr}"
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def _can(chart: InstalledChart, user: str, verb: str, resource: str, namespace: str) -> bool:
    resource, _, subresource = resource.partition("/")
    extra = [f"--subresource={subresource}"] if subresource else []
    done = chart.kubectl("auth", "can-i", verb, resource, *extra, "-n", namespace, f"--as={user}")
    assert done.stdout.strip() in ("yes", "no"), done.stderr
    return done.stdout.strip() == "yes"


def test_helm_install_puts_the_operator_and_the_history_server_on_the_node_as_restricted_deployments(
    agentrun_chart: InstalledChart, run_namespace: str
) -> None:
    chart = agentrun_chart
    kinds = sorted({o["kind"] for o in release_objects(chart)})
    deployments = {d["metadata"]["name"]: d for d in chart.plane.list_objects("deployments", RELEASE_NAMESPACE)}
    operators, histories = chart.operator_pods(), chart.history_pods()
    leader = chart.leader()

    assert chart.release["status"] == "deployed" and {"Deployment", "ServiceAccount", "ClusterRole"} <= set(kinds)
    assert {name: d["status"].get("readyReplicas") for name, d in deployments.items()} == {
        "agentrun-operator": 2,
        "agentrun-history": 1,
    }, dump({n: d["status"] for n, d in deployments.items()})
    for pod in (*operators, *histories):
        (container,) = pod["spec"]["containers"]
        assert pod["spec"]["nodeName"] == chart.node.name, dump(pod["spec"])  # bound by kube-scheduler
        assert container["image"] == "localhost/agentrun:dev" and container["imagePullPolicy"] == "Never"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["containerID"].startswith("containerd://"), dump(status)
    assert len(operators) == 2 and len(histories) == 1
    assert leader in {p["metadata"]["name"] for p in operators}

    # Read from inside each pod, through the real kubelet: the operator's own token is its
    # ServiceAccount's; the history server has none.
    operator_sa = operators[0]["spec"]["serviceAccountName"]
    for pod in operators:
        inside = _exec_json(chart, pod["metadata"]["name"], WHO_AM_I)
        assert inside == {
            "token": True,
            "uid": 65532,
            "user": f"system:serviceaccount:{RELEASE_NAMESPACE}:{operator_sa}",
        }, inside
    assert _exec_json(chart, histories[0]["metadata"]["name"], WHO_AM_I) == {"token": False, "uid": 65532}

    # The chart's RBAC, as the API server's authorizer answers for each ServiceAccount.
    operator_user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{operator_sa}"
    history_user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{histories[0]['spec']['serviceAccountName']}"
    assert _can(chart, operator_user, "create", "pods", run_namespace)
    assert _can(chart, operator_user, "patch", "agentruns/status", run_namespace)
    assert not _can(chart, operator_user, "create", "secrets", run_namespace)
    assert not _can(chart, operator_user, "patch", "agentruns", run_namespace)  # only its status
    assert not _can(chart, history_user, "list", "agentruns", run_namespace)
    assert not _can(chart, history_user, "get", "pods", run_namespace)


def test_the_operator_pods_deleted_mid_run_are_replaced_and_a_new_one_takes_over_without_a_second_runner_pod(
    agentrun_chart: InstalledChart, run_namespace: str
) -> None:
    """Item 4 g: every operator pod (the leader and the standby) deleted while a runner is inside a tool."""
    chart, ns = agentrun_chart, run_namespace
    before = {p["metadata"]["name"] for p in chart.wait_operator_ready()}
    manifest = yaml.safe_load((ROOT / "examples" / "agentrun.yaml").read_text())
    manifest["spec"]["podTemplate"]["env"].append({"name": "SUPPORT_TOOL_DELAY_SEND_RECEIPT", "value": "20"})
    run, thread = manifest["metadata"]["name"], f"{ns}/{manifest['spec']['threadId']}"
    with KeptFiles(chart, "support_effects.db").keep() as kept:
        applied = chart.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        assert applied.returncode == 0, applied.stderr
        chart.wait_runner(ns, f"{run}-1")
        chart.wait_for(
            lambda: any(e.tool_name == "charge_card" for e in chart.ledger(thread)),
            timeout=120,
            message="charge_card in the ledger",
        )
        at_delete = chart.run(ns, run)["status"]
        deleted = chart.kubectl("delete", "pods", "-n", RELEASE_NAMESPACE, "-l", OPERATOR_SELECTOR, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        new_leader = chart.wait_for_leader(timeout=180, excluding=before)
        status = chart.wait_phase(ns, run, "Succeeded", "Failed", timeout=240)
        chart.wait_pod_ended(ns, f"{run}-1")
    after = {p["metadata"]["name"] for p in chart.wait_operator_ready()}
    pods = chart.runner_pods(ns, run)
    new_log = chart.kubectl("logs", "-n", RELEASE_NAMESPACE, new_leader).stdout

    assert (at_delete["phase"], at_delete["podName"]) == ("Running", f"{run}-1"), dump(at_delete)
    assert len(before) == 2 and not before & after and new_leader in after, (before, after, new_leader)
    assert "acquired the leader lease" in new_log, new_log[-3000:]
    assert [p["metadata"]["name"] for p in pods] == [f"{run}-1"]  # no second runner pod
    assert status["phase"] == "Succeeded", dump(status)
    assert (status["attempt"], status.get("restarts", 0), status.get("disruptions", 0)) == (1, 0, 0), dump(status)
    assert status["toolCalls"] == {"executed": 3, "replayed": 0}, dump(status)
    kept_file = kept.path(pods[0])
    assert kept_file is not None and count_effects(str(kept_file))["charges"] == 1
