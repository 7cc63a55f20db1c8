"""What the node tier's fault scenarios (``test_faults.py``) share: their image, their effects, a pod watch.

- The fault graph (``fault_graphs.py``) must be importable inside the runner container, and only the
  image's own files are (a runner pod gets no volume of ours): ``fault_image_archive()`` builds
  ``localhost/agentrun-faults:dev`` FROM the runtime image with that one file added as
  ``/app/node_faults.py`` (podman, no network, never pulls), saved as an OCI archive next to
  ``make image``'s and rebuilt only when the file or the runtime image changed;
  ``import_fault_image()`` loads it into the node's containerd, as the node loads the others.
- Effects are counted outside the container: ``node_effects`` rows in the runs' PostgreSQL, which the
  runner reaches with its own store DSN (no password in any spec); gates in ``node_gates``.
- ``PodWatch``: ``kubectl get pods -w`` kept running, so a pod's last states (its exit code, its
  DisruptionTarget condition) are seen even when the pod is deleted a moment later.
- ``WitnessNode``: the rest of a cluster, for a lost node to be tainted at all (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from kubesim.real import RealControlPlane
    from tests.node.conftest import Images
    from tests.node.support import InstalledChart

HERE = Path(__file__).resolve().parent
GRAPH_FILE = HERE / "fault_graphs.py"
FAULT_IMAGE = "localhost/agentrun-faults:dev"
GRAPH = "node_faults:app"
EFFECTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS node_effects (
    id bigserial PRIMARY KEY, label text NOT NULL, tool text NOT NULL, attempt int NOT NULL,
    idempotency_key text, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS node_gates (label text PRIMARY KEY);
GRANT SELECT, INSERT ON node_effects, node_gates TO {role};
GRANT USAGE ON SEQUENCE node_effects_id_seq TO {role};
"""


class FaultImageError(RuntimeError):
    """The fault image could not be built or loaded; the message holds the tool's words."""


