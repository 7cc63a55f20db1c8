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
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from agentrun_dev.launch import OperatorProcess, start_operator
from agentrun_dev.servers import PrivatePostgres, PrivateRedis
from kubesim import KOPF_PEERING_CRDS, EmulatedCluster, KubeletThread, default_base_env

ROOT = Path(__file__).resolve().parents[2]
CRD_FILES = (*sorted((ROOT / "crds").glob("*.yaml")), KOPF_PEERING_CRDS)
IMAGE = "agentrun:chaos"
NAMESPACE = "default"
STORE_SECRET = "agentrun-store"
# Many runners in flight at once, each with its pool; commits need not wait for the (fsync-less) WAL.
# authentication_timeout: a fast shutdown waits for a backend still reading a client's startup packet, and
# a runner frozen by a fault (SIGSTOP) in the middle of connecting never sends it: with the default 60 s, one
# such runner made `pg_ctl stop` time out and left the campaign's PostgreSQL down for every later trial.
POSTGRES_SETTINGS = {"max_connections": "400", "synchronous_commit": "off", "authentication_timeout": "5s"}


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
    operators: list[OperatorProcess] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    replaced: list[str] = field(default_factory=list)  # "op-2 exited 1" for each replica replaced

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.postgres = PrivatePostgres(settings=POSTGRES_SETTINGS, timeout=60, prefix="agentrun-chaos-pg-")
        self.redis = PrivateRedis(self.workdir / "redis")
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

    def start_operator(self) -> OperatorProcess:
        with self.lock:
            identity = f"op-{self._next_operator}"
            self._next_operator += 1
        operator = start_operator(
            self.cluster.kubeconfig,
            identity=identity,
            log_path=self.workdir / f"operator-{identity}.log",
            settings={
                "lease_namespace": NAMESPACE,
                "lease_duration_seconds": self.lease_seconds,
                "stop_grace_seconds": 15,
                "pod_grace_seconds": 10,
                "lost_node_timeout_seconds": self.lost_node_timeout,
                "default_image": IMAGE,
            },
            env={"PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
        with self.lock:
            self.operators.append(operator)
        return operator

    def live_operators(self) -> list[OperatorProcess]:
        with self.lock:
            return [o for o in self.operators if o.proc.poll() is None]

    def leader(self) -> OperatorProcess | None:
        for operator in self.live_operators():
            if operator.role(timeout=1) == "leader":
                return operator
        return None

    def close(self) -> None:
        self._closing.set()
        for operator in self.live_operators():
            operator.stop(timeout=20)
        if self.kubelet is not None:
            with contextlib.suppress(Exception):
                self.kubelet.stop()
            self.kubelet = None
        with contextlib.suppress(Exception):
            self.cluster.stop()
        self.redis.stop()
        self.postgres.destroy()
