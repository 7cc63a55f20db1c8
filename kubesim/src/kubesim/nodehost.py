"""The host side of the real node (``kubesim.node``): slots, namespaces, cgroups, mounts, and the sweep.

Everything a node puts on this machine is named after its slot (``agentrun-node-<n>``), so a sweep
finds it again without asking a process that may be gone: a network namespace, a veth pair, a route,
a cgroup in every hierarchy, two folders (``/run/agentrun-node/<n>``, ``/var/lib/agentrun-node/<n>``),
and a few files in shared places (below). ``claim()`` takes a free slot under a lock held for the
node's life (``flock``: released by the kernel when its owner dies, even by SIGKILL) and sweeps what a
previous owner of that slot left; ``sweep()`` removes it all; ``inventory()`` lists what is there (the
tests' proof that nothing survives).

Hazards, first:

- Root only, and it changes the host: while a node runs, the kubelet sets six kernel sysctls
  host-wide (``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1``,
  ``vm.panic_on_oom=0``, ``kernel.keys.root_max*``): it refuses to start otherwise. The first node
  to start records the values it found (``/run/agentrun-node/host.json``); the last one to go, or the
  next claim after a crash, writes them back.
- Shared places the node's programs write to, swept by name: ``/var/log/containers`` (the kubelet's
  links to pod logs, a fixed path), ``/var/lib/cni/results`` (libcni's cache of the network's
  results), ``/run/containerd/s`` (containerd 1.6 puts every shim's socket there, whatever its
  state dir). A folder among these that did not exist before the first node is removed with the
  last one when it is empty.
- Processes are found by cgroup (``pids:/agentrun-node-<n>``, which holds the node's daemons, every
  shim and every container) and killed with SIGKILL; mounts (overlay root filesystems, the kubelet's
  bind mount of its root folder, volumes, the pods' network namespaces, which containerd mounts
  under its state folder here) are unmounted deepest first, lazily when busy.
- The pod network lives inside the node's own network namespace, which has no route off the node:
  its only links are the pods' bridge and the veth to the host, whose host end holds the one host
  address pods can reach (the API server and the stores listen there). Deleting that namespace
  removes the bridge, every pod veth and kube-proxy's nftables table with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STATE_ROOT = Path(os.environ.get("AGENTRUN_NODE_STATE_ROOT") or "/run/agentrun-node")
DATA_ROOT = Path(os.environ.get("AGENTRUN_NODE_DATA_ROOT") or "/var/lib/agentrun-node")
SLOTS = 8
PREFIX = "agentrun-node-"
SERVICE_CIDR = "10.96.0.0/16"  # kubesim.real's; routed to the node's bridge for kube-proxy to rewrite
# Every slot's pod and link subnets are inside these. While a node is live the host holds them as
# unreachable routes (behind each slot's own routes): a client still dialling an address of a node
# whose link has gone (a plane outliving its node, a test's connection) fails on this machine rather
# than leaving by the default route.
GUARD_ROUTES = ("10.244.0.0/16", "10.245.0.0/16")
GUARD_METRIC = "4000"
CLEAN = ".clean"  # in a slot's image_dir: written after a stop that deleted every container
CGROUP_FS = Path("/sys/fs/cgroup")
TRACKING_HIERARCHY = "pids"  # the daemons' cgroup lives here only: their memory accounting stays where it was
# What the kubelet sets host-wide before it runs (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables).
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Fixed paths the node's programs write beside their own folders (see the module docstring).
CONTAINER_LOG_LINKS = Path("/var/log/containers")
CNI_CACHE = Path("/var/lib/cni")
SHIM_SOCKETS = Path("/run/containerd")
SHARED_FOLDERS = (CONTAINER_LOG_LINKS, CNI_CACHE, SHIM_SOCKETS)

_CLONE_NEWNET = 0x40000000
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class NodeHostError(RuntimeError):
    """The host cannot hold a node; the message names what is missing and how to get it."""


@dataclass(frozen=True)
class Slot:
    """One node's names and addresses on this machine, all derived from its index."""

    index: int

    @property
    def name(self) -> str:
        """The node's name (also its network namespace, cgroup and CNI network name)."""
        return f"{PREFIX}{self.index}"

    @property
    def state_dir(self) -> Path:
        """Sockets, containerd's state, the state file (``/run/agentrun-node/<n>``)."""
        return STATE_ROOT / str(self.index)

    @property
    def data_dir(self) -> Path:
        """containerd's root (images, snapshots), the kubelet's root, pod logs, configs."""
        return DATA_ROOT / str(self.index)

    @property
    def image_dir(self) -> Path:
        """containerd's root (images, unpacked layers): kept from one node to the next as a cache when the
        node stopped cleanly (``.clean``: every container deleted), removed by the sweep otherwise."""
        return DATA_ROOT / "images" / str(self.index)

    @property
    def netns(self) -> str:
        """The node's network namespace (``ip netns`` name)."""
        return self.name

    @property
    def netns_path(self) -> Path:
        """Where ``ip netns`` mounts it."""
        return Path("/run/netns") / self.netns

    @property
    def host_link(self) -> str:
        """The host end of the veth to the node (the node end is ``eth0`` inside its namespace)."""
        return f"arn{self.index}h"

    @property
    def link_cidr(self) -> ipaddress.IPv4Network:
        """The /30 between the host and the node."""
        return ipaddress.IPv4Network(f"10.245.{self.index}.0/30")

    @property
    def host_address(self) -> str:
        """The host's address on the node's link: the one host address pods reach (API server, stores)."""
        return str(self.link_cidr.network_address + 1)

    @property
    def node_address(self) -> str:
        """The node's InternalIP: the kubelet, kube-proxy and the scheduler serve here."""
        return str(self.link_cidr.network_address + 2)

    @property
    def pod_cidr(self) -> ipaddress.IPv4Network:
        """The pods' subnet, on the node's bridge ``cni0``."""
        return ipaddress.IPv4Network(f"10.244.{self.index}.0/24")

    @property
    def gateway(self) -> str:
        """The bridge's address: the pods' next hop to the host and to Service IPs."""
        return str(self.pod_cidr.network_address + 1)

    @property
    def cgroup(self) -> str:
        """The kubelet's ``cgroupRoot`` (``kubepods`` under it) and, in ``pids``, the daemons' parent."""
        return f"/{self.name}"

    @property
    def state_file(self) -> Path:
        """What the owner recorded (pids, folders); read by the sweep after a crash."""
        return self.state_dir / "state.json"


