"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-controller-manager.

The binaries are built from the official Go modules at the versions ``hack/k8s/versions.env`` pins
(``hack/k8s/build.sh``); this module starts them as processes, beside kubesim's emulator, so the
same tests, the real ``kubectl`` and Helm, an operator and the kubelet stand-in meet the real API
server: its TLS, the Node and RBAC authorizers, the default admission plugins (PodSecurity
included) plus NodeRestriction, as kubeadm enables it, and real controllers (garbage collector,
namespace, service accounts and their tokens, node lifecycle, pod GC).

Hazards, first:

- The binaries take minutes to build on a cold cache (hack/k8s/README.md has the figures) and
  none when cached: ``binaries()`` runs the build script, which returns at once when all three
  exist. ``AGENTRUN_K8S_BIN`` names a folder holding them to use as they are.
- Static token users are read once, when kube-apiserver starts: name them before ``start()``
  (``users=``). After it, ``add_user()`` mints a client certificate (the authenticator real
  kubelets and admins use), which works at any time.
- Every process runs in its own session and is stopped by its PID (SIGTERM, SIGKILL after 10 s)
  by ``stop()``, the context manager and an ``atexit`` hook. Started from the main thread, each
  also has ``PR_SET_PDEATHSIG``: a SIGKILLed Python parent takes them down with it. The work
  folder (etcd's data, certificates, logs in ``logs/``) is the caller's to remove.
- A new namespace has no ``default`` ServiceAccount until the serviceaccount controller writes
  it a moment later (pods are admitted meanwhile; a token request or a RoleBinding test that
  needs the account is not): ``create_namespace()`` waits for it, ``start()`` for ``default``'s.
- The scheduler is not run: the kubelet stand-in binds pods itself with the admin identity
  (``binder``), as kubesim's does, since a node may not bind pods (see kubelet.py). The real node
  (``kubesim.node``) runs kube-scheduler with its kubelet.
- ``bind_address``: kube-apiserver listens on one address, 127.0.0.1 by default. A real node's pods
  reach it on the node link's host address (``kubesim.node``): then it binds and advertises that
  address, and the ``kubernetes`` Service's endpoints point there (they may not be loopback).
"""

from __future__ import annotations

import atexit
import ctypes
import http.client
import json
import logging
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kubesim import pki
from kubesim.access import ApiAccess
from kubesim.cluster import KUBECTL, ApiResponse, poll
from kubesim.kubelet import KNOWN_IMAGES, LEASE_SECONDS, NODE_NAME, KubeletThread
from kubesim.limits import raise_recursion_limit

T = TypeVar("T")
logger = logging.getLogger(__name__)

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "k8s" / "build.sh"
BIN_ENV = "AGENTRUN_K8S_BIN"
ADMIN_USER = "kubesim-admin"
MASTERS = "system:masters"
NODES = "system:nodes"
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
# The controllers the operator's owner references, namespaces, service accounts and the default
# aggregated roles rely on, plus the node controllers a real cluster runs (the kubelet stand-in
# renews its Lease, so a live node stays Ready; a node whose kubelet stopped is tainted and its
# pods evicted after 300 s, as upstream).
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",  # fills admin, edit, view: without it they grant nothing
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
)
STOP_GRACE = 10.0
IDLE_CONNECTIONS = 8  # kept alive per identity for ``api`` (more threads at once open and close their own)
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The real control plane could not be built or started; the message says which part and why."""


@dataclass(frozen=True)
class Binaries:
    """The folder holding etcd, kube-apiserver and kube-controller-manager."""

    folder: Path

    def path(self, name: str) -> Path:
        """The binary ``name`` (``etcd``, ``kube-apiserver``, ``kube-controller-manager``) in this folder."""
        return self.folder / name


def binaries(*, build: bool = True) -> Binaries:
    """The binaries: ``$AGENTRUN_K8S_BIN``, else what ``hack/k8s/build.sh`` builds (or has cached).

    Raises ControlPlaneError with the build's own error when they are absent and cannot be built.
    """
    if folder := os.environ.get(BIN_ENV):
        found = Binaries(Path(folder))
    else:
        if not BUILD_SCRIPT.is_file():
            raise ControlPlaneError(f"the build script {BUILD_SCRIPT} is missing (kubesim outside its checkout?)")
        mode = "build" if build else "dir"
        done = subprocess.run(["bash", str(BUILD_SCRIPT), mode], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ControlPlaneError(
                f"hack/k8s/build.sh failed (exit {done.returncode}); its last words:\n{done.stderr[-3000:]}"
            )
        found = Binaries(Path(done.stdout.strip().splitlines()[-1]))
    missing = [n for n in ("etcd", "kube-apiserver", "kube-controller-manager") if not found.path(n).is_file()]
    if missing:
        raise ControlPlaneError(f"{', '.join(missing)} not found in {found.folder}")
    return found


def free_port() -> int:
    """A port on 127.0.0.1 free right now (another process may take it before ours binds it)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


_LIVE: set[RealControlPlane] = set()


@atexit.register
def _stop_all() -> None:
    for plane in list(_LIVE):
        plane.stop()


@dataclass
class _Users:
    """Static token users (the ``--token-auth-file``): name -> (token, groups)."""

    tokens: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def add(self, name: str, groups: Iterable[str]) -> None:
        self.tokens[name] = (secrets.token_hex(16), tuple(groups))

    def write(self, path: Path) -> None:
        lines = [f'{token},{name},{name},"{",".join(groups)}"' for name, (token, groups) in self.tokens.items()]
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)


class RealControlPlane:
    """etcd, kube-apiserver and kube-controller-manager on loopback; see the module docstring.

    ``start()`` returns when the API server is ready and the ``default`` ServiceAccount exists
    (``started_in`` holds the seconds it took); ``url``, ``kubeconfig`` (admin), ``admin``
    (an ``ApiAccess``), ``kubectl()``, ``api()``, ``get()`` and ``wait_for()`` are the test's
    handles, shaped like ``EmulatedCluster``'s.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        users: Mapping[str, Sequence[str]] | None = None,
        nodes: Sequence[str] = (NODE_NAME,),
        controllers: Sequence[str] = CONTROLLERS,
        apiserver_args: Sequence[str] = (),
        controller_manager_args: Sequence[str] = (),
        bins: Binaries | None = None,
        bind_address: str = "127.0.0.1",
    ) -> None:
        """``users``: static token users (name -> groups) besides the admin and the ``nodes``'
        kubelets; ``apiserver_args`` / ``controller_manager_args``: flags appended to the defaults
        (``--node-monitor-grace-period=6s`` to see a lost node sooner, say); ``bind_address``: the
        one address kube-apiserver listens on and advertises (see the module docstring)."""
        # Absolute: kube-controller-manager reads a kubeconfig's relative paths from the kubeconfig's folder.
        self.workdir = workdir = workdir.absolute()
        self.bind_address = bind_address
        self.controllers = tuple(controllers)
        self.apiserver_args = tuple(apiserver_args)
        self.controller_manager_args = tuple(controller_manager_args)
        self._bins = bins
        self._users = _Users()
        self._users.add(ADMIN_USER, [MASTERS])
        for node in nodes:
            self._users.add(f"system:node:{node}", [NODES])
        for name, groups in (users or {}).items():
            self._users.add(name, groups)
        self.kubeconfig = workdir / "kubeconfig"
        self.url = ""
        self.started_in = 0.0
        self._processes: list[_Process] = []
        self._ca: pki.CertificateAuthority | None = None
        self._lock = threading.Lock()
        self._paths: dict[str, str] = {}  # resource name -> API path prefix, from discovery
        self._idle: dict[ApiAccess, list[http.client.HTTPSConnection]] = {}  # kept-alive connections, by identity

    # --- identities ------------------------------------------------------------------------------

    @property
    def ca(self) -> pki.CertificateAuthority:
        """The plane's certificate authority (serving, client and kubelet certs); ControlPlaneError before start."""
        if self._ca is None:
            raise ControlPlaneError("the control plane has not been started")
        return self._ca

    @property
    def admin(self) -> ApiAccess:
        """The admin's access (a static token in system:masters)."""
        return self.access(ADMIN_USER)

    def access(self, user: str) -> ApiAccess:
        """A static token user's access (``users=`` at construction, the admin, the nodes)."""
        token, _ = self._users.tokens[user]
        return ApiAccess(self.url, ca_file=self.ca.pair.cert, token=token)

    def add_user(self, name: str, groups: Sequence[str] = ()) -> ApiAccess:
        """A new user at any time: a client certificate with CN=name and one O per group."""
        stem = "user-" + "".join(c if c.isalnum() else "_" for c in name)
        pair = self.ca.issue(stem, name, organizations=tuple(groups), client=True)
        return ApiAccess(self.url, ca_file=self.ca.pair.cert, cert_file=pair.cert, key_file=pair.key)

    def node_access(self, node: str) -> ApiAccess:
        """The kubelet's identity for ``node``: ``system:node:<node>`` in ``system:nodes``."""
        user = f"system:node:{node}"
        if user in self._users.tokens:
            return self.access(user)
        return self.add_user(user, [NODES])

    def kubelet_serving_tls(self, node: str) -> ssl.SSLContext:
        """The TLS a kubelet serves logs with: a CA-signed cert for 127.0.0.1, client certs required.

        kube-apiserver checks the cert with ``--kubelet-certificate-authority`` and presents its
        ``--kubelet-client-certificate``; a real kubelet would also authorize that client through
        a SubjectAccessReview, which the stand-in does not.
        """
        stem = "kubelet-" + "".join(c if c.isalnum() else "_" for c in node)
        pair = self.ca.issue(
            stem,
            f"system:node:{node}",
            organizations=(NODES,),
            server=True,
            dns_names=(node, "localhost"),
            ip_addresses=("127.0.0.1",),
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca.pair.cert))
        context.load_cert_chain(pair.cert, pair.key)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def write_kubeconfig(self, path: Path, access: ApiAccess, namespace: str = "default") -> Path:
        """Write a kubeconfig for ``access`` at ``path`` (parents made) and return ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(access.kubeconfig(namespace=namespace, name="real")))
        return path

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 90) -> RealControlPlane:
        """Start etcd, kube-apiserver and kube-controller-manager; ControlPlaneError if one fails.

        Ports are chosen free, but another process may bind one first: then the component exits
        with "address already in use" and the whole plane is started again on new ports (3 tries).
        """
        started = time.monotonic()
        # The real server stores objects 10,000 levels deep; its clients here decode them in Python (limits.py).
        raise_recursion_limit()
        bins = self._bins or binaries()
        for attempt in range(3):
            try:
                self._start(bins, started + timeout)
                break
            except ControlPlaneError as e:
                if "address already in use" not in str(e) or attempt == 2:
                    raise
                logger.warning("a port was taken before the control plane bound it; starting again: %s", e)
                for leftover in ("etcd", "logs"):
                    shutil.rmtree(self.workdir / leftover, ignore_errors=True)
        self.started_in = time.monotonic() - started
        return self

    def _start(self, bins: Binaries, deadline: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        pki_dir = self.workdir / "pki"
        self._ca = ca = pki.CertificateAuthority(pki_dir)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=tuple(dict.fromkeys(("127.0.0.1", self.bind_address, "10.96.0.1"))),
        )
        kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", client=True)
        controller_manager = ca.issue("controller-manager", "system:kube-controller-manager", client=True)
        sa = pki.signing_key(pki_dir)
        tokens = pki_dir / "tokens.csv"
        self._users.write(tokens)
        etcd_port, peer_port, api_port, kcm_port = (free_port() for _ in range(4))
        self.url = f"https://{self.bind_address}:{api_port}"
        _LIVE.add(self)
        try:
            self._spawn(
                "etcd",
                bins.path("etcd"),
                "--name=kubesim",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=kubesim=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",  # a test cluster: durability across a host crash is not wanted
                "--log-level=warn",
            )
            self._spawn(
                "kube-apiserver",
                bins.path("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                f"--bind-address={self.bind_address}",
                f"--advertise-address={self.bind_address}",
                f"--secure-port={api_port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.pair.cert}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Endpoints may not hold a loopback address: on loopback the `kubernetes` Service stays
                # without endpoints rather than the reconciler failing every 10 s.
                f"--endpoint-reconciler-type={'none' if self.bind_address.startswith('127.') else 'lease'}",
                f"--kubelet-certificate-authority={ca.pair.cert}",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                # The stand-in's Node names itself (its Hostname address does not resolve).
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--profiling=false",
                # An open watch (a client still running, a kubectl --watch) held SIGTERM for the whole 10 s
                # grace before SIGKILL; a test plane gives watches 1 s to drain (stop: 10.1 -> 1.3 s).
                "--shutdown-watch-termination-grace-period=1s",
                *self.apiserver_args,
            )
            self.write_kubeconfig(self.kubeconfig, self.admin)
            # kube-controller-manager gives the server a fixed 10 s to be healthy, then exits: on a loaded
            # machine the rbac/bootstrap-roles hook took longer (CI, stop 39). It starts once the server is ready.
            self._wait_http("kube-apiserver", self.url + "/readyz", deadline, self.admin.ssl_context())
            kcm_kubeconfig = self.write_kubeconfig(
                self.workdir / "controller-manager.kubeconfig",
                ApiAccess(
                    self.url, ca_file=ca.pair.cert, cert_file=controller_manager.cert, key_file=controller_manager.key
                ),
                namespace="kube-system",
            )
            self._spawn(
                "kube-controller-manager",
                bins.path("kube-controller-manager"),
                f"--kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                f"--controllers={','.join(self.controllers)}",
                f"--service-account-private-key-file={sa.key}",
                f"--root-ca-file={ca.pair.cert}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--profiling=false",
                *self.controller_manager_args,
            )
            insecure = ssl.create_default_context()
            insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # its own self-signed cert
            self._wait_http("kube-controller-manager", f"https://127.0.0.1:{kcm_port}/healthz", deadline, insecure)
            self._wait_service_account("default", deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process by its PID, one after the other, newest first (SIGTERM, then SIGKILL
        after 10 s): kube-apiserver drains in about a second while etcd is up (watches included: it gives
        them 1 s), and hangs without it."""
        with self._lock:
            processes, self._processes = self._processes[::-1], []
            _LIVE.discard(self)
        self._close_idle()
        for process in processes:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
            try:
                process.popen.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %s s after SIGTERM; killing it", process.name, STOP_GRACE)
                process.popen.kill()
                process.popen.wait()

    def __enter__(self) -> RealControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> dict[str, int]:
        """The PID of each running component, by name."""
        return {p.name: p.popen.pid for p in self._processes}

    def _spawn(self, name: str, binary: Path, *args: str) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [str(binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Tied to the thread that forks: only the main thread is sure to outlive the plane.
                preexec_fn=_die_with_parent if threading.current_thread() is threading.main_thread() else None,
            )
        with self._lock:
            self._processes.append(_Process(name, popen, log))

    def _check_alive(self) -> None:
        for process in self._processes:
            if process.popen.poll() is not None:
                tail = process.log.read_text(errors="replace")[-3000:]
                raise ControlPlaneError(f"{process.name} exited with {process.popen.returncode}; its log ends:\n{tail}")

    def _wait_http(self, what: str, url: str, deadline: float, context: ssl.SSLContext | None) -> None:
        request = urllib.request.Request(url, headers=self.admin.headers())
        last = ""
        while True:
            self._check_alive()
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as e:
                with e:
                    last = f"{e.code} {e.read()[-500:]!r}"
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{what} was not ready in time ({url}: {last})")
            time.sleep(0.1)

    def _wait_service_account(self, namespace: str, deadline: float) -> None:
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
        while self.api("GET", path).status != 200:
            self._check_alive()
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"the serviceaccount controller wrote no {namespace}/default in time")
            time.sleep(0.1)

    # --- kubelets --------------------------------------------------------------------------------

    def start_kubelet(
        self,
        workdir: Path,
        *,
        node_name: str = NODE_NAME,
        known_images: Iterable[str] = KNOWN_IMAGES,
        base_env: dict[str, str] | None = None,
        lease_interval: float = LEASE_SECONDS / 4,
    ) -> KubeletThread:
        """A kubelet stand-in for ``node_name``, as that node's identity, binding with the admin's."""
        return KubeletThread(
            self.node_access(node_name),
            workdir,
            known_images=known_images,
            base_env=base_env,
            node_name=node_name,
            binder=self.admin,
            serving_tls=self.kubelet_serving_tls(node_name),
            lease_interval=lease_interval,
        ).start()

    # --- clients ---------------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = False,
        timeout: float = 60,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the REAL kubectl (admin unless ``kubeconfig`` is given); returns the completed process."""
        return subprocess.run(
            self._kubectl_argv(args),
            input=input,
            capture_output=True,
            text=True,
            env=self._kubectl_env(kubeconfig),
            check=check,
            timeout=timeout,
        )

    def kubectl_popen(self, *args: str, kubeconfig: Path | None = None) -> subprocess.Popen[str]:
        """Start a long-running kubectl (``get -w``, ``wait``, ``logs -f``); the caller ends it."""
        return subprocess.Popen(
            self._kubectl_argv(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self._kubectl_env(kubeconfig),
        )

    def _kubectl_argv(self, args: tuple[str, ...]) -> list[str]:
        return [KUBECTL, f"--cache-dir={self.workdir / 'kubectl-cache'}", *args]

    def _kubectl_env(self, kubeconfig: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        return env

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        timeout: float = 10,
        access: ApiAccess | None = None,
    ) -> ApiResponse:
        """One HTTPS request to the API as ``access`` (the admin by default); never raises on HTTP errors.

        Over a kept-alive connection of ``who``'s when one is idle: a new TLS connection per request cost 22 ms
        (5.6 ms of it this process's CPU, the rest the server's handshake) against 5 ms, and the tests' waits poll.
        """
        who = access or self.admin
        url = path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        headers = {"Content-Type": content_type, "Accept": "application/json", **who.headers()}
        with self._lock:
            idle = self._idle.get(who)
            connection = idle.pop() if idle else None
        reused = connection is not None
        if connection is None:
            connection = self._connect(who, timeout)
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        try:
            connection.request(method, url, body=data, headers=headers)
            response = connection.getresponse()
            status, payload, response_headers = response.status, response.read(), dict(response.headers)
        except (http.client.RemoteDisconnected, ConnectionError, ssl.SSLError):
            connection.close()
            if not reused:
                raise
            # The server closed a connection that sat idle (seen as a reset, an EOF or a TLS EOF on the next
            # request): send it once more on a new one.
            return self.api(
                method, path, body, content_type=content_type, params=params, timeout=timeout, access=access
            )
        except BaseException:
            connection.close()
            raise
        with self._lock:
            idle = self._idle.setdefault(who, [])
            if response.will_close or len(idle) >= IDLE_CONNECTIONS:
                connection.close()
            else:
                idle.append(connection)
        return ApiResponse(status, _json(payload), response_headers)

    def _connect(self, who: ApiAccess, timeout: float) -> http.client.HTTPSConnection:
        address = urllib.parse.urlsplit(self.url)  # as before: the plane's URL, whoever asks
        return http.client.HTTPSConnection(
            address.hostname or "127.0.0.1", address.port, context=who.ssl_context(), timeout=timeout
        )

    def _close_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for connection in (c for connections in idle.values() for c in connections):
            connection.close()

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None, timeout: float = 30) -> None:
        """Create a namespace and wait for its ``default`` ServiceAccount (the controller's, a moment later)."""
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
        response = self.api("POST", "/api/v1/namespaces", body)
        if response.status not in (201, 409):
            raise ControlPlaneError(f"namespace {name} not created: {response}")
        self._wait_service_account(name, time.monotonic() + timeout)

    def resource_path(self, resource: str, namespace: str | None = None, name: str | None = None) -> str:
        """The API path of a resource (``pods``, ``agentruns``, ``leases.coordination.k8s.io``), by discovery."""
        if resource not in self._paths:
            self._discover()
        try:
            prefix, namespaced = self._paths[resource].split("|")
        except KeyError:
            raise KeyError(f"the API server serves no resource {resource!r}") from None
        path = prefix
        if namespace is not None and namespaced == "1":
            path += f"/namespaces/{namespace}"
        path += f"/{resource.split('.')[0]}"
        return path + (f"/{name}" if name else "")

    def _discover(self) -> None:
        paths: dict[str, str] = {}
        groups: list[tuple[str, str]] = [("/api/v1", "")]
        for group in self.api("GET", "/apis").body.get("groups", []):
            groups.append((f"/apis/{group['preferredVersion']['groupVersion']}", group["name"]))
        for prefix, group_name in groups:
            listing = self.api("GET", prefix)
            for resource in listing.body.get("resources", []) if listing.status == 200 else []:
                if "/" in resource["name"]:
                    continue
                value = f"{prefix}|{'1' if resource['namespaced'] else '0'}"
                paths.setdefault(resource["name"], value)
                if group_name:
                    paths[f"{resource['name']}.{group_name}"] = value
        self._paths = paths

    def get(self, resource: str, name: str, namespace: str | None = "default") -> dict[str, Any] | None:
        """The object as the API serves it now, or None."""
        response = self.api("GET", self.resource_path(resource, namespace, name))
        if response.status == 404:
            return None
        if response.status != 200:
            raise ControlPlaneError(f"GET {resource} {namespace}/{name}: {response}")
        result: dict[str, Any] = response.body
        return result

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every ``resource`` in ``namespace`` (all namespaces when None); ControlPlaneError unless 200."""
        response = self.api("GET", self.resource_path(resource, namespace))
        if response.status != 200:
            raise ControlPlaneError(f"LIST {resource} in {namespace}: {response}")
        items: list[dict[str, Any]] = response.body["items"]
        return items

    def wait_for(
        self,
        predicate: Callable[[], T | None],
        *,
        timeout: float = 10,
        interval: float = 0.05,
        message: str = "condition",
    ) -> T:
        """Poll until ``predicate()`` is truthy and return it; AssertionError naming ``message`` on timeout."""
        return poll(predicate, timeout=timeout, interval=interval, message=message)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data or b"null")
    except ValueError:
        return data.decode(errors="replace")
