"""Runner pods on the real node (issue 35 item 5), side by side with the process kubelet, in one run.

``python -m bench.node`` (``make bench``) measures the same runs twice:

- ``node``: the real node (``kubesim.node``: kubelet, containerd, runc, kube-proxy, kube-scheduler joined to
  the real control plane), helm/agentrun installed on it with real Helm, runner pods created by the chart's
  operator POD in a restricted namespace, the runs' PostgreSQL on the node's host address;
- ``process``: the real control plane with kubesim's kubelet stand-in (runner processes on this machine, as
  ``bench/operator.py`` uses) and the operator as a process.

Both run ``agentrun_dev.graphs:ticker`` (a step a second, a checkpoint each). On the node it is in an image
``localhost/agentrun-bench:dev`` built FROM the runtime image with that one file added (podman, never pulls).

Figures (``bench/results/node.json``, merged into ``latest.json`` under ``node``):

- ``image``: the runtime and demo images' sizes (podman's, uncompressed) and their OCI archives;
- ``startup``: ``--pods`` runs applied one after the other (each once the one before took its first step):
  pod created -> first checkpoint committed (the first step, which sleeps ``TICK_SECONDS`` = 1 s, included),
  p50/p95, split by the driver's pod poll (every 0.1 s: created, scheduled, running) and, on the node,
  containerd's creation times of the sandbox and the container, the process's start (/proc), the store's
  ``backend_start`` for the pod's address (imports and graph load end when the runner dials the store) and
  the runner's "attempt N of run" log line as ``kubectl logs --timestamps`` reports it (the store connected,
  the attempt registered: the first step begins);
- ``reschedule``: each runner SIGKILLed (``ctr task kill`` on the node, the stand-in's kill otherwise) one at
  a time: kill -> pod terminated, -> next attempt's pod created, -> its first checkpoint (resumed);
- ``eviction``: ``--evictions`` runner pods evicted through the Eviction API -> next pod -> resumed;
- ``stop``: ``spec.stop`` patched -> phase Stopped;
- ``burst``: ``--burst`` runs (3 quick steps) applied at once -> all Succeeded, wall time.
"""

# The driver blocks on purpose (it polls the API and the database while the cluster works).

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench import operator as opbench
from kubesim.real import RealControlPlane

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BUILD_SCRIPT = ROOT / "hack" / "image" / "build.sh"
GRAPH_FILE = ROOT / "devtools" / "agentrun_dev" / "graphs.py"
RUNTIME, DEMO, PAUSE = "localhost/agentrun:dev", "localhost/agentrun-demo:dev", "localhost/agentrun-pause:dev"
BENCH_IMAGE = "localhost/agentrun-bench:dev"
RUN_LABEL = "agentrun.dev/run"
TICK = {"TICKS": "100000", "TICK_SECONDS": "1"}
BENCH_RESOURCES = {"requests": {"cpu": "25m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


def p(samples: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``samples``, NaN when there are none."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50": round(p(samples, 0.5), 3), "p95": round(p(samples, 0.95), 3), "n": float(len(samples))}


def stamp(text: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 time with any number of fraction digits (containerd's nanoseconds)."""
    if not text:
        return None
    head, _, rest = text.replace("Z", "+00:00").partition(".")
    if rest:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text).timestamp()


# --- images --------------------------------------------------------------------------------------------------------


def _podman(*args: str, timeout: float = 900) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:2])} failed: {done.stderr.strip()[-1500:]}")
    return done.stdout.strip()


