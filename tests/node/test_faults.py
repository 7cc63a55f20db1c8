"""Faults on real containers (issue 35 item 4 c-f): a drain, an OOM kill, a stop in a hung tool, a lost node.

The chart runs on the node (``agentrun_chart``: the operator's two replicas and the history server as
Deployments); every run here is created with ``kubectl apply`` and handled by the operator pod, its runner
a container of ``localhost/agentrun-faults:dev`` (the runtime image plus the fault graph,
``fault_graphs.py``). What the graph did is counted outside the containers, in the runs' PostgreSQL
(``node_effects``), and what the runtime did is read from the cluster (the pods' states, seen by a watch
even when a pod is deleted a moment later) and from containerd (``ctr tasks list``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.node.conftest import Images
from tests.node.fault_support import (
    FAULT_IMAGE,
    PodWatch,
    WitnessNode,
    apply,
    effects,
    fault_image_archive,
    fault_run,
    import_fault_image,
    open_gate,
    prepare_effects,
    watching,
)
from tests.node.support import STORE_ROLE, InstalledChart, dump

# The node and the chart start inside the first test's time; a lost node takes minutes by design (the
# lifecycle controller's 20 s grace, the 10 s toleration, the runner's 30 s grace, the operator's 10 s here).
pytestmark = pytest.mark.timeout(900)

OPERATOR_PDB = "agentrun-operator"


@pytest.fixture(scope="module")
def fault_image(images: Images, agentrun_chart: InstalledChart) -> str:
    """The fault image loaded into the node's containerd, and the effects tables in the runs' database."""
    import_fault_image(agentrun_chart, fault_image_archive(images))
    prepare_effects(agentrun_chart, STORE_ROLE)
    return FAULT_IMAGE


@pytest.fixture
def settled(agentrun_chart: InstalledChart) -> Iterator[InstalledChart]:
    """The chart as a fault leaves it for the next test: the node schedulable, two operator replicas Ready,
    one of them leading, the history server Ready."""
    yield agentrun_chart
    chart = agentrun_chart
    chart.kubectl("uncordon", chart.node.name)
    chart.wait_for(lambda: len(_ready(chart.operator_pods())) == 2, timeout=300, message="two operator pods Ready")
    chart.wait_for_leader(timeout=120)
    chart.wait_for(lambda: _ready(chart.history_pods()), timeout=300, message="the history server Ready")


def _ready(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions") or [])
    ]


def _log(chart: InstalledChart, namespace: str, pod: str) -> str:
    """The pod's log through the API server and the real kubelet ('' once the pod is gone)."""
    got = chart.plane.api("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log", timeout=10)
    return got.body if got.status == 200 and isinstance(got.body, str) else ""


def _tasks(chart: InstalledChart) -> set[str]:
    """The ids of containerd's tasks on the node (a task is a container's running process)."""
    listed = chart.node.ctr("tasks", "list", "--quiet", timeout=30)
    assert listed.returncode == 0, listed.stderr
    return set(listed.stdout.split())


def _tools(chart: InstalledChart, label: str) -> list[tuple[str, int]]:
    return sorted(effects(chart, label))


# --- c. kubectl drain ----------------------------------------------------------------------------------------


def _budgets_selecting(chart: InstalledChart, labels: dict[str, str]) -> list[str]:
    """The PodDisruptionBudgets (any namespace) whose selector matches ``labels`` (matchLabels only)."""
    found = chart.plane.api("GET", "/apis/policy/v1/poddisruptionbudgets").body.get("items", [])
    names = []
    for pdb in found:
        selector = pdb["spec"].get("selector") or {}
        assert not selector.get("matchExpressions"), f"a PDB with expressions: {dump(pdb)}"
        if all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
            names.append(f"{pdb['metadata']['namespace']}/{pdb['metadata']['name']}")
    return names


