"""What the operator costs the cluster: API requests, database queries, CPU and memory per run, and its latencies.

``make bench`` (``python -m bench.operator``) runs, on each API server (``--api-server``:
``kubesim``, the emulator, and ``real``, kube-apiserver with etcd and kube-controller-manager
built by ``make k8s``; ``both`` by default, one after the other in one run) with the real
operator process and a private PostgreSQL database:

1. quiet load: ``--runs`` (1,000) AgentRuns held Running by a kubelet stand-in
   that reported their pods Running and went quiet (no runner processes, so
   runner CPU does not blur the operator's). Over ``--window`` seconds:
   ``operator_api_requests_per_run_per_s`` (every request the operator makes,
   watches and the Lease included: on kubesim counted by a proxy only it talks
   through; on the real server from kube-apiserver's own audit log, which records
   the operator's user only),
   ``operator_db_queries_per_run_per_s`` (transactions of the private database,
   which only the operator uses here, from ``pg_stat_database``),
   ``operator_cpu_percent`` (of one core, from /proc) and
   ``operator_rss_mb_1000_runs`` (its resident memory at the end);
2. burst: ``--burst`` (200) AgentRuns applied at once: ``burst_pods_created_s``,
   seconds from the apply's return (the operator sees them with the watch
   events the apply causes) until every pod exists;
3. with runners (the kubelet stand-in running real runner processes of the current code, ``--active`` runs
   of ``agentrun_dev.graphs:ticker``): ``status_lag_p95_s`` (a checkpoint's
   commit time in PostgreSQL to the moment the AgentRun shows that
   ``stateVersion``), ``stop_p95_s`` (``spec.stop`` patched to phase Stopped),
   ``reschedule_p95_s`` (a SIGKILLed runner's pod reported terminated to the next
   attempt's pod existing);
4. at 10x (``scale``; ``--scale N``, 10,000 by default, 50 with ``--quick``; ``--scale-only`` runs this
   phase alone and keeps the other figures in ``--out``): N AgentRuns waiting for approval (phase
   Interrupted, no pod) beside ``scale_running`` (200) running ones, measured at 1,000 and at N (merged
   under ``operator.scale.<server>.<N>``). The waiting runs are seeded while no operator runs: each
   AgentRun created with the status the operator writes when attempt 1's pod exits 3 (less what it copies
   from the store), and its thread left interrupted in the store by the ``asker`` graph itself, run in this
   process as that run's attempt 1; the operator's first pass then takes each through its normal
   reconcile (it reads the thread's progress and writes the interrupt into status). The running ones are
   held Running on ``QUIET_NODE`` as in phase 1, ``active`` of them ticking with real runners for the
   status lag. At each size: ``start_reconciled_s`` (a new leader's start to every run reconciled, from
   its ``agentrun_operator_runs_reconciled`` gauge), then over ``scale_window`` seconds the requests,
   queries and CPU per run and the RSS (``rss_peak_mb``: its high-water mark, VmHWM), then
   ``status_lag_p95_s``, then ``restart_reconciled_s``
   (SIGTERM to the leader to every run reconciled by its successor) and the failover: a standby beside
   the leader, the leader SIGKILLed, ``failover_leading_s`` (until the standby leads: the Lease,
   ``failover_lease_s``, must expire first) and ``failover_reconciled_s`` (until it reconciled every run).
   These operators use the default Lease (15 s), not the setup's 60 s.

``--baseline REV`` measures the operator of git revision REV the same way (a
worktree; its runner code too) and stores it as ``before`` (with ``--scale-only``: phase 4, server by server
right after this tree's, as ``scale_before``). ``--operator-env KEY=VALUE`` sets a variable in every operator
(an allocator setting); ``--memory-dump DIR`` writes the leader's memory dump at each size of phase 4
(``agentrun_operator.io.memory.dump``: RSS, the allocators' live vs kept, objects by type). Results are merged
into ``bench/results/latest.json`` under ``operator``: ``figures`` and ``before``
hold one set of figures per server (the runtime benchmark's keys are kept).
``--quick`` (the smoke in tests/cluster) runs a few runs of each.

On the real server the quiet runs' pods are bound to a Node without a kubelet
(``bench-quiet``) and reported Running by the driver; its controllers run without
the node lifecycle controllers, so that node is never found unready and its pods
never evicted while the operator is measured (the pod garbage collector still
runs: it removes pods of nodes that do not exist, hence the Node object).
"""

# The driver blocks on purpose (it polls the API and the database while the operator works).

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import yaml

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun_dev import launch
from agentrun_dev.databases import create_database, drop_database
from agentrun_dev.graphs import asker
from agentrun_dev.kubeload import CountingProxy, RunningHolder
from agentrun_dev.launch import OperatorProcess
from agentrun_operator.decide.identity import request_key
from kubesim import KubeletThread, default_base_env, write_kubeconfig
from kubesim.access import ApiAccess
from kubesim.real import CONTROLLERS, MASTERS, RealControlPlane

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SERVERS = ("kubesim", "real")
OPERATOR_USER = "agentrun-bench-operator"  # the operator's identity on the real server (what its audit log records)
QUIET_NODE = "bench-quiet"
AUDIT_LOG = "audit.log"  # in the real server's work folder
NODE_LIFECYCLE = ("node-lifecycle-controller", "taint-eviction-controller")
KNOWN_IMAGES = ("agentrun:test",)
TICKER = "agentrun_dev.graphs:ticker"
CHUNK = 100
# A Lease renewed every 20 s rather than 5 s: an emulator busy with the setup must not cost the leader its
# Lease (old and new operator alike); in steady state it is 0.1 request per second, whatever the runs.
LEASE_SECONDS = "60"
SCALE_BASE = 1000
ASKER = "agentrun_dev.graphs:asker"
SEED_ATTEMPTS = 5  # per seeded run: the API server under 16 parallel creates may drop a connection
SEED_WORKERS = 16  # parallel creates while seeding (the API server is the bottleneck, not the driver)
WAITING = "waiting"  # the label value (bench=...) of the scale phase's runs waiting for approval
# The environment of every operator this bench starts besides its settings (``--operator-env KEY=VALUE``: an
# allocator setting, PYTHONTRACEMALLOC for ``--memory-dump``).
OPERATOR_ENV: dict[str, str] = {}
MEMORY_SIGNAL = 12  # SIGUSR2: the operator's debugMemorySignal when ``--memory-dump`` is given
MEMORY_DUMPS: list[Path] = []  # ``--memory-dump DIR``: where the leader's dump at each size goes (empty: none)