def build_images() -> Path:
    """``make image``'s script (at once when nothing changed), then the bench image; the archives' folder."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"hack/image/build.sh failed (exit {done.returncode}); run `make image`")
    cache = Path(lines[-1])
    archive = cache / "agentrun-bench.oci.tar"
    digest_file = cache / "agentrun-bench.inputs"
    inputs = GRAPH_FILE.read_text() + _podman("image", "inspect", "--format", "{{.Id}}", RUNTIME)
    if not (archive.is_file() and digest_file.is_file() and digest_file.read_text() == inputs):
        with tempfile.TemporaryDirectory(prefix="agentrun-bench-") as context:
            shutil.copy(GRAPH_FILE, Path(context) / "bench_graphs.py")
            (Path(context) / "Containerfile").write_text(f"FROM {RUNTIME}\nCOPY bench_graphs.py /app/bench_graphs.py\n")
            _podman("build", "--pull=never", "--network", "none", "--tag", BENCH_IMAGE, context)
        archive.unlink(missing_ok=True)
        _podman("save", "--quiet", "--format", "oci-archive", "--output", str(archive), BENCH_IMAGE)
        digest_file.write_text(inputs)
    return cache


def image_sizes(cache: Path) -> dict[str, float]:
    sizes: dict[str, float] = {}
    for image, stem in ((RUNTIME, "agentrun"), (DEMO, "agentrun-demo")):
        size = int(_podman("image", "inspect", "--format", "{{.Size}}", image))
        sizes[f"{stem}_mb"] = round(size / 1e6, 1)
        sizes[f"{stem}_archive_mb"] = round((cache / f"{stem}.oci.tar").stat().st_size / 1e6, 1)
    return sizes


# --- what both sides share ----------------------------------------------------------------------------------------


@dataclass
class Target:
    """One side: its plane, the runs' namespace and graph, the store as the driver reads it, a kill."""

    name: str
    plane: RealControlPlane
    namespace: str
    graph: str
    dsn: str
    kill: Callable[[dict[str, Any]], None]
    extras: Callable[[dict[str, Any]], dict[str, float]] | None = None
    image: str | None = None

    def manifest(self, name: str, env: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
        made = opbench.run(
            name, graph=self.graph, env=env, labels=labels, restartPolicy={"maxRestarts": 50, "backoffSeconds": 0}
        )
        made["spec"]["config"] = {"recursionLimit": 10000}  # a tick is a step: 50 (the default) is 50 s of ticking
        # A ticker needs little: the default request (100m CPU) would fit only 17 runners on this 2-CPU node beside
        # the chart's pods, and the startup figures keep every run ticking (a 21st pod would stay Pending).
        made["spec"]["podTemplate"]["resources"] = BENCH_RESOURCES
        made["metadata"]["namespace"] = self.namespace
        if self.image:
            made["spec"]["image"] = self.image
        return made

    def apply(self, manifests: list[dict[str, Any]]) -> None:
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
        done = self.plane.kubectl("apply", "-f", "-", input=listed, timeout=300)
        assert done.returncode == 0, done.stderr

    def runs(self) -> dict[str, dict[str, Any]]:
        found = self.plane.api("GET", f"/apis/agentrun.dev/v1alpha1/namespaces/{self.namespace}/agentruns", timeout=30)
        return {r["metadata"]["name"]: r.get("status") or {} for r in found.body.get("items", [])}

    def patch_stop(self, run: str) -> None:
        done = self.plane.kubectl(
            "patch", "-n", self.namespace, "ar", run, "--type", "merge", "-p", '{"spec":{"stop":true}}'
        )
        assert done.returncode == 0, done.stderr


class PodPoll:
    """The namespace's pods listed every 0.1 s from a thread: when each pod was first seen, first bound to a node,
    first running, first terminated (epoch seconds), and its last object."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.seen: dict[str, dict[str, float]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-poll", daemon=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[PodPoll]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(10)

    def _loop(self) -> None:
        path = f"/api/v1/namespaces/{self.target.namespace}/pods"
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError, ValueError):
                items = self.target.plane.api("GET", path, timeout=10).body.get("items", [])
                now = time.time()
                for pod in items:
                    self._saw(pod, now)

    def _saw(self, pod: dict[str, Any], now: float) -> None:
        name = pod["metadata"]["name"]
        self.pods[name] = pod
        marks = self.seen.setdefault(name, {"created": now})
        if pod.get("spec", {}).get("nodeName"):
            marks.setdefault("scheduled", now)
        state = ((pod.get("status", {}).get("containerStatuses") or [{}])[0]).get("state") or {}
        if "running" in state:
            marks.setdefault("running", now)
        if "terminated" in state or pod["metadata"].get("deletionTimestamp"):
            marks.setdefault("ended", now)

    def mark(self, pod: str, key: str, timeout: float) -> float:
        """When ``pod`` was first seen ``key`` ("created", "scheduled", "running", "ended"); waits for it."""
        at: float = self.wait(lambda: self.seen.get(pod, {}).get(key), timeout, f"pod {pod} {key}")
        return at

    def commit(self, run: str, after: float, timeout: float) -> float:
        """The run's first checkpoint committed after ``after``; waits for it."""
        at: float = self.wait(lambda: first_commit_after(self.target, run, after), timeout, f"{run}'s checkpoint")
        return at

    def wait(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.05)
        raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


async def _commits(dsn: str) -> dict[str, list[tuple[int, float]]]:
    connection = await asyncpg.connect(dsn, server_settings={"search_path": "agentrun"})
    try:
        rows = await connection.fetch(
            "SELECT thread_id, version, extract(epoch FROM created_at)::float8 AS at FROM states ORDER BY at"
        )
    finally:
        await connection.close()
    found: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        found.setdefault(row["thread_id"], []).append((int(row["version"]), float(row["at"])))
    return found


def commits(target: Target) -> dict[str, list[tuple[int, float]]]:
    """Every checkpoint's commit time by thread (``<namespace>/<thread>``), the store's clock (this machine's)."""
    with contextlib.suppress(asyncpg.UndefinedTableError):
        return asyncio.run(_commits(target.dsn))
    return {}


def first_commit_after(target: Target, run: str, after: float) -> float | None:
    later = [at for _, at in commits(target).get(f"{target.namespace}/{run}", []) if at > after]
    return min(later) if later else None


# --- the measurements ---------------------------------------------------------------------------------------------


def startup(target: Target, poll: PodPoll, count: int) -> tuple[list[str], dict[str, Any]]:
    """``count`` runs, one after the other: pod created -> first checkpoint, split where the time goes."""
    names = [f"tick-{i}" for i in range(count)]
    phases: dict[str, list[float]] = {}
    for name in names:
        target.apply([target.manifest(name, TICK, {"bench": "tick"})])
        pod = f"{name}-1"
        at = poll.commit(name, 0, 300)
        marks = poll.seen.get(pod, {})
        split = {
            "total": at - marks["created"],
            "scheduling": marks.get("scheduled", at) - marks["created"],
            "to_running_seen": marks.get("running", at) - marks["created"],
        }
        if target.extras:
            split.update(target.extras(poll.pods[pod]) | {"created": marks["created"], "first_checkpoint": at})
            split = _node_split(split, marks)
        for key, value in split.items():
            if key not in ("created", "first_checkpoint", "scheduled"):
                phases.setdefault(key, []).append(value)
        print(f"  {target.name} {pod}: " + " ".join(f"{k}={v:.2f}" for k, v in split.items() if v < 1e6), flush=True)
    return names, {key: summary(values) for key, values in phases.items()}


def _node_split(split: dict[str, float], marks: dict[str, float]) -> dict[str, float]:
    """The node's marks (epoch seconds) as consecutive intervals from the pod's creation to its first checkpoint."""
    order = [
        # The poll sees the binding up to 0.1 s late; containerd's sandbox cannot come before it.
        ("scheduling", min(marks.get("scheduled", float("inf")), split.get("sandbox_created", float("inf")))),
        ("sandbox", split.get("sandbox_created")),
        ("container_create", split.get("container_created")),
        ("container_start", split.get("process_started")),
        ("imports_and_graph", split.get("store_dialled")),
        ("store_connect_and_register", split.get("attempt_logged")),
        ("to_first_checkpoint", split["first_checkpoint"]),
    ]
    out = {"total": split["total"]}
    last = split["created"]
    for key, at in order:
        if at is None or at == float("inf"):
            continue
        out[key] = at - last
        last = at
    return out


def reschedules(target: Target, poll: PodPoll, names: list[str]) -> dict[str, Any]:
    """Each run's current runner SIGKILLed, one at a time: -> terminated, -> next pod, -> resumed."""
    ended, created, resumed = [], [], []
    for name in names:
        attempt = _attempt(target, name)
        pod, nxt = f"{name}-{attempt}", f"{name}-{attempt + 1}"
        try:
            poll.mark(pod, "running", 120)
            killed = time.time()
            target.kill(poll.pods[pod])  # AssertionError when the runtime has no such task: the sample is lost
            gone = poll.mark(pod, "ended", 60)
            new = poll.mark(nxt, "created", 60)
            back = poll.commit(name, new, 120)
        except (RuntimeError, AssertionError) as e:  # a sample lost to a loaded machine: said, not fatal
            state = (poll.pods.get(pod, {}).get("status") or {}).get("containerStatuses")
            print(f"  {target.name} reschedule {pod} lost: {e}; its state: {state}", flush=True)
            continue
        ended.append(gone - killed)
        created.append(new - killed)
        resumed.append(back - killed)
        print(
            f"  {target.name} kill {pod}: ended {gone - killed:.2f} next {new - killed:.2f} resumed {back - killed:.2f}"
        )
    return {
        "kill_to_terminated_s": summary(ended),
        "kill_to_next_pod_s": summary(created),
        "kill_to_resumed_s": summary(resumed),
    }


def _attempt(target: Target, run: str) -> int:
    return int(target.runs().get(run, {}).get("attempt") or 1)


def evictions(target: Target, poll: PodPoll, names: list[str]) -> dict[str, Any]:
    """The runner pods evicted through the Eviction API: -> next attempt's pod, -> resumed."""
    created, resumed = [], []
    for name in names:
        pod = f"{name}-{_attempt(target, name)}"
        nxt = f"{name}-{_attempt(target, name) + 1}"
        try:
            poll.mark(pod, "running", 120)
            asked = time.time()
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": target.namespace},
            }
            answer = target.plane.api("POST", f"/api/v1/namespaces/{target.namespace}/pods/{pod}/eviction", body)
            assert answer.status == 201, f"eviction of {pod}: {answer.status} {answer.body}"
            new = poll.mark(nxt, "created", 120)
            back = poll.commit(name, new, 180)
        except (RuntimeError, AssertionError) as e:
            print(f"  {target.name} eviction {pod} lost: {e}", flush=True)
            continue
        created.append(new - asked)
        resumed.append(back - asked)
        print(f"  {target.name} evict {pod}: next pod {new - asked:.2f} resumed {back - asked:.2f}", flush=True)
    return {"evict_to_next_pod_s": summary(created), "evict_to_resumed_s": summary(resumed)}


