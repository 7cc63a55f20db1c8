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

from tests.node.support import RELEASE_NAMESPACE, InstalledChart, dump, release_objects

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