@dataclass(frozen=True)
class Params:
    runs: int = 1000
    burst: int = 200
    active: int = 8
    window: float = 60.0
    settle: float = 10.0
    scale: int = 10_000  # runs waiting for approval in the scale phase (measured at 1,000 too when larger)
    scale_running: int = 200  # running beside them (``active`` of them with real runners, for the status lag)
    scale_window: float = 30.0
    failover_lease: float = 15.0  # the chart's and the operator's default Lease, for the restart and the failover
    scale_at: tuple[int, ...] = ()  # the sizes to measure at, when not (1,000, scale)

    @classmethod
    def quick(cls) -> Params:
        return cls(
            runs=6,
            burst=5,
            active=2,
            window=3.0,
            settle=1.0,
            scale=50,
            scale_running=6,
            scale_window=3.0,
            failover_lease=3.0,
        )

    def scale_sizes(self) -> tuple[int, ...]:
        """The sizes the scale phase is measured at: 1,000 and ``scale``, or ``scale`` alone when not larger."""
        if self.scale_at:
            return tuple(sorted(self.scale_at))
        return (SCALE_BASE, self.scale) if self.scale > SCALE_BASE else (self.scale,)


# --- the pieces -------------------------------------------------------------------------------------------------------


class Server(Protocol):
    """What the driver needs of an API server: the emulator (``Cluster``) or the real one (``RealControlPlane``)."""

    kubeconfig: Path  # the admin's

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]: ...

    def list_objects(self, resource: str, namespace: str) -> list[dict[str, Any]]: ...

    def get(self, resource: str, name: str, namespace: str) -> dict[str, Any] | None: ...


class Cluster:
    """The emulated API server in a process of its own (``python -m kubesim``): with a thousand runs it
    is the busiest party, and in the driver's process it would share one interpreter lock with the
    driver, the counting proxy and the kubelet stand-in. The driver talks to it over HTTP and kubectl."""

    def __init__(self, workdir: Path, source: Path) -> None:
        self.workdir = workdir
        self.kubeconfig = workdir / "kubeconfig"
        self.log = workdir / "kubesim.log"
        argv = [sys.executable, "-m", "kubesim", "--crd", str(source / "crds"), "--kopf-peerings"]
        argv += ["--kubeconfig", str(self.kubeconfig)]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 30
        while "serving at" not in self.log.read_text(errors="replace"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"kubesim did not start: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        self.url = str(yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        argv = ["kubectl", f"--cache-dir={self.workdir / 'kubectl-cache'}", *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True, env=env, timeout=300)

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=60) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def list_objects(self, resource: str, namespace: str = "default") -> list[dict[str, Any]]:
        group = "/apis/agentrun.dev/v1alpha1" if resource == "agentruns" else "/api/v1"
        return list((self._get(f"{group}/namespaces/{namespace}/{resource}") or {}).get("items") or [])

    def get(self, resource: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        group = "/apis/agentrun.dev/v1alpha1" if resource == "agentruns" else "/api/v1"
        found: dict[str, Any] | None = self._get(f"{group}/namespaces/{namespace}/{resource}/{name}")
        return found


@contextlib.contextmanager
def emulated(workdir: Path, source: Path) -> Iterator[Cluster]:
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(workdir, source)
    try:
        yield cluster
    finally:
        cluster.stop()


# kube-apiserver's audit policy: one event per request of the operator's user (when it is received;
# a watch counts once, as the proxy counts it), nothing for anyone else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["ResponseStarted", "ResponseComplete", "Panic"],
    "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
}


@contextlib.contextmanager
def real(workdir: Path, source: Path, *, node_lifecycle: bool = True) -> Iterator[RealControlPlane]:
    """kube-apiserver, etcd and kube-controller-manager (``make k8s``) with the CRDs installed and
    the operator's user (``OPERATOR_USER``, in system:masters) audited to ``workdir/audit.log``."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    controllers = CONTROLLERS if node_lifecycle else tuple(c for c in CONTROLLERS if c not in NODE_LIFECYCLE)
    plane = RealControlPlane(
        workdir / "plane",
        users={OPERATOR_USER: [MASTERS]},
        controllers=controllers,
        apiserver_args=(f"--audit-policy-file={policy}", f"--audit-log-path={workdir / AUDIT_LOG}"),
    )
    with plane:
        applied = plane.kubectl("apply", "--server-side", "-f", str(source / "crds"))
        assert applied.returncode == 0, applied.stderr
        # Established first; a new CRD's storage then answers 429 for a moment.
        plane.wait_for(
            lambda: plane.api("GET", "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns").status == 200,
            timeout=60,
            message="agentruns served",
        )
        yield plane


@contextlib.contextmanager
def serving(server: str, workdir: Path, source: Path, *, node_lifecycle: bool = True) -> Iterator[Server]:
    """``server``'s API server ("kubesim" or "real"), up for the block."""
    if server == "kubesim":
        with emulated(workdir, source) as cluster:
            yield cluster
    else:
        with real(workdir, source, node_lifecycle=node_lifecycle) as plane:
            yield plane


