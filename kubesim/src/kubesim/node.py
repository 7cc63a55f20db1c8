"""A real node joined to the real control plane: containerd, runc, CNI, kubelet, kube-proxy, kube-scheduler.

``kubesim.real`` runs etcd, kube-apiserver and kube-controller-manager; this module adds a node on
which pods are containers: Debian's containerd and runc, the CNI bridge, host-local and loopback
plugins, and the kubelet, kube-proxy (nftables mode) and kube-scheduler built from
``k8s.io/kubernetes`` at the pinned version (``hack/k8s/build.sh``). ``NodeCluster`` starts a plane
and a node together (``python -m kubesim.node``, ``make node``, the ``tests/node`` fixture).

Hazards, first:

- Root only, and it changes the host while it runs (``kubesim.nodehost`` has the list: a network
  namespace, a veth, routes, cgroups, six kernel sysctls the kubelet insists on). ``stop()``
  removes all of it and restores the sysctls: pods first (deleted through the API, then whatever
  is left killed by cgroup), then the daemons, the plane bound to the node's link, mounts,
  namespaces, links, cgroups and folders. What stays is containerd's image store, per slot, as a
  cache for the next node (only after a clean stop: no container left in it). A node whose owner
  was SIGKILLed is swept by the next node's start (a lock per slot tells a live node from a dead
  one), or by ``python -m kubesim.node sweep``.
- A plane bound to the node's link (``plane_options()``) must not outlive the link: its own requests
  to itself would fail and, without the guard routes the host keeps while a node lives, leave by
  the default route. ``RealNode.stop()`` stops it before the sweep.
- Its daemons die with the process that started them (``PR_SET_PDEATHSIG``, from the main thread);
  its containers do not (their shims are not children of containerd): the sweep ends them.
- The network: the node lives in a network namespace of its own with no route off the machine. Pods
  reach exactly the pod subnet, Service IPs (kube-proxy rewrites them to their endpoints) and the
  host's address on the node's link (``host_address``), where kube-apiserver listens (the plane is
  bound there: ``NodeCluster``) and where a store a pod should reach must listen too. No masquerade,
  no default route, no DNS server (pods keep the host's resolv.conf; its server is unreachable).
- Images are never pulled: the OCI archives in ``$AGENTRUN_IMAGE_CACHE`` (``make image``) are imported
  into the node's own containerd at start, unless its store holds them at the same digest already,
  ``localhost/agentrun-pause:dev`` (the sandbox image) required. Pods name them as
  ``localhost/<name>:dev`` (``imagePullPolicy: Never`` or ``IfNotPresent``).
- containerd is Debian's 1.6 (not v2 from the Go modules): it is what the notes verified on this
  machine kind, installs in seconds (``scripts/node_packages.sh``), and the kubelet 1.37 runs on it.
  What 1.6 lacks is the CRI ``RuntimeConfig`` call (the kubelet logs "Unimplemented" and uses its
  own ``cgroupDriver``). A build of containerd 2 from the module proxy would cost minutes more per
  cold machine for no scenario of ours.
- Noise in the logs that is expected: "RuntimeConfig ... Unimplemented", cadvisor's "cannot find
  filesystem info for device /dev/vda" (disk-pressure signals are unavailable; image GC is off),
  failed oom_score_adj changes (this machine forbids lowering them: containerd runs with
  ``restrict_oom_score_adj``), cgroup v1 deprecation warnings (``failCgroupV1: false``).
- Short node-lifecycle timeouts (``NODE_LIFECYCLE``): a node that stops renewing its lease is
  NotReady after 20 s and its pods are evicted 10 s later, so tests see a lost node within a minute.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubesim import nodehost
from kubesim.nodehost import Claim, Inventory, NodeHostError, Slot
from kubesim.real import CONTROLLERS, NODES, Binaries, ControlPlaneError, RealControlPlane, binaries

logger = logging.getLogger(__name__)

IMAGE_CACHE_ENV = "AGENTRUN_IMAGE_CACHE"
PAUSE_IMAGE = "localhost/agentrun-pause:dev"
CNI_BIN = Path("/usr/lib/cni")
NODE_BINARIES = ("kubelet", "kube-proxy", "kube-scheduler")
CRI_READY = "Start streaming server"  # containerd 1.6: logged as its CRI service becomes ready
PACKAGES = "bash scripts/node_packages.sh (Debian's containerd, runc, containernetworking-plugins, nftables)"
# Besides the plane's own: what Deployments (the chart's operator and history server), Services with
# selectors, and PodDisruptionBudgets (the drain scenario) need on a cluster that runs containers.
NODE_CONTROLLERS = (
    *CONTROLLERS,
    "deployment-controller",
    "replicaset-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "disruption-controller",
)
# A lost node is NotReady after node-monitor-grace-period without a lease renewal (the kubelet renews
# every nodeLeaseDurationSeconds / 4); its pods tolerate that for the default toleration seconds.
NODE_LEASE_SECONDS = 10
NODE_LIFECYCLE = {
    "apiserver": ("--default-not-ready-toleration-seconds=10", "--default-unreachable-toleration-seconds=10"),
    "controller-manager": ("--node-monitor-period=2s", "--node-monitor-grace-period=20s"),
}
POD_DELETE_GRACE = 2  # seconds a pod gets to exit when the node stops
STOP_GRACE = 10.0
KUBELET_PORT = 10250
KUBE_PROXY_HEALTH_PORT = 10256
SCHEDULER_PORT = 10259
_LIVE: set[RealNode] = set()


class NodeError(RuntimeError):
    """The node cannot start or failed; the message names what is missing and how to get it."""


@atexit.register
def _stop_all() -> None:
    for node in list(_LIVE):
        node.stop()


def image_cache() -> Path:
    """Where ``make image`` leaves its OCI archives (``$AGENTRUN_IMAGE_CACHE``)."""
    return Path(os.environ.get(IMAGE_CACHE_ENV) or Path.home() / ".cache" / "agentrun" / "image")


def image_archives(folder: Path | None = None) -> dict[str, Path]:
    """The image name (``localhost/<stem>:dev``) of each ``<stem>.oci.tar`` in the cache."""
    found = sorted((folder or image_cache()).glob("*.oci.tar"))
    return {f"localhost/{path.name.removesuffix('.oci.tar')}:dev": path for path in found}


def preflight(bins: Binaries, archives: dict[str, Path]) -> None:
    """NodeError, in one line naming what is missing and how to get it, unless the node can start."""
    if os.geteuid() != 0:
        raise NodeError("the real node needs root (containerd, network namespaces, cgroups): run it as root")
    for name in NODE_BINARIES:
        if not bins.path(name).is_file():
            raise NodeError(f"{name} not found in {bins.folder}: run make k8s (bash hack/k8s/build.sh)")
    for program in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "nft"):
        if shutil.which(program) is None:
            raise NodeError(f"{program} not found on PATH: run {PACKAGES}")
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN / plugin).is_file():
            raise NodeError(f"the CNI plugin {CNI_BIN / plugin} is missing: run {PACKAGES}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise NodeError("the kernel has no overlay filesystem (containerd's snapshotter): modprobe overlay")
    if not (nodehost.CGROUP_FS / nodehost.TRACKING_HIERARCHY).is_dir():
        raise NodeError("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids: the node expects this machine's cgroups")
    if PAUSE_IMAGE not in archives:
        raise NodeError(
            f"the sandbox image {PAUSE_IMAGE} is not in {image_cache()} (agentrun-pause.oci.tar): run make image"
        )


@dataclass
class _Daemon:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class RealNode:
    """One node: ``prepare()`` claims a slot and lays out its network and cgroups (before the plane
    starts, since kube-apiserver binds ``host_address``), ``start(plane)`` runs containerd, the
    kubelet, kube-proxy and kube-scheduler and returns once the Node is Ready, ``stop()`` removes it
    all. ``inventory()`` lists what of it exists on the host."""

    def __init__(
        self,
        logs: Path,
        *,
        slot: int | None = None,
        archives: dict[str, Path] | None = None,
        bins: Binaries | None = None,
    ) -> None:
        """``logs``: a folder for the daemons' logs (kept after stop); ``slot``: a fixed slot (else the first
        free); ``archives``: image name -> OCI archive to import (default: ``image_archives()``)."""
        self.logs = logs
        self._want_slot = slot
        self._archives = archives
        self._bins = bins
        self._claim: Claim | None = None
        self._slot: Slot | None = None  # kept after stop(), for inventory()
        self._daemons: dict[str, _Daemon] = {}
        self._procs: list[Path] = []
        self.plane: RealControlPlane | None = None
        self.started_in = 0.0
        self.stopped_in = 0.0
        self.swept_at_start: nodehost.SweepReport | None = None
        self._lock = threading.Lock()

    # --- names -----------------------------------------------------------------------------------

    @property
    def slot(self) -> Slot:
        """The claimed slot (NodeError before ``prepare()``; still named after ``stop()``)."""
        if self._slot is None:
            raise NodeError("the node has not been prepared")
        return self._slot

    @property
    def name(self) -> str:
        """The Node's name."""
        return self.slot.name

    @property
    def host_address(self) -> str:
        """The host's address on the node's link: bind servers pods must reach here."""
        return self.slot.host_address

    @property
    def pod_cidr(self) -> str:
        """The pods' subnet (a store's access rules name it)."""
        return str(self.slot.pod_cidr)

    @property
    def containerd_socket(self) -> Path:
        """The node's own containerd (never the system's default socket)."""
        return self.slot.state_dir / "containerd.sock"

    def plane_options(self) -> dict[str, Any]:
        """``RealControlPlane`` keyword arguments for a plane this node joins."""
        return {
            "bind_address": self.host_address,
            "controllers": NODE_CONTROLLERS,
            "apiserver_args": NODE_LIFECYCLE["apiserver"],
            "controller_manager_args": NODE_LIFECYCLE["controller-manager"],
        }

    # --- lifecycle -------------------------------------------------------------------------------

    def prepare(self) -> RealNode:
        """Check the host, claim a slot (sweeping what a dead node left), lay out its network and cgroups."""
        self._bins = self._bins or binaries()
        if self._archives is None:
            self._archives = image_archives()
        preflight(self._bins, self._archives)
        try:
            self._claim = nodehost.claim(self._want_slot)
        except NodeHostError as e:
            raise NodeError(str(e)) from e
        self.swept_at_start = self._claim.swept
        self._slot = self._claim.slot
        _LIVE.add(self)
        try:
            slot = self.slot
            nodehost.write_state(slot, owner=os.getpid(), pids={}, data_dir=str(slot.data_dir))
            (slot.image_dir / nodehost.CLEAN).unlink(missing_ok=True)  # in use from now: a crash leaves it unclean
            nodehost.setup_network(slot)
            self._procs = nodehost.setup_cgroups(slot)
        except BaseException:
            self.stop()
            raise
        return self

    def start(self, plane: RealControlPlane, timeout: float = 300) -> RealNode:
        """Run the node's daemons against ``plane`` (bound to ``host_address``); returns once the Node is
        Ready, kube-proxy serves and the scheduler is healthy. NodeError (after a stop) if one fails."""
        started = time.monotonic()
        if self._claim is None:
            self.prepare()
        if plane.bind_address != self.host_address:
            raise NodeError(
                f"the plane listens on {plane.bind_address}; pods reach {self.host_address}: plane_options()"
            )
        self.plane = plane
        deadline = started + timeout
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
            self._write_configs(plane)
            self._start_containerd(deadline)
            # The images unpack (tens of seconds for the runtime's layers on a busy machine) while
            # the kubelet registers: no pod can be bound before start() returns.
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="node-images") as pool:
                imported = pool.submit(self._import_images)
                try:
                    self._authorize_apiserver(plane)
                    nodehost.record_host_defaults()
                    self.start_kubelet()
                    self._spawn("kube-proxy", self._bin("kube-proxy"), f"--config={self._file('kube-proxy.yaml')}")
                    self._spawn("kube-scheduler", *self._scheduler_argv())
                    self._wait_ready(deadline)
                finally:
                    imported.result()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Remove the node: pods (through the API, short grace), the daemons, the plane it joined when
        that plane listens on the node's link (``plane_options()``: with the link gone its own requests
        to itself would fail), then everything of its slot on the host (``nodehost.sweep``); release the
        slot. Safe to call twice, or after a failure."""
        started = time.monotonic()
        with self._lock:
            claim, self._claim = self._claim, None
            _LIVE.discard(self)
        if claim is None:
            return
        try:
            if self._daemons and self.plane is not None:
                self._drain(claim.slot)
            logger.debug("node %s: drained at %.1f s", claim.slot.name, time.monotonic() - started)
            for name in ("kube-scheduler", "kube-proxy", "kubelet"):
                self._stop_daemon(name)
                logger.debug("node %s: %s stopped at %.1f s", claim.slot.name, name, time.monotonic() - started)
            forgotten = "containerd" in self._daemons and self._forget_containers()
            if self._stop_daemon("containerd") == 0 and forgotten:
                (claim.slot.image_dir / nodehost.CLEAN).touch()  # only images left: the next node starts from them
            logger.debug("node %s: containerd stopped at %.1f s", claim.slot.name, time.monotonic() - started)
            if self.plane is not None and self.plane.bind_address == claim.slot.host_address:
                self.plane.stop()  # it listens on the link the sweep removes: it must not outlive it
                logger.debug("node %s: plane stopped at %.1f s", claim.slot.name, time.monotonic() - started)
            report = nodehost.sweep(claim.slot)
            if report.killed:
                logger.info(
                    "node %s: %d processes were left after its daemons stopped", claim.slot.name, len(report.killed)
                )
        finally:
            claim.release()
            self.stopped_in = time.monotonic() - started

    def __enter__(self) -> RealNode:
        return self.prepare()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inventory(self) -> Inventory:
        """What of this node's slot exists on the host now."""
        return nodehost.inventory(self.slot)

    def pids(self) -> dict[str, int]:
        """The PID of each running daemon, by name."""
        return {name: d.popen.pid for name, d in self._daemons.items() if d.popen.poll() is None}

    # --- faults ----------------------------------------------------------------------------------

    def start_kubelet(self) -> None:
        """Start the kubelet (again, after ``stop_kubelet()``: the node comes back Ready)."""
        slot = self.slot
        self._spawn(
            "kubelet",
            self._bin("kubelet"),
            f"--config={self._file('kubelet.yaml')}",
            f"--kubeconfig={self._file('kubelet.kubeconfig')}",
            f"--hostname-override={slot.name}",
            f"--node-ip={slot.node_address}",
            f"--root-dir={slot.data_dir / 'kubelet'}",
        )

    def stop_kubelet(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop the kubelet only (a lost node: its containers keep running, its lease stops)."""
        self._stop_daemon("kubelet", sig)

    # --- clients ---------------------------------------------------------------------------------

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against the node's containerd, in the ``k8s.io`` namespace (the CRI's)."""
        argv = ["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    # --- internals -------------------------------------------------------------------------------

    def _bin(self, name: str) -> str:
        assert self._bins is not None
        return str(self._bins.path(name))

    def _file(self, name: str) -> Path:
        return self.slot.data_dir / "config" / name

    def _write_configs(self, plane: RealControlPlane) -> None:
        slot = self.slot
        folder = slot.data_dir / "config"
        (folder / "net.d").mkdir(parents=True, exist_ok=True)
        (folder / "containerd.toml").write_text(containerd_config(slot))
        (folder / "net.d" / "10-agentrun.conflist").write_text(json.dumps(cni_config(slot), indent=1))
        serving = plane.ca.issue(
            f"kubelet-{slot.name}",
            f"system:node:{slot.name}",
            organizations=(NODES,),
            server=True,
            dns_names=(slot.name,),
            ip_addresses=(slot.node_address,),
        )
        kubelet = kubelet_config(slot, plane.ca.pair.cert, serving.cert, serving.key, self.containerd_socket)
        (folder / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        plane.write_kubeconfig(folder / "kubelet.kubeconfig", plane.add_user(f"system:node:{slot.name}", [NODES]))
        # Both users are bound by Kubernetes' bootstrap RBAC (system:node-proxier, system:kube-scheduler).
        plane.write_kubeconfig(folder / "kube-proxy.kubeconfig", plane.add_user("system:kube-proxy"))
        plane.write_kubeconfig(folder / "kube-scheduler.kubeconfig", plane.add_user("system:kube-scheduler"))
        proxy = kube_proxy_config(slot, folder / "kube-proxy.kubeconfig")
        (folder / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))

    def _scheduler_argv(self) -> list[str]:
        kubeconfig = self._file("kube-scheduler.kubeconfig")
        return [
            self._bin("kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={self.slot.node_address}",
            f"--secure-port={SCHEDULER_PORT}",
            f"--cert-dir={self.slot.data_dir / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _authorize_apiserver(self, plane: RealControlPlane) -> None:
        """kube-apiserver's kubelet client (logs, exec, port-forward) passes the kubelet's webhook
        authorization through this binding, as kubeadm's ``kubeadm:apiserver-kubelet-client``. A Node
        of this name left by a node that died (cordoned by a drain, say) goes: the kubelet registers anew."""
        plane.api("DELETE", f"/api/v1/nodes/{self.slot.name}")
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubesim-node:apiserver-kubelet-client"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:kubelet-api-admin",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}
            ],
        }
        response = plane.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        if response.status not in (201, 409):
            raise NodeError(f"the kubelet client's ClusterRoleBinding was refused: {response}")

    def _start_containerd(self, deadline: float) -> None:
        """Start containerd and wait for its CRI service, not only its socket: ``ctr version`` answers
        while the CRI plugin still recovers its state, and a kubelet started then exits 1 with "server
        is not initialized yet" (failed CI once). containerd 1.6 logs "Start streaming server" right
        before it marks the CRI initialized (pkg/cri/server/service.go, Run); no crictl here to ask."""
        log = self.logs / "containerd.log"
        offset = log.stat().st_size if log.exists() else 0
        self._spawn("containerd", "containerd", f"--config={self._file('containerd.toml')}")
        while not (self.ctr("version", timeout=10).returncode == 0 and _logged(log, offset, CRI_READY)):
            self._check_alive()
            if time.monotonic() > deadline:
                raise NodeError(f"containerd's CRI service did not start on {self.containerd_socket} in time")
            time.sleep(0.1)

    def _import_images(self) -> None:
        """Import each archive whose image the store does not hold at the archive's digest already."""
        assert self._archives is not None
        held = {}
        for line in self.ctr("images", "list").stdout.splitlines()[1:]:
            ref, _, digest, *_ = line.split()
            held[ref] = digest
        for name, archive in self._archives.items():
            if held.get(name) == archive_digest(archive):
                continue
            base = name.rsplit(":", 1)[0]
            done = self.ctr("images", "import", f"--base-name={base}", str(archive), timeout=600)
            if done.returncode != 0:
                raise NodeError(f"ctr images import {archive} failed: {done.stderr.strip()[-500:]}")
        listed = set(self.ctr("images", "list", "--quiet").stdout.split())
        missing = sorted(set(self._archives) - listed)
        if missing:
            raise NodeError(f"the archives in {image_cache()} hold no image named {', '.join(missing)}: run make image")

    def _spawn(self, name: str, program: str, *args: str) -> None:
        slot = self.slot
        log = self.logs / f"{name}.log"
        main = threading.current_thread() is threading.main_thread()
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [program, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=nodehost.enter(slot, self._procs, die_with_parent=main),
            )
        self._daemons[name] = _Daemon(name, popen, log)
        pids = nodehost.read_state(slot).get("pids", {})
        pids[name] = {"pid": popen.pid, "start": nodehost.start_time(popen.pid)}
        nodehost.write_state(slot, pids=pids)

    def _stop_daemon(self, name: str, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """Stop one daemon (``sig``, SIGKILL after STOP_GRACE); its exit status, None if it was not running."""
        daemon = self._daemons.pop(name, None)
        if daemon is None:
            return None
        if daemon.popen.poll() is None:
            daemon.popen.send_signal(sig)
        try:
            return daemon.popen.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in %s s after %s; killing it", name, STOP_GRACE, sig.name)
            daemon.popen.kill()
            return daemon.popen.wait()

    def _forget_containers(self) -> bool:
        """Once the kubelet is gone: kill what still runs and delete every container (and its snapshot)
        from containerd's store, so that only images are left in it; False if one could not be deleted."""
        for task in self.ctr("tasks", "list", "--quiet", timeout=30).stdout.split():
            self.ctr("tasks", "kill", "--signal=SIGKILL", task, timeout=30)
            self.ctr("tasks", "delete", "--force", task, timeout=30)
        listed = self.ctr("containers", "list", "--quiet", timeout=30)
        if listed.returncode != 0:
            return False
        if listed.stdout.split() and self.ctr("containers", "delete", *listed.stdout.split(), timeout=60).returncode:
            return False
        after = self.ctr("containers", "list", "--quiet", timeout=30)
        return after.returncode == 0 and not after.stdout.split()

    def _check_alive(self) -> None:
        for daemon in self._daemons.values():
            if daemon.popen.poll() is not None:
                tail = daemon.log.read_text(errors="replace")[-3000:]
                raise NodeError(f"{daemon.name} exited with {daemon.popen.returncode}; its log ends:\n{tail}")

    def _wait_ready(self, deadline: float) -> None:
        assert self.plane is not None
        slot = self.slot
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # the scheduler's self-signed cert
        checks: dict[str, Callable[[], bool]] = {
            "the Node Ready": lambda: _node_ready(self.plane, slot.name),
            "kube-proxy's healthz": lambda: _http_ok(f"http://{slot.node_address}:{KUBE_PROXY_HEALTH_PORT}/healthz"),
            "kube-scheduler's healthz": lambda: _http_ok(
                f"https://{slot.node_address}:{SCHEDULER_PORT}/healthz", insecure
            ),
        }
        for what, check in checks.items():
            while not check():
                self._check_alive()
                if time.monotonic() > deadline:
                    raise NodeError(f"{what} not reached in time (logs in {self.logs})")
                time.sleep(0.2)

    def _drain(self, slot: Slot) -> None:
        """Cordon the node, delete its pods with a short grace and wait for the kubelet to remove them
        (their containers stopped, their sandboxes' networks torn down by the CNI)."""
        plane = self.plane
        assert plane is not None
        try:
            plane.api(
                "PATCH",
                f"/api/v1/nodes/{slot.name}",
                {"spec": {"unschedulable": True}},
                content_type="application/merge-patch+json",
                timeout=5,
            )
            selector = {"fieldSelector": f"spec.nodeName={slot.name}"}
            for pod in plane.api("GET", "/api/v1/pods", params=selector, timeout=5).body.get("items", []):
                meta = pod["metadata"]
                plane.api(
                    "DELETE",
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    {"gracePeriodSeconds": POD_DELETE_GRACE},
                    timeout=5,
                )
            deadline = time.monotonic() + POD_DELETE_GRACE + 30
            while plane.api("GET", "/api/v1/pods", params=selector, timeout=5).body.get("items"):
                if time.monotonic() > deadline or self._daemons.get("kubelet") is None:
                    logger.warning("node %s: pods still bound after the drain; the sweep kills them", slot.name)
                    break
                time.sleep(0.2)
            while self.ctr("tasks", "list", "--quiet", timeout=10).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)  # the kubelet stops each sandbox after its pod is gone
            plane.api("DELETE", f"/api/v1/nodes/{slot.name}", timeout=5)
        except (OSError, ControlPlaneError) as e:  # the plane went first: the sweep still removes everything
            logger.warning("node %s: could not drain through the API (%s); the sweep kills its pods", slot.name, e)


def archive_digest(archive: Path) -> str | None:
    """The manifest digest an OCI archive's index names (what ``ctr images list`` shows once imported)."""
    with tarfile.open(archive) as tar:
        index = next((m for m in tar if m.name.lstrip("./") == "index.json"), None)
        member = tar.extractfile(index) if index is not None else None
        if member is None:
            return None
        manifests = json.load(member).get("manifests", [])
    return str(manifests[0]["digest"]) if len(manifests) == 1 else None


def _node_ready(plane: RealControlPlane | None, name: str) -> bool:
    assert plane is not None
    node = plane.get("nodes", name, None)
    conditions = (node or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


# --- configuration files ---------------------------------------------------------------------------


def _logged(log: Path, offset: int, line: str) -> bool:
    """Whether ``log`` holds ``line`` past ``offset`` (this start's part of an appended log)."""
    with open(log, "rb") as f:
        f.seek(offset)
        return line.encode() in f.read()


def containerd_config(slot: Slot) -> str:
    """containerd 1.6's config (version 2): its own root, state, sockets, runc root and CNI folders;
    the two settings this machine needs (restrict_oom_score_adj, the local sandbox image)."""
    state, data = slot.state_dir, slot.data_dir
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = "{slot.image_dir}"
state = "{state}/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{state}/containerd.sock"
[ttrpc]
  address = "{state}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{data}/opt"

[{cri}]
  # This machine forbids lowering oom_score_adj: without this every sandbox fails in runc
  # ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  # No registry is reachable: the pause image is imported from make image's archive.
  sandbox_image = "{PAUSE_IMAGE}"
  # The pods' network namespaces are mounted under the state folder, not /run/netns: the sweep finds them.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc") or "runc"}"
        Root = "{state}/runc"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{data}/config/net.d"
    max_conf_num = 1
  [{cri}.registry]
    config_path = ""
"""


def cni_config(slot: Slot) -> dict[str, Any]:
    """The bridge ``cni0`` inside the node's namespace, host-local addresses, and routes to Service IPs and
    to the host's address only (no default route, no masquerade: pods reach nothing else)."""
    return {
        "cniVersion": "1.0.0",
        "name": slot.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(slot.pod_cidr), "gateway": slot.gateway}]],
                    "routes": [{"dst": nodehost.SERVICE_CIDR}, {"dst": f"{slot.host_address}/32"}],
                    "dataDir": str(slot.data_dir / "cni-ipam"),
                },
            }
        ],
    }