# --- slots ----------------------------------------------------------------------------------------


@dataclass
class Claim:
    """A slot held by this process (its lock file stays open and locked until ``release()``)."""

    slot: Slot
    fd: int
    swept: SweepReport

    def release(self) -> None:
        """Give the slot up (the caller has swept it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def claim(index: int | None = None) -> Claim:
    """Take slot ``index`` (or the first free one); NodeHostError when it is held (or none is free).

    Every slot no live process holds is swept on the way, so what a crashed node left behind (its
    owner SIGKILLed, whatever slot it had) is gone before a new node starts.
    """
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    chosen: Claim | None = None
    for i in range(SLOTS):
        fd = _try_lock(i)
        if fd is None:
            continue
        try:
            report = sweep(Slot(i))
        except BaseException:
            os.close(fd)
            if chosen is not None:
                chosen.release()
            raise
        if chosen is None and index in (None, i):
            chosen = Claim(Slot(i), fd, report)
        else:
            os.close(fd)
    if chosen is None:
        held = f"slot {index} is" if index is not None else f"all {SLOTS} node slots are"
        raise NodeHostError(f"{held} held by live processes (locks in {STATE_ROOT}); stop their nodes first")
    try:
        _check_addresses_free(chosen.slot)
    except BaseException:
        chosen.release()
        raise
    return chosen


def _try_lock(index: int) -> int | None:
    fd = os.open(STATE_ROOT / f"{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def slot_is_live(index: int) -> bool:
    """Whether a live process holds slot ``index`` (its lock)."""
    path = STATE_ROOT / f"{index}.lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Serialises the host-wide bookkeeping (host.json, shared folders) between slots (never nested:
    flock locks an open file, so a second one in the same process would wait for the first)."""
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    fd = os.open(STATE_ROOT / "host.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _check_addresses_free(slot: Slot) -> None:
    """Refuse a slot whose subnets an interface of someone else's already uses on this host."""
    out = _run("ip", "-o", "-4", "addr", "show").stdout
    for line in out.splitlines():
        dev, address = line.split()[1], line.split()[3]
        if dev == slot.host_link:
            continue  # our own leftover: the sweep removes it
        net = ipaddress.IPv4Interface(address).network
        if net.overlaps(slot.link_cidr) or net.overlaps(slot.pod_cidr):
            raise NodeHostError(
                f"{address} on {dev} overlaps node slot {slot.index}'s {slot.link_cidr} or {slot.pod_cidr}"
            )


# --- the host's network, cgroups, state ------------------------------------------------------------


def setup_network(slot: Slot) -> None:
    """The node's network namespace, the veth to the host and the routes between them.

    Inside: ``lo``, ``eth0`` (``node_address``), the pods' bridge ``cni0`` (``gateway``) holding the
    route to the Service CIDR (kube-proxy rewrites a Service's packets before they leave; a packet to
    any other Service address asks the bridge in vain), forwarding on (pods reach the host through
    it), and nothing else: no default route.
    On the host: ``host_address`` on the host end and a route to the pods' subnet through the node.
    """
    ns = ["ip", "-n", slot.netns]
    _run("ip", "netns", "add", slot.netns)
    _run("ip", "link", "add", slot.host_link, "type", "veth", "peer", "name", "eth0", "netns", slot.netns)
    _run("ip", "addr", "add", f"{slot.host_address}/30", "dev", slot.host_link)
    _run("ip", "link", "set", slot.host_link, "up")
    _run(*ns, "link", "set", "lo", "up")
    _run(*ns, "addr", "add", f"{slot.node_address}/30", "dev", "eth0")
    _run(*ns, "link", "set", "eth0", "up")
    # The pods' bridge, made here rather than by the CNI bridge plugin (which adopts it) so that the
    # Service CIDR has a route before the first pod: without one a Service address is unreachable
    # from the node itself before kube-proxy can rewrite it. This kernel has no dummy links.
    _run(*ns, "link", "add", "cni0", "type", "bridge")
    _run(*ns, "addr", "add", f"{slot.gateway}/{slot.pod_cidr.prefixlen}", "dev", "cni0")
    _run(*ns, "link", "set", "cni0", "up")
    _run(*ns, "route", "add", SERVICE_CIDR, "dev", "cni0")
    _run("ip", "netns", "exec", slot.netns, "sh", "-c", "echo 1 >/proc/sys/net/ipv4/ip_forward")
    _run("ip", "route", "add", str(slot.pod_cidr), "via", slot.node_address, "dev", slot.host_link)
    with _host_lock():
        for guard in GUARD_ROUTES:
            _run("ip", "route", "replace", "unreachable", guard, "metric", GUARD_METRIC)


def cgroup_hierarchies() -> list[Path]:
    """Every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers, ``systemd``, ``unified``)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        mountpoint = Path(_unescape(fields[4]))
        if fstype in ("cgroup", "cgroup2") and mountpoint.parent == CGROUP_FS:
            found.append(mountpoint)
    return sorted(found)


def setup_cgroups(slot: Slot) -> list[Path]:
    """The kubelet's ``cgroupRoot`` in every hierarchy (it refuses a root missing from one), and the
    daemons' cgroup ``<root>/node`` in ``pids``; returns the ``cgroup.procs`` files a daemon joins."""
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / slot.cgroup.lstrip("/")
        root.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":  # a new cpuset is empty: nothing could run in it
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (root / knob).write_text((hierarchy / knob).read_text())
    node = CGROUP_FS / TRACKING_HIERARCHY / slot.cgroup.lstrip("/") / "node"
    node.mkdir(exist_ok=True)
    return [node / "cgroup.procs"]


def write_state(slot: Slot, **values: Any) -> None:
    """Merge ``values`` into the slot's state file (written whole, then renamed)."""
    state = read_state(slot)
    state.update(values)
    slot.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = slot.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(slot.state_file)


def read_state(slot: Slot) -> dict[str, Any]:
    """The slot's state file, or {}."""
    try:
        state: dict[str, Any] = json.loads(slot.state_file.read_text())
        return state
    except (FileNotFoundError, ValueError):
        return {}


def record_host_defaults() -> None:
    """Before a kubelet starts: remember the host's sysctls and which shared folders exist, once for
    all live nodes (the first node writes ``host.json``; the last one restores from it)."""
    with _host_lock():
        path = STATE_ROOT / "host.json"
        if path.exists():
            return
        record = {
            "sysctls": {name: (Path("/proc/sys") / name).read_text().strip() for name in KUBELET_SYSCTLS},
            "created": [str(folder) for folder in SHARED_FOLDERS if not folder.exists()],
        }
        path.write_text(json.dumps(record, indent=1))


def _restore_host_defaults(leaving: Slot) -> list[str]:
    """Called with the host lock held, once ``leaving`` is swept: when no other slot is live, remove the
    guard routes, write the recorded sysctls back and remove the shared folders that did not exist
    before, if empty."""
    if any(slot_is_live(i) for i in range(SLOTS) if i != leaving.index):
        return []
    restored = []
    for guard in _guard_routes():
        _run("ip", "route", "delete", "unreachable", guard, "metric", GUARD_METRIC, check=False)
        restored.append(f"route unreachable {guard}")
    path = STATE_ROOT / "host.json"
    if not path.exists():
        return restored
    record = json.loads(path.read_text())
    for name, value in record["sysctls"].items():
        file = Path("/proc/sys") / name
        if file.read_text().strip() != value:
            file.write_text(value)
            restored.append(f"sysctl {name}={value}")
    for folder in map(Path, record["created"]):
        for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()
            restored.append(f"removed {folder}")
    path.unlink()
    return restored


# --- entering the node ------------------------------------------------------------------------------


def enter(slot: Slot, cgroup_procs: list[Path], *, die_with_parent: bool) -> Callable[[], None]:
    """A ``preexec_fn``: the child joins the node's network namespace and cgroup before it execs, and
    (from the main thread) dies with its parent, as kubesim.real's processes do."""
    netns = str(slot.netns_path)
    procs = [str(p) for p in cgroup_procs]

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        fd = os.open(netns, os.O_RDONLY)
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            os._exit(126)
        os.close(fd)
        for path in procs:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        if die_with_parent:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return preexec


# --- the sweep ---------------------------------------------------------------------------------------


@dataclass
class SweepReport:
    """What a sweep found and removed (all empty when the slot was clean)."""

    killed: list[int] = field(default_factory=list)
    unmounted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.killed or self.unmounted or self.removed)

    def summary(self) -> str:
        """One line: how many of each."""
        return f"{len(self.killed)} processes killed, {len(self.unmounted)} mounts, {len(self.removed)} other things"