def stops(target: Target, names: list[str]) -> dict[str, Any]:
    """``spec.stop`` patched on each run, one after the other; -> phase Stopped."""
    asked: dict[str, float] = {}
    for name in names:
        asked[name] = time.time()
        target.patch_stop(name)
    done: dict[str, float] = {}
    deadline = time.monotonic() + 300
    while len(done) < len(names) and time.monotonic() < deadline:
        now = time.time()
        for name, status in target.runs().items():
            if name in asked and name not in done and status.get("phase") == "Stopped":
                done[name] = now - asked[name]
        time.sleep(0.1)
    return {"stop_s": summary(list(done.values())), "stopped": float(len(done)), "asked": float(len(names))}


def burst(target: Target, count: int) -> dict[str, Any]:
    """``count`` runs of 3 quick steps applied at once (one kubectl apply) -> all Succeeded."""
    names = [f"burst-{i}" for i in range(count)]
    env = {"TICKS": "3", "TICK_SECONDS": "0.2"}
    started = time.time()
    target.apply([target.manifest(n, env, {"bench": "burst"}) for n in names])
    applied = time.time() - started
    phases: dict[str, str] = {}
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        phases = {n: str(s.get("phase")) for n, s in target.runs().items() if n in names}
        if len(phases) == count and all(v in ("Succeeded", "Failed") for v in phases.values()):
            break
        time.sleep(0.5)
    wall = time.time() - started
    counted: dict[str, int] = {}
    for phase in phases.values():
        counted[phase] = counted.get(phase, 0) + 1
    return {"runs": float(count), "apply_s": round(applied, 2), "all_ended_s": round(wall, 2), "phases": counted}


