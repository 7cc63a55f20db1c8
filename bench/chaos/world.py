"""The campaign's world: a private PostgreSQL and Redis, the emulated cluster, its kubelet, two operators.

Everything is real except the Kubernetes control plane and node (kubesim): the
operators are ``python -m agentrun_operator`` processes (two replicas, one leader by
Lease), runner pods are ``python -m agentrun.runner`` processes started by kubesim's
kubelet stand-in, and the store is a PostgreSQL server and a redis-server of the
campaign's own (a free port, a temporary directory), so restarting them disturbs
nothing else on the machine. All traffic stays on 127.0.0.1.

HAZARD: the servers run with ``fsync=off`` and no Redis persistence: a restart here is
a clean stop and start (``pg_ctl -m fast``, Redis ``SHUTDOWN NOSAVE``), not a power cut.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kubesim import KOPF_PEERING_CRDS, EmulatedCluster, KubeletThread, default_base_env

ROOT = Path(__file__).resolve().parents[2]
CRD_FILES = (*sorted((ROOT / "crds").glob("*.yaml")), KOPF_PEERING_CRDS)
IMAGE = "agentrun:chaos"
NAMESPACE = "default"
STORE_SECRET = "agentrun-store"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float, alive: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline or (alive is not None and alive.poll() is not None):
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.05)


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    on_path = shutil.which(name)
    if on_path is None:
        raise RuntimeError(f"{name} not found under /usr/lib/postgresql/*/bin or on PATH")
    return on_path


class Postgres:
    """A PostgreSQL server of the campaign's own (initdb in a temporary directory, a free port)."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        root.mkdir(parents=True, exist_ok=True)
        # PostgreSQL refuses to run as root: then the server runs as the postgres OS user.
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(root, user="postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as_user, *cmd], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=400 -c synchronous_commit=off"
        )
        self._run(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"
        )

    def stop(self) -> None:
        # fast: every client disconnected, open transactions rolled back, a clean shutdown.
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")


class Redis:
    """A redis-server of the campaign's own, without persistence; stopped and started on the same port."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.root = root
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [*argv, "--dir", str(self.root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_port(self.port, 10, self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # redis-server: SHUTDOWN (no save configured)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@dataclass
class Operator:
    identity: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def role(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as response:
                body: bytes = response.read()
                return body.decode()
        except OSError:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class World:
    """One campaign's infrastructure; ``start()`` it, ``close()`` it (idempotent).

    The operators are kept at ``replicas`` like a Deployment's ReplicaSet would: a replica
    that exits (SIGKILLed by a fault, or stepping down after it could not renew the Lease,
    which ends the process by design) is replaced by a new one a second later.
    """

    workdir: Path
    lost_node_timeout: float = 2.0
    lease_seconds: float = 5.0
    replicas: int = 2
    operators: list[Operator] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    replaced: list[str] = field(default_factory=list)  # "op-2 exited 1" for each replica replaced

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._pg_root = Path(tempfile.mkdtemp(prefix="agentrun-chaos-pg-"))
        self.postgres = Postgres(self._pg_root)
        self.redis = Redis(self.workdir / "redis")
        self.cluster = EmulatedCluster(self.workdir / "cluster", crd_files=CRD_FILES)
        self.kubelet: KubeletThread | None = None
        self._next_operator = 1
        self._closing = threading.Event()
        self._gone: set[str] = set()
        self._supervisor = threading.Thread(target=self._supervise, name="chaos-replicaset", daemon=True)

    def start(self) -> World:
        self.postgres.init()
        self.postgres.start()
        self.redis.start()
        self.cluster.start()
        self.kubelet = KubeletThread(
            self.cluster.url,
            self.workdir / "kubelet",
            known_images=(IMAGE,),
            base_env=default_base_env(pythonpath=[ROOT]),
        )
        # The kubelet waits for each pod's process on its loop's default executor: min(32, cores + 4)
        # threads, 6 on this 2-core machine, so a seventh live pod's exit would be seen only after one
        # of the first six ended (and a frozen runner holds one for as long as it is frozen).
        self.kubelet._loop.set_default_executor(ThreadPoolExecutor(max_workers=512, thread_name_prefix="pod-wait"))
        self.kubelet.start()
        secret = self.cluster.kubectl(
            "create",
            "secret",
            "generic",
            STORE_SECRET,
            "-n",
            NAMESPACE,
            f"--from-literal=postgresDsn={self.postgres.dsn}",
            f"--from-literal=redisUrl={self.redis.url}",
        )
        if secret.returncode != 0:
            raise RuntimeError(f"could not create the store Secret: {secret.stderr}")
        for _ in range(self.replicas):
            self.start_operator()
        self.cluster.wait_for(self.leader, timeout=30, message="an operator leads")
        self._supervisor.start()
        return self

    def _supervise(self) -> None:
        while not self._closing.wait(1.0):
            with self.lock:
                ended = [o for o in self.operators if o.proc.poll() is not None and o.identity not in self._gone]
                self._gone.update(o.identity for o in ended)
                self.replaced += [f"{o.identity} exited {o.proc.returncode}" for o in ended]
            for _ in ended:
                if len(self.live_operators()) < self.replicas and not self._closing.is_set():
                    self.start_operator()

    def start_operator(self) -> Operator:
        with self.lock:
            identity = f"op-{self._next_operator}"
            self._next_operator += 1
        port = free_port()
        log_path = self.workdir / f"operator-{identity}.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
        environment.update(
            KUBECONFIG=str(self.cluster.kubeconfig),
            PYTHONPATH=str(ROOT),
            AGENTRUN_OPERATOR_IDENTITY=identity,
            AGENTRUN_OPERATOR_METRICS_PORT=str(port),
            AGENTRUN_OPERATOR_LEASE_NAMESPACE=NAMESPACE,
            AGENTRUN_OPERATOR_LEASE_DURATION_SECONDS=str(self.lease_seconds),
            AGENTRUN_OPERATOR_RECONCILE_INTERVAL_SECONDS="0.5",
            AGENTRUN_OPERATOR_STOP_GRACE_SECONDS="15",
            AGENTRUN_OPERATOR_POD_GRACE_SECONDS="10",
            AGENTRUN_OPERATOR_LOST_NODE_TIMEOUT_SECONDS=str(self.lost_node_timeout),
            AGENTRUN_OPERATOR_RUNNER_METRICS_PORT="0",
            AGENTRUN_OPERATOR_DEFAULT_IMAGE=IMAGE,
        )
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agentrun_operator"],
                env=environment,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        operator = Operator(identity, proc, port, log_path)
        with self.lock:
            self.operators.append(operator)
        return operator

    def live_operators(self) -> list[Operator]:
        with self.lock:
            return [o for o in self.operators if o.proc.poll() is None]

    def leader(self) -> Operator | None:
        for operator in self.live_operators():
            if operator.role() == "leader":
                return operator
        return None

    def close(self) -> None:
        self._closing.set()
        for operator in self.live_operators():
            operator.stop()
        if self.kubelet is not None:
            with contextlib.suppress(Exception):
                self.kubelet.stop()
            self.kubelet = None
        with contextlib.suppress(Exception):
            self.cluster.stop()
        self.redis.stop()
        self.postgres.destroy()
        shutil.rmtree(self._pg_root, ignore_errors=True)
