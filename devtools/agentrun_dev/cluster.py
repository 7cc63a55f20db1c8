"""``agentrun-dev`` (``make cluster``): a local cluster to keep, for your own AgentRuns and graphs.

It starts, and on Ctrl-C stops, everything it started:

- the emulated Kubernetes API server (kubesim) on a fixed local port
  (``--port``, ``$AGENTRUN_DEV_PORT``, default 6880), serving the AgentRun CRD;
  or, with ``--api-server real`` (``$AGENTRUN_DEV_K8S=real``), the real control
  plane (etcd, kube-apiserver, kube-controller-manager from ``make k8s``, on
  loopback ports of its own, TLS and RBAC as in a cluster: ``kubesim.real``);
  or, with ``--api-server node`` (``$AGENTRUN_DEV_K8S=node``, root), that control plane
  and a real node (``kubesim.node``: containerd, runc, kubelet, kube-proxy,
  kube-scheduler) with helm/agentrun installed on it for real
  (``agentrun_dev.chart_on_node``): the operator and the history server as the
  chart's Deployments, runner pods as containers of ``make image``'s images,
  a PostgreSQL of its own on the node's host address as the store (the items
  below do not apply: no process of the operator or a runner runs here);
- the kubelet stand-in: runner pods run as local processes with this
  virtualenv's Python and ``PYTHONPATH`` (the current folder first), so a
  graph module of yours runs without building an image;
- a store (``dev_store``): the database ``agentrun_dev`` on the PostgreSQL
  ``scripts/services.sh`` starts on 127.0.0.1:5432 (created when missing), or
  ``$AGENTRUN_DEV_POSTGRES_DSN``'s, or a SQLite file in the work folder
  (``$AGENTRUN_DEV_STORE=sqlite``, or when no PostgreSQL answers); the Secret
  ``agentrun-store`` in namespace ``default`` points at it;
- the real operator (``python -m agentrun_operator``), configured to accept
  a local SQLite store;
- on PostgreSQL, the history server (``python -m agentrun_history``) on
  127.0.0.1, its URL written into the kubeconfig (the cluster's
  ``agentrun.dev/history`` extension), where ``kubectl agentrun history`` and
  ``ui`` find it without ``--server``.

It writes a kubeconfig into the work folder (``--workdir``, default
``.agentrun-dev``, made absolute once, from the folder it starts in: the
control plane's own kubeconfigs name files in it, and a relative path there
is read relative to the kubeconfig) and prints the ``export KUBECONFIG=...`` line to use it,
and, when ``kubectl agentrun`` would not find this virtualenv's plugin (the
console script ``kubectl-agentrun`` beside its Python) on the ``PATH`` it was
started with, the ``export PATH=...`` line that puts it there (a process
cannot change its parent shell's ``PATH``).

HAZARD: the API server keeps its objects in memory. A restart loses every
AgentRun, Secret and pod (and the pods' logs); what survives is the store:
the threads, their checkpoints and the tool-call ledger (the PostgreSQL
database, or the SQLite file in the work folder), so an AgentRun applied again
after a restart continues its thread, and a request that completed is not
run again. Runner processes are children of this one; a SIGKILL of it (not
Ctrl-C) leaves them to finish on their own.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrun_operator.kubectl_plugin import HISTORY_EXTENSION  # where kubectl agentrun looks for the history

from .dev_store import STORES, DevStore, StoreError, choose_store
from .launch import OperatorNotReady, OperatorProcess, start_operator

DEFAULT_PORT = 6880
STORE_SECRET = "agentrun-store"
# The runner image every AgentRun gets unless it names one; the kubelet stand-in "has" every image.
DEFAULT_IMAGE = "agentrun:dev"
API_SERVERS = ("kubesim", "real", "node")


PLUGIN = "kubectl-agentrun"


def plugin_path_line(path: str | None = None) -> str | None:
    """The ``export PATH=...`` line that lets ``kubectl agentrun`` find this virtualenv's plugin, or ``None``.

    ``None`` when ``path`` (default: this process's ``PATH``) already finds that very script first, or when
    this environment has no plugin to offer.
    """
    scripts = Path(sysconfig.get_path("scripts"))
    plugin = scripts / PLUGIN
    if not plugin.is_file():
        return None
    found = shutil.which(PLUGIN, path=path if path is not None else os.environ.get("PATH", ""))
    if found is not None and Path(found).resolve() == plugin.resolve():
        return None
    return f"export PATH={shlex.quote(str(scripts))}:$PATH"


class DevClusterError(Exception):
    """Why the cluster cannot start, for the user in one line."""


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Progress:
    """One line that grows while the cluster starts: ``starting: API server ok, kubelet ok, ...``."""

    def __init__(self) -> None:
        print("starting the local cluster:", end="", flush=True)

    def step(self, what: str) -> None:
        """Print the step starting (on the same line)."""
        print(f" {what}", end="", flush=True)

    def done(self) -> None:
        """End the step's line: ready."""
        print(" - ready", flush=True)

    def failed(self) -> None:
        """End the step's line: failed."""
        print(" - failed", flush=True)


@dataclass
class DevCluster:
    """What ``agentrun-dev`` runs; ``start`` brings it up, ``stop`` ends every process it started."""

    workdir: Path
    port: int = DEFAULT_PORT
    host: str = "127.0.0.1"
    postgres_dsn: str | None = None
    store: str = "auto"  # dev_store.STORES: auto (PostgreSQL if one answers, else SQLite), postgres, sqlite
    pythonpath: list[str] = field(default_factory=list)
    cluster: Any = None
    kubelet: Any = None
    operator: OperatorProcess | None = None
    history: subprocess.Popen[bytes] | None = None
    history_port: int = 0
    api_server: str = "kubesim"  # or "real": the real control plane (kubesim.real); or "node" (ChartOnNode)
    node: Any = None  # ChartOnNode in node mode
    dev_store: DevStore | None = None  # chosen by start()

    def __post_init__(self) -> None:
        # Once, here: every path below is absolute, whichever folder a process reading it starts in.
        self.workdir = self.workdir.absolute()

    @property
    def kubeconfig(self) -> Path:
        """Where the cluster's kubeconfig is written."""
        return self.workdir / "kubeconfig"

    @property
    def store_url(self) -> str:
        """The store the ``agentrun-store`` Secret names (``dev_store.choose_store``, by ``start()``)."""
        assert self.dev_store is not None, "start() chooses the store"
        return self.dev_store.url

    @property
    def on_postgres(self) -> bool:
        """Whether the store is PostgreSQL (the history server then runs)."""
        return self.dev_store is not None and self.dev_store.postgres

    @property
    def operator_log(self) -> Path:
        """The operator's log file."""
        return self.workdir / "operator.log"

    def check(self) -> str:
        """The kubectl binary; raises ``DevClusterError`` when something the cluster needs is missing."""
        kubectl = shutil.which("kubectl")
        if not kubectl:
            raise DevClusterError(
                "kubectl is not on PATH: the local cluster is used with the real kubectl "
                "(install it: https://kubernetes.io/docs/tasks/tools/)"
            )
        if self.api_server not in API_SERVERS:
            raise DevClusterError(f"--api-server {self.api_server!r}: one of {', '.join(API_SERVERS)}")
        if self.store not in STORES:
            raise DevClusterError(f"--store {self.store!r} (AGENTRUN_DEV_STORE): one of {', '.join(STORES)}")
        if self.api_server == "node" and self.postgres_dsn:
            raise DevClusterError(
                "AGENTRUN_DEV_POSTGRES_DSN (--postgres-dsn) does not apply to --api-server node: its store is a "
                "PostgreSQL of its own that pods reach on the node's host address; unset it"
            )
        if self.api_server == "kubesim" and not _port_free(self.host, self.port):
            raise DevClusterError(
                f"port {self.port} on {self.host} is taken (another make cluster? see: lsof -i :{self.port}); "
                f"pick another with AGENTRUN_DEV_PORT=<port> make cluster, or agentrun-dev --port <port>"
            )
        try:
            import kubesim  # noqa: F401
        except ImportError:
            raise DevClusterError(
                "the emulated cluster (kubesim) is not installed: make dev, or pip install -e ./kubesim"
            ) from None
        return kubectl

    def start(self, progress: Progress | None = None) -> None:
        """Start the API server, the kubelet stand-in, the store Secret and the operator."""
        from agentrun.contract import GROUP
        from kubesim import KOPF_PEERING_CRDS, EmulatedCluster, KubeletThread, default_base_env

        say = progress.step if progress is not None else (lambda _: None)
        crds = Path(__file__).resolve().parents[2] / "crds"
        crd_files = (*sorted(crds.glob(f"*{GROUP}*.yaml")), KOPF_PEERING_CRDS)
        if not crd_files[:-1]:
            raise DevClusterError(f"no AgentRun CRD in {crds}: run agentrun-dev from a checkout of agentrun")
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.workdir / "kubelet", ignore_errors=True)  # the last run's pod logs went with its pods
        if self.api_server == "node":
            self._start_node(say)
            return
        try:  # before any process: a store that cannot be had stops nothing but this
            self.dev_store = choose_store(self.workdir, store=self.store, postgres_dsn=self.postgres_dsn)
        except StoreError as e:
            raise DevClusterError(str(e)) from None
        base_env = default_base_env(pythonpath=self.pythonpath)
        if self.api_server == "real":
            self._start_real(crd_files, base_env, say)
        else:
            self.cluster = EmulatedCluster(
                self.workdir / "cluster", host=self.host, port=self.port, crd_files=crd_files
            )
            self.cluster.start()
            shutil.copyfile(self.cluster.kubeconfig, self.kubeconfig)
            say("API server")
            self.kubelet = KubeletThread(
                self.cluster.url, self.workdir / "kubelet", known_images=("*",), base_env=base_env
            ).start()
        say("kubelet")
        self._setup_store()
        self._store_secret()
        say("store" + (" (PostgreSQL)" if self.on_postgres else " (SQLite)"))
        operator = self._start_operator()
        try:
            operator.wait_until_leader()
        except OperatorNotReady as e:
            raise DevClusterError(str(e)) from None
        say("operator")
        if self.on_postgres:  # the history server reads PostgreSQL only (dev_store says why)
            self._start_history()
            say("history server")
        else:  # kubectl agentrun history|ui say why instead of looking for the chart's Service
            assert self.dev_store is not None
            reason = f"the store of make cluster is SQLite ({self.dev_store.why_not_postgres})"
            self._name_history_in_kubeconfig({"unavailable": reason})

    def _start_real(self, crd_files: tuple[Path, ...], base_env: dict[str, str], say: Any) -> None:
        """The real control plane (a fresh etcd each start, as kubesim's memory), its CRDs, a kubelet stand-in."""
        from kubesim.real import ControlPlaneError, RealControlPlane

        shutil.rmtree(self.workdir / "real-cluster", ignore_errors=True)
        self.cluster = RealControlPlane(self.workdir / "real-cluster")
        try:
            self.cluster.start()
        except ControlPlaneError as e:
            raise DevClusterError(f"the real control plane did not start (make k8s builds it): {e}") from None
        shutil.copyfile(self.cluster.kubeconfig, self.kubeconfig)
        say("API server (real)")
        for path in crd_files:
            done = self._kubectl("apply", "--server-side", "-f", str(path))
            if done.returncode != 0:
                raise DevClusterError(f"the CRD {path.name} was refused: {done.stderr.strip()}")
        done = self._kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        if done.returncode != 0:
            raise DevClusterError(f"the CRDs were not established: {done.stderr.strip()}")
        self.kubelet = self.cluster.start_kubelet(self.workdir / "kubelet", known_images=("*",), base_env=base_env)

    def _start_node(self, say: Any) -> None:
        """The real node with the chart installed on it (``ChartOnNode``); its kubeconfig copied here."""
        from kubesim.node import NodeError
        from kubesim.real import ControlPlaneError

        from .chart_on_node import ChartError, ChartOnNode

        self.node = ChartOnNode(self.workdir / "node")
        try:
            self.node.start(say)
        except (NodeError, ControlPlaneError, ChartError) as e:
            raise DevClusterError(f"the real node with the chart did not start: {e}") from None
        self.cluster = self.node.plane
        shutil.copyfile(self.cluster.kubeconfig, self.kubeconfig)

    def _kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        return subprocess.run(["kubectl", *args], capture_output=True, text=True, env=env, timeout=60, check=False)

    def _setup_store(self) -> None:
        """Create (or migrate) the store's schema: the runners do so too, but the operator reads it first."""
        import asyncio

        from agentrun.checkpoint import open_store

        async def setup() -> None:
            store = open_store(self.store_url, retry_timeout=10)
            try:
                await store.setup()
            finally:
                await store.aclose()

        try:
            asyncio.run(setup())
        except Exception as e:
            raise DevClusterError(f"the store {self._store_name()} cannot be set up: {e}") from None

    def _store_name(self) -> str:
        return "AGENTRUN_DEV_POSTGRES_DSN" if self.postgres_dsn else self.store_url.split("?", 1)[0]

    def _store_secret(self) -> None:
        done = self._kubectl(
            "create", "secret", "generic", STORE_SECRET, "-n", "default", f"--from-literal=postgresDsn={self.store_url}"
        )
        if done.returncode != 0:
            raise DevClusterError(f"could not create the store Secret: {done.stderr.strip()}")

    def _start_operator(self) -> OperatorProcess:
        settings: dict[str, object] = {
            "default_image": DEFAULT_IMAGE,
            "runner_resources": {},
            "pod_grace_seconds": 10,
            "local_stores": True,
        }
        if not self.on_postgres:  # SQLite cannot notify the operator of progress: a resync every second shows it
            settings["resync_interval_seconds"] = 1
        self.operator = start_operator(
            self.kubeconfig, identity="agentrun-dev", log_path=self.operator_log, settings=settings
        )
        return self.operator

    def _start_history(self) -> None:
        """``python -m agentrun_history`` on 127.0.0.1: the run history, as the kubeconfig's identity (its user)."""
        with socket.socket() as probe:
            probe.bind((self.host, 0))
            self.history_port = probe.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            AGENTRUN_HISTORY_POSTGRES_DSN=self.store_url,
            AGENTRUN_HISTORY_HOST=self.host,
            AGENTRUN_HISTORY_PORT=str(self.history_port),
        )
        with open(self.history_log, "wb") as log:
            self.history = subprocess.Popen(
                [sys.executable, "-m", "agentrun_history"], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_history()
        self._name_history_in_kubeconfig({"server": self.history_url})

    @property
    def history_url(self) -> str:
        """The history server's URL (``http://127.0.0.1:PORT``)."""
        return f"http://{self.host}:{self.history_port}"

    @property
    def history_log(self) -> Path:
        """The history server's log file."""
        return self.workdir / "history.log"

    def _wait_history(self, timeout: float = 30) -> None:
        """Return once the history server answers (its ``/healthz``), so the banner's commands work at once."""
        assert self.history is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.history.poll() is not None:
                raise DevClusterError(f"the history server exited ({self.history.returncode}); see {self.history_log}")
            try:
                with urllib.request.urlopen(self.history_url + "/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise DevClusterError(f"the history server did not answer in {timeout:g}s; see {self.history_log}")

    def _name_history_in_kubeconfig(self, extension: dict[str, str]) -> None:
        """Write where the history server is (``{server: URL}``), or why there is none (``{unavailable: why}``),
        into the exported kubeconfig's cluster (``HISTORY_EXTENSION``).

        ``kubectl agentrun history|ui`` read it there (through ``kubectl config view``): a URL that travels
        with the kubeconfig it belongs to, rewritten by each start (the port changes), and kubectl keeps
        cluster extensions it does not know.
        """
        config = yaml.safe_load(self.kubeconfig.read_text())
        for entry in config.get("clusters") or []:
            cluster = entry.setdefault("cluster", {})
            others = [e for e in cluster.get("extensions") or [] if e.get("name") != HISTORY_EXTENSION]
            cluster["extensions"] = [*others, {"name": HISTORY_EXTENSION, "extension": extension}]
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))

    def stop(self) -> None:
        """Stop the history server and the operator, then the pods (SIGTERM, then SIGKILL after their grace), then
        the API server."""
        if self.history is not None:
            self.history.terminate()
            try:
                self.history.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.history.kill()
                self.history.wait()
        if self.operator is not None:
            self.operator.stop()
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.node is not None:
            self.node.stop()  # the plane with the node
        elif self.cluster is not None:
            self.cluster.stop()

    def banner(self) -> str:
        """What to type next: the ``export KUBECONFIG`` line, the ``PATH`` line if needed, the store and the logs."""
        if self.node is not None:
            return self._node_banner()
        metrics_port = self.operator.port if self.operator is not None else 0
        return "\n".join(
            [
                f"API server  {self.cluster.url}   store {self._store_line()}",
                f"operator    metrics http://{self.host}:{metrics_port}/metrics, log {self.operator_log}",
                *(
                    [f"history     {self.history_url} (named in the kubeconfig), log {self.history_log}"]
                    if self.history is not None
                    else []
                ),
                f"pods        run here with {sys.executable}; PYTHONPATH={os.pathsep.join(self.pythonpath)}",
                *self._what_next(),
                *(
                    [
                        "  kubectl agentrun history support-order-4821   # what it did: attempts, steps, tool calls",
                        "  kubectl agentrun ui                           # the run history in your browser",
                    ]
                    if self.history is not None
                    else []
                ),
                "",
                "Ctrl-C stops the cluster and every pod (AgentRuns live in memory; the store keeps the threads).",
            ]
        )

    def _store_line(self) -> str:
        """The banner's store: which, where, and on SQLite why there is no history."""
        assert self.dev_store is not None
        if not self.dev_store.postgres:
            return f"SQLite {self.store_url} (no history server: {self.dev_store.why_not_postgres})"
        created = ", created now" if self.dev_store.created else ""
        if self.postgres_dsn:
            return f"PostgreSQL (AGENTRUN_DEV_POSTGRES_DSN{created})"
        return f"PostgreSQL {self.store_url}{created}"

    def _what_next(self) -> list[str]:
        """The banner's lines every mode shares: the ``export`` lines, then the first commands to try."""
        on_path = plugin_path_line()
        return [
            "",
            "In another terminal"
            + (f" (the PATH line puts the kubectl agentrun plugin, {PLUGIN}, on it):" if on_path else ":"),
            "",
            f"export KUBECONFIG={self.kubeconfig.resolve()}",
            *([on_path] if on_path else []),
            "",
            "  kubectl apply -f examples/agentrun.yaml",
            "  kubectl agentrun watch support-order-4821",
            "  kubectl agentrun list",
        ]

    def _node_banner(self) -> str:
        from .chart_on_node import DEMO_IMAGE, RELEASE, RELEASE_NAMESPACE

        node = self.node.cluster.node
        return "\n".join(
            [
                f"API server  {self.cluster.url} (real)   node {node.name}, pods {node.pod_cidr}",
                f"store       PostgreSQL {self.node.store.dsn} (pods: {node.host_address}), Secret agentrun-store "
                "in default",
                f"operator    the chart's Deployment: kubectl -n {RELEASE_NAMESPACE} logs deploy/{RELEASE}-operator",
                f"pods        containers of {DEMO_IMAGE} (make image: examples/ inside; rebuild it for your graphs)",
                f"logs        {(self.workdir / 'node' / 'logs').resolve()}",
                *self._what_next(),
                "  kubectl agentrun ui      # the run history in your browser (a port-forward to the chart's Service)",
                "",
                "Ctrl-C stops the node (pods first), the control plane and the store, and leaves nothing behind "
                "(etcd and the store start empty next time).",
            ]
        )