def _unschedulable(chart: InstalledChart, namespace: str, pod: str) -> dict[str, Any]:
    """The pod once the scheduler said it has no node for it (PodScheduled False, Unschedulable)."""

    def refused() -> dict[str, Any] | None:
        found = chart.plane.get("pods", pod, namespace) or {}
        conditions = found.get("status", {}).get("conditions") or []
        scheduled: dict[str, Any] = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return found if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable" else None

    return chart.wait_for(refused, timeout=180, message=f"{namespace}/{pod} waiting for a node (Unschedulable)")


def _disruptions_allowed(chart: InstalledChart) -> int | None:
    pdb = chart.plane.get("poddisruptionbudgets", OPERATOR_PDB, chart.namespace) or {}
    allowed = pdb.get("status", {}).get("disruptionsAllowed")
    return None if allowed is None else int(allowed)


def _drain(chart: InstalledChart, namespace: str, pod: str, label: str) -> tuple[int, str, str]:
    """``kubectl drain`` the node; once the runner logs its SIGTERM, open its gate (its node then finishes
    within the runner's 5 s window). Returns drain's exit code, stdout and stderr."""
    drain = chart.plane.kubectl_popen(
        "drain", chart.node.name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=30s"
    )
    try:
        chart.wait_for(
            lambda: "SIGTERM" in _log(chart, namespace, pod),
            timeout=60,
            interval=0.2,
            message=f"{pod} to log the SIGTERM of its eviction",
        )
        open_gate(chart, label)
        out, err = drain.communicate(timeout=120)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait()
    return drain.returncode, out, err


def test_a_drain_evicts_the_runner_which_exits_6_at_the_next_step_and_resumes_once_uncordoned(
    settled: InstalledChart, run_namespace: str, fault_image: str
) -> None:
    chart, ns = settled, run_namespace
    label = f"drain-{ns}"
    calls = [["charge_card", {"order_id": "4821"}], ["wait_for_gate", {"then_seconds": 1}]]
    apply(chart, ns, fault_run("drained", label, calls))
    chart.wait_for(lambda: len(effects(chart, label)) == 2, timeout=180, message="both tools started")
    runner = chart.wait_runner(ns, "drained-1")
    # Runner pods have no budget (an attempt is resumable: evicting it costs a step, not the run); the
    # operator's, from the chart, lets a drain take one of its two replicas at a time.
    assert _budgets_selecting(chart, runner["metadata"]["labels"]) == []
    operators = {p["metadata"]["name"] for p in chart.operator_pods()}
    assert _budgets_selecting(chart, chart.operator_pods()[0]["metadata"]["labels"]) == [
        f"{chart.namespace}/{OPERATOR_PDB}"
    ]
    chart.wait_for(
        lambda: _disruptions_allowed(chart) == 1, timeout=60, message="the operator's budget to allow one disruption"
    )
    with watching(chart, ns) as watch:
        started = time.monotonic()
        code, out, err = _drain(chart, ns, "drained-1", label)
        drained = time.monotonic() - started
        second = _unschedulable(chart, ns, "drained-2")
        waiting = chart.wait_for(
            lambda: (s := chart.run(ns, "drained").get("status") or {}).get("attempt") == 2 and s,
            timeout=60,
            message="status attempt 2",
        )
        uncordoned = time.monotonic()
        chart.kubectl("uncordon", chart.node.name)
        final = chart.wait_phase(ns, "drained", "Succeeded", timeout=300)
    print(
        f"\ndrain on the real node: kubectl drain ran {drained:.1f} s (its timeout: the operator's budget held one"
        f" replica); uncordon -> Succeeded {time.monotonic() - uncordoned:.1f} s"
    )
    evicted = {line.split("/", 1)[1].split()[0] for line in out.splitlines() if line.endswith(" evicted")}
    assert "drained-1" in evicted, out
    assert len(evicted & operators) == 1, f"the PDB lets exactly one operator replica go:\n{out}\n{err}"
    assert code != 0 and "violate the pod's disruption budget" in err, (code, err)
    _assert_drained_run(chart, watch, label, second, waiting, final)