def _podman(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise FaultImageError(f"podman {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def fault_image_archive(images: Images) -> Path:
    """The OCI archive of ``FAULT_IMAGE`` in ``images.cache``, built when its inputs changed."""
    archive = images.cache / "agentrun-faults.oci.tar"
    stamp = images.cache / "agentrun-faults.sha256"
    runtime_id = _podman("image", "inspect", "--format", "{{.Id}}", images.runtime)
    digest = hashlib.sha256(GRAPH_FILE.read_bytes() + runtime_id.encode()).hexdigest()
    with open(images.cache / ".faults.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions may build at once
        if archive.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
            return archive
        with tempfile.TemporaryDirectory(prefix="agentrun-faults-") as context:
            shutil.copy(GRAPH_FILE, Path(context) / "node_faults.py")
            (Path(context) / "Containerfile").write_text(
                f"FROM {images.runtime}\nCOPY node_faults.py /app/node_faults.py\n"
            )
            _podman("build", "--pull=never", "--network", "none", "--tag", FAULT_IMAGE, context)
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        _podman("save", "--quiet", "--format", "oci-archive", "--output", str(partial), FAULT_IMAGE)
        partial.replace(archive)
        stamp.write_text(digest + "\n")
    return archive


def import_fault_image(chart: InstalledChart, archive: Path) -> None:
    """Load the archive into the node's containerd (its base layers are there already)."""
    base = FAULT_IMAGE.rsplit(":", 1)[0]
    done = chart.node.ctr("images", "import", f"--base-name={base}", str(archive), timeout=600)
    if done.returncode != 0:
        raise FaultImageError(f"ctr images import {archive} failed: {done.stderr.strip()[-1000:]}")
    listed = chart.node.ctr("images", "list", "--quiet").stdout.split()
    if FAULT_IMAGE not in listed:
        raise FaultImageError(f"{archive} holds no image named {FAULT_IMAGE}: {listed}")


# --- effects -------------------------------------------------------------------------------------------------


async def _sql(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(dsn, timeout=30)
    try:
        if args:
            return list(await connection.fetch(query, *args))
        await connection.execute(query)
        return []
    finally:
        await connection.close()


def prepare_effects(chart: InstalledChart, role: str) -> None:
    """The effects and gates tables in the runs' database, writable by the runners' role."""
    asyncio.run(_sql(chart.store.dsn, EFFECTS_SCHEMA.format(role=role)))


def effects(chart: InstalledChart, label: str) -> list[tuple[str, int]]:
    """``(tool, attempt)`` of every execution recorded under ``label``, in order."""
    rows = asyncio.run(
        _sql(chart.store.dsn, "SELECT tool, attempt FROM node_effects WHERE label = $1 ORDER BY id", label)
    )
    return [(row["tool"], row["attempt"]) for row in rows]


def open_gate(chart: InstalledChart, label: str) -> None:
    """Let the label's ``wait_for_gate`` return."""
    query = "INSERT INTO node_gates (label) VALUES ($1) ON CONFLICT DO NOTHING RETURNING label"
    asyncio.run(_sql(chart.store.dsn, query, label))


def fault_run(name: str, label: str, calls: list[list[Any]], **spec: Any) -> dict[str, Any]:
    """An AgentRun of the fault graph: one tools node making ``calls`` (``[tool, {arguments}]``)."""
    request = json.dumps({"label": label, "calls": calls})
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "graph": GRAPH,
            "image": FAULT_IMAGE,
            "threadId": name,
            "input": {"messages": [{"role": "user", "content": request}]},
            **spec,
        },
    }


def apply(chart: InstalledChart, namespace: str, manifest: dict[str, Any]) -> None:
    """``kubectl apply -f -``, as a user does."""
    done = chart.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    assert done.returncode == 0, done.stderr


# --- watching pods -------------------------------------------------------------------------------------------


class PodWatch:
    """``kubectl get pods -w --output-watch-events -o json`` in a namespace, every event kept."""

    def __init__(self, chart: InstalledChart, namespace: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._proc = chart.plane.kubectl_popen(
            "get", "pods", "-n", namespace, "--watch", "--output-watch-events", "-o", "json"
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self._proc.stdout:
            buffer += line
            with contextlib.suppress(ValueError):
                event, end = decoder.raw_decode(buffer.lstrip())
                buffer = buffer.lstrip()[end:]
                with self._lock:
                    self.events.append((event["type"], event["object"]))

    def states(self, pod: str) -> list[dict[str, Any]]:
        """Every version of ``pod`` seen, oldest first."""
        with self._lock:
            return [obj for _, obj in self.events if obj["metadata"]["name"] == pod]

    def terminated(self, pod: str) -> dict[str, Any] | None:
        """The last ``terminated`` state seen of the pod's container (exit code, reason, message)."""
        found = None
        for obj in self.states(pod):
            for status in obj.get("status", {}).get("containerStatuses") or []:
                found = (status.get("state") or {}).get("terminated") or found
        return found

    def condition(self, pod: str, kind: str) -> dict[str, Any] | None:
        """The last condition ``kind`` seen on the pod."""
        found = None
        for obj in self.states(pod):
            for condition in obj.get("status", {}).get("conditions") or []:
                if condition["type"] == kind:
                    found = condition
        return found

    def stop(self) -> None:
        """End the watch (the kubectl this object started)."""
        if self._proc.poll() is None:
            self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(10)
        self._reader.join(10)
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def watching(chart: InstalledChart, namespace: str) -> Iterator[PodWatch]:
    """A ``PodWatch`` for the block."""
    watch = PodWatch(chart, namespace)
    try:
        yield watch
    finally:
        watch.stop()


# --- the rest of a cluster -----------------------------------------------------------------------------------


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class WitnessNode:
    """A second Node, Ready and cordoned, whose heartbeat (its Lease in ``kube-node-lease``) the test renews.

    Why: the node lifecycle controller computes a zone's state from its nodes' Ready conditions, and when
    every node of every zone is NotReady it enters "master disruption mode" (it takes that for its own
    disconnection): it removes the NoExecute taints and stops tainting (``handleDisruption`` in
    pkg/controller/nodelifecycle). On a one-node cluster whether a lost node is tainted at all is then a
    race: its taint, queued in the same pass, is kept only when the tainting loop applies it after the
    removal (seen here: "Entering master disruption mode", and the pods deleted 10 s later anyway). A
    real cluster has other nodes; this one stands in for them, and the controller stays in its normal
    mode. It takes no pod: it is unschedulable (the scheduler skips it), and nothing runs behind it.
    """

    RENEW_SECONDS = 2.0

    def __init__(self, plane: RealControlPlane, name: str = "agentrun-witness") -> None:
        self.plane, self.name = plane, name
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name=f"{name}-lease", daemon=True)

    def __enter__(self) -> WitnessNode:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name}},
            "spec": {"unschedulable": True},
        }
        made = self.plane.api("POST", "/api/v1/nodes", node)
        assert made.status == 201, made
        now = _micro_time().split(".")[0] + "Z"
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "a witness of the test"}
        ready |= {"lastHeartbeatTime": now, "lastTransitionTime": now}
        patched = self.plane.api(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": {"conditions": [ready]}},
            content_type="application/merge-patch+json",
        )
        assert patched.status == 200, patched
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": _micro_time()},
        }
        made = self.plane.api("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
        assert made.status == 201, made
        self._renewer.start()
        return self

    def _renew(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        while not self._stop.wait(self.RENEW_SECONDS):
            with contextlib.suppress(OSError):
                body = {"spec": {"renewTime": _micro_time()}}
                self.plane.api("PATCH", path, body, content_type="application/merge-patch+json")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._renewer.join(10)
        self.plane.api("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}")
        self.plane.api("DELETE", f"/api/v1/nodes/{self.name}")