def parser() -> argparse.ArgumentParser:
    """``agentrun-dev``'s command line."""
    cli = argparse.ArgumentParser(
        prog="agentrun-dev", description=(__doc__ or "").split("\n", maxsplit=1)[0].split(": ", 1)[-1]
    )
    cli.add_argument(
        "--port", type=int, default=int(os.environ.get("AGENTRUN_DEV_PORT") or DEFAULT_PORT), help="API server port"
    )
    cli.add_argument(
        "--api-server",
        choices=API_SERVERS,
        default=os.environ.get("AGENTRUN_DEV_K8S") or "kubesim",
        help="kubesim (the emulator, default), real (kube-apiserver, etcd, kube-controller-manager from make k8s) "
        "or node (that plane and a real node, root: make k8s image node-packages; the chart installed on it); "
        "default: $AGENTRUN_DEV_K8S",
    )
    cli.add_argument("--workdir", type=Path, default=Path(os.environ.get("AGENTRUN_DEV_WORKDIR") or ".agentrun-dev"))
    cli.add_argument(
        "--postgres-dsn",
        default=os.environ.get("AGENTRUN_DEV_POSTGRES_DSN") or None,
        help="the PostgreSQL store, its database created when missing (default: $AGENTRUN_DEV_POSTGRES_DSN, else "
        "agentrun_dev on the PostgreSQL scripts/services.sh starts on 127.0.0.1:5432)",
    )
    cli.add_argument(
        "--store",
        choices=STORES,
        default=os.environ.get("AGENTRUN_DEV_STORE") or "auto",
        help="auto (default: PostgreSQL, SQLite when none answers), postgres (PostgreSQL or an error) or sqlite "
        "(a file in the work folder; no history server); default: $AGENTRUN_DEV_STORE",
    )
    return cli


def main(argv: list[str] | None = None) -> int:
    """``agentrun-dev`` (``make cluster``): start the local cluster, print how to use it, stop it on Ctrl-C."""
    args = parser().parse_args(argv)
    pythonpath = [str(Path.cwd())] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    dev = DevCluster(
        args.workdir,
        port=args.port,
        postgres_dsn=args.postgres_dsn,
        store=args.store,
        pythonpath=pythonpath,
        api_server=args.api_server,
    )
    try:
        dev.check()
    except DevClusterError as e:
        print(f"agentrun-dev: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    progress = Progress()
    try:
        dev.start(progress)  # Ctrl-C meanwhile: KeyboardInterrupt, and the finally clause stops what started
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        progress.done()
        print(dev.banner(), flush=True)
        while not stop.wait(1):
            if dev.operator is not None and dev.operator.proc.poll() is not None:
                print(f"agentrun-dev: the operator exited ({dev.operator.proc.returncode}); see {dev.operator_log}")
                return 1
        print("\nstopping the local cluster...", flush=True)
        return 0
    except DevClusterError as e:
        progress.failed()
        print(f"agentrun-dev: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.failed()
        return 130
    finally:
        dev.stop()
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
