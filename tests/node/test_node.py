"""The real node (``kubesim.node``): pods are containers, and the node leaves nothing behind.

Every answer about a container is read from inside it (its own /proc, its own files, its own
connections), reported through ``kubectl logs`` (the API server asks the real kubelet, which reads
containerd's log file), never from the manifest.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_dev.servers import PrivatePostgres, PrivateRedis
from kubesim import nodehost
from kubesim.node import NodeCluster, NodeError, RealNode
from kubesim.real import Binaries, RealControlPlane
from tests.node.conftest import Images

# A node's start (a plane, containerd, the images, kubelet) is part of the first test's time.
pytestmark = pytest.mark.timeout(300)

RESTRICTED = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

# Run inside the restricted container: what the kernel says about this process and its filesystem.
REPORT_FROM_INSIDE = """
import errno, json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
try:
    open("/written-by-the-pod", "w")
    rootfs = "writable"
except OSError as e:
    rootfs = "read-only" if e.errno == errno.EROFS else errno.errorcode[e.errno]
print(json.dumps({
    "uid": os.getuid(),
    "pid": os.getpid(),
    "CapEff": status["CapEff"].strip(),
    "Seccomp": status["Seccomp"].strip(),
    "NoNewPrivs": status["NoNewPrivs"].strip(),
    "rootfs": rootfs,
    "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    "memory_limit": int(open("/sys/fs/cgroup/memory/memory.limit_in_bytes").read()),
}))
"""

# Run inside a pod: who the API server says it is through the `kubernetes` Service (in-cluster config,
# as the operator's client finds it), the address PostgreSQL and Redis see it connect from, its routes,
# and that an address off the node has no route (the connect fails in the pod; no packet leaves it).
REACH_FROM_INSIDE = """
import asyncio, errno, json, os, socket, ssl, urllib.request
import asyncpg, redis
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
request = urllib.request.Request(
    f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews", data=review, method="POST",
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read(), "Content-Type": "application/json"})
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
with urllib.request.urlopen(request, context=context, timeout=10) as response:
    user = json.load(response)["status"]["userInfo"]["username"]

async def postgres():
    connection = await asyncpg.connect(os.environ["PG_DSN"], timeout=10)
    try:
        return await connection.fetchrow("SELECT host(inet_client_addr()) AS address, current_user AS role")
    finally:
        await connection.close()
pg = asyncio.run(postgres())
client = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=10)
redis_address = client.client_info()["addr"].rsplit(":", 1)[0]
routes = [line.split()[1] for line in open("/proc/net/route").read().splitlines()[1:]]
probe = socket.socket()
try:
    probe.connect(("198.51.100.1", 80))  # TEST-NET-2: must have no route
    off_node = "connected"
except OSError as e:
    off_node = errno.errorcode[e.errno]
print(json.dumps({"service": f"{host}:{port}", "user": user, "postgres": dict(pg), "redis": redis_address,
                  "default_route": "00000000" in routes, "off_node": off_node}))
"""


def _pod(name: str, script: str, *, token: bool, env: dict[str, str] | None = None, images: Images) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": token,
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532},
            "containers": [
                {
                    "name": "main",
                    "image": images.runtime,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", script],
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                    "securityContext": RESTRICTED,
                    "resources": {"limits": {"memory": "64Mi", "cpu": "500m"}},
                }
            ],
        },
    }


def _run_to_completion(plane: RealControlPlane, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Create ``pod``, wait for it to succeed, and return what it printed (read with ``kubectl logs``)."""
    name = pod["metadata"]["name"]
    created = plane.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert created.status == 201, created

    def finished() -> dict[str, Any] | None:
        got = plane.get("pods", name, namespace)
        return got if got and got["status"].get("phase") in ("Succeeded", "Failed") else None

    done = plane.wait_for(finished, timeout=120, interval=0.5, message=f"pod {name} finished")
    logs = plane.kubectl("logs", "-n", namespace, name)
    assert done["status"]["phase"] == "Succeeded", (done["status"], logs.stdout, logs.stderr)
    assert logs.returncode == 0, logs.stderr
    report: dict[str, Any] = json.loads(logs.stdout.strip().splitlines()[-1])
    report["podIP"] = done["status"]["podIP"]
    report["nodeName"] = done["spec"]["nodeName"]
    return report


@pytest.fixture
def namespace(node_cluster: NodeCluster) -> Iterator[str]:
    """A namespace enforcing the restricted Pod Security profile, deleted after the test."""
    plane = node_cluster.plane
    assert plane is not None
    name = f"node-{secrets.token_hex(3)}"
    plane.create_namespace(name, labels={"pod-security.kubernetes.io/enforce": "restricted"})
    yield name
    plane.api("DELETE", f"/api/v1/namespaces/{name}")