def _assert_drained_run(
    chart: InstalledChart,
    watch: PodWatch,
    label: str,
    second: dict[str, Any],
    waiting: dict[str, Any],
    final: dict[str, Any],
) -> None:
    ended = watch.terminated("drained-1")
    assert ended is not None and ended["exitCode"] == 6, f"the runner must exit 6 after SIGTERM: {dump(ended)}"
    disruption = watch.condition("drained-1", "DisruptionTarget")
    assert disruption is not None and disruption["reason"] == "EvictionByEvictionAPI", dump(disruption)
    # The next attempt waited for a schedulable node (the scheduler found none: the only one was cordoned).
    assert not second["spec"].get("nodeName"), dump(second)
    assert waiting["disruptions"] == 1 and waiting["restarts"] == 0, dump(waiting)
    assert (final["attempt"], final["disruptions"], final["restarts"]) == (2, 1, 0), (
        f"GUARANTEE BROKEN: an eviction is a disruption, not a restart: {dump(final)}"
    )
    first, then = final["attempts"]
    assert (first["outcome"], then["outcome"]) == ("Disrupted", "Completed"), dump(final["attempts"])
    # The tools node finished after the SIGTERM and was checkpointed; attempt 2 began at the next step.
    assert _tools(chart, label) == [("charge_card", 1), ("wait_for_gate", 1)], (
        f"GUARANTEE BROKEN: charged once, no tool re-run after a drain: {effects(chart, label)}"
    )
    assert final["toolCalls"]["executed"] == 2 and final["toolCalls"]["replayed"] == 0, dump(final["toolCalls"])
    resumed = chart.plane.get("pods", "drained-2", second["metadata"]["namespace"])
    assert resumed is not None and resumed["spec"]["nodeName"] == chart.node.name


# --- d. the memory limit -------------------------------------------------------------------------------------

MEMORY = {"requests": {"cpu": "100m", "memory": "96Mi"}, "limits": {"memory": "160Mi"}}


def _oom_kills(chart: InstalledChart, namespace: str, run: str) -> list[tuple[str, int | None]]:
    """``(reason, exitCode)`` of each of the run's pods' container as the kubelet reports it."""
    found = []
    for pod in chart.runner_pods(namespace, run):
        state = (pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}
        terminated = state.get("terminated") or {}
        found.append((terminated.get("reason", "?"), terminated.get("exitCode")))
    return found


def test_a_graph_over_its_memory_limit_is_oom_killed_and_retried_under_its_restart_policy(
    agentrun_chart: InstalledChart, run_namespace: str, fault_image: str
) -> None:
    chart, ns = agentrun_chart, run_namespace
    hog = {"mib": 400}
    # Twice OOM-killed, then within its limit: two restarts of the two allowed, then Succeeded.
    apply(
        chart,
        ns,
        fault_run(
            "hog-twice",
            f"twice-{ns}",
            [["hog", {**hog, "times": 2}]],
            podTemplate={"resources": MEMORY},
            restartPolicy={"maxRestarts": 2, "backoffSeconds": 1},
        ),
    )
    # Always over it: one restart allowed, then Failed BackoffLimitExceeded.
    apply(
        chart,
        ns,
        fault_run(
            "hog-always",
            f"always-{ns}",
            [["hog", {**hog, "times": 1000}]],
            podTemplate={"resources": MEMORY},
            restartPolicy={"maxRestarts": 1, "backoffSeconds": 1},
        ),
    )
    twice = chart.wait_phase(ns, "hog-twice", "Succeeded", "Failed", timeout=400)
    always = chart.wait_phase(ns, "hog-always", "Succeeded", "Failed", timeout=400)

    assert (twice["phase"], twice["restarts"], twice["attempt"], twice["disruptions"]) == ("Succeeded", 2, 3, 0), (
        f"GUARANTEE BROKEN: each OOM kill is one restart: {dump(twice)}"
    )
    assert [(a["outcome"], a.get("exitCode"), a.get("reason")) for a in twice["attempts"]] == [
        ("Crashed", 137, "OOMKilled"),
        ("Crashed", 137, "OOMKilled"),
        ("Completed", 0, "Completed"),
    ], dump(twice["attempts"])
    assert _oom_kills(chart, ns, "hog-twice") == [("OOMKilled", 137), ("OOMKilled", 137), ("Completed", 0)]
    assert _tools(chart, f"twice-{ns}") == [("hog", 1), ("hog", 2), ("hog", 3)]

    assert (always["phase"], always["reason"], always["restarts"], always["attempt"]) == (
        "Failed",
        "BackoffLimitExceeded",
        1,
        2,
    ), dump(always)
    assert "OOMKilled" in always["message"], f"the kubelet's reason must reach the user: {always['message']}"
    assert _oom_kills(chart, ns, "hog-always") == [("OOMKilled", 137), ("OOMKilled", 137)]
    assert _tools(chart, f"always-{ns}") == [("hog", 1), ("hog", 2)]