def operator_kubeconfig(cluster: Server, workdir: Path) -> Path:
    """The operator's own identity: on the real server the audited ``OPERATOR_USER``."""
    if isinstance(cluster, RealControlPlane):
        return cluster.write_kubeconfig(workdir / "operator.kubeconfig", cluster.access(OPERATOR_USER))
    return cluster.kubeconfig


def audited(audit_log: Path, since: float, until: float) -> Counter[str]:
    """The operator's requests received in [since, until) (epoch seconds), by "verb resource[/subresource]"."""
    seen: Counter[str] = Counter()
    with audit_log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("stage") != "RequestReceived" or event.get("user", {}).get("username") != OPERATOR_USER:
                continue
            received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            if since <= received < until:
                ref = event.get("objectRef") or {}
                what = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
                seen[f"{event['verb']} {what or event.get('requestURI', '?')}"] += 1
    return seen


def quiet_node(plane: RealControlPlane) -> RunningHolder:
    """On the real server: a Node with no kubelet, and ``RunningHolder`` binding the operator's pods to it and
    reporting them Running (once each), standing in for the quiet kubelet it plays on kubesim."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": QUIET_NODE}}
    created = plane.api("POST", "/api/v1/nodes", node)
    assert created.status in (201, 409), created
    return RunningHolder(plane.admin, interval=1.0, node=QUIET_NODE)


async def _migrated() -> str:
    dsn = await create_database()
    store = PgCheckpointer(dsn)  # migrated up front, as a store in use is: no run waits for the schema
    try:
        await store.setup()
    finally:
        await store.aclose()
    return dsn


@contextlib.contextmanager
def database() -> Iterator[str]:
    dsn = asyncio.run(_migrated())
    try:
        yield dsn
    finally:
        asyncio.run(drop_database(dsn))


def start_operator(
    source: Path, kubeconfig: Path, workdir: Path, *, identity: str = "bench", lease: str = LEASE_SECONDS, **env: str
) -> OperatorProcess:
    """The operator of the ``source`` tree (this one, or ``--baseline``'s checkout), by the one launcher."""
    return launch.start_operator(
        kubeconfig,
        identity=identity,
        log_path=workdir / f"operator-{time.monotonic_ns()}.log",
        settings={
            "default_image": "agentrun:test",
            "log_format": "text",
            "lease_duration_seconds": lease,
            **({"debug_memory_path": str(workdir / "memory.txt")} if MEMORY_DUMPS else {}),
        },
        env={
            "PYTHONPATH": os.pathsep.join(str(source / p) for p in ("operator", "runner", ".")),
            **OPERATOR_ENV,
            **env,
        },
        cwd=source,
    )


def secret(cluster: Server, dsn: str) -> None:
    result = cluster.kubectl("create", "secret", "generic", "agentrun-store", f"--from-literal=postgresDsn={dsn}")
    assert result.returncode == 0, result.stderr


def run(
    name: str,
    *,
    graph: str = "examples.support_agent:app",
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "spec": {
            "graph": graph,
            "threadId": name,
            "input": {"messages": [{"role": "user", "content": "charge my saved card for order 4821"}]},
            "store": {"secretRef": {"name": "agentrun-store"}},
            "podTemplate": {"env": [{"name": k, "value": v} for k, v in (env or {}).items()]},
            **spec,
        },
    }


def apply(cluster: Server, manifests: list[dict[str, Any]], chunk: int = 250) -> None:
    for start in range(0, len(manifests), chunk):
        listing = {"apiVersion": "v1", "kind": "List", "items": manifests[start : start + chunk]}
        result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(listing))
        assert result.returncode == 0, result.stderr


def statuses(cluster: Server, selector: str | None = None) -> dict[str, dict[str, Any]]:
    """Every AgentRun's status by name (only those ``selector`` chooses, when given: a list of 10,000 is slow)."""
    if selector is None:
        found = cluster.list_objects("agentruns", "default")
    else:
        path = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns?" + urllib.parse.urlencode(
            {"labelSelector": selector}
        )
        found = list(_api_get(cluster, path).get("items") or [])
    return {r["metadata"]["name"]: r.get("status") or {} for r in found}


def _api_get(cluster: Server, path: str) -> dict[str, Any]:
    if isinstance(cluster, RealControlPlane):
        answer = cluster.api("GET", path, timeout=60)
        assert answer.status == 200, answer
        return dict(answer.body)
    assert isinstance(cluster, Cluster)
    return dict(cluster._get(path) or {})


def pod_names(cluster: Server) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.list_objects("pods", "default")}