def test_a_restricted_pod_runs_as_a_container_and_reports_it_from_inside_through_kubectl_logs(
    node_cluster: NodeCluster, namespace: str, images: Images
) -> None:
    plane = node_cluster.plane
    assert plane is not None
    report = _run_to_completion(plane, namespace, _pod("restricted", REPORT_FROM_INSIDE, token=False, images=images))

    assert report["nodeName"] == node_cluster.node.name  # bound by kube-scheduler to the real node
    assert report["uid"] == 65532
    assert report["pid"] == 1  # its own pid namespace: a container, not a process of this machine
    assert report["CapEff"] == "0000000000000000"
    assert report["Seccomp"] == "2"  # a seccomp filter (RuntimeDefault), not 0 (none)
    assert report["NoNewPrivs"] == "1"
    assert report["rootfs"] == "read-only"
    assert report["token"] is False
    assert report["memory_limit"] == 64 * 1024 * 1024  # the kubelet's limit, in the container's own cgroup


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service_and_the_stores_on_the_host(
    node_cluster: NodeCluster, namespace: str, images: Images, tmp_path: Path
) -> None:
    plane, node = node_cluster.plane, node_cluster.node
    assert plane is not None
    password = secrets.token_hex(12)
    postgres = PrivatePostgres(listen=[node.host_address], hba=[f"host all pod {node.pod_cidr} scram-sha-256"])
    redis = PrivateRedis(tmp_path / "redis", listen=[node.host_address], password=password)
    with postgres.running():
        postgres.sql(f"CREATE ROLE pod LOGIN PASSWORD '{password}'")
        redis.start()
        try:
            env = {
                "PG_DSN": f"postgresql://pod:{password}@{node.host_address}:{postgres.port}/postgres",
                "REDIS_URL": redis.url_at(node.host_address),
            }
            pod = _pod("reach", REACH_FROM_INSIDE, token=True, env=env, images=images)
            report = _run_to_completion(plane, namespace, pod)
        finally:
            redis.stop()

    assert report["service"] == "10.96.0.1:443"  # the `kubernetes` Service's ClusterIP, rewritten by kube-proxy
    assert report["user"] == f"system:serviceaccount:{namespace}:default"
    assert report["postgres"] == {"address": report["podIP"], "role": "pod"}  # straight from the pod's address
    assert report["redis"] == report["podIP"]
    assert report["podIP"].startswith(node.pod_cidr.rsplit(".", 2)[0])
    assert report["default_route"] is False
    assert report["off_node"] == "ENETUNREACH"


def _assert_all_present(found: nodehost.Inventory, slot: nodehost.Slot) -> None:
    """While a node runs a pod, each kind of thing the sweep removes exists (so its absence later means something)."""
    assert found.processes and found.netns and found.links and found.cgroups and found.files, found
    assert any("/rootfs" in m for m in found.mounts), found.mounts  # a container's overlay
    assert any("/netns/" in m for m in found.mounts), found.mounts  # a pod's network namespace
    assert any(m.endswith("/kubelet") for m in found.mounts), found.mounts  # the kubelet's bind mount of its root
    assert str(nodehost.CGROUP_FS / "memory" / slot.name) in found.cgroups, found.cgroups


def _kubepods(slot: nodehost.Slot) -> list[Path]:
    """The kubelet's ``kubepods`` cgroups: under the slot's root in each hierarchy, never at a hierarchy's top."""
    hierarchies = nodehost.cgroup_hierarchies()
    return [h / slot.name / "kubepods" for h in hierarchies if (h / slot.name / "kubepods").exists()] + [
        h / "kubepods" for h in hierarchies if (h / "kubepods").exists()
    ]


def _sleeper(images: Images) -> dict[str, Any]:
    pod = _pod("sleeper", "import time; time.sleep(3600)", token=False, images=images)
    pod["metadata"]["namespace"] = "default"
    pod["spec"]["containers"][0]["securityContext"] = RESTRICTED
    return pod


def _run_sleeper(plane: RealControlPlane, images: Images) -> None:
    created = plane.api("POST", "/api/v1/namespaces/default/pods", _sleeper(images))
    assert created.status == 201, created
    plane.wait_for(
        lambda: (plane.get("pods", "sleeper") or {}).get("status", {}).get("phase") == "Running",
        timeout=120,
        interval=0.5,
        message="the sleeper pod Running",
    )


def _gone(pids: list[int]) -> list[int]:
    return [pid for pid in pids if nodehost.start_time(pid) is None]


