"""The kubelet stand-in: pods run as real processes, with real signals and kubelet-shaped status."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from kubesim import EmulatedCluster, KubeletThread
from kubesim.testing import python_pod, terminated

# A process that reports readiness, then records the SIGTERM it gets and exits like a preempted runner (6).
PREEMPTIBLE = """
import pathlib, signal, sys, time
def on_term(*_):
    pathlib.Path({marker!r}).write_text("SIGTERM")
    sys.exit(6)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""
PODS = "/api/v1/namespaces/default/pods"
WIDGETS = "/apis/kubesim.dev/v1/namespaces/default/widgets"
SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
)


def create_pod(cluster: EmulatedCluster, pod: dict[str, Any], namespace: str = "default") -> None:
    response = cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert response.status == 201, response.body


def wait_pod(cluster: EmulatedCluster, name: str, phase: str, timeout: float = 15) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = cluster.get("pods", name)
        return pod if pod is not None and pod.get("status", {}).get("phase") == phase else None

    return cluster.wait_for(check, timeout=timeout, message=f"pod {name} in phase {phase}")


def wait_ready(kubelet: KubeletThread, cluster: EmulatedCluster, name: str) -> None:
    """Running, and the process has installed its handlers (it prints "ready")."""
    wait_pod(cluster, name, "Running")
    cluster.wait_for(lambda: "ready" in kubelet.logs(name), message=f"{name} printed ready")


def wait_gone(cluster: EmulatedCluster, name: str, timeout: float = 15) -> list[dict[str, Any] | None]:
    cluster.wait_for(lambda: cluster.get("pods", name) is None, timeout=timeout, message=f"pod {name} removed")
    return cluster.history("pods", name)