def sweep(slot: Slot) -> SweepReport:
    """Remove everything of ``slot`` on this host, whether its owner stopped it or died: processes,
    mounts, network namespaces, links, cgroups, the shared files, its folders; then, if no other node
    is live, the host's recorded defaults. Idempotent; call with the slot's lock held."""
    started = time.monotonic()
    report = SweepReport()
    report.killed = kill_processes(slot)
    shim_sockets = _shim_sockets(slot)
    report.unmounted = unmount_under(slot.data_dir, slot.state_dir, slot.image_dir)
    logger.debug("slot %s: processes and mounts at %.2f s", slot.index, time.monotonic() - started)
    if slot.netns_path.exists():
        _run("ip", "netns", "delete", slot.netns, check=False)
        report.removed.append(f"netns {slot.netns}")
    if _link_exists(slot.host_link):  # gone with the namespace; left only if the namespace was lost first
        _run("ip", "link", "delete", slot.host_link, check=False)
        report.removed.append(f"link {slot.host_link}")
    logger.debug("slot %s: network at %.2f s", slot.index, time.monotonic() - started)
    report.removed += _remove_cgroups(slot)
    logger.debug("slot %s: cgroups at %.2f s", slot.index, time.monotonic() - started)
    report.removed += _remove_shared_files(slot, shim_sockets)
    stale_images = [slot.image_dir] if not (slot.image_dir / CLEAN).exists() else []
    for folder in (slot.data_dir, slot.state_dir, *stale_images):
        if folder.exists():
            shutil.rmtree(folder)
            report.removed.append(f"folder {folder}")
    with _host_lock():
        report.removed += _restore_host_defaults(slot)
    if report:
        logger.info("node slot %s swept: %s", slot.index, report.summary())
    return report