def kubelet_config(slot: Slot, client_ca: Path, cert: Path, key: Path, containerd: Path) -> dict[str, Any]:
    """The kubelet's configuration: cgroup v1 and cgroupfs as this machine has them, the slot's cgroup root
    and folders, x509 + webhook authentication and webhook authorization (the API server's logs,
    exec and port-forward requests pass them), image GC off (no registry to pull back from)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": slot.cgroup,
        "failSwapOn": False,
        "address": slot.node_address,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{containerd}",
        "podLogsDir": str(slot.data_dir / "pod-logs"),
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "shutdownGracePeriod": "0s",
        "serializeImagePulls": False,
        "registerNode": True,
        "oomScoreAdj": 0,
    }


def kube_proxy_config(slot: Slot, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy in nftables mode inside the node's namespace, leaving every host sysctl as it is
    (conntrack sizes and timeouts 0 = unchanged) and its own oom_score_adj alone."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": slot.name,
        "bindAddress": slot.node_address,
        "healthzBindAddress": f"{slot.node_address}:{KUBE_PROXY_HEALTH_PORT}",
        "metricsBindAddress": "127.0.0.1:10249",
        "clusterCIDR": str(slot.pod_cidr),
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{slot.node_address}/32"],
        "oomScoreAdj": 0,
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


# --- a plane and a node ----------------------------------------------------------------------------


class NodeCluster:
    """The real control plane bound to a node's host address, and that node (``make node``, tests/node)."""

    def __init__(
        self,
        workdir: Path,
        *,
        slot: int | None = None,
        archives: dict[str, Path] | None = None,
        bins: Binaries | None = None,
    ) -> None:
        """``workdir``: the plane's files and every log (``logs/``); the node's own files live in its slot.
        ``slot``, ``archives``: as ``RealNode``'s; ``bins``: the binaries (default: ``kubesim.real.binaries()``)."""
        self.workdir = workdir
        self._bins = bins
        self.node = RealNode(workdir / "logs" / "node", slot=slot, archives=archives, bins=bins)
        self.plane: RealControlPlane | None = None

    def start(self) -> NodeCluster:
        """Prepare the node, start the plane on its host address, start the node; stop all on failure."""
        try:
            for fresh in ("plane", "logs"):  # a plane's etcd from an earlier run would hold its stale objects
                shutil.rmtree(self.workdir / fresh, ignore_errors=True)
            bins = self._bins or binaries()
            self.node._bins = bins
            self.node.prepare()
            self.plane = RealControlPlane(self.workdir / "plane", bins=bins, **self.node.plane_options()).start()
            self.node.start(self.plane)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """The node's pods and daemons, then the plane, then the node's network and the rest (``RealNode.stop``)."""
        self.node.stop()
        if self.plane is not None:
            self.plane.stop()  # stopped already unless the node never got as far as joining it

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kubesim.node [run|sweep]``: keep a plane and a node until Ctrl-C, or sweep dead nodes."""
    cli = argparse.ArgumentParser(prog="python -m kubesim.node", description=__doc__.splitlines()[0] if __doc__ else "")
    cli.add_argument("command", nargs="?", choices=("run", "sweep"), default="run")
    cli.add_argument("--workdir", type=Path, default=Path(os.environ.get("AGENTRUN_NODE_WORKDIR") or ".agentrun-node"))
    args = cli.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "sweep":
        for i in range(nodehost.SLOTS):
            if not nodehost.slot_is_live(i):
                claimed = nodehost.claim(i)
                print(f"slot {i}: {claimed.swept.summary()}")
                claimed.release()
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = NodeCluster(args.workdir.resolve())
    try:
        print(
            "starting the real control plane and a node (containerd, kubelet, kube-proxy, kube-scheduler)...",
            flush=True,
        )
        cluster.start()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        assert cluster.plane is not None
        node = cluster.node
        print(
            f"node {node.name} Ready in {node.started_in:.1f} s (plane {cluster.plane.started_in:.1f} s)\n"
            f"API server  {cluster.plane.url}   pods {node.pod_cidr}, stores for pods listen on {node.host_address}\n"
            f"logs        {args.workdir.resolve() / 'logs'}\n\n"
            f"export KUBECONFIG={cluster.plane.kubeconfig}\n\n"
            "Ctrl-C stops the node (pods first) and the plane, and leaves nothing behind.",
            flush=True,
        )
        while not stop.wait(1):
            for name, daemon in list(node._daemons.items()):
                if daemon.popen.poll() is not None:
                    print(f"{name} exited ({daemon.popen.returncode}); see {daemon.log}", file=sys.stderr)
                    return 1
        return 0
    except (NodeError, ControlPlaneError) as e:
        print(f"kubesim.node: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        print("stopping...", flush=True)
        cluster.stop()
        print(f"stopped in {cluster.node.stopped_in:.1f} s.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