# --- e. spec.stop in a hung tool -----------------------------------------------------------------------------


def test_spec_stop_ends_a_run_hung_in_a_tool_and_its_container_is_gone(
    agentrun_chart: InstalledChart, run_namespace: str, fault_image: str
) -> None:
    chart, ns = agentrun_chart, run_namespace
    label = f"hung-{ns}"
    apply(chart, ns, fault_run("hung", label, [["hang", {}]]))
    chart.wait_for(lambda: effects(chart, label), timeout=180, message="the hung tool started")
    cid = chart.container_id(chart.wait_runner(ns, "hung-1"))
    assert cid in _tasks(chart)
    asked = time.monotonic()
    patched = chart.kubectl("patch", "agentrun", "hung", "-n", ns, "--type", "merge", "-p", '{"spec":{"stop":true}}')
    assert patched.returncode == 0, patched.stderr
    final = chart.wait_phase(ns, "hung", "Stopped", "Failed", "Succeeded", timeout=120)
    took = time.monotonic() - asked
    print(f"\nstop in a hung tool on the real node: kubectl patch -> phase Stopped in {took:.2f} s")

    assert (final["phase"], final["reason"]) == ("Stopped", "Stopped"), (
        f"the runner must stop by itself, not be force-deleted: {dump(final)}"
    )
    pod = chart.plane.get("pods", "hung-1", ns)
    assert pod is not None
    terminated = pod["status"]["containerStatuses"][0]["state"].get("terminated") or {}
    assert terminated.get("exitCode") == 4, dump(pod["status"])
    assert cid not in _tasks(chart), "the stopped runner's container still has a process in containerd"
    assert _tools(chart, label) == [("hang", 1)]


# --- f. the node lost ----------------------------------------------------------------------------------------


def _node(chart: InstalledChart) -> dict[str, Any]:
    node = chart.plane.get("nodes", chart.node.name, None)
    assert node is not None
    return node