def cgroup_pids(slot: Slot) -> set[int]:
    """Every process in the slot's cgroup tree (daemons, shims, containers), from the ``pids`` hierarchy."""
    root = CGROUP_FS / TRACKING_HIERARCHY / slot.cgroup.lstrip("/")
    pids: set[int] = set()
    if root.is_dir():
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def recorded_pids(slot: Slot) -> set[int]:
    """The daemons the state file names that still run the same program (a reused pid is not ours)."""
    alive = set()
    for entry in read_state(slot).get("pids", {}).values():
        pid, start = entry["pid"], entry["start"]
        if start_time(pid) == start:
            alive.add(pid)
    return alive


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None when
    there is no such process or it is a zombie (dead, waiting for its parent to collect it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, *fields = stat.rsplit(")", 1)[1].split()
    return None if state in ("Z", "X") else int(fields[18])


def kill_processes(slot: Slot, timeout: float = 10) -> list[int]:
    """SIGKILL every process of the slot until none is left (a dying shim may fork once more)."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while pids := cgroup_pids(slot) | recorded_pids(slot):
        for pid in pids - {os.getpid()}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
        _reap(killed)
        if time.monotonic() > deadline:
            raise NodeHostError(f"processes of node slot {slot.index} survive SIGKILL: {sorted(pids)}")
        time.sleep(0.05)
    return killed


def _reap(pids: list[int]) -> None:
    """Collect those of the killed that are our own children (a zombie stays in its cgroup until
    reaped); never another child of this process, whose owner waits for it."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def mounts_under(*folders: Path) -> list[str]:
    """Mount points at or below ``folders`` in this mount namespace, deepest first."""
    prefixes = [str(f) for f in folders]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_under(*folders: Path) -> list[str]:
    """Unmount everything at or below ``folders``, deepest first (lazily when busy); returns the points."""
    done: list[str] = []
    for _ in range(5):  # a bind mount over itself (the kubelet's root) shows up once per layer
        points = mounts_under(*folders)
        if not points:
            break
        for point in points:
            if _libc.umount2(point.encode(), 0) != 0:
                err = ctypes.get_errno()
                if err in (errno.EINVAL, errno.ENOENT):
                    continue  # gone already (a parent's lazy unmount took it)
                if _libc.umount2(point.encode(), _MNT_DETACH) != 0:
                    raise NodeHostError(f"cannot unmount {point}: {os.strerror(ctypes.get_errno())}")
            done.append(point)
    return done


def _remove_cgroups(slot: Slot) -> list[str]:
    removed = []
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / slot.cgroup.lstrip("/")
        if not root.is_dir():
            continue
        for folder in [*sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), root]:
            for attempt in range(50):  # a just-killed task leaves its cgroup a moment later
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or attempt == 49:
                        raise NodeHostError(f"cannot remove cgroup {folder}: {e}") from e
                    time.sleep(0.05)
        removed.append(f"cgroup {root}")
    return removed


