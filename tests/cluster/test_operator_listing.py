"""A restarted operator reconciles nothing before its own listings of runs and pods are complete.

The operator lists AgentRuns and its pods itself, in pages, then watches them (``io/informer.py``); the
restart and take-over guarantees rest on ``Handlers.ready``: no reconcile before every listing was handed
over whole. Here the new operator lists one object a page, in an order that puts a run waiting for its
thread before the run holding that thread, and the pods after a run's own listing (filler pods named to
come first): a reconcile started as soon as its run is listed would start the waiting run (a thread with
two active runs) and take a Running run's pod for deleted (a second pod, attempt 2). Both servers.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from agentrun_dev.kubeload import RunningHolder
from agentrun_operator.decide.podspec import MANAGED_BY
from kubesim import EmulatedCluster
from kubesim.testing import python_pod
from tests.cluster.operator_harness import OperatorProcess, agentrun, operator_pods, start_operator

pytestmark = pytest.mark.timeout(240)

HOLDERS = 6  # runs on threads of their own, Running, listed between the waiting run and the thread's holder
QUIET_NODE = "listing-quiet"
FILLER_PODS = 30  # pods the operator's selector lists, named to come before every run's pod


@pytest.fixture
def store(cluster: EmulatedCluster, dsn: str) -> str:
    made = cluster.kubectl("create", "secret", "generic", "agentrun-store", f"--from-literal=postgresDsn={dsn}")
    assert made.returncode == 0, made.stderr
    return dsn


def _runs(cluster: EmulatedCluster) -> dict[str, dict[str, object]]:
    return {r["metadata"]["name"]: r.get("status") or {} for r in cluster.list_objects("agentruns", "default")}


def _holder(cluster: EmulatedCluster) -> RunningHolder:
    """The operator's pods reported Running with no process: on the real server bound to a Node with no kubelet
    (as bench/operator.py's quiet node), on kubesim by its kubelet stand-in's API."""
    plane = getattr(cluster, "plane", None)
    if plane is None:
        return RunningHolder(cluster.url).start()
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": QUIET_NODE}}
    assert cluster.api("POST", "/api/v1/nodes", node).status in (201, 409)
    return RunningHolder(plane.admin, node=QUIET_NODE).start()


def _metrics(operator: OperatorProcess) -> str:
    try:
        return operator.metrics()
    except OSError:  # not serving yet
        return ""


def _apply(cluster: EmulatedCluster, manifest: dict[str, object]) -> None:
    made = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    assert made.returncode == 0, made.stderr


@pytest.mark.real_server
@pytest.mark.kubesim_too
def test_a_restarted_operator_listing_one_object_a_page_reconciles_nothing_before_both_listings_are_whole(
    cluster: EmulatedCluster, store: str, tmp_path: Path
) -> None:
    holder = _holder(cluster)
    first = start_operator(cluster, tmp_path, identity="op-1")
    running = ["s-holder", *(f"m-{i}" for i in range(HOLDERS))]
    try:
        _apply(cluster, agentrun("s-holder", thread="shared", effects=tmp_path / "s.db"))
        for i in range(HOLDERS):
            _apply(cluster, agentrun(f"m-{i}", thread=f"own-{i}", effects=tmp_path / f"m{i}.db"))
        cluster.wait_for(
            lambda: all(_runs(cluster).get(n, {}).get("phase") == "Running" for n in running),
            timeout=90,
            interval=0.5,
            message="the thread's holder and the other runs Running",
        )
        # Listed first (by name), created last: it waits for the thread "s-holder" holds.
        _apply(cluster, agentrun("a-waiting", thread="shared", effects=tmp_path / "a.db"))
        cluster.wait_for(
            lambda: _runs(cluster).get("a-waiting", {}).get("phase") == "Pending",
            timeout=60,
            interval=0.5,
            message="the second run on the thread waits",
        )
        assert "a-waiting" not in operator_pods(cluster)
    finally:
        first.stop()
    for i in range(FILLER_PODS):  # listed before every run's pod ("0" sorts before letters)
        filler = python_pod(f"0-filler-{i:02d}", "pass", restricted=True)
        filler["metadata"]["labels"] = dict(MANAGED_BY)
        assert cluster.api("POST", "/api/v1/namespaces/default/pods", filler).status == 201
    second = start_operator(cluster, tmp_path, identity="op-2", AGENTRUN_OPERATOR_LIST_PAGE_SIZE="1")
    try:
        count = len(running) + 1
        cluster.wait_for(
            lambda: f"agentrun_operator_runs_reconciled {float(count)}" in _metrics(second),
            timeout=90,
            interval=0.5,
            message=f"the new operator reconciled all {count} runs",
        )
        time.sleep(3)  # what a reconcile on an incomplete index would still do (start a pod, a second attempt)
        runs, pods = _runs(cluster), operator_pods(cluster)
        assert "a-waiting" not in pods and runs["a-waiting"].get("phase") == "Pending", (
            f"GUARANTEE BROKEN: a thread with two active runs: {runs['a-waiting']}, pods {pods.get('a-waiting')}\n"
            + second.log()[-3000:]
        )
        doubled = {name: pods.get(name) for name in running if pods.get(name) != [f"{name}-1"]}
        assert not doubled, (
            f"GUARANTEE BROKEN: a Running run's pod taken for deleted: {doubled}\n" + second.log()[-3000:]
        )
        attempts = {name: runs[name].get("attempt") for name in running}
        assert set(attempts.values()) == {1}, f"a run moved past attempt 1: {attempts}"
    finally:
        second.stop()
        holder.stop()
        if getattr(cluster, "plane", None) is not None:
            cluster.api("DELETE", f"/api/v1/nodes/{QUIET_NODE}")