def _node_ready(chart: InstalledChart) -> str:
    conditions = _node(chart).get("status", {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "?")


def _unreachable_taint(chart: InstalledChart) -> bool:
    taints = _node(chart).get("spec", {}).get("taints") or []
    return any(t["key"] == "node.kubernetes.io/unreachable" and t["effect"] == "NoExecute" for t in taints)


def _deleting(chart: InstalledChart, ns: str, pod: str) -> bool:
    found = chart.plane.get("pods", pod, ns) or {}
    return bool(found.get("metadata", {}).get("deletionTimestamp"))


def _lose_the_node(chart: InstalledChart, ns: str, old: str, times: dict[str, float], start: float) -> dict[str, Any]:
    """Stop the kubelet and wait until the operator replaced the unreachable pod; returns the new pod. ``times``:
    when each stage was seen, in seconds since ``start``."""
    chart.node.stop_kubelet()

    def mark(what: str) -> bool:
        times[what] = time.monotonic() - start
        return True

    chart.wait_for(lambda: _node_ready(chart) != "True" and mark("NotReady"), timeout=120, message="NotReady")
    chart.wait_for(lambda: _unreachable_taint(chart) and mark("tainted"), timeout=120, message="the NoExecute taint")
    chart.wait_for(
        lambda: _deleting(chart, ns, "lost-1") and mark("evicted"),
        timeout=120,
        message="the taint eviction of lost-1",
    )
    chart.wait_for(lambda: chart.plane.get("pods", "lost-2", ns) and mark("rescheduled"), timeout=300, message="lost-2")
    new = _unschedulable(chart, ns, "lost-2")
    assert chart.plane.get("pods", "lost-1", ns) is None, "attempt 2 came before lost-1 was gone"
    assert old in _tasks(chart), "the lost node's container should still run: only its kubelet stopped"
    return new


def test_a_lost_node_is_tainted_its_run_rescheduled_and_resumed_when_it_returns_charged_once(
    settled: InstalledChart, run_namespace: str, fault_image: str
) -> None:
    chart, ns = settled, run_namespace
    label = f"lost-{ns}"
    apply(chart, ns, fault_run("lost", label, [["charge_card", {"order_id": "4821"}], ["wait_for_gate", {}]]))
    chart.wait_for(lambda: len(effects(chart, label)) == 2, timeout=180, message="both tools started")
    chart.wait_for(
        lambda: any(e.tool_name == "charge_card" for e in chart.ledger(f"{ns}/lost")),
        timeout=60,
        message="the charge recorded in the ledger",
    )
    old = chart.container_id(chart.wait_runner(ns, "lost-1"))
    times: dict[str, float] = {}
    # The rest of a cluster: with every node NotReady the lifecycle controller stops tainting (it takes that
    # for its own disconnection; the taint then lands only by a race), so a cordoned Node whose Lease the
    # test renews stays Ready beside ours.
    with WitnessNode(chart.plane), watching(chart, ns) as watch:
        start = time.monotonic()
        try:
            second = _lose_the_node(chart, ns, old, times, start)
        finally:
            if "kubelet" not in chart.node.pids():
                chart.node.start_kubelet()
        times["kubelet started"] = time.monotonic() - start
        chart.wait_for(lambda: _node_ready(chart) == "True", timeout=120, message="the node Ready again")
        times["Ready"] = time.monotonic() - start
        chart.wait_runner(ns, "lost-2", timeout=300)
        chart.wait_for(lambda: old not in _tasks(chart), timeout=120, message="the lost pod's container killed")
        times["orphan killed"] = time.monotonic() - start
        open_gate(chart, label)
        final = chart.wait_phase(ns, "lost", "Succeeded", "Failed", timeout=300)
        times["Succeeded"] = time.monotonic() - start
    print("\nlost node, seconds after the kubelet stopped: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    _assert_lost_run(chart, watch, label, second, final)


def _assert_lost_run(
    chart: InstalledChart, watch: PodWatch, label: str, second: dict[str, Any], final: dict[str, Any]
) -> None:
    disruption = watch.condition("lost-1", "DisruptionTarget")
    assert disruption is not None and disruption["reason"] == "DeletionByTaintManager", dump(disruption)
    assert not second["spec"].get("nodeName"), f"attempt 2 must wait for a Ready node: {dump(second)}"
    assert (final["phase"], final["attempt"], final["disruptions"], final["restarts"]) == ("Succeeded", 2, 1, 0), (
        f"GUARANTEE BROKEN: a lost node is a disruption, not a restart: {dump(final)}"
    )
    # The charge was recorded before the node was lost: replayed from the ledger, executed once.
    assert _tools(chart, label) == [("charge_card", 1), ("wait_for_gate", 1), ("wait_for_gate", 2)], (
        f"GUARANTEE BROKEN: charged once across a lost node: {effects(chart, label)}"
    )
    assert final["toolCalls"]["replayed"] >= 1, dump(final["toolCalls"])
    # The history closes the lost attempt when the operator gives its pod up and starts the next one.
    first, then = final["attempts"]
    assert then["outcome"] == "Completed", dump(final["attempts"])
    assert first["outcome"] == "Disrupted" and first.get("reason") == "NodeLost" and first.get("endTime"), (
        f"attempt 1 is still shown as live after the operator replaced its pod: {dump(final['attempts'])}"
    )