def _shim_sockets(slot: Slot) -> list[Path]:
    """containerd 1.6 writes each shim's socket address into the task's bundle (``address``)."""
    sockets = []
    for address in (slot.state_dir / "containerd").glob("io.containerd.runtime.v2.task/*/*/address"):
        with contextlib.suppress(OSError):
            text = address.read_text().strip()
            if text.startswith("unix://"):
                sockets.append(Path(text.removeprefix("unix://")))
    return sockets


def _remove_shared_files(slot: Slot, shim_sockets: list[Path]) -> list[str]:
    removed = []
    for sock in shim_sockets:
        if sock.exists():
            sock.unlink()
            removed.append(f"socket {sock}")
    if CONTAINER_LOG_LINKS.is_dir():
        for link in CONTAINER_LOG_LINKS.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(slot.data_dir) + "/"):
                link.unlink()
                removed.append(f"link {link}")
    for cached in (CNI_CACHE / "results").glob(f"{slot.name}-*"):
        cached.unlink()
        removed.append(f"cni cache {cached.name}")
    return removed


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _guard_routes() -> list[str]:
    out = _run("ip", "route", "show", "type", "unreachable").stdout
    return [line.split()[1] for line in out.splitlines() if line.split()[1] in GUARD_ROUTES]


def _slot_routes(slot: Slot) -> list[str]:
    out = _run("ip", "route", "show").stdout
    subnets = (str(slot.pod_cidr), str(slot.link_cidr))
    return [line for line in out.splitlines() if line.split()[0] in subnets]