def last_state(history: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The last stored version of a pod before its removal (what a controller last sees)."""
    versions = [v for v in history if v is not None]
    return versions[-1]


def test_pod_reads_a_secret_through_its_env_and_succeeds(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    secret = {"metadata": {"name": "app-store"}, "stringData": {"postgresDsn": "postgresql://db/app"}}
    assert cluster.api("POST", "/api/v1/namespaces/default/secrets", secret).status == 201
    assert (
        cluster.api(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            {"metadata": {"name": "settings"}, "data": {"region": "eu-west-1"}},
        ).status
        == 201
    )
    env: list[dict[str, Any]] = [
        {"name": "STORE_DSN", "valueFrom": {"secretKeyRef": {"name": "app-store", "key": "postgresDsn"}}},
        {"name": "REGION", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "region"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "GREETING", "value": "$(POD_NAME) in $(REGION)"},
    ]
    script = "import os; print('|'.join(os.environ[k] for k in ('STORE_DSN', 'REGION', 'GREETING')))"
    create_pod(cluster, python_pod("reader-1", script, env=env))
    pod = wait_pod(cluster, "reader-1", "Succeeded")
    state = terminated(pod)
    assert state is not None and (state["exitCode"], state["reason"]) == (0, "Completed")
    assert state["startedAt"] and state["finishedAt"]
    assert kubelet.logs("reader-1").strip() == "postgresql://db/app|eu-west-1|reader-1 in eu-west-1"
    assert kubelet.log_path("reader-1").is_file()
    assert pod["spec"]["nodeName"] == "emulated-node"
    ready = {c["type"]: c for c in pod["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "PodCompleted")
    phases = [v["status"].get("phase") for v in cluster.history("pods", "reader-1") if v is not None]
    assert phases.index("Pending") < phases.index("Running") < phases.index("Succeeded"), phases


def test_nonzero_exit_fails_the_pod_with_the_exit_code(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    create_pod(cluster, python_pod("interrupted-1", "import sys; sys.exit(3)"))
    state = terminated(wait_pod(cluster, "interrupted-1", "Failed"))
    assert state is not None and (state["exitCode"], state["reason"]) == (3, "Error")
    assert "Error" in cluster.kubectl("get", "pod", "interrupted-1").stdout


def test_sigkill_is_reported_as_exit_137(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    create_pod(cluster, python_pod("crash-1", SLEEPER))
    wait_ready(kubelet, cluster, "crash-1")
    pid = kubelet.pid("crash-1")
    kubelet.kill("crash-1")
    state = terminated(wait_pod(cluster, "crash-1", "Failed"))
    assert state is not None and (state["exitCode"], state["reason"]) == (137, "Error")
    assert pid is not None and not _alive(pid)


def test_oom_kill_is_reported_as_oomkilled(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    create_pod(cluster, python_pod("oom-1", SLEEPER))
    wait_ready(kubelet, cluster, "oom-1")
    kubelet.oom_kill("oom-1")
    state = terminated(wait_pod(cluster, "oom-1", "Failed"))
    assert state is not None and (state["exitCode"], state["reason"]) == (137, "OOMKilled")
    assert "OOMKilled" in cluster.kubectl("get", "pod", "oom-1").stdout


def test_eviction_marks_disruption_target_sends_sigterm_and_removes_the_pod(
    cluster: EmulatedCluster, kubelet: KubeletThread, tmp_path: Path
) -> None:
    marker = tmp_path / "evicted"
    create_pod(cluster, python_pod("evicted-1", PREEMPTIBLE.format(marker=str(marker)), grace=10))
    wait_ready(kubelet, cluster, "evicted-1")
    kubelet.evict("evicted-1")
    last = last_state(wait_gone(cluster, "evicted-1"))
    assert marker.read_text() == "SIGTERM", "the evicted process did not get SIGTERM"
    disruption = {c["type"]: c for c in last["status"]["conditions"]}.get("DisruptionTarget")
    assert disruption is not None, "no DisruptionTarget condition on the evicted pod"
    assert (disruption["status"], disruption["reason"]) == ("True", "EvictionByEvictionAPI")
    state = terminated(last)
    assert state is not None and state["exitCode"] == 6, "the preempted process's exit code was not reported"
    assert last["metadata"]["deletionTimestamp"]
    assert kubelet.signals("evicted-1")[-1] == signal.SIGTERM, "SIGKILL was sent although the process exited"


def test_node_pressure_eviction_keeps_a_failed_pod_with_reason_evicted(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    create_pod(cluster, python_pod("pressure-1", SLEEPER))
    wait_ready(kubelet, cluster, "pressure-1")
    kubelet.evict("pressure-1", node_pressure=True)
    pod = wait_pod(cluster, "pressure-1", "Failed")
    assert pod["status"]["reason"] == "Evicted" and "low on resource" in pod["status"]["message"]
    disruption = {c["type"]: c for c in pod["status"]["conditions"]}["DisruptionTarget"]
    assert disruption["reason"] == "TerminationByKubelet"
    state = terminated(pod)
    assert state is not None and state["exitCode"] == 137


def test_delete_with_grace_period_sends_sigterm_first(
    cluster: EmulatedCluster, kubelet: KubeletThread, tmp_path: Path
) -> None:
    marker = tmp_path / "terminated"
    create_pod(cluster, python_pod("graceful-1", PREEMPTIBLE.format(marker=str(marker)), grace=10))
    wait_ready(kubelet, cluster, "graceful-1")
    result = cluster.kubectl("delete", "pod", "graceful-1", "--wait=false")
    assert result.returncode == 0, result.stderr
    last = last_state(wait_gone(cluster, "graceful-1"))
    assert marker.read_text() == "SIGTERM"
    state = terminated(last)
    assert state is not None and state["exitCode"] == 6
    assert last["metadata"]["deletionGracePeriodSeconds"] == 10
    assert kubelet.signals("graceful-1") == [signal.SIGCONT, signal.SIGTERM]


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    create_pod(cluster, python_pod("stubborn-1", STUBBORN, grace=1))
    wait_ready(kubelet, cluster, "stubborn-1")
    started = time.monotonic()
    assert cluster.api("DELETE", f"{PODS}/stubborn-1").status == 200
    state = terminated(last_state(wait_gone(cluster, "stubborn-1")))
    assert time.monotonic() - started >= 1.0, "SIGKILL came before the grace period was over"
    assert state is not None and state["exitCode"] == 137
    assert kubelet.signals("stubborn-1")[-2:] == [signal.SIGTERM, signal.SIGKILL]


def test_missing_secret_keeps_the_pod_pending_with_create_container_config_error(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    env = [{"name": "DSN", "valueFrom": {"secretKeyRef": {"name": "late-store", "key": "postgresDsn"}}}]
    create_pod(cluster, python_pod("late-1", "import os; print(os.environ['DSN'])", env=env))

    def waiting() -> dict[str, Any] | None:
        pod = cluster.get("pods", "late-1")
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        found: dict[str, Any] | None = statuses[0].get("state", {}).get("waiting")
        return found

    state = cluster.wait_for(
        lambda: (w := waiting()) and w["reason"] == "CreateContainerConfigError" and w,
        message="CreateContainerConfigError",
    )
    assert state["message"] == 'secret "late-store" not found'
    pod = cluster.get("pods", "late-1")
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert "CreateContainerConfigError" in cluster.kubectl("get", "pod", "late-1").stdout

    assert (
        cluster.api(
            "POST",
            "/api/v1/namespaces/default/secrets",
            {"metadata": {"name": "late-store"}, "stringData": {"other": "x"}},
        ).status
        == 201
    )
    cluster.wait_for(
        lambda: (w := waiting()) and "couldn't find key postgresDsn" in w.get("message", ""),
        message="missing key reported",
    )
    assert (
        cluster.api(
            "PATCH",
            "/api/v1/namespaces/default/secrets/late-store",
            {"stringData": {"postgresDsn": "postgresql://late"}},
            content_type="application/merge-patch+json",
        ).status
        == 200
    )
    wait_pod(cluster, "late-1", "Succeeded")
    assert kubelet.logs("late-1").strip() == "postgresql://late"


def test_lost_node_reports_unknown_kills_the_process_and_needs_a_force_delete(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    create_pod(cluster, python_pod("lost-1", SLEEPER, grace=1))
    wait_ready(kubelet, cluster, "lost-1")
    pid = kubelet.pid("lost-1")
    kubelet.lose_node("lost-1")
    pod = wait_pod(cluster, "lost-1", "Unknown")
    assert pod["status"]["reason"] == "NodeLost"
    assert pid is not None
    cluster.wait_for(lambda: not _alive(pid), message="the process on the lost node is gone")
    assert cluster.api("DELETE", f"{PODS}/lost-1").status == 200
    time.sleep(1.5)  # longer than the grace period: nobody confirms the deletion
    stuck = cluster.get("pods", "lost-1")
    assert stuck is not None and stuck["metadata"]["deletionTimestamp"]
    assert "Unknown" in cluster.kubectl("get", "pod", "lost-1").stdout
    assert cluster.kubectl("delete", "pod", "lost-1", "--force", "--grace-period=0").returncode == 0
    assert cluster.get("pods", "lost-1") is None


def test_pause_stops_the_process_and_resume_continues_it(
    cluster: EmulatedCluster, kubelet: KubeletThread, tmp_path: Path
) -> None:
    ticks = tmp_path / "ticks"
    script = (
        f"import pathlib, time\nprint('ready', flush=True)\nfor i in range(40):\n"
        f"    pathlib.Path({str(ticks)!r}).write_text(str(i)); time.sleep(0.05)"
    )
    create_pod(cluster, python_pod("paused-1", script))
    wait_ready(kubelet, cluster, "paused-1")
    kubelet.pause("paused-1")
    time.sleep(0.2)
    frozen = ticks.read_text()
    time.sleep(0.4)
    assert ticks.read_text() == frozen, "the paused process kept running"
    kubelet.resume("paused-1")
    wait_pod(cluster, "paused-1", "Succeeded")
    assert ticks.read_text() == "39"


def test_node_selector_that_matches_no_node_leaves_the_pod_unschedulable(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    create_pod(cluster, python_pod("gpu-1", "pass", nodeSelector={"accelerator": "h100"}))

    def scheduled() -> dict[str, Any] | None:
        pod = cluster.get("pods", "gpu-1") or {}
        return {c["type"]: c for c in pod.get("status", {}).get("conditions") or []}.get("PodScheduled")

    condition = cluster.wait_for(scheduled, message="PodScheduled condition")
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    pod = cluster.get("pods", "gpu-1")
    assert pod is not None and not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"


def test_deleting_an_owner_terminates_and_collects_its_running_pod(
    cluster: EmulatedCluster, kubelet: KubeletThread, tmp_path: Path
) -> None:
    widget = {"apiVersion": "kubesim.dev/v1", "kind": "Widget", "metadata": {"name": "owner"}, "spec": {"owner": "me"}}
    owner = cluster.api("POST", WIDGETS, widget).body
    marker = tmp_path / "collected"
    create_pod(cluster, python_pod("owner-1", PREEMPTIBLE.format(marker=str(marker)), grace=5, owner=owner))
    wait_ready(kubelet, cluster, "owner-1")
    assert cluster.kubectl("delete", "widget", "owner").returncode == 0
    wait_gone(cluster, "owner-1")
    assert marker.read_text() == "SIGTERM", "the garbage-collected pod was not terminated gracefully"
    assert cluster.api("GET", f"{WIDGETS}/owner").status == 404


def test_a_command_that_does_not_exist_fails_the_pod(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    pod = python_pod("typo-1", "pass")
    pod["spec"]["containers"][0]["command"] = ["no-such-binary-kubesim"]
    create_pod(cluster, pod)
    state = terminated(wait_pod(cluster, "typo-1", "Failed"))
    assert state is not None and (state["exitCode"], state["reason"]) == (128, "StartError")


def test_kubectl_get_pods_shows_kubelet_states(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    create_pod(cluster, python_pod("running-1", SLEEPER))
    create_pod(cluster, python_pod("done-1", "pass"))
    wait_ready(kubelet, cluster, "running-1")
    wait_pod(cluster, "done-1", "Succeeded")
    rows = {line.split()[0]: line.split()[1:3] for line in cluster.kubectl("get", "pods").stdout.splitlines()[1:]}
    assert rows == {"running-1": ["1/1", "Running"], "done-1": ["0/1", "Completed"]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kubectl_logs_reads_the_pod_output_through_the_api(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    create_pod(cluster, python_pod("chatty-1", "print('line 1'); print('line 2', flush=True)"))
    wait_pod(cluster, "chatty-1", "Succeeded")
    result = cluster.kubectl("logs", "chatty-1")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "line 1\nline 2\n"
    assert cluster.kubectl("logs", "chatty-1", "--tail=1").stdout == "line 2\n"


def test_kubectl_logs_follow_streams_until_the_process_ends(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    script = "import time\nfor i in range(3):\n    print(f'tick {i}', flush=True); time.sleep(0.3)"
    create_pod(cluster, python_pod("ticker-1", script))
    wait_pod(cluster, "ticker-1", "Running")
    result = cluster.kubectl("logs", "-f", "ticker-1", timeout=20)
    assert result.stdout == "tick 0\ntick 1\ntick 2\n", result.stderr


def waiting_state(cluster: EmulatedCluster, name: str) -> dict[str, Any]:
    pod = cluster.get("pods", name)
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    found: dict[str, Any] = statuses[0].get("state", {}).get("waiting") or {}
    return found


def test_a_missing_command_is_a_start_error_with_runcs_message(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    pod = python_pod("nocmd-1", "pass")
    pod["spec"]["containers"][0]["command"] = ["no-such-binary-kubesim"]
    create_pod(cluster, pod)
    state = terminated(wait_pod(cluster, "nocmd-1", "Failed"))
    assert state is not None and (state["exitCode"], state["reason"]) == (128, "StartError")
    assert state["message"] == (
        "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
        'failed: unable to start container process: exec: "no-such-binary-kubesim": executable file not found '
        "in $PATH: unknown"
    )


def test_an_environment_string_over_128_kib_is_a_start_error(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    """Linux caps one environment string at 128 KiB (MAX_ARG_STRLEN): exec fails with E2BIG."""
    create_pod(cluster, python_pod("e2big-1", "pass", env=[{"name": "AGENTRUN_INPUT", "value": "x" * 140_000}]))
    state = terminated(wait_pod(cluster, "e2big-1", "Failed"))
    assert state is not None and (state["exitCode"], state["reason"]) == (128, "StartError")
    assert state["message"].startswith("failed to create containerd task: failed to create shim task: ")
    assert state["message"].endswith("python: argument list too long: unknown"), state["message"]
    assert kubelet.pid("e2big-1") is None, "no process may exist for a container that could not start"


def test_an_invalid_image_name_waits_with_invalid_image_name(cluster: EmulatedCluster, kubelet: KubeletThread) -> None:
    pod = python_pod("badname-1", "pass")
    pod["spec"]["containers"][0]["image"] = "Kubesim:Test"
    create_pod(cluster, pod)
    state = cluster.wait_for(
        lambda: (w := waiting_state(cluster, "badname-1")).get("reason") == "InvalidImageName" and w,
        message="InvalidImageName",
    )
    assert state["message"] == (
        'Failed to apply default image tag "Kubesim:Test": couldn\'t parse image name "Kubesim:Test": '
        "invalid reference format: repository name must be lowercase"
    )
    current = cluster.get("pods", "badname-1")
    assert current is not None and current["status"]["phase"] == "Pending"
    assert kubelet.pid("badname-1") is None
    assert "InvalidImageName" in cluster.kubectl("get", "pod", "badname-1").stdout
    assert cluster.kubectl("delete", "pod", "badname-1", "--wait=true", timeout=30).returncode == 0


def test_an_image_that_cannot_be_pulled_backs_off_until_it_exists(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    pod = python_pod("nopull-1", "print('pulled at last')")
    pod["spec"]["containers"][0]["image"] = "registry.invalid/agents/nosuch:1"
    create_pod(cluster, pod)
    pulled = cluster.wait_for(
        lambda: (w := waiting_state(cluster, "nopull-1")).get("reason") == "ErrImagePull" and w,
        message="ErrImagePull",
    )
    assert pulled["message"] == (
        'rpc error: code = NotFound desc = failed to pull and unpack image "registry.invalid/agents/nosuch:1": '
        'failed to resolve reference "registry.invalid/agents/nosuch:1": registry.invalid/agents/nosuch:1: not found'
    )
    backoff = cluster.wait_for(
        lambda: (w := waiting_state(cluster, "nopull-1")).get("reason") == "ImagePullBackOff" and w,
        message="ImagePullBackOff",
    )
    assert backoff["message"] == 'Back-off pulling image "registry.invalid/agents/nosuch:1"'
    assert kubelet.pid("nopull-1") is None
    events = cluster.api("GET", "/api/v1/namespaces/default/events").body["items"]
    assert any(e["reason"] == "Failed" and "Failed to pull image" in e["message"] for e in events)

    kubelet.kubelet.known_images.add("registry.invalid/agents/*")  # "pushed": the next pull succeeds
    wait_pod(cluster, "nopull-1", "Succeeded", timeout=20)
    assert "pulled at last" in kubelet.logs("nopull-1")


def test_known_images_match_by_normalized_reference() -> None:
    from kubesim.kubelet import Kubelet

    node = Kubelet("http://127.0.0.1:1", workdir=Path("/nonexistent"), known_images=["python:3.11", "ghcr.io/x/*"])
    assert node._known("docker.io/library/python:3.11") and node._known("python:3.11")
    assert node._known("ghcr.io/x/runner:2") and not node._known("python:3.12") and not node._known("x:1")


# A pod that holds on until its go-file exists, then exits with 3.
HOLD = """
import os, time
print('ready', flush=True)
while not os.path.exists({go!r}):
    time.sleep(0.1)
raise SystemExit(3)
"""


def test_every_pod_exit_is_seen_with_fifty_pods_alive(
    cluster: EmulatedCluster, kubelet: KubeletThread, tmp_path: Path
) -> None:
    """Issue 22 item 8: each pod's process has a watcher of its own. With waits on a shared pool (6
    threads here, 32 at most), the 40 pods that hold on would take every thread and the exits of
    the last 10 would go unseen."""
    names = [f"many-{i}" for i in range(50)]
    for i, name in enumerate(names):
        create_pod(cluster, python_pod(name, HOLD.format(go=str(tmp_path / f"go-{i}"))))
    for name in names:
        wait_ready(kubelet, cluster, name)
    for i in range(40, 50):
        (tmp_path / f"go-{i}").touch()
    for name in names[40:]:
        state = terminated(wait_pod(cluster, name, "Failed", timeout=10))
        assert state is not None and state["exitCode"] == 3, f"{name}'s exit was not reported: {state}"
    assert all(cluster.get("pods", n)["status"]["phase"] == "Running" for n in names[:40])  # type: ignore[index]
    for i in range(40):
        (tmp_path / f"go-{i}").touch()
    for name in names[:40]:
        wait_pod(cluster, name, "Failed", timeout=10)


def test_kubectl_logs_of_a_pod_not_started_is_empty_unbound_and_waiting_once_bound(
    cluster: EmulatedCluster, kubelet: KubeletThread
) -> None:
    """As kube-apiserver answers (test_real.py): no node, no location, an empty log; on a node, the
    kubelet's "waiting to start"."""
    create_pod(cluster, python_pod("nowhere", "print(1)", nodeSelector={"disk": "none"}))
    unbound = cluster.kubectl("logs", "nowhere")
    assert (unbound.returncode, unbound.stdout) == (0, ""), unbound.stderr
    pod = python_pod("unpullable", "print(1)")
    pod["spec"]["containers"][0]["image"] = "registry.example/absent:1"
    create_pod(cluster, pod)
    cluster.wait_for(
        lambda: "is waiting to start" in cluster.kubectl("logs", "unpullable").stderr,
        message="kubectl logs says the container waits",
    )
    waiting = cluster.kubectl("logs", "unpullable")
    assert waiting.returncode == 1
    assert 'container "main" in pod "unpullable" is waiting to start: ' in waiting.stderr, waiting.stderr