def test_nothing_of_a_stopped_node_survives_it(node_cluster: NodeCluster, images: Images, tmp_path: Path) -> None:
    # A second node of its own (the session's keeps running): stopped here with a pod still running on it.
    with NodeCluster(tmp_path, archives=node_cluster.node._archives) as cluster:
        assert cluster.plane is not None
        slot = cluster.node.slot
        _run_sleeper(cluster.plane, images)
        during = nodehost.inventory(slot)
        kubepods = _kubepods(slot)
        tables = subprocess.run(
            ["ip", "netns", "exec", slot.netns, "nft", "list", "tables"], capture_output=True, text=True
        )
        veths = subprocess.run(
            ["ip", "-n", slot.netns, "-o", "link", "show", "type", "veth"], capture_output=True, text=True
        )
    after = nodehost.inventory(slot)

    _assert_all_present(during, slot)
    assert "table ip kube-proxy" in tables.stdout  # kube-proxy's rules, inside the node's namespace
    assert len(veths.stdout.splitlines()) >= 2  # eth0 (to the host) and the pod's
    assert after.empty(), after
    assert {p.parent.parent for p in kubepods} == set(nodehost.cgroup_hierarchies()), kubepods  # every v1 hierarchy
    assert _kubepods(slot) == []
    assert (slot.image_dir / nodehost.CLEAN).exists()  # containerd's root kept for the next node: images only
    assert _gone(during.processes) == during.processes  # containerd, kubelet, shims, the pod's processes
    assert not Path(f"/sys/class/net/{slot.host_link}").exists()
    host_tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
    assert "kube-proxy" not in host_tables


CRASHING_OWNER = """
import json, sys, time
from pathlib import Path
from kubesim.node import NodeCluster
cluster = NodeCluster(Path(sys.argv[1]), archives={k: Path(v) for k, v in json.loads(sys.argv[2]).items()}).start()
created = cluster.plane.api("POST", "/api/v1/namespaces/default/pods", json.loads(sys.argv[3]))
assert created.status == 201, created
cluster.plane.wait_for(lambda: cluster.plane.get("pods", "sleeper")["status"].get("phase") == "Running", timeout=120)
print(json.dumps({"slot": cluster.node.slot.index}), flush=True)
time.sleep(3600)
"""


def test_a_node_whose_owner_was_sigkilled_is_swept_by_the_next_start(
    node_cluster: NodeCluster, images: Images, tmp_path: Path
) -> None:
    archives = json.dumps({k: str(v) for k, v in (node_cluster.node._archives or {}).items()})
    argv = [sys.executable, "-c", CRASHING_OWNER, str(tmp_path / "crashed"), archives, json.dumps(_sleeper(images))]
    owner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line, f"the owner exited ({owner.wait()}) before its node ran a pod"
        slot = nodehost.Slot(json.loads(line)["slot"])
        before = nodehost.inventory(slot)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    # Its daemons follow it (their parent-death signal); its containers and their shims do not.
    deadline = time.monotonic() + 10
    while nodehost.recorded_pids(slot) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = nodehost.inventory(slot)

    _assert_all_present(before, slot)
    assert not nodehost.recorded_pids(slot)
    assert left.processes and left.netns and left.links and left.cgroups, left
    assert any("/rootfs" in m for m in left.mounts), left.mounts
    with NodeCluster(tmp_path / "next", slot=slot.index, archives=node_cluster.node._archives) as cluster:
        swept = cluster.node.swept_at_start
        assert swept is not None and swept.killed and swept.unmounted, swept
        assert f"folder {slot.image_dir}" in swept.removed  # a store that did not stop cleanly is not reused
        assert _gone(left.processes) == left.processes  # none of the old processes, before this node's first pod
        old_pod_mounts = {m for m in left.mounts if not m.endswith("/kubelet")}  # the kubelet's own is made anew
        assert old_pod_mounts and not old_pod_mounts & set(nodehost.inventory(slot).mounts)
    assert (final := nodehost.inventory(slot)).empty(), final


@pytest.mark.parametrize("missing", ["images", "binaries"])
def test_a_node_that_cannot_start_says_in_one_line_what_is_missing_and_how_to_get_it(
    missing: str, real_binaries: Binaries, tmp_path: Path
) -> None:
    archives = {} if missing == "images" else None
    bins = Binaries(tmp_path) if missing == "binaries" else real_binaries
    expected = {"images": "run make image", "binaries": "run make k8s"}[missing]
    node = RealNode(tmp_path / "logs", archives=archives, bins=bins)

    with pytest.raises(NodeError) as refused:
        node.prepare()

    assert expected in str(refused.value) and "\n" not in str(refused.value), refused.value
    with pytest.raises(NodeError, match="not been prepared"):
        node.slot  # noqa: B018 - refused before it claimed a slot or touched the host