# --- what is there ------------------------------------------------------------------------------------


@dataclass
class Inventory:
    """What of a slot exists on this host right now (each list empty after a sweep)."""

    processes: list[int]
    mounts: list[str]
    netns: list[str]
    links: list[str]
    routes: list[str]
    cgroups: list[str]
    files: list[str]

    def empty(self) -> bool:
        """Nothing of the slot is left."""
        return not any(asdict(self).values())


def inventory(slot: Slot) -> Inventory:
    """Everything of ``slot`` present now: processes (by cgroup and recorded pid), mounts under its
    folders (overlays, the kubelet's, pods' namespaces), its network namespace, its host link, its
    host routes (and the guard routes when no other node is live), its cgroups in any hierarchy, its
    folders and its files in the shared places. Not the image store a clean stop keeps (``image_dir``)."""
    netns = [slot.netns] if slot.netns_path.exists() else []
    links = [slot.host_link] if _link_exists(slot.host_link) else []
    routes = _slot_routes(slot)
    if not any(slot_is_live(i) for i in range(SLOTS) if i != slot.index):
        routes += [f"unreachable {guard}" for guard in _guard_routes()]
    cgroups = [str(h / slot.cgroup.lstrip("/")) for h in cgroup_hierarchies() if (h / slot.cgroup.lstrip("/")).exists()]
    files = [str(f) for f in (slot.data_dir, slot.state_dir) if f.exists()]
    if slot.image_dir.exists() and not (slot.image_dir / CLEAN).exists():
        files.append(str(slot.image_dir))  # a store in use, or left by a node that did not stop cleanly
    if CONTAINER_LOG_LINKS.is_dir():
        files += [
            str(link)
            for link in CONTAINER_LOG_LINKS.iterdir()
            if link.is_symlink() and os.readlink(link).startswith(str(slot.data_dir) + "/")
        ]
    files += [str(p) for p in (CNI_CACHE / "results").glob(f"{slot.name}-*")]
    return Inventory(
        processes=sorted(cgroup_pids(slot) | recorded_pids(slot)),
        mounts=mounts_under(slot.data_dir, slot.state_dir),
        netns=netns,
        links=links,
        routes=routes,
        cgroups=cgroups,
        files=files,
    )


# --- helpers ------------------------------------------------------------------------------------------


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise NodeHostError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return path.encode().decode("unicode_escape") if "\\" in path else path