def measure(
    target: Target, args: argparse.Namespace, save_to: Callable[[str, dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    poll = PodPoll(target)
    with poll.running():
        names, started = startup(target, poll, args.pods)
        print(f"{target.name} startup: {started}", flush=True)
        if save_to is not None:
            save_to(target.name, {"startup_s": started})
        figures: dict[str, Any] = {"startup_s": started}
        figures["reschedule"] = reschedules(target, poll, names[: args.kills])
        print(f"{target.name} reschedule: {figures['reschedule']}", flush=True)
        figures["eviction"] = evictions(target, poll, names[: args.evictions])
        print(f"{target.name} eviction: {figures['eviction']}", flush=True)
        figures["stop"] = stops(target, names)
        print(f"{target.name} stop: {figures['stop']}", flush=True)
    _delete_runs(target)
    figures["burst"] = burst(target, args.burst)
    print(f"{target.name} burst: {figures['burst']}", flush=True)
    _delete_runs(target)
    return figures


def _delete_runs(target: Target) -> None:
    target.plane.kubectl("delete", "-n", target.namespace, "agentruns", "--all", "--wait=false", timeout=300)
    deadline = time.monotonic() + 300
    path = f"/api/v1/namespaces/{target.namespace}/pods"
    while target.plane.api("GET", path, timeout=30).body.get("items") and time.monotonic() < deadline:
        time.sleep(1)


# --- the node ------------------------------------------------------------------------------------------------------


@dataclass
class NodeSide:
    """The real node with the chart installed (``agentrun_dev.chart_on_node``), and the node's own clocks."""

    cluster: Any  # kubesim.node.NodeCluster
    dsn: str  # the runs' store as this machine reads it
    namespace: str
    hz: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))

    @property
    def plane(self) -> RealControlPlane:
        assert self.cluster.plane is not None
        plane: RealControlPlane = self.cluster.plane
        return plane

    def container(self, cid: str) -> dict[str, Any]:
        done = self.cluster.node.ctr("containers", "info", cid, timeout=30)
        info: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {}
        return info

    def kill(self, pod: dict[str, Any]) -> None:
        cid = str(pod["status"]["containerStatuses"][0]["containerID"]).split("://", 1)[1]
        done = self.cluster.node.ctr("tasks", "kill", "--signal", "SIGKILL", cid, timeout=30)
        assert done.returncode == 0, done.stderr

    def extras(self, pod: dict[str, Any]) -> dict[str, float]:
        """containerd's creation times, the process's start, the store's backend_start, the attempt's log line."""
        found: dict[str, float] = {}
        cid = str(pod["status"]["containerStatuses"][0]["containerID"]).split("://", 1)[1]
        info = self.container(cid)
        if (created := stamp(info.get("CreatedAt"))) is not None:
            found["container_created"] = created
        sandbox = ((info.get("Spec") or {}).get("annotations") or {}).get("io.kubernetes.cri.sandbox-id")
        if sandbox and (made := stamp(self.container(sandbox).get("CreatedAt"))) is not None:
            found["sandbox_created"] = made
        if (started := self._process_start(cid)) is not None:
            found["process_started"] = started
        if (dialled := self._backend_start(pod.get("status", {}).get("podIP"))) is not None:
            found["store_dialled"] = dialled
        if (logged := self._attempt_line(pod)) is not None:
            found["attempt_logged"] = logged
        return found

    def _process_start(self, cid: str) -> float | None:
        for line in self.cluster.node.ctr("tasks", "list", timeout=30).stdout.splitlines()[1:]:
            parts = line.split()
            if parts and parts[0] == cid:
                ticks = int(Path(f"/proc/{parts[1]}/stat").read_text().rsplit(")", 1)[1].split()[19])
                since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / self.hz
                return time.time() - since_boot
        return None

    def _backend_start(self, ip: str | None) -> float | None:
        async def read() -> float | None:
            connection = await asyncpg.connect(self.dsn)
            try:
                query = (
                    "SELECT extract(epoch FROM min(backend_start))::float8 FROM pg_stat_activity WHERE client_addr = $1"
                )
                value = await connection.fetchval(query, ip)
                return float(value) if value is not None else None
            finally:
                await connection.close()

        return asyncio.run(read()) if ip else None

    def _attempt_line(self, pod: dict[str, Any]) -> float | None:
        name = pod["metadata"]["name"]
        done = self.plane.kubectl("logs", "--timestamps", "-n", self.namespace, name, timeout=30)
        for line in done.stdout.splitlines():
            if "attempt " in line and " of run " in line:
                return stamp(line.split(" ", 1)[0])
        return None


@contextlib.contextmanager
def node_side(cache: Path, workdir: Path) -> Iterator[Target]:
    """The real node, the chart installed with real Helm (as ``make cluster`` and tests/node install it:
    ``agentrun_dev.chart_on_node``), a restricted namespace with the store Secret; runners run the bench image."""
    from agentrun_dev import chart_on_node as chart
    from kubesim.node import NodeCluster

    archives = {
        image: cache / f"{image.removeprefix('localhost/').split(':')[0]}.oci.tar"
        for image in (RUNTIME, DEMO, PAUSE, BENCH_IMAGE)
    }
    cluster = NodeCluster(workdir / "node", archives=archives)
    with cluster, chart.running_store(cluster.node) as store:
        side = NodeSide(cluster, dsn=store.dsn, namespace="bench")
        side.plane.create_namespace(side.namespace, labels=chart.RESTRICTED)
        chart.store_secret(side.plane, side.namespace, store.pod_dsn)
        chart.install_release(
            side.plane,
            chart.chart_values(RUNTIME, BENCH_IMAGE),
            pod_dsn=store.pod_dsn,
            diagnostics=lambda: chart.pod_states(side.plane),
        )
        chart.wait_for_leader(side.plane)
        yield Target("node", side.plane, side.namespace, "bench_graphs:ticker", side.dsn, side.kill, extras=side.extras)


@contextlib.contextmanager
def process_side(workdir: Path) -> Iterator[Target]:
    """The real control plane, kubesim's kubelet stand-in running runner processes, the operator as a process."""
    with opbench.database() as dsn, opbench.serving("real", workdir, ROOT) as cluster:
        assert isinstance(cluster, RealControlPlane)
        opbench.secret(cluster, dsn)
        kubelet = opbench._kubelet(cluster, workdir)
        operator = opbench.start_operator(ROOT, opbench.operator_kubeconfig(cluster, workdir), workdir)
        try:
            yield Target(
                "process", cluster, "default", opbench.TICKER, dsn, lambda pod: kubelet.kill(pod["metadata"]["name"])
            )
        finally:
            operator.stop()
            kubelet.stop()


def merge(out: Path, section: dict[str, Any]) -> None:
    """Write ``section`` as ``node`` into ``out``, keeping every other key."""
    existing: dict[str, Any] = {}
    if out.exists():
        with contextlib.suppress(ValueError):
            existing = json.loads(out.read_text())
    existing["node"] = section
    out.write_text(json.dumps(existing, indent=1, sort_keys=True) + "\n")


def save(section: dict[str, Any], out: Path) -> None:
    sides = section["params"]["sides"]
    name = "node.json" if sides == "node,process" else f"node-{sides}.json"  # one side alone: a file of its own
    (RESULTS / name).write_text(json.dumps(section, indent=1, sort_keys=True) + "\n")
    if sides == "node,process":
        merge(out, section)


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m bench.node", description=__doc__.splitlines()[0] if __doc__ else "")
    cli.add_argument(
        "--pods",
        type=int,
        default=24,
        help="runs started one after the other, all kept running (startup figures); each requests 25m CPU, so a "
        "2-CPU node fits them beside the chart's pods",
    )
    cli.add_argument("--kills", type=int, default=24, help="runners SIGKILLed one at a time (at most --pods)")
    cli.add_argument("--evictions", type=int, default=10, help="runner pods evicted (at most --pods)")
    cli.add_argument("--burst", type=int, default=100, help="runs applied at once")
    cli.add_argument("--sides", default="node,process", help="node, process or both (comma-separated)")
    cli.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    args = cli.parse_args(argv)
    section: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "params": {k: getattr(args, k) for k in ("pods", "kills", "evictions", "burst", "sides")},
    }

    def partial(side: str, figures: dict[str, Any]) -> None:
        section[side] = figures
        save(section, args.out)

    with tempfile.TemporaryDirectory(prefix="agentrun-bench-node-") as tmp:
        if "node" in args.sides:
            cache = build_images()
            section["image"] = image_sizes(cache)
            print(f"images: {section['image']}", flush=True)
            try:
                with node_side(cache, Path(tmp)) as target:
                    section["node"] = measure(target, args, partial)
            except (RuntimeError, AssertionError) as e:  # said in the results; the other side still measured
                section["node_error"] = f"{type(e).__name__}: {e}"[:2000]
            save(section, args.out)
        if "process" in args.sides:
            with process_side(Path(tmp) / "process") as target:
                section["process"] = measure(target, args, partial)
            save(section, args.out)
    print(json.dumps(section, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
