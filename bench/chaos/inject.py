"""How each fault is done to the world: real signals to real processes, real server restarts.

Runner faults go through kubesim's kubelet (``kill``, ``evict``, ``lose_node``), as a
node would do them. Two need more than its public face, and reach into its pod
records (``Kubelet.pods``), which is why they live here and not in kubesim:

- ``partition``: the runner is frozen (SIGSTOP) and its node stops reporting (phase
  Unknown, NodeLost) while the process stays alive: a network partition, where
  ``lose_node`` kills the process. The kubelet forgets the process, so the operator's
  force delete cannot reach it (a partitioned node never hears of it); the campaign
  thaws it later (SIGCONT) and must kill it in the end.
- ``pods_alive``: which runner processes are alive now, for the duplicate-pod watch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubesim import ApiResponse, EmulatedCluster, KubeletThread

from .world import NAMESPACE, World

STRATEGIC = "application/strategic-merge-patch+json"


@dataclass
class Zombie:
    """A partitioned runner: alive, frozen, out of the kubelet's reach."""

    pod: str
    process: subprocess.Popen[bytes]

    def thaw(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)

    def exit_code(self, timeout: float) -> int | None:
        """The zombie's exit status once it ends by itself, else None (Popen.wait: safe beside the kubelet's)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)  # reaped here too: the kubelet no longer waits for it


def pods_alive(kubelet: KubeletThread) -> list[str]:
    """Names of the pods whose runner process runs now (a partitioned one is not the kubelet's any more)."""
    for _ in range(5):
        try:
            runtimes = list(kubelet.kubelet.pods.values())
            break
        except RuntimeError:  # the kubelet's loop added a pod while we copied
            continue
    else:
        return []
    return [r.name for r in runtimes if r.process is not None and r.exit_code is None and not r.lost]


def pod_pid(kubelet: KubeletThread, pod: str) -> int | None:
    try:
        return kubelet.pid(pod, NAMESPACE)
    except KeyError:
        return None


def partition(kubelet: KubeletThread, pod: str) -> Zombie | None:
    """SIGSTOP the pod's runner and take it out of the kubelet's hands; None when it has no live process.

    The caller then reports the node unreachable (``node_unreachable``) and owns the zombie: it must
    thaw or kill it whatever happens next.
    """
    runtime = kubelet.kubelet.runtime(pod, NAMESPACE)
    process = runtime.process
    if process is None or runtime.exit_code is not None or not _waited_for(kubelet, pod):
        return None
    try:
        os.killpg(process.pid, signal.SIGSTOP)
    except ProcessLookupError:
        return None
    runtime.lost = True  # the kubelet neither reports this pod any more nor acts on its deletion
    runtime.process = None
    return Zombie(pod, process)


def _waited_for(kubelet: KubeletThread, pod: str) -> bool:
    """Whether the kubelet has reported the container running, and so waits on the process: only then may
    the process be taken from it (its pod worker reads ``runtime.process`` once more, right after that report)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        runtime = kubelet.kubelet.runtime(pod, NAMESPACE)
        if runtime.exit_code is not None or runtime.process is None:
            return False
        statuses = (runtime.pod.get("status") or {}).get("containerStatuses") or [{}]
        if "running" in (statuses[0].get("state") or {}):
            time.sleep(0.3)  # the report is in the API; the worker now evaluates process.wait
            return runtime.exit_code is None
        time.sleep(0.1)
    return False


def node_unreachable(cluster: EmulatedCluster, kubelet: KubeletThread, pod: str) -> None:
    """The pod's status as the node lifecycle controller leaves it when its node stops reporting."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "status": {
            "phase": "Unknown",
            "reason": "NodeLost",
            "message": f"Node {kubelet.kubelet.node_name} which was running pod {pod} is unresponsive",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NodeLost",
                    "lastTransitionTime": stamp,
                    "lastProbeTime": None,
                }
            ],
        }
    }
    call(cluster, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/status", body, content_type=STRATEGIC)


def call(
    cluster: EmulatedCluster, method: str, path: str, body: Any, *, content_type: str = "application/json"
) -> ApiResponse:
    """One API request, retried while the loaded emulator does not answer in time (a 409 is an answer)."""
    for attempt in range(5):
        try:
            return cluster.api(method, path, body, content_type=content_type, timeout=20)
        except OSError:  # urllib's timeout and connection errors
            if attempt == 4:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


class Globals:
    """The world-wide faults, one at a time each (two trials never restart PostgreSQL together)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.postgres = threading.Lock()
        self.redis = threading.Lock()
        self.operator = threading.Lock()

    def restart_postgres(self, down: float) -> str:
        with self.postgres:
            self.world.postgres.stop()
            time.sleep(down)
            self.world.postgres.start()
        return f"PostgreSQL stopped (pg_ctl -m fast) for {down:.2f}s, then started"

    def restart_redis(self, down: float) -> str:
        with self.redis:
            self.world.redis.stop()
            time.sleep(down)
            self.world.redis.start()
        return f"redis-server shut down for {down:.2f}s, then started on the same port"

    def kill_leader(self) -> str | None:
        with self.operator:
            # Right after another trial's kill the Lease is in transit (up to its 5 s): wait for the next leader.
            deadline = time.monotonic() + 15
            while (leader := self.world.leader()) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if leader is None:
                return None
            leader.proc.send_signal(signal.SIGKILL)
            leader.proc.wait(timeout=30)
            return f"SIGKILL to the leader {leader.identity} (the other replica takes the Lease; a new one replaces it)"