def wait(predicate: Any, *, timeout: float, what: str, operator: OperatorProcess, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}; operator log:\n{operator.log()[-3000:]}")


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory now (``VmHWM``: its peak so far), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _xacts(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        value = await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(value)
    finally:
        await conn.close()


def _terminated(pod: dict[str, Any] | None) -> bool:
    """The kubelet reported the runner container's end (what the operator acts on)."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    return bool((statuses[0].get("state") or {}).get("terminated"))


def p95(samples: list[float]) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


# --- 1. quiet load ---------------------------------------------------------------------------------------------------


def quiet_load(server: str, source: Path, p: Params, workdir: Path) -> dict[str, float]:
    with (
        database() as dsn,
        serving(server, workdir, source, node_lifecycle=False) as cluster,
        contextlib.ExitStack() as stack,
    ):
        secret(cluster, dsn)
        kubeconfig, count, holder = _quiet(cluster, workdir, stack)
        started = time.monotonic()  # the operator's first requests (its watches, the Lease) included
        operator = start_operator(source, kubeconfig, workdir)
        stack.callback(operator.stop)
        # In chunks, each once its pods exist: setting up is not measured, and a burst of 1,000 on the
        # emulator (validation, CEL rules) would only measure the emulator.
        for start in range(0, p.runs, CHUNK):
            upto = min(p.runs, start + CHUNK)
            apply(cluster, [run(f"quiet-{i}") for i in range(start, upto)])
            wait(
                lambda upto=upto: len(pod_names(cluster)) >= upto,
                timeout=600,
                what=f"{upto} pods",
                operator=operator,
                interval=1.0,
            )
        wait(
            lambda: sum(s.get("phase") == "Running" for s in statuses(cluster).values()) >= p.runs,
            timeout=max(120.0, p.runs * 0.6),
            what=f"{p.runs} runs Running",
            operator=operator,
            interval=2.0,
        )
        print(f"  {p.runs} runs Running after {time.monotonic() - started:.0f}s", flush=True)
        holder.stop()
        time.sleep(p.settle)
        pid = operator.proc.pid
        xacts0, cpu0, t0 = asyncio.run(_xacts(dsn)), proc_cpu_seconds(pid), time.monotonic()
        time.sleep(p.window)
        xacts1, cpu1, t1 = asyncio.run(_xacts(dsn)), proc_cpu_seconds(pid), time.monotonic()
        rss = proc_rss_mb(pid)
        time.sleep(0.5)  # the audit log is written as requests arrive; a moment for the last lines
        seen, setup = count(t0, t1), count(started, t0)
        elapsed = t1 - t0
        # The two reads of pg_stat_database are transactions too: not the operator's.
        queries = max(0, xacts1 - xacts0 - 2)
        print(f"  requests in the window: {dict(seen)}", flush=True)
        return {
            "operator_api_requests_per_run_per_s": sum(seen.values()) / p.runs / elapsed,
            # Its requests while the runs were created and started (pods, status): the counter's proof of life.
            "operator_api_requests_per_run_setup": sum(setup.values()) / p.runs,
            "operator_db_queries_per_run_per_s": queries / p.runs / elapsed,
            "operator_cpu_percent": 100.0 * (cpu1 - cpu0) / elapsed,
            # Named for the full benchmark's 1,000 runs; with --runs N it is the RSS at N runs (quiet_runs).
            "operator_rss_mb_1000_runs": rss,
            "quiet_runs": float(p.runs),
            "quiet_window_s": elapsed,
        }


def _quiet(
    cluster: Server, workdir: Path, stack: contextlib.ExitStack, *, bind: bool = False
) -> tuple[Path, Callable[[float, float], Counter[str]], RunningHolder]:
    """The operator's kubeconfig, a count of its requests in a window (monotonic seconds) and the quiet
    kubelet: on kubesim a counting proxy and ``RunningHolder`` (binding the pods to ``QUIET_NODE`` when
    ``bind``, so a kubelet started later leaves them alone); on the real server its audit log and
    ``quiet_node``."""
    if isinstance(cluster, RealControlPlane):
        node = quiet_node(cluster).start()
        stack.callback(node.stop)
        offset = time.time() - time.monotonic()
        return (
            operator_kubeconfig(cluster, workdir),
            lambda t0, t1: audited(workdir / AUDIT_LOG, t0 + offset, t1 + offset),
            node,
        )
    assert isinstance(cluster, Cluster)
    proxy = CountingProxy(cluster.url).start()
    stack.callback(proxy.stop)
    holder = RunningHolder(cluster.url, interval=1.0, node=QUIET_NODE if bind else None).start()
    stack.callback(holder.stop)
    return (
        write_kubeconfig(workdir / "via-proxy", proxy.url),
        lambda t0, t1: proxy.count(t0, t1, watches=True),
        holder,
    )


# --- 2. burst --------------------------------------------------------------------------------------------------------


def burst(server: str, source: Path, p: Params, workdir: Path) -> dict[str, float]:
    with database() as dsn, serving(server, workdir, source) as cluster:
        secret(cluster, dsn)
        operator = start_operator(source, operator_kubeconfig(cluster, workdir), workdir)
        try:
            wait(
                lambda: "leading as" in operator.log(),
                timeout=60,
                what="leader",
                operator=operator,
            )
            time.sleep(1)
            apply(cluster, [run(f"burst-{i}") for i in range(p.burst)], chunk=p.burst)
            seen = time.monotonic()
            wait(
                lambda: len(pod_names(cluster)) >= p.burst,
                timeout=300,
                what="burst pods",
                operator=operator,
                interval=0.1,
            )
            return {"burst_pods_created_s": time.monotonic() - seen, "burst_runs": float(p.burst)}
        finally:
            operator.stop()


# --- 3. with runners -------------------------------------------------------------------------------------------------


async def _commits(dsn: str) -> list[tuple[str, int, float]]:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": "agentrun"})
    try:
        rows = await conn.fetch("SELECT thread_id, version, extract(epoch FROM created_at)::float8 AS at FROM states")
        return [(r["thread_id"], int(r["version"]), float(r["at"])) for r in rows]
    finally:
        await conn.close()


def active(server: str, source: Path, p: Params, workdir: Path) -> dict[str, float]:
    with database() as dsn, serving(server, workdir, source) as cluster:
        secret(cluster, dsn)
        base_env = default_base_env([ROOT])
        if isinstance(cluster, RealControlPlane):
            kubelet = cluster.start_kubelet(workdir / "kubelet", known_images=KNOWN_IMAGES, base_env=base_env)
        else:
            assert isinstance(cluster, Cluster)
            kubelet = KubeletThread(
                cluster.url, workdir / "kubelet", known_images=KNOWN_IMAGES, base_env=base_env
            ).start()
        operator = start_operator(source, operator_kubeconfig(cluster, workdir), workdir)
        try:
            return {
                **_status_lag(cluster, dsn, p, operator),
                **_stops(cluster, p, operator),
                **_reschedules(cluster, kubelet, p, operator),
            }
        finally:
            operator.stop()
            kubelet.stop()


def _status_lag(
    cluster: Server, dsn: str, p: Params, operator: OperatorProcess, prefix: str = "lag"
) -> dict[str, float]:
    names = [f"{prefix}-{i}" for i in range(p.active)]
    labels = {"bench": prefix}
    watch = StatusWatch(cluster, f"bench={prefix}").start()  # a watch, not a poll: a list of 10,000 runs is slow
    apply(cluster, [run(n, graph=TICKER, env={"TICKS": "8", "TICK_SECONDS": "1"}, labels=labels) for n in names])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not all(watch.phases.get(n) == "Succeeded" for n in names):
        time.sleep(0.2)
    shown = {(f"default/{name}", version): at for (name, version), at in watch.shown.items()}
    lags: list[float] = []
    for thread, version, committed in asyncio.run(_commits(dsn)):
        later = [at for (t, v), at in shown.items() if t == thread and v >= version]
        if later and thread.startswith(f"default/{prefix}-"):
            lags.append(max(0.0, min(later) - committed))
    return {"status_lag_p95_s": p95(lags), "status_lag_samples": float(len(lags))}


class StatusWatch:
    """The AgentRuns ``selector`` chooses, watched from a thread: when each (name, stateVersion) was first seen
    (epoch seconds, as the watch event arrived) and each run's latest phase."""

    def __init__(self, cluster: Server, selector: str) -> None:
        self.access = cluster.admin if isinstance(cluster, RealControlPlane) else ApiAccess(getattr(cluster, "url", ""))
        query = urllib.parse.urlencode({"watch": "1", "labelSelector": selector, "timeoutSeconds": "600"})
        self.url = f"{self.access.server}/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns?{query}"
        self.shown: dict[tuple[str, int], float] = {}
        self.phases: dict[str, str] = {}
        self._thread = threading.Thread(target=self._loop, name="status-watch", daemon=True)

    def start(self) -> StatusWatch:
        """Start watching (the thread ends with the watch's own timeout, or with the driver)."""
        self._thread.start()
        time.sleep(0.5)  # the watch is open before the runs are applied
        return self

    def _loop(self) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # a watch the server ends is opened again (events seen are kept)
            request = urllib.request.Request(self.url, headers=self.access.headers())
            try:
                with urllib.request.urlopen(request, timeout=600, context=self.access.ssl_context()) as response:
                    for line in response:
                        self._seen(json.loads(line).get("object") or {}, time.time())
            except (OSError, ValueError):
                time.sleep(0.2)

    def _seen(self, run: dict[str, Any], at: float) -> None:
        name, status = (run.get("metadata") or {}).get("name"), run.get("status") or {}
        if not name:
            return
        self.phases[name] = str(status.get("phase") or "")
        if status.get("stateVersion"):
            self.shown.setdefault((name, int(status["stateVersion"])), at)


def _stops(cluster: Server, p: Params, operator: OperatorProcess) -> dict[str, float]:
    names = [f"stop-{i}" for i in range(p.active)]
    apply(cluster, [run(n, graph=TICKER, env={"TICKS": "1000", "TICK_SECONDS": "1"}) for n in names])
    wait(
        lambda: all(statuses(cluster).get(n, {}).get("stateVersion") for n in names),
        timeout=120,
        what="stop runs stepping",
        operator=operator,
    )
    asked: dict[str, float] = {}
    for n in names:
        asked[n] = time.monotonic()
        assert cluster.kubectl("patch", "ar", n, "--type", "merge", "-p", '{"spec":{"stop":true}}').returncode == 0
    done: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while len(done) < len(names) and time.monotonic() < deadline:
        for n, s in statuses(cluster).items():
            if n in asked and n not in done and s.get("phase") == "Stopped":
                done[n] = time.monotonic() - asked[n]
        time.sleep(0.05)
    return {"stop_p95_s": p95(list(done.values())), "stop_samples": float(len(done))}


def _reschedules(cluster: Server, kubelet: KubeletThread, p: Params, operator: OperatorProcess) -> dict[str, float]:
    names = [f"resched-{i}" for i in range(p.active)]
    apply(
        cluster,
        [
            run(
                n,
                graph=TICKER,
                env={"TICKS": "1000", "TICK_SECONDS": "1"},
                restartPolicy={"maxRestarts": 5, "backoffSeconds": 0},
            )
            for n in names
        ],
    )
    wait(
        lambda: all((statuses(cluster).get(n, {}).get("stateVersion") or 0) >= 2 for n in names),
        timeout=120,
        what="reschedule runs stepping",
        operator=operator,
    )
    samples: list[float] = []
    for n in names:
        time.sleep(0.5)  # one at a time, on a machine that is not starting runners
        try:
            kubelet.kill(f"{n}-1")
            ended = wait(
                lambda n=n: _terminated(cluster.get("pods", f"{n}-1", "default")) and time.monotonic(),
                timeout=30,
                what=f"{n}-1 terminated",
                operator=operator,
                interval=0.01,
            )
            created = wait(
                lambda n=n: cluster.get("pods", f"{n}-2", "default") is not None and time.monotonic(),
                timeout=30,
                what=f"{n}-2 created",
                operator=operator,
                interval=0.01,
            )
        except RuntimeError as e:  # a sample lost to a loaded machine: said, not fatal
            print(f"  reschedule sample {n} lost: {str(e)[:200]}", flush=True)
            continue
        samples.append(created - ended)
    for n in names:
        cluster.kubectl("patch", "ar", n, "--type", "merge", "-p", '{"spec":{"stop":true}}')
    return {"reschedule_p95_s": p95(samples), "reschedule_samples": float(len(samples))}


# --- 4. at 10x: thousands of runs waiting for approval ------------------------------------------------------------


def scale(server: str, source: Path, p: Params, workdir: Path) -> dict[str, dict[str, float]]:
    """The operator with ``scale`` runs waiting for approval and ``scale_running`` running, at each of
    ``p.scale_sizes()``: figures by size (the module docstring's phase 4)."""
    with (
        database() as dsn,
        serving(server, workdir, source, node_lifecycle=False) as cluster,
        contextlib.ExitStack() as stack,
    ):
        secret(cluster, dsn)
        kubeconfig, count, holder = _quiet(cluster, workdir, stack, bind=True)
        runs = _scale_running(cluster, source, kubeconfig, workdir, p.scale_running - p.active, holder)
        kubelet = _kubelet(cluster, workdir)
        stack.callback(kubelet.stop)
        measured: dict[str, dict[str, float]] = {}
        seeded = 0
        for size in p.scale_sizes():
            began = time.monotonic()
            _seed_waiting(cluster, dsn, range(seeded, size))  # no operator runs meanwhile (see _seed_waiting)
            setup = time.monotonic() - began
            print(f"  {size - seeded} runs waiting for approval seeded in {setup:.0f}s", flush=True)
            runs += size - seeded
            seeded = size
            at = _at_scale(cluster, dsn, source, p, workdir, kubeconfig, count, runs=runs, size=size)
            runs += p.active  # the status lag's runs, Succeeded now
            measured[str(size)] = {"setup_s": setup, "waiting_runs": float(size), **at}
            print(f"  at {size}: {measured[str(size)]}", flush=True)
        return {size: {k: round(v, 6) for k, v in figures.items()} for size, figures in measured.items()}


def _kubelet(cluster: Server, workdir: Path) -> KubeletThread:
    """A kubelet stand-in running real runner processes (the status lag's runs)."""
    base_env = default_base_env([ROOT])
    if isinstance(cluster, RealControlPlane):
        return cluster.start_kubelet(workdir / "kubelet", known_images=KNOWN_IMAGES, base_env=base_env)
    assert isinstance(cluster, Cluster)
    return KubeletThread(cluster.url, workdir / "kubelet", known_images=KNOWN_IMAGES, base_env=base_env).start()


def _scale_running(
    cluster: Server, source: Path, kubeconfig: Path, workdir: Path, quiet: int, holder: RunningHolder
) -> int:
    """``quiet`` runs Running on ``QUIET_NODE`` (their pods held Running, no process), started by an operator
    stopped afterwards; returns how many runs exist."""
    operator = start_operator(source, kubeconfig, workdir, identity="bench-setup")
    try:
        apply(cluster, [run(f"running-{i}", labels={"bench": "running"}) for i in range(quiet)])
        wait(
            lambda: sum(s.get("phase") == "Running" for s in statuses(cluster, "bench=running").values()) >= quiet,
            timeout=max(120.0, quiet * 0.6),
            what=f"{quiet} runs Running",
            operator=operator,
            interval=1.0,
        )
    finally:
        operator.stop()
        holder.stop()
    return quiet


def _api(cluster: Server, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
    """One request as the admin; the decoded answer (raises unless 2xx)."""
    if isinstance(cluster, RealControlPlane):
        answer = cluster.api(method, path, body, content_type=content_type, timeout=60)
        if not 200 <= answer.status < 300:
            raise RuntimeError(f"{method} {path}: {answer}")
        return answer.body
    assert isinstance(cluster, Cluster)
    data = json.dumps(body).encode()
    request = urllib.request.Request(cluster.url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def waiting_status(name: str, started: str) -> dict[str, Any]:
    """What the operator writes when attempt 1's pod exits 3 (``decide.run``: ``pod_outcome`` of an interrupt),
    less what it copies from the store (the interrupt, stateVersion, node, step): its first reconcile adds those."""
    return {
        "phase": "Interrupted",
        "reason": "Interrupted",
        "message": "approve?",
        "attempt": 1,
        "podName": f"{name}-1",
        "startTime": started,
        "observedGeneration": 1,
        "attempts": [
            {
                "attempt": 1,
                "podName": f"{name}-1",
                "startTime": started,
                "endTime": started,
                "outcome": "Interrupted",
                "exitCode": 3,
                "message": "Interrupted: waiting on approve?",
            }
        ],
    }


def _seed_waiting(cluster: Server, dsn: str, indexes: range) -> None:
    """Runs ``waiting-<i>`` left as a runner and the operator leave a run waiting for approval, with no pod:
    the AgentRun created with its status (phase Interrupted) and its thread in the store as the ``asker``
    graph really leaves it (the graph runs in this process, one attempt registered with the run's uid).

    Seeded while no operator runs: one that saw a new run before its status would start its first pod.
    The pod is gone, as after a node drain or a cleanup: an Interrupted run needs none (``decide.run``)."""
    names = [f"waiting-{i}" for i in indexes]
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"

    def create(name: str) -> str:
        for attempt in range(SEED_ATTEMPTS):
            try:
                # A retry finds the run if the dropped request had created it.
                created = (cluster.get("agentruns", name, "default") if attempt else None) or _api(
                    cluster, "POST", path, run(name, graph=ASKER, labels={"bench": WAITING})
                )
                patch = {"status": waiting_status(name, started)}
                _api(cluster, "PATCH", f"{path}/{name}/status", patch, "application/merge-patch+json")
                return str(created["metadata"]["uid"])
            except OSError as e:  # a connection the loaded API server dropped (seen: SSL EOF at 9,000 creates)
                if attempt + 1 == SEED_ATTEMPTS:
                    raise
                print(f"  seeding {name}: {e!r}; retrying", flush=True)
                time.sleep(1.0 + attempt)
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(max_workers=SEED_WORKERS) as pool:
        uids = list(pool.map(create, names))
    asyncio.run(_interrupted_threads(dsn, list(zip(names, uids, strict=True))))


async def _interrupted_threads(dsn: str, runs: list[tuple[str, str]]) -> None:
    """Run ``asker`` to its interrupt for each (name, uid) on the run's thread, as attempt 1 of that run."""
    store = PgCheckpointer(dsn)
    app = asker.compile(store, name=ASKER)
    gate = asyncio.Semaphore(SEED_WORKERS)
    manifest_input = run("x")["spec"]["input"]

    async def one(name: str, uid: str) -> None:
        thread = f"default/{name}"
        key = request_key(namespace="default", name=name, request_id=None, input=manifest_input)
        config = {"thread_id": thread, "attempt": 1, "run_uid": uid, "request_key": key}
        async with gate:
            await store.register_attempt(thread, 1, run_uid=uid)
            async for _ in app.astream(manifest_input, config):
                pass

    try:
        await store.setup()
        await asyncio.gather(*(one(name, uid) for name, uid in runs))
    finally:
        await store.aclose()


def _at_scale(
    cluster: Server,
    dsn: str,
    source: Path,
    p: Params,
    workdir: Path,
    kubeconfig: Path,
    count: Callable[[float, float], Counter[str]],
    *,
    runs: int,
    size: int,
) -> dict[str, float]:
    """One size: a new leader's first pass, the quiet window, the status lag, a restart and a failover."""
    lease = f"{p.failover_lease:g}"
    began = time.monotonic()
    leader = start_operator(source, kubeconfig, workdir, identity=f"bench-{size}-a", lease=lease)
    try:
        first = _all_reconciled(leader, runs, began)
        _check_waiting(cluster, size - 1)
        figures = {"start_reconciled_s": first, **_scale_window(dsn, p, leader, count, runs)}
        if MEMORY_DUMPS:
            _memory_dump(leader, workdir, MEMORY_DUMPS[0] / f"{workdir.name}-{size}.txt")
        figures.update(_status_lag(cluster, dsn, p, leader, prefix=f"lag{size}"))
        runs += p.active
        began = time.monotonic()
        leader.stop()
        leader = start_operator(source, kubeconfig, workdir, identity=f"bench-{size}-b", lease=lease)
        figures["restart_reconciled_s"] = _all_reconciled(leader, runs, began)
        figures["rss_mb_after_restart"] = proc_rss_mb(leader.proc.pid)
        figures["rss_peak_mb_after_restart"] = proc_rss_mb(leader.proc.pid, "VmHWM")
        standby = start_operator(source, kubeconfig, workdir, identity=f"bench-{size}-c", lease=lease)
        try:
            wait(lambda: (standby.role() or "").strip() == "standby", timeout=60, what="standby", operator=standby)
            began = time.monotonic()
            leader.kill()  # SIGKILL: the Lease is not released, the standby waits for it to expire
            wait(lambda: (standby.role() or "").strip() == "leader", timeout=120, what="takeover", operator=standby)
            figures["failover_leading_s"] = time.monotonic() - began
            figures["failover_reconciled_s"] = _all_reconciled(standby, runs, began)
        finally:
            standby.stop()
        figures["failover_lease_s"] = p.failover_lease
        return figures
    finally:
        leader.stop()


def _memory_dump(operator: OperatorProcess, workdir: Path, to: Path) -> None:
    """The operator's debug dump of where its memory is (``agentrun_operator.io.memory.dump``), copied to ``to``."""
    written = workdir / "memory.txt"
    written.unlink(missing_ok=True)
    os.kill(operator.proc.pid, MEMORY_SIGNAL)
    wait(written.exists, timeout=120, what="the memory dump", operator=operator, interval=1.0)
    time.sleep(1.0)  # written in one call, but let it finish
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_text(written.read_text())
    print(f"  memory dump: {to}", flush=True)


def _check_waiting(cluster: Server, index: int) -> None:
    """The operator took a seeded run through its normal path: still Interrupted, with the interrupt it read
    from the store (the seeded status has none) and the thread's position."""
    found = cluster.get("agentruns", f"waiting-{index}", "default") or {}
    status = found.get("status") or {}
    problem = (
        status.get("phase") != "Interrupted"
        or not (status.get("interrupt") or {}).get("id")
        or not status.get("stateVersion")
    )
    if problem:
        raise RuntimeError(f"waiting-{index} was not reconciled as a run waiting for approval: {status}")


def reconciled(operator: OperatorProcess) -> int:
    """How many runs ``operator`` has reconciled since it started (its ``runs_reconciled`` gauge); 0 while
    it does not answer or does not lead."""
    try:
        text = operator.metrics()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("agentrun_operator_runs_reconciled "):
            return int(float(line.split()[1]))
    return 0


def _all_reconciled(operator: OperatorProcess, runs: int, since: float) -> float:
    """Seconds from ``since`` (monotonic) until ``operator`` has reconciled ``runs`` runs."""
    wait(lambda: reconciled(operator) >= runs, timeout=600, what=f"{runs} runs reconciled", operator=operator)
    return time.monotonic() - since


def _scale_window(
    dsn: str, p: Params, operator: OperatorProcess, count: Callable[[float, float], Counter[str]], runs: int
) -> dict[str, float]:
    """Over ``scale_window`` seconds after ``settle``: requests, queries and CPU per run, and the RSS."""
    time.sleep(p.settle)
    pid = operator.proc.pid
    xacts0, cpu0, t0 = asyncio.run(_xacts(dsn)), proc_cpu_seconds(pid), time.monotonic()
    time.sleep(p.scale_window)
    xacts1, cpu1, t1 = asyncio.run(_xacts(dsn)), proc_cpu_seconds(pid), time.monotonic()
    rss, peak = proc_rss_mb(pid), proc_rss_mb(pid, "VmHWM")
    time.sleep(0.5)  # the audit log's last lines
    elapsed = t1 - t0
    seen = count(t0, t1)
    print(f"  requests in the window: {dict(seen)}", flush=True)
    return {
        "api_requests_per_run_per_s": sum(seen.values()) / runs / elapsed,
        "db_queries_per_run_per_s": max(0, xacts1 - xacts0 - 2) / runs / elapsed,
        "cpu_percent": 100.0 * (cpu1 - cpu0) / elapsed,
        "rss_mb": rss,
        "rss_peak_mb": peak,  # the first pass's high-water mark: what the memory limit must hold
        "runs": float(runs),
        "window_s": elapsed,
    }


# --- the driver ------------------------------------------------------------------------------------------------------


def measure(source: Path, p: Params, servers: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Every figure of phases 1-3 on each server, server after server (one API server up at a time)."""
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        for server in servers:
            measured: dict[str, float] = {}
            for name, phase in (("quiet load", quiet_load), ("burst", burst), ("with runners", active)):
                print(f"{source.name or source} on {server}: {name}", flush=True)
                work = Path(tmp) / server / name.replace(" ", "-")
                work.mkdir(parents=True)
                measured.update(phase(server, source, p, work))
            figures[server] = {k: round(v, 4) for k, v in measured.items()}
    return figures


def measure_scale(source: Path, p: Params, servers: tuple[str, ...]) -> dict[str, Any]:
    """Phase 4 on each server: its figures by server and size, and the machine's load around each."""
    scaled: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-operator-scale-") as tmp:
        for server in servers:
            print(f"{source.name or source} on {server}: scale {p.scale_sizes()}", flush=True)
            work = Path(tmp) / server
            work.mkdir(parents=True)
            before = os.getloadavg()
            began = time.monotonic()
            scaled[server] = scale(server, source, p, work)
            scaled[server]["machine"] = {
                "loadavg_1m_before": before[0],
                "loadavg_5m_after": os.getloadavg()[1],
                "loadavg_15m_after": os.getloadavg()[2],
                "phase_s": round(time.monotonic() - began, 1),
            }
    return scaled


def existing_section(out: Path) -> dict[str, Any]:
    """The ``operator`` section ``out`` holds now ({} if none)."""
    with contextlib.suppress(ValueError, OSError):
        found = json.loads(out.read_text()).get("operator")
        if isinstance(found, dict):
            return found
    return {}


def merge(out: Path, section: dict[str, Any]) -> None:
    """Write ``section`` as ``operator`` into ``out``, keeping every other key (the runtime benchmark's)."""
    existing: dict[str, Any] = {}
    if out.exists():
        with contextlib.suppress(ValueError):
            existing = json.loads(out.read_text())
    existing["operator"] = section
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(existing, indent=1, sort_keys=True) + "\n")  # as bench/runtime.py writes it


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def _scale_only(out: Path, p: Params, servers: tuple[str, ...], meta: dict[str, Any], baseline: str | None) -> int:
    """Phase 4 alone, merged into ``out``'s ``operator.scale`` (the other figures kept); with ``baseline``, that
    revision's operator measured the same way right after this one on each server (``operator.scale_before``)."""
    section = dict(existing_section(out))
    for server in servers:
        section["scale"] = {**(section.get("scale") or {}), **measure_scale(ROOT, p, (server,))}
        if baseline:
            worktree = Path(tempfile.mkdtemp(prefix="bench-operator-baseline-"))
            git("worktree", "add", "--detach", str(worktree), baseline)
            try:
                before = measure_scale(worktree, p, (server,))
            finally:
                git("worktree", "remove", "--force", str(worktree))
            section["scale_before"] = {**(section.get("scale_before") or {}), **before}
            meta["baseline"] = git("rev-parse", "--short", baseline)
        section["scale_meta"] = meta
        merge(out, section)  # after each server: a later failure keeps what was measured
    print(json.dumps({key: section.get(key) for key in ("scale", "scale_before")}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.operator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=Params.runs)
    parser.add_argument("--burst", type=int, default=Params.burst)
    parser.add_argument("--active", type=int, default=Params.active)
    parser.add_argument("--window", type=float, default=Params.window)
    parser.add_argument("--scale", type=int, default=Params.scale, help="runs waiting for approval in phase 4")
    parser.add_argument("--scale-only", action="store_true", help="only phase 4; the other figures in --out are kept")
    parser.add_argument("--scale-at", help="comma-separated sizes of phase 4 (default: 1000 and --scale)")
    parser.add_argument("--baseline", help="also measure the operator of this git revision (as 'before')")
    parser.add_argument("--quick", action="store_true", help="the smoke: a few runs of each")
    parser.add_argument(
        "--api-server", choices=("both", *SERVERS), default="both", help="the emulator, the real one or both"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    parser.add_argument(
        "--operator-env", action="append", default=[], help="KEY=VALUE in every operator's environment (repeatable)"
    )
    parser.add_argument("--memory-dump", type=Path, help="write the leader's memory dump at each size here")
    args = parser.parse_args(argv)
    OPERATOR_ENV.update(item.split("=", 1) for item in args.operator_env)
    if args.memory_dump:
        MEMORY_DUMPS.append(args.memory_dump.resolve())
        OPERATOR_ENV.setdefault("AGENTRUN_OPERATOR_DEBUG_MEMORY_SIGNAL", str(MEMORY_SIGNAL))
    p = (
        Params.quick()
        if args.quick
        else Params(runs=args.runs, burst=args.burst, active=args.active, window=args.window, scale=args.scale)
    )
    if args.scale_at:
        p = replace(p, scale_at=tuple(int(n) for n in args.scale_at.split(",")))
    servers = SERVERS if args.api_server == "both" else (args.api_server,)
    meta = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "params": p.__dict__,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    if args.scale_only:
        return _scale_only(args.out, p, servers, meta, args.baseline)
    section: dict[str, Any] = {"meta": meta, "figures": measure(ROOT, p, servers)}
    section["scale"] = measure_scale(ROOT, p, servers)
    section["scale_meta"] = meta
    if args.baseline:
        worktree = Path(tempfile.mkdtemp(prefix="bench-operator-baseline-"))
        git("worktree", "add", "--detach", str(worktree), args.baseline)
        try:
            section["before"] = measure(worktree, p, servers)
            section["meta"]["baseline"] = git("rev-parse", "--short", args.baseline)
        finally:
            git("worktree", "remove", "--force", str(worktree))
    merge(args.out, section)
    print(json.dumps(section, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
