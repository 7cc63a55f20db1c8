"""The operator on the emulated cluster: the real operator process, real runner pods, real kubectl.

Each test applies AgentRuns with the real kubectl, lets the real operator
(``python -m agentrun_operator``) create pods that the kubelet stand-in runs
as real ``python -m agentrun.runner`` processes against the real PostgreSQL,
injects faults, and asserts on what kubectl shows, what the store holds and
how many side effects happened.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.support_agent import count_effects
from kubesim import EmulatedCluster, KubeletThread
from tests.cluster import operator_harness as harness
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    executions,
    pods_of,
    progress,
    start_operator,
    status,
    wait_node,
    wait_phase,
)

store, operator = harness.store, harness.operator

pytestmark = pytest.mark.timeout(180)


@pytest.mark.real_server
def test_kubectl_apply_runs_to_succeeded_and_status_mirrors_the_store(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, agentrun("order-4821", thread="order-4821", effects=effects))
    final = wait_phase(cluster, operator, "order-4821", "Succeeded")
    stored = progress(store, "default/order-4821")
    assert stored is not None and stored.status == "completed"
    assert final["stateVersion"] == stored.version, "status.stateVersion must mirror the store's version"
    assert final["attempt"] == 1 and final["restarts"] == 0 and final["podName"] == "order-4821-1"
    assert final["toolCalls"] == {"executed": 3, "replayed": 0}
    assert {c["type"]: c["status"] for c in final["conditions"]}["Succeeded"] == "True"
    shown = cluster.kubectl("get", "ar")
    assert shown.returncode == 0, shown.stderr
    row = next(line.split() for line in shown.stdout.splitlines() if line.startswith("order-4821"))
    assert row[1:5] == ["Succeeded", "__end__", str(stored.version), "1"], shown.stdout
    assert count_effects(str(effects))["charges"] == 1
    events = [
        e["reason"]
        for e in cluster.list_objects("events", "default")
        if e.get("involvedObject", {}).get("name") == "order-4821"
    ]
    assert "PodCreated" in events and "Completed" in events


@pytest.mark.real_server
def test_sigkill_mid_tool_reschedules_and_charges_once(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(
        cluster,
        agentrun(
            "kill-me",
            thread="kill-me",
            effects=effects,
            env={"SUPPORT_TOOL_DELAY": "1.5"},
            restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
        ),
    )
    wait_node(store, "default/kill-me", "tools")
    time.sleep(0.5)  # inside the tools now
    kubelet.kill("kill-me-1")
    final = wait_phase(cluster, operator, "kill-me", "Succeeded")
    assert final["podName"] == "kill-me-2" and final["attempt"] == 2
    assert final["restarts"] == 1 and final["disruptions"] == 0
    assert count_effects(str(effects))["charges"] == 1, "GUARANTEE BROKEN: charged twice after SIGKILL"


@pytest.mark.real_server
def test_crash_loop_fails_with_backoff_limit_exceeded(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(
        cluster,
        agentrun(
            "crashy",
            thread="crashy",
            graph="tests.cluster.graphs:crasher",
            effects=effects,
            restartPolicy={"maxRestarts": 2, "backoffSeconds": 0},
        ),
    )
    final = wait_phase(cluster, operator, "crashy", "Failed", timeout=90)
    assert final["reason"] == "BackoffLimitExceeded", final
    assert final["restarts"] == 2 and final["attempt"] == 3
    assert executions(effects).count("crash") == 3
    assert pods_of(cluster, "crashy") == ["crashy-1", "crashy-2", "crashy-3"]


@pytest.mark.real_server
@pytest.mark.parametrize(
    ("graph", "seen"),
    [
        ("tests.cluster.exits_at_import:app", "no progress at all"),
        ("tests.cluster.graphs:quitter", "status running at node quit"),
    ],
    ids=["at-import", "mid-node"],
)
def test_exit_0_without_a_completed_turn_is_a_crash_not_success(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path, graph: str, seen: str
) -> None:
    """Issue 22 item 5: the operator never trusts an exit code alone."""
    name = "quiet-exit"
    apply(
        cluster,
        agentrun(
            name,
            thread=name,
            graph=graph,
            effects=tmp_path / "e.db",
            restartPolicy={"maxRestarts": 1, "backoffSeconds": 0},
        ),
    )
    final = wait_phase(cluster, operator, name, "Failed", timeout=90)
    assert final["reason"] == "BackoffLimitExceeded" and final["attempt"] == 2, final
    assert "exited 0 before the run completed" in final["message"] and seen in final["message"], final


@pytest.mark.real_server
@pytest.mark.parametrize(
    ("crash", "kill", "exit_code", "ran"),
    [
        ("import:0", None, 0, ["work:2"]),
        ("node:0", None, 0, ["work:1", "work:2"]),
        ("node:1", None, 1, ["work:1", "work:2"]),
        ("hang", "sigkill", 137, ["work:1", "work:2"]),
        ("hang", "oom", 137, ["work:1", "work:2"]),
    ],
    ids=["exit-0-at-import", "exit-0-mid-node", "exit-1", "sigkill-137", "oom-killed"],
)
def test_one_crash_under_the_default_backoff_is_one_restart_and_a_second_pod_that_succeeds(
    cluster: EmulatedCluster,
    kubelet: KubeletThread,
    operator: OperatorProcess,
    tmp_path: Path,
    crash: str,
    kill: str | None,
    exit_code: int,
    ran: list[str],
) -> None:
    """Issue 31 item 9: with the CRD's default restartPolicy (3 restarts, 5 s backoff) an exit 0 before the
    turn completed was counted again at every backoff wake-up and failed BackoffLimitExceeded with one pod."""
    name = "crash-" + (kill or crash.replace(":", "-"))  # one thread each: the module's store is shared
    effects = tmp_path / "e.db"
    # No restartPolicy: the CRD's defaults apply.
    apply(
        cluster,
        agentrun(
            name, thread=name, graph="tests.cluster.crashes_once:app", effects=effects, env={"CLUSTER_CRASH": crash}
        ),
    )
    if kill is not None:
        cluster.wait_for(lambda: "work:1" in executions(effects), timeout=60, message="attempt 1 inside its node")
        (kubelet.oom_kill if kill == "oom" else kubelet.kill)(f"{name}-1")
    final = wait_phase(cluster, operator, name, "Succeeded", timeout=90)
    assert (final["restarts"], final["attempt"], final["disruptions"]) == (1, 2, 0), (
        f"GUARANTEE BROKEN: one crash must be one restart and one new pod: {final}"
    )
    assert pods_of(cluster, name) == [f"{name}-1", f"{name}-2"]
    first, second = final["attempts"]
    assert (first["outcome"], first["exitCode"], second["outcome"]) == ("Crashed", exit_code, "Completed"), final
    if kill == "oom":
        assert first["reason"] == "OOMKilled", first
    if exit_code == 0:
        assert first["message"].startswith("exited 0 before the run completed"), first
    assert executions(effects) == ran


@pytest.mark.real_server
def test_kubectl_patch_stop_ends_a_run_hung_in_a_tool(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, agentrun("hung", thread="hung", effects=effects, env={"SUPPORT_TOOL_DELAY": "3600"}))
    wait_node(store, "default/hung", "tools")
    time.sleep(0.5)
    asked = time.monotonic()
    patched = cluster.kubectl("patch", "ar", "hung", "--type", "merge", "-p", '{"spec":{"stop":true}}')
    assert patched.returncode == 0, patched.stderr
    final = wait_phase(cluster, operator, "hung", "Stopped", timeout=30)
    latency = time.monotonic() - asked
    print(f"stop latency (kubectl patch -> phase Stopped): {latency:.2f}s")
    assert final["reason"] == "Stopped", "the runner should have stopped by itself, not been force-deleted"
    assert progress(store, "default/hung").status == "stopped"  # type: ignore[union-attr]
    assert "agentrun_operator_stop_latency_seconds_count 1.0" in operator.metrics()


@pytest.mark.real_server
def test_interrupt_then_kubectl_patch_resume_completes_without_rerunning_siblings(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, agentrun("approval", thread="approval", graph="tests.cluster.graphs:approval", effects=effects))
    paused = wait_phase(cluster, operator, "approval", "Interrupted")
    interrupt = paused["interrupt"]
    assert interrupt["message"] == "approve a refund of 120?"
    assert isinstance(interrupt["payload"], str) and interrupt["payload"].endswith("…(truncated)")
    assert sorted(executions(effects)) == ["notify", "reserve"]
    patched = cluster.kubectl(
        "patch",
        "ar",
        "approval",
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"resume": {"value": {"approved": True}}}}),
    )
    assert patched.returncode == 0, patched.stderr
    final = wait_phase(cluster, operator, "approval", "Succeeded")
    assert final["attempt"] == 2
    done = executions(effects)
    assert done.count("reserve") == 1 and done.count("notify") == 1, f"siblings re-ran: {done}"
    assert 'approve:{"approved": true}' in done


@pytest.mark.real_server
def test_operator_sigkilled_mid_run_and_restarted_makes_no_duplicate_pod(
    cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    first = start_operator(cluster, tmp_path, identity="op-a")
    try:
        apply(cluster, agentrun("survivor", thread="survivor", effects=effects, env={"SUPPORT_TOOL_DELAY": "1"}))
        cluster.wait_for(lambda: cluster.get("pods", "survivor-1"), timeout=30, message="pod survivor-1")
        first.kill()
    finally:
        first.stop()
    second = start_operator(cluster, tmp_path, identity="op-a")
    try:
        final = wait_phase(cluster, second, "survivor", "Succeeded")
    finally:
        second.stop()
    assert final["attempt"] == 1
    assert pods_of(cluster, "survivor") == ["survivor-1"]
    assert count_effects(str(effects))["charges"] == 1


@pytest.mark.real_server
def test_unknown_graph_fails_once_with_a_reason(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    apply(cluster, agentrun("typo", thread="typo", graph="examples.nope:app", effects=tmp_path / "e.db"))
    final = wait_phase(cluster, operator, "typo", "Failed")
    assert final["reason"] == "RunFailed" and "GRAPH_REFERENCE_001" in final["message"], final
    time.sleep(1.5)
    assert pods_of(cluster, "typo") == ["typo-1"], "a permanent failure must not be retried"


@pytest.mark.real_server
def test_missing_store_secret_fails_without_a_pod(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    manifest = agentrun("nosecret", thread="nosecret", effects=tmp_path / "e.db")
    manifest["spec"]["store"] = {"secretRef": {"name": "does-not-exist"}}
    apply(cluster, manifest)
    final = wait_phase(cluster, operator, "nosecret", "Failed")
    assert final["reason"] == "StoreSecretNotFound" and "does-not-exist" in final["message"]
    assert pods_of(cluster, "nosecret") == []


@pytest.mark.real_server
def test_stop_before_start_ends_without_a_pod(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    apply(cluster, agentrun("never", thread="never", effects=tmp_path / "e.db", stop=True))
    final = wait_phase(cluster, operator, "never", "Stopped")
    assert final["reason"] == "StoppedBeforeStart"
    assert pods_of(cluster, "never") == []


@pytest.mark.real_server
def test_kubectl_delete_removes_pods_and_keeps_thread_data(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    apply(cluster, agentrun("doomed", thread="doomed", effects=tmp_path / "e.db", env={"SUPPORT_TOOL_DELAY": "3600"}))
    wait_node(store, "default/doomed", "tools")
    deleted = cluster.kubectl("delete", "ar", "doomed", "--wait=true", "--timeout=60s")
    assert deleted.returncode == 0, deleted.stderr
    cluster.wait_for(lambda: not pods_of(cluster, "doomed"), timeout=30, message="the run's pods are gone")
    assert cluster.get("agentruns", "doomed") is None
    assert progress(store, "default/doomed") is not None, "deleting the AgentRun must keep the thread's data"


@pytest.mark.real_server
def test_an_agentrun_is_deleted_at_once_even_with_no_operator_running(
    cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path
) -> None:
    # No finalizer: an uninstalled (or down) operator never holds a deletion; owner references remove the pods.
    one = start_operator(cluster, tmp_path)
    try:
        apply(
            cluster, agentrun("orphan", thread="orphan", effects=tmp_path / "e.db", env={"SUPPORT_TOOL_DELAY": "3600"})
        )
        wait_node(store, "default/orphan", "tools")
    finally:
        one.stop()
    deleted = cluster.kubectl("delete", "ar", "orphan", "--wait=true", "--timeout=10s")
    assert deleted.returncode == 0, deleted.stderr
    assert cluster.get("agentruns", "orphan") is None
    cluster.wait_for(lambda: not pods_of(cluster, "orphan"), timeout=30, message="the pods garbage collected")
    assert progress(store, "default/orphan") is not None, "deleting the AgentRun must keep the thread's data"


@pytest.mark.real_server
def test_same_thread_id_in_two_namespaces_is_two_threads(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    assert cluster.kubectl("create", "namespace", "team-b").returncode == 0
    made = cluster.kubectl(
        "create", "secret", "generic", "agentrun-store", "-n", "team-b", f"--from-literal=postgresDsn={store}"
    )
    assert made.returncode == 0, made.stderr
    apply(cluster, agentrun("shared", thread="shared-thread", effects=tmp_path / "a.db"))
    apply(cluster, agentrun("shared", thread="shared-thread", effects=tmp_path / "b.db"), namespace="team-b")
    wait_phase(cluster, operator, "shared", "Succeeded")
    wait_phase(cluster, operator, "shared", "Succeeded", namespace="team-b")
    a, b = progress(store, "default/shared-thread"), progress(store, "team-b/shared-thread")
    assert a is not None and b is not None
    expected = {"executed": 3, "replayed": 0, "failed": 0, "in_doubt": 0}
    assert a.tool_calls == b.tool_calls == expected, "the threads must not share a ledger"


@pytest.mark.real_server
def test_two_replicas_exactly_one_leads_and_the_other_takes_over(
    cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path
) -> None:
    one = start_operator(cluster, tmp_path, identity="op-1")
    two = start_operator(cluster, tmp_path, identity="op-2")
    try:
        cluster.wait_for(
            lambda: {one.role(), two.role()} == {"leader", "standby"}, timeout=20, message="one leader and one standby"
        )
        leader, standby = (one, two) if one.role() == "leader" else (two, one)
        apply(cluster, agentrun("led", thread="led", effects=tmp_path / "a.db"))
        wait_phase(cluster, leader, "led", "Succeeded")
        assert "created pod led-1" in leader.log() and "created pod" not in standby.log()
        leader.kill()
        killed = time.monotonic()
        cluster.wait_for(lambda: standby.role() == "leader", timeout=20, message="the standby takes over")
        takeover = time.monotonic() - killed
        print(f"leader takeover after SIGKILL: {takeover:.1f}s (lease 3s)")
        # Generous: lease duration + retry is about 6 s; what this tells apart is a standby that waits on
        # something else than the lease's expiry.
        assert takeover < 5 * 3, f"takeover took {takeover:.1f}s with a 3 s lease"
        apply(cluster, agentrun("after", thread="after", effects=tmp_path / "b.db"))
        wait_phase(cluster, standby, "after", "Succeeded")
    finally:
        one.stop()
        two.stop()


@pytest.fixture
def impatient_operator(
    cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """An operator with short stop-grace and lost-node timeouts."""
    process = start_operator(
        cluster, tmp_path, AGENTRUN_OPERATOR_STOP_GRACE_SECONDS="3", AGENTRUN_OPERATOR_LOST_NODE_TIMEOUT_SECONDS="2"
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.mark.real_server
def test_a_runner_that_ignores_stop_is_force_deleted(
    cluster: EmulatedCluster,
    kubelet: KubeletThread,
    impatient_operator: OperatorProcess,
    store: str,
    tmp_path: Path,
) -> None:
    apply(cluster, agentrun("frozen", thread="frozen", effects=tmp_path / "e.db", env={"SUPPORT_TOOL_DELAY": "3600"}))
    wait_node(store, "default/frozen", "tools")
    kubelet.pause("frozen-1")  # SIGSTOP: it can no longer see the stop request
    assert cluster.kubectl("patch", "ar", "frozen", "--type", "merge", "-p", '{"spec":{"stop":true}}').returncode == 0
    wait_phase(cluster, impatient_operator, "frozen", "Stopping", timeout=10)
    final = wait_phase(cluster, impatient_operator, "frozen", "Stopped", timeout=30)
    assert final["reason"] == "ForcedStop", final
    cluster.wait_for(lambda: cluster.get("pods", "frozen-1") is None, timeout=30, message="the frozen pod deleted")


def _evict(cluster: EmulatedCluster, kubelet: KubeletThread, pod: str) -> None:
    kubelet.evict(pod)


def _lose_node(cluster: EmulatedCluster, kubelet: KubeletThread, pod: str) -> None:
    kubelet.lose_node(pod)  # phase Unknown; replaced after the (short) lost-node timeout


def _delete_pod(cluster: EmulatedCluster, kubelet: KubeletThread, pod: str) -> None:
    assert cluster.kubectl("delete", "pod", pod, "--wait=false").returncode == 0


@pytest.mark.real_server
@pytest.mark.kubesim_too  # on kubesim a lost node makes the pod Unknown, a path the real server never takes
@pytest.mark.parametrize("disrupt", [_evict, _lose_node, _delete_pod], ids=["eviction", "lost-node", "pod-deleted"])
def test_a_disruption_reschedules_without_counting_a_restart_and_charges_once(
    cluster: EmulatedCluster,
    kubelet: KubeletThread,
    impatient_operator: OperatorProcess,
    store: str,
    tmp_path: Path,
    disrupt: Any,
) -> None:
    effects = tmp_path / "e.db"
    name = disrupt.__name__.strip("_").replace("_", "-")  # one thread per case: the database is per module
    apply(cluster, agentrun(name, thread=name, effects=effects, env={"SUPPORT_TOOL_DELAY": "1.5"}))
    wait_node(store, f"default/{name}", "tools")
    disrupt(cluster, kubelet, f"{name}-1")
    final = wait_phase(cluster, impatient_operator, name, "Succeeded", timeout=60)
    assert final["disruptions"] == 1 and final["restarts"] == 0 and final["attempt"] == 2
    assert count_effects(str(effects))["charges"] == 1


@pytest.mark.real_server
def test_a_gracefully_stopped_leader_hands_over_at_once(
    cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path
) -> None:
    one = start_operator(cluster, tmp_path, identity="op-1")
    try:
        cluster.wait_for(lambda: one.role() == "leader", timeout=20, message="op-1 leads")
        two = start_operator(cluster, tmp_path, identity="op-2")
        try:
            cluster.wait_for(lambda: two.role() == "standby", timeout=20, message="op-2 stands by")
            signalled = time.monotonic()
            one.stop()  # SIGTERM: kopf shuts down, then the lease is released, not left to expire
            exited = time.monotonic()
            assert one.proc.returncode == 0, one.log()[-3000:]
            # Not kopf's 5 s wait for a task left pending (its waiter on our stop flag, __main__.py): the bound is
            # that failure's, the most room it leaves.
            assert exited - signalled < 5, f"SIGTERM to exit took {exited - signalled:.1f}s"
            # Released, not left to expire: once op-1 is gone the Lease names no one (or already op-2). Read
            # from the Lease, not timed: a late read can only see op-2.
            lease = cluster.get("leases", "agentrun-operator")
            assert lease is not None and lease["spec"].get("holderIdentity") in ("", None, "op-2"), lease
            cluster.wait_for(lambda: two.role() == "leader", timeout=30, message="op-2 takes over")
            handover = time.monotonic() - exited
            print(f"graceful handover: {exited - signalled:.1f}s to shut down, {handover:.1f}s to take over")
            assert "released the leader lease" in one.log()
        finally:
            two.stop()
    finally:
        one.stop()


@pytest.mark.real_server
def test_an_operator_watching_one_namespace_leaves_the_others_alone(
    cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path
) -> None:
    assert cluster.kubectl("create", "namespace", "team-a").returncode == 0
    made = cluster.kubectl(
        "create", "secret", "generic", "agentrun-store", "-n", "team-a", f"--from-literal=postgresDsn={store}"
    )
    assert made.returncode == 0, made.stderr
    scoped = start_operator(cluster, tmp_path, AGENTRUN_OPERATOR_NAMESPACES="team-a")
    try:
        apply(cluster, agentrun("mine", thread="mine", effects=tmp_path / "a.db"), namespace="team-a")
        apply(cluster, agentrun("theirs", thread="theirs", effects=tmp_path / "b.db"))
        wait_phase(cluster, scoped, "mine", "Succeeded", namespace="team-a")
        time.sleep(1)
        # The CRD's default only (no reason: no operator wrote it).
        assert status(cluster, "theirs") == {"phase": "Pending"}, "a run outside the watched namespaces was touched"
        assert pods_of(cluster, "theirs") == []
    finally:
        scoped.stop()


# --- one live run per thread: the newer waits ------------------------------------------------------------------------


def _waits_for(cluster: EmulatedCluster, waiter: str, holder: str) -> dict[str, Any]:
    """The waiter is Pending ThreadBusy naming the holder, and has no pod."""
    seen = cluster.wait_for(
        lambda: (s := status(cluster, waiter)).get("reason") == "ThreadBusy" and s,
        timeout=20,
        interval=0.1,
        message=f"{waiter} waiting for the thread (ThreadBusy)",
    )
    assert seen["phase"] == "Pending" and holder in seen["message"], seen
    assert pods_of(cluster, waiter) == [], "GUARANTEE BROKEN: a waiting run got a pod while another holds its thread"
    return seen


def _ran_after(cluster: EmulatedCluster, first: dict[str, Any], second: dict[str, Any]) -> None:
    assert second["startTime"] >= first["completionTime"], (
        f"the waiter started ({second['startTime']}) before the holder ended ({first['completionTime']})"
    )


@pytest.mark.real_server
def test_a_second_run_on_a_running_thread_waits_then_continues_the_thread(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    thread = "busy-thread"
    apply(cluster, agentrun("turn-1", thread=thread, effects=tmp_path / "1.db", env={"SUPPORT_TOOL_DELAY": "2"}))
    wait_node(store, f"default/{thread}", "tools")
    apply(cluster, agentrun("turn-2", thread=thread, effects=tmp_path / "2.db", text="and where is my parcel?"))
    _waits_for(cluster, "turn-2", "turn-1")
    first = wait_phase(cluster, operator, "turn-1", "Succeeded")
    second = wait_phase(cluster, operator, "turn-2", "Succeeded", timeout=60)
    assert second["attempt"] == 1 and second["restarts"] == 0, second
    _ran_after(cluster, first, second)


@pytest.mark.real_server
def test_two_runs_applied_at_once_on_one_thread_run_one_after_the_other(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    thread = "twin-thread"
    runs = [
        agentrun("twin-a", thread=thread, effects=tmp_path / "a.db", env={"SUPPORT_TOOL_DELAY": "1"}),
        agentrun("twin-b", thread=thread, effects=tmp_path / "b.db", env={"SUPPORT_TOOL_DELAY": "1"}),
    ]
    applied = cluster.kubectl("apply", "-n", "default", "-f", "-", input=yaml.safe_dump_all(runs))
    assert applied.returncode == 0, applied.stderr
    # Created together, so which one the operator saw first decides who runs first (see decide/thread.py).
    holder = cluster.wait_for(
        lambda: next((name for name in ("twin-a", "twin-b") if pods_of(cluster, name)), None),
        timeout=20,
        interval=0.1,
        message="one of the twins starts",
    )
    waiter = "twin-b" if holder == "twin-a" else "twin-a"
    _waits_for(cluster, waiter, holder)
    first = wait_phase(cluster, operator, holder, "Succeeded")
    second = wait_phase(cluster, operator, waiter, "Succeeded", timeout=60)
    _ran_after(cluster, first, second)
    assert pods_of(cluster, waiter) == [f"{waiter}-1"]


@pytest.mark.real_server
def test_deleting_the_running_holder_lets_the_waiting_run_take_over_the_thread(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    """Issue 22 item 4: a run deleted mid-node leaves its turn unfinished; the waiter takes the thread over."""
    thread = "orphan-thread"
    apply(cluster, agentrun("holder", thread=thread, effects=tmp_path / "h.db", env={"SUPPORT_TOOL_DELAY": "30"}))
    wait_node(store, f"default/{thread}", "tools")
    apply(cluster, agentrun("waiter", thread=thread, effects=tmp_path / "w.db", text="and where is my parcel?"))
    _waits_for(cluster, "waiter", "holder")
    kubelet.pause("holder-1")  # its runner ignores SIGTERM for a while: its pod stays terminating
    deleted = cluster.kubectl("delete", "ar", "holder", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    blocked = cluster.wait_for(
        lambda: "holder-1" in ((s := status(cluster, "waiter")).get("message") or "") and s,
        timeout=20,
        interval=0.1,
        message="the waiter waits for the deleted run's pod",
    )
    assert blocked["reason"] == "ThreadBusy" and pods_of(cluster, "waiter") == [], blocked
    kubelet.resume("holder-1")
    final = wait_phase(cluster, operator, "waiter", "Succeeded", timeout=90)
    assert final["attempt"] == 1 and final["restarts"] == 0, final
    assert "was deleted; closed by run waiter" in kubelet.logs("waiter-1"), kubelet.logs("waiter-1")[-2000:]
    after = progress(store, f"default/{thread}")
    assert after is not None and after.status == "completed", after
    apply(cluster, agentrun("next", thread=thread, effects=tmp_path / "n.db", text="thanks, one more question"))
    wait_phase(cluster, operator, "next", "Succeeded", timeout=60)


@pytest.mark.real_server
def test_a_new_run_for_the_next_turn_of_a_finished_thread_starts_and_succeeds(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    thread = "next-turn"
    apply(cluster, agentrun("turn-one", thread=thread, effects=tmp_path / "1.db"))
    wait_phase(cluster, operator, "turn-one", "Succeeded")
    before = progress(store, f"default/{thread}")
    apply(
        cluster,
        agentrun("turn-two", thread=thread, effects=tmp_path / "2.db", restartPolicy={"maxRestarts": 0}),
    )
    final = wait_phase(cluster, operator, "turn-two", "Succeeded", timeout=60)
    assert final["attempt"] == 1 and final.get("reason") == "Completed", final
    after = progress(store, f"default/{thread}")
    assert before is not None and after is not None and after.version > before.version, (
        "the second AgentRun must continue the thread in the store"
    )
