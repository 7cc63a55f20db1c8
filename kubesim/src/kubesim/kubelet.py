"""A local kubelet stand-in: runs a cluster's pods as local processes.

It is a client of the Kubernetes API like a real kubelet (plus the scheduler's
one job here: binding pending pods to its node), and works against kubesim's
emulator and the real kube-apiserver (``kubesim.real``) alike. On the real
server it is its node's identity (``system:node:<node>`` in ``system:nodes``,
which the Node authorizer and NodeRestriction admission accept): it registers
its Node, renews its Lease in ``kube-node-lease`` every 10 s (so the node
lifecycle controller keeps the node Ready), watches only the pods bound to it
(``fieldSelector=spec.nodeName=<node>``, all a node may list) and writes their
status through ``pods/status``. A node may not bind pods, so binding runs as
``binder`` (the admin on the real server; the scheduler's job, which is not run
there: one process fewer to start, and the same binding on both servers), on
a second watch of unbound pods (``spec.nodeName=``). It watches pods, and for each
pod bound to its node:

- resolves the first container's environment like a kubelet: ``value``,
  ``valueFrom.secretKeyRef`` / ``configMapKeyRef`` / ``fieldRef``, ``envFrom``
  and ``$(VAR)`` expansion; a missing Secret, ConfigMap or key keeps the pod
  Pending with the container Waiting, reason ``CreateContainerConfigError``
  (retried every second, as the real kubelet retries);
- "pulls" the image first, as a kubelet does: an image name that is not a valid
  reference waits with ``InvalidImageName``; an image outside ``known_images``
  (by default ``KNOWN_IMAGES``; ``*`` allowed)
  waits with ``ErrImagePull``, then ``ImagePullBackOff`` ("Back-off pulling
  image ...") and is pulled again after a back-off that doubles (1 s to 10 s
  here, 10 s to 300 s on a real node); adding the image to ``known_images``
  lets the next pull succeed; ``imagePullPolicy: Never`` waits with
  ``ErrImageNeverPull``;
- runs ``command`` + ``args`` (the local Python environment is the image's
  filesystem) in a new session, with the pod's environment
  on top of ``base_env``; stdout and stderr go to one log file per pod;
- reports status the way a kubelet does: phase Pending -> Running ->
  Succeeded/Failed, ``containerStatuses`` with ``waiting`` / ``running`` /
  ``terminated`` (``exitCode``, reason ``Completed``, ``Error`` or
  ``OOMKilled``, ``startedAt``, ``finishedAt``); a process killed by signal N
  exits with 128+N (137 for SIGKILL); a process that cannot be started (no
  such executable, or exec's E2BIG: one environment string over Linux's
  128 KiB) is ``terminated`` with reason ``StartError``, exit code 128 and
  runc's message, as containerd reports it;
- honours deletion with the grace period: SIGTERM, SIGKILL after
  ``deletionGracePeriodSeconds``, the final status, then the zero-grace delete
  that removes the pod from the API.

``kubectl logs [-f]`` works: the kubelet serves ``/containerLogs/...`` on a
local port published in its Node's ``daemonEndpoints``, and the API server
proxies ``pods/NAME/log`` there, as in a real cluster (over TLS with
``serving_tls``: kube-apiserver checks the kubelet's certificate with
``--kubelet-certificate-authority`` and presents its client certificate).

Each pod's process is awaited by a watcher of its own (a pidfd on the event
loop, or a thread of its own where pidfds are missing), never by a shared pool:
any number of pods' exits are seen as they happen.

Limits (hazards for tests): only ``restartPolicy: Never`` semantics (containers
are never restarted; the operator creates a new pod per attempt); init
containers and containers after the first are not run (a Warning event says
so); images are names only (nothing is unpacked); there are no volumes or probes; ``securityContext`` is not
applied (processes run as the test's user); ``activeDeadlineSeconds`` is not
enforced; the pod IP is 127.0.0.1 (host network).

Faults, for crash tests: ``kill`` (any signal; SIGKILL -> 137), ``oom_kill``,
``evict`` (the Eviction API: DisruptionTarget condition with reason
EvictionByEvictionAPI, SIGTERM, grace period, removal; or with
``node_pressure=True`` the kubelet's own eviction: ``status.reason: Evicted``,
phase Failed, the pod kept), ``lose_node`` (the process is SIGKILLed and the
kubelet stops reporting: phase Unknown, reason NodeLost; like a real lost
node, the pod is only removed by a force delete), ``pause`` / ``resume``
(SIGSTOP / SIGCONT). On the real server the Eviction API runs as ``binder``
(an admin draining the node), a node-pressure eviction, ``lose_node`` and the
final status as the node.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import fnmatch
import json
import logging
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import aiohttp.web

from kubesim.access import ApiAccess

logger = logging.getLogger(__name__)
T = TypeVar("T")

NODE_NAME = "emulated-node"
STRATEGIC = "application/strategic-merge-patch+json"
# The images a pod may use by default (``kubesim.testing.python_pod`` uses python:3.11); a project
# passes its own set (its runner image, say) to Kubelet/KubeletThread, or the pytest plugin's
# ``kubesim_known_images`` fixture.
KNOWN_IMAGES = ("python:3.11",)
PULL_BACKOFF = (1.0, 10.0)  # seconds: first back-off and cap (the kubelet's are 10 s and 300 s)
LEASE_SECONDS = 40  # the kubelet's node lease duration; it renews every quarter of it
NODE_LEASE_NAMESPACE = "kube-node-lease"
RUNC_START_ERROR = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: {detail}: unknown"
)
# distribution/reference: [domain[:port]/]path-component(/path-component)*[:tag][@digest]
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}))?$"
)


def now() -> str:
    """The time now as the kubelet writes it (UTC, seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_base_env(pythonpath: Iterable[str | Path] | None = None) -> dict[str, str]:
    """The "image" environment: this interpreter first on PATH, ``pythonpath`` importable.

    ``pythonpath`` defaults to the current directory (a project's checkout, when its tests or
    tools run from its root), so a pod's ``python -m some.module`` imports the project's code.
    """
    paths = [Path.cwd()] if pythonpath is None else list(pythonpath)
    return {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
        "PYTHONPATH": os.pathsep.join(str(p) for p in paths),
        "PYTHONUNBUFFERED": "1",
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
    }


def image_name_error(image: str) -> str | None:
    """The kubelet's InvalidImageName message for a name that is not a valid reference, else None."""
    match = _REFERENCE.match(image)
    if match is not None and len(image.split("@")[0].rsplit(":", 1)[0]) <= 255:
        domain = match.group("domain")
        # a first component without "." or ":" (and not localhost) is a path component: lowercase only
        if (
            domain is None
            or "." in domain
            or ":" in domain
            or domain == "localhost"
            or re.fullmatch(_COMPONENT, domain)
        ):
            return None
    why = "invalid reference format"
    if image.lower() != image and _REFERENCE.match(image.lower()):
        why += ": repository name must be lowercase"
    return f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": {why}'


def normalized_image(image: str, *, default_tag: bool = True) -> str:
    """``python:3.11`` -> ``docker.io/library/python:3.11``; no tag means ``latest``."""
    name, digest = [*image.split("@", 1), ""][:2]
    first, _, rest = name.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}" if rest else f"docker.io/library/{name}"
    if default_tag and ":" not in name.rsplit("/", 1)[-1] and not digest:
        name += ":latest"
    return name + (f"@{digest}" if digest else "")


class ConfigError(Exception):
    """A container cannot be configured (CreateContainerConfigError)."""


@dataclass
class PodRuntime:
    """What the kubelet stand-in knows of one pod it runs: its process, log, reason, paused or not."""

    namespace: str
    name: str
    uid: str
    pod: dict[str, Any]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str | None = None  # terminated reason override (OOMKilled, StartError)
    message: str | None = None
    terminating: bool = False
    lost: bool = False
    evicted: str | None = None  # node-pressure eviction message
    paused: bool = False
    deletion_confirmed: bool = False
    worker: asyncio.Task[None] | None = None
    killer: asyncio.Task[None] | None = None
    signals: list[int] = field(default_factory=list)


class Kubelet:
    """The node agent; see the module docstring. All methods run on the kubelet's event loop."""

    def __init__(
        self,
        api: str | ApiAccess,
        *,
        workdir: Path,
        node_name: str = NODE_NAME,
        base_env: dict[str, str] | None = None,
        node_labels: dict[str, str] | None = None,
        known_images: Iterable[str] = KNOWN_IMAGES,
        pull_backoff: tuple[float, float] = PULL_BACKOFF,
        binder: ApiAccess | None = None,
        serving_tls: ssl.SSLContext | None = None,
        lease_interval: float = LEASE_SECONDS / 4,
    ) -> None:
        """``api``: the server (a URL for kubesim, or an ``ApiAccess`` with the node's identity);
        ``binder``: who binds pods and calls the Eviction API (default: ``api``'s identity);
        ``serving_tls``: the log endpoint's server TLS (plain HTTP without it)."""
        self.access = api if isinstance(api, ApiAccess) else ApiAccess(api)
        self.binder = binder or self.access
        self.api_url = self.access.server.rstrip("/")
        self.serving_tls = serving_tls
        self.lease_interval = lease_interval
        self.known_images = set(known_images)  # patterns (fnmatch); a test may add to it while pods wait
        self.pull_backoff = pull_backoff
        self.workdir = workdir
        self.node_name = node_name
        self.base_env = default_base_env() if base_env is None else base_env
        self.node_labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(node_labels or {}),
        }
        self.pods: dict[tuple[str, str], PodRuntime] = {}
        self._session: aiohttp.ClientSession | None = None
        self._binder_session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lease_task: asyncio.Task[None] | None = None
        self.node_lost = False  # lose_whole_node(): the kubelet is silent, as a node that is gone
        self._node_uid: str | None = None
        self._unschedulable: set[str] = set()
        self._log_server: aiohttp.web.AppRunner | None = None
        self.port = 0

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Register the node and start watching for the pods bound to it."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._session = _session(self.access)
        self._binder_session = self._session if self.binder is self.access else _session(self.binder)
        await self._serve_logs()
        await self._register_node()
        loop = asyncio.get_running_loop()
        bound: asyncio.Future[None] = loop.create_future()
        unbound: asyncio.Future[None] = loop.create_future()
        self._tasks = [
            asyncio.create_task(
                self._watch_pods(f"spec.nodeName={self.node_name}", self._on_pod, self._session, bound),
                name="kubelet-watch",
            ),
            asyncio.create_task(
                self._watch_pods("spec.nodeName=", self._on_unbound_pod, self._binder_session, unbound),
                name="kubelet-binder-watch",
            ),
        ]
        self._lease_task = asyncio.create_task(self._renew_lease(), name="kubelet-lease")
        self._tasks.append(self._lease_task)
        await asyncio.gather(bound, unbound)

    async def stop(self) -> None:
        """Stop watching and kill every pod process (SIGKILL): nothing outlives the kubelet."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runtime in list(self.pods.values()):
            self._signal(runtime, signal.SIGCONT)
            self._signal(runtime, signal.SIGKILL)
        tasks = [t for r in self.pods.values() for t in (r.worker, r.killer) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*(wait_process(r.process) for r in self.pods.values() if r.process is not None))
        await asyncio.gather(*tasks, return_exceptions=True)
        for session in {self._session, self._binder_session}:
            if session is not None:
                await session.close()
        if self._log_server is not None:
            await self._log_server.cleanup()
        if self.access.server.startswith("https:") or self.serving_tls is not None:
            # TLS transports finish closing on the next turns of the loop (aiohttp's advice for a
            # graceful shutdown): a loop stopped at once leaves them to the garbage collector.
            await asyncio.sleep(0.25)

    async def _serve_logs(self) -> None:
        """The kubelet's log endpoint, which the API server proxies ``kubectl logs`` to."""
        app = aiohttp.web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._container_logs)
        self._log_server = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._log_server.setup()
        site = aiohttp.web.TCPSite(self._log_server, "127.0.0.1", 0, ssl_context=self.serving_tls)
        await site.start()
        self.port = self._log_server.addresses[0][1]

    async def _container_logs(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        runtime = self.pods.get((request.match_info["namespace"], request.match_info["pod"]))
        if runtime is None:
            raise aiohttp.web.HTTPNotFound(text="pod not found on this node")
        if runtime.process is None and runtime.exit_code is None:
            # The kubelet's validateContainerLogStatus: no container yet, say what it waits for.
            statuses = runtime.pod.get("status", {}).get("containerStatuses") or [{}]
            reason = (statuses[0].get("state", {}).get("waiting") or {}).get("reason") or "ContainerCreating"
            container = request.match_info["container"]
            raise aiohttp.web.HTTPBadRequest(
                text=f'container "{container}" in pod "{runtime.name}" is waiting to start: {reason}'
            )
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        text = _read_log(runtime.log_path, 0)
        offset = len(text)
        if "tailLines" in request.query:
            tail = int(request.query["tailLines"])
            text = b"".join(text.splitlines(keepends=True)[-tail:]) if tail else b""
        await response.write(text)
        while request.query.get("follow") == "true" and runtime.exit_code is None and not runtime.lost:
            await asyncio.sleep(0.2)
            chunk = _read_log(runtime.log_path, offset)
            offset += len(chunk)
            if chunk:
                await response.write(chunk)
        await response.write_eof()
        return response

    # --- API client ------------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201),
        as_binder: bool = False,
    ) -> tuple[int, Any]:
        session = self._binder_session if as_binder else self._session
        assert session is not None
        async with session.request(
            method, self.api_url + path, json=body, params=params, headers={"Content-Type": content_type}
        ) as response:
            data = await response.json(content_type=None)
            if response.status not in ok:
                logger.debug("kubelet: %s %s -> %s %s", method, path, response.status, data)
            return response.status, data

    async def _patch_status(self, runtime: PodRuntime, status: dict[str, Any]) -> None:
        if runtime.lost:
            return
        code, _ = await self._request(
            "PATCH",
            f"/api/v1/namespaces/{runtime.namespace}/pods/{runtime.name}/status",
            {"status": status},
            content_type=STRATEGIC,
            ok=(200, 404),
        )
        if code not in (200, 404):
            logger.warning("kubelet: status of %s/%s not written (%s)", runtime.namespace, runtime.name, code)

    async def _event(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        stamp = now()
        await self._request(
            "POST",
            f"/api/v1/namespaces/{meta['namespace']}/events",
            {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                "type": type_,
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "source": {"component": "kubelet", "host": self.node_name},
            },
        )

    async def _register_node(self) -> None:
        stamp = now()
        code, node = await self._request(
            "POST",
            "/api/v1/nodes",
            {
                "metadata": {"name": self.node_name, "labels": self.node_labels},
                "spec": {},
            },
            ok=(201, 409),
        )
        if code == 409:  # registered by an earlier kubelet of the same name, as after a real restart
            code, node = await self._request("GET", f"/api/v1/nodes/{self.node_name}")
        if code not in (200, 201):
            raise RuntimeError(f"the kubelet could not register node {self.node_name}: {code} {node}")
        self._node_uid = node["metadata"]["uid"]
        code, answer = await self._request(
            "PATCH",
            f"/api/v1/nodes/{self.node_name}/status",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "kubelet stand-in is posting ready status",
                            "lastHeartbeatTime": stamp,
                            "lastTransitionTime": stamp,
                        }
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": self.node_name},
                    ],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                    "nodeInfo": {
                        "kubeletVersion": "v1.32.0-kubesim-stand-in",
                        "operatingSystem": "linux",
                        "architecture": "amd64",
                        "containerRuntimeVersion": "local-process://1",
                        "kernelVersion": os.uname().release,
                        "osImage": "local",
                        "kubeProxyVersion": "",
                        "machineID": "",
                        "systemUUID": "",
                        "bootID": "",
                    },
                }
            },
            content_type="application/merge-patch+json",
        )
        if code != 200:
            raise RuntimeError(f"the kubelet could not report node {self.node_name}'s status: {code} {answer}")

    async def _renew_lease(self) -> None:
        """The node's heartbeat, as the kubelet keeps it: a Lease in kube-node-lease, owned by the Node."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"
        while True:
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            try:
                code, answer = await self._request(
                    "PATCH",
                    f"{path}/{self.node_name}",
                    {"spec": {"holderIdentity": self.node_name, "renewTime": stamp}},
                    content_type="application/merge-patch+json",
                    ok=(200, 404),
                )
                if code == 404:
                    owner = {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self._node_uid}
                    code, answer = await self._request(
                        "POST",
                        path,
                        {
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {"name": self.node_name, "ownerReferences": [owner]},
                            "spec": {
                                "holderIdentity": self.node_name,
                                "leaseDurationSeconds": LEASE_SECONDS,
                                "renewTime": stamp,
                            },
                        },
                        ok=(201, 409),
                    )
                if code not in (200, 201, 409):
                    logger.warning("kubelet: node lease not renewed (%s %s); retrying in %ss", code, answer, 1)
                    await asyncio.sleep(1)
                    continue
            except aiohttp.ClientError as e:
                logger.warning("kubelet: node lease not renewed (%s); retrying in 1 s", e)
                await asyncio.sleep(1)
                continue
            await asyncio.sleep(self.lease_interval)

    # --- watching --------------------------------------------------------------------------------

    async def _watch_pods(
        self,
        field_selector: str,
        handler: Callable[[str, dict[str, Any]], Awaitable[None]],
        session: aiohttp.ClientSession | None,
        ready: asyncio.Future[None],
    ) -> None:
        """List, then watch, the pods a field selector chooses, relisting when the watch ends."""
        assert session is not None
        while True:
            try:
                async with session.get(
                    f"{self.api_url}/api/v1/pods", params={"fieldSelector": field_selector}
                ) as response:
                    listing = await response.json(content_type=None)
                    if response.status != 200:
                        raise RuntimeError(f"listing pods ({field_selector}): {response.status} {listing}")
                for pod in listing["items"]:
                    await handler("ADDED", pod)
                if not ready.done():
                    ready.set_result(None)
                params = {
                    "watch": "true",
                    "resourceVersion": listing["metadata"]["resourceVersion"],
                    "allowWatchBookmarks": "true",
                    "fieldSelector": field_selector,
                }
                async with session.get(
                    f"{self.api_url}/api/v1/pods", params=params, timeout=aiohttp.ClientTimeout(total=None)
                ) as response:
                    async for line in response.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            break  # 410 Gone: relist
                        if event["type"] != "BOOKMARK":
                            await handler(event["type"], event["object"])
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not ready.done():
                    ready.set_exception(RuntimeError(f"the kubelet could not list pods: {e}"))
                    return
                logger.exception("kubelet: pod watch failed; relisting")
            await asyncio.sleep(0.2)

    async def _on_unbound_pod(self, type_: str, pod: dict[str, Any]) -> None:
        """The scheduler's watch: bind what is pending (leaving the selection shows as DELETED)."""
        if self.node_lost:
            return  # a scheduler binds nothing to a node that stopped renewing its lease
        if (
            type_ != "DELETED"
            and not pod.get("spec", {}).get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
        ):
            await self._schedule(pod)

    async def _on_pod(self, type_: str, pod: dict[str, Any]) -> None:
        if self.node_lost:
            return
        meta, spec = pod["metadata"], pod.get("spec", {})
        key = (meta["namespace"], meta["name"])
        runtime = self.pods.get(key)
        if runtime is not None and runtime.uid != meta["uid"]:
            runtime = None  # a new pod with the name of an old one
        if type_ == "DELETED":
            if runtime is not None and runtime.process is not None and runtime.exit_code is None:
                self._signal(runtime, signal.SIGKILL)  # force-deleted while running
            return
        if spec.get("nodeName") != self.node_name:
            return
        if runtime is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            runtime = PodRuntime(
                meta["namespace"],
                meta["name"],
                meta["uid"],
                pod,
                self.workdir / "logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}.log",
            )
            self.pods[key] = runtime
            runtime.worker = asyncio.create_task(self._run_pod(runtime), name=f"pod-{meta['name']}")
            return
        runtime.pod = pod
        if runtime.lost:
            return
        if meta.get("deletionTimestamp") and not runtime.terminating:
            runtime.terminating = True
            runtime.killer = asyncio.create_task(
                self._terminate(runtime, int(meta.get("deletionGracePeriodSeconds") or 0))
            )

    async def _schedule(self, pod: dict[str, Any]) -> None:
        """The scheduler's part: bind to this node when the nodeSelector allows it."""
        meta, spec = pod["metadata"], pod.get("spec", {})
        selector = spec.get("nodeSelector") or {}
        if all(self.node_labels.get(k) == v for k, v in selector.items()):
            await self._request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
                },
                ok=(201, 409),
                as_binder=True,
            )
        elif meta["uid"] not in self._unschedulable:
            self._unschedulable.add(meta["uid"])
            await self._request(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {
                    "status": {
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "lastProbeTime": None,
                                "lastTransitionTime": now(),
                                "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node "
                                "affinity/selector. preemption: 0/1 nodes are available: 1 "
                                "Preemption is not helpful for scheduling.",
                            }
                        ]
                    }
                },
                content_type=STRATEGIC,
                as_binder=True,
            )

    # --- running a pod ---------------------------------------------------------------------------

    async def _run_pod(self, runtime: PodRuntime) -> None:
        pod = runtime.pod
        containers = pod["spec"].get("containers") or []
        container = containers[0]
        if len(containers) > 1 or pod["spec"].get("initContainers"):
            await self._event(pod, "Warning", "NotEmulated", "the kubelet stand-in runs only the first container")
        if pod["spec"].get("restartPolicy") != "Never":
            await self._event(
                pod,
                "Warning",
                "NotEmulated",
                f"restartPolicy {pod['spec'].get('restartPolicy')} is run as Never (no restarts)",
            )
        await self._patch_status(runtime, self._status(runtime, waiting=("ContainerCreating", None)))
        env: dict[str, str] | None = None
        if not await self._pull_image(runtime, container):
            if runtime.terminating and not runtime.lost:  # deleted while waiting for its image
                await self._patch_status(runtime, self._status(runtime))
                await self._confirm_deletion(runtime)
            return  # else it waits with InvalidImageName until deleted, as on a real node
        while env is None:
            if runtime.terminating or runtime.lost:
                break
            try:
                env = await self._resolve_env(runtime.pod, container)
            except ConfigError as e:
                await self._patch_status(runtime, self._status(runtime, waiting=("CreateContainerConfigError", str(e))))
                await asyncio.sleep(1.0)
        if env is not None and not runtime.terminating:
            self._start_process(runtime, container, env)
        if runtime.process is not None:
            await self._patch_status(runtime, self._status(runtime))
            code = await wait_process(runtime.process)
            runtime.finished_at = now()
            runtime.exit_code = 128 - code if code < 0 else code
            if runtime.killer is not None and not runtime.killer.done():
                runtime.killer.cancel()
        if runtime.lost:
            return
        await self._patch_status(runtime, self._status(runtime))
        if runtime.terminating:
            await self._confirm_deletion(runtime)

    def _known(self, image: str) -> bool:
        name = normalized_image(image)
        return any(
            fnmatch.fnmatchcase(name, normalized_image(pattern, default_tag="*" not in pattern))
            for pattern in self.known_images
        )

    async def _pull_image(self, runtime: PodRuntime, container: dict[str, Any]) -> bool:
        """The kubelet's image step; False while the pod can never start or was deleted before."""
        image = str(container.get("image") or "")
        if (problem := image_name_error(image)) is not None:
            await self._event(runtime.pod, "Warning", "InspectFailed", problem)
            await self._patch_status(runtime, self._status(runtime, waiting=("InvalidImageName", problem)))
            return False
        policy = container.get("imagePullPolicy", "IfNotPresent")
        backoff, cap = self.pull_backoff
        while not self._known(image):
            if runtime.terminating or runtime.lost:
                return False
            if policy == "Never":
                message = f'Container image "{image}" is not present with pull policy of Never'
                await self._event(runtime.pod, "Warning", "ErrImageNeverPull", message)
                await self._patch_status(runtime, self._status(runtime, waiting=("ErrImageNeverPull", message)))
                await asyncio.sleep(backoff)
                continue
            reference = normalized_image(image)
            message = (
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{reference}": failed to '
                f'resolve reference "{reference}": {reference}: not found'
            )
            await self._event(runtime.pod, "Warning", "Failed", f'Failed to pull image "{image}": {message}')
            await self._patch_status(runtime, self._status(runtime, waiting=("ErrImagePull", message)))
            await asyncio.sleep(min(backoff, 0.5))  # the next pod sync shows the back-off
            if runtime.terminating or runtime.lost:
                return False
            backing_off = f'Back-off pulling image "{image}"'
            await self._event(runtime.pod, "Normal", "BackOff", backing_off)
            await self._patch_status(runtime, self._status(runtime, waiting=("ImagePullBackOff", backing_off)))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, cap)
        return not (runtime.terminating or runtime.lost)

    async def _confirm_deletion(self, runtime: PodRuntime) -> None:
        """The kubelet's last word on a terminated pod: the zero-grace delete that removes it."""
        if runtime.deletion_confirmed or runtime.lost:
            return
        runtime.deletion_confirmed = True
        await self._request(
            "DELETE",
            f"/api/v1/namespaces/{runtime.namespace}/pods/{runtime.name}",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": runtime.uid}},
            ok=(200, 404, 409),
        )

    def _start_process(self, runtime: PodRuntime, container: dict[str, Any], env: dict[str, str]) -> None:
        """Start the container's process (fast, so it runs on the loop; the wait runs in a thread)."""
        argv = [_expand(a, env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
        runtime.started_at = now()
        if not container.get("command"):
            runtime.reason, runtime.message = "StartError", "the kubelet stand-in has no images: set command"
            runtime.exit_code, runtime.finished_at = 128, now()
            return
        # The image's filesystem does not exist here: an existing local workingDir is used as is,
        # anything else runs in a scratch directory per pod.
        workdir = Path(container.get("workingDir") or "/nonexistent")
        if not workdir.is_dir():
            workdir = self.workdir / "pods" / f"{runtime.namespace}_{runtime.name}_{runtime.uid[:8]}"
            workdir.mkdir(parents=True, exist_ok=True)
        try:
            with open(runtime.log_path, "ab") as log:
                runtime.process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                    env={**self.base_env, "HOSTNAME": runtime.name, **env},
                    start_new_session=True,
                )
        except OSError as e:
            # runc's words: a name not found on PATH, or exec's own error (E2BIG, EACCES) on the resolved path.
            if isinstance(e, FileNotFoundError):
                detail = f'exec: "{argv[0]}": executable file not found in $PATH'
            else:
                detail = f"exec {shutil.which(argv[0], path=env.get('PATH', self.base_env.get('PATH'))) or argv[0]}: "
                detail += (e.strerror or str(e)).lower()
            runtime.reason = "StartError"
            runtime.message = RUNC_START_ERROR.format(detail=detail)
            runtime.exit_code, runtime.finished_at = 128, now()
            return
        logger.info("kubelet: started %s/%s (pid %s): %s", runtime.namespace, runtime.name, runtime.process.pid, argv)

    async def _terminate(self, runtime: PodRuntime, grace: int) -> None:
        """Graceful termination: SIGTERM, then SIGKILL when the grace period is over."""
        if runtime.worker is not None and runtime.worker.done():
            await self._patch_status(runtime, self._status(runtime))
            await self._confirm_deletion(runtime)
            return
        if runtime.process is None or runtime.exit_code is not None:
            return  # the worker sees `terminating` and confirms the deletion itself
        self._signal(runtime, signal.SIGCONT)
        self._signal(runtime, signal.SIGTERM)
        await asyncio.sleep(grace)
        if runtime.exit_code is None:
            self._signal(runtime, signal.SIGKILL)

    def _signal(self, runtime: PodRuntime, sig: int) -> bool:
        if runtime.process is None or runtime.process.returncode is not None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(runtime.process.pid, sig)
            runtime.signals.append(sig)
            return True
        return False

    # --- environment -----------------------------------------------------------------------------

    async def _resolve_env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, ref_key in (("secrets", "secretRef"), ("configmaps", "configMapRef")):
                if ref_key in source:
                    data = await self._data(
                        namespace, kind, source[ref_key]["name"], optional=bool(source[ref_key].get("optional"))
                    )
                    env.update({prefix + k: v for k, v in (data or {}).items()})
        for var in container.get("env") or []:
            name, source = var["name"], var.get("valueFrom")
            if source is None:
                env[name] = _expand(var.get("value", ""), env)
                continue
            value: str | None = None
            if "secretKeyRef" in source or "configMapKeyRef" in source:
                kind, ref = (
                    ("secrets", source["secretKeyRef"])
                    if "secretKeyRef" in source
                    else ("configmaps", source["configMapKeyRef"])
                )
                optional = bool(ref.get("optional"))
                data = await self._data(namespace, kind, ref["name"], optional=optional)
                if data is not None and ref["key"] in data:
                    value = data[ref["key"]]
                elif data is not None and not optional:
                    noun = "Secret" if kind == "secrets" else "ConfigMap"
                    raise ConfigError(f"couldn't find key {ref['key']} in {noun} {namespace}/{ref['name']}")
            elif "fieldRef" in source:
                value = _field_ref(pod, source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                resource = source["resourceFieldRef"]["resource"]
                kind_, _, res = resource.partition(".")
                value = str(((container.get("resources") or {}).get(kind_) or {}).get(res, "0"))
            if value is not None:
                env[name] = value
        return env

    async def _data(self, namespace: str, kind: str, name: str, *, optional: bool) -> dict[str, str] | None:
        code, obj = await self._request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}", ok=(200, 404))
        if code == 404:
            if optional:
                return None
            raise ConfigError(f'{"secret" if kind == "secrets" else "configmap"} "{name}" not found')
        if code != 200:
            # The Node authorizer lets a node read only what its pods name, once it has seen the
            # binding: a 403 right after binding passes, as the kubelet's retries find.
            message = obj.get("message") if isinstance(obj, dict) else None
            raise ConfigError(message or f"reading {kind} {namespace}/{name}: HTTP {code}")
        if kind == "secrets":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    # --- status ----------------------------------------------------------------------------------

    def _status(self, runtime: PodRuntime, *, waiting: tuple[str, str | None] | None = None) -> dict[str, Any]:
        pod = runtime.pod
        container = (pod["spec"].get("containers") or [{}])[0]
        stamp = now()
        state: dict[str, Any]
        ready = False
        if waiting is not None:
            reason, message = waiting
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
            phase = "Pending"
        elif runtime.exit_code is None and runtime.process is not None:
            state = {"running": {"startedAt": runtime.started_at}}
            phase, ready = "Running", True
        elif runtime.exit_code is not None:
            reason = runtime.reason or ("Completed" if runtime.exit_code == 0 else "Error")
            terminated = {
                "exitCode": runtime.exit_code,
                "reason": reason,
                "startedAt": runtime.started_at,
                "finishedAt": runtime.finished_at,
                "containerID": f"local://{runtime.uid}",
            }
            message = runtime.message or self._fallback_message(runtime, container)
            if message:
                terminated["message"] = message
            state = {"terminated": terminated}
            phase = "Succeeded" if runtime.exit_code == 0 and not runtime.evicted else "Failed"
        else:  # deleted before it started
            state = {"waiting": {"reason": "ContainerCreating"}}
            phase = "Failed" if runtime.terminating else "Pending"
        not_ready = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
        conditions: list[dict[str, Any]] = [
            {"type": "PodReadyToStartContainers", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False", **({} if ready else {"reason": not_ready})},
            {
                "type": "ContainersReady",
                "status": "True" if ready else "False",
                **({} if ready else {"reason": not_ready}),
            },
            {"type": "PodScheduled", "status": "True"},
        ]
        old = {c["type"]: c for c in pod.get("status", {}).get("conditions") or []}
        for cond in conditions:
            previous = old.get(cond["type"])
            same = previous is not None and previous.get("status") == cond["status"]
            cond["lastTransitionTime"] = previous.get("lastTransitionTime", stamp) if same and previous else stamp
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": pod.get("status", {}).get("startTime") or stamp,
            "containerStatuses": [
                {
                    "name": container.get("name", "main"),
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": ready,
                    "started": ready,
                    "restartCount": 0,
                    "state": state,
                    **({"containerID": f"local://{runtime.uid}"} if runtime.started_at else {}),
                }
            ],
        }
        if runtime.evicted:
            status.update(reason="Evicted", message=runtime.evicted)
        return status

    @staticmethod
    def _fallback_message(runtime: PodRuntime, container: dict[str, Any]) -> str | None:
        """``terminationMessagePolicy: FallbackToLogsOnError``: a failed container's message is the tail
        of its log (the kubelet's limits: the last 80 lines, at most 2048 bytes). The stand-in cannot give
        the process a ``/dev/termination-log`` of its own, so only the fallback is emulated."""
        if container.get("terminationMessagePolicy") != "FallbackToLogsOnError" or runtime.exit_code in (0, None):
            return None
        try:
            data = runtime.log_path.read_bytes()[-2048:]
        except OSError:
            return None
        lines = data.decode(errors="replace").splitlines()[-80:]
        return "\n".join(lines) or None

    # --- faults ----------------------------------------------------------------------------------

    def runtime(self, name: str, namespace: str = "default") -> PodRuntime:
        """The running pod ``namespace/name``; ``KeyError`` if this kubelet does not run it."""
        try:
            return self.pods[(namespace, name)]
        except KeyError:
            raise KeyError(f"the kubelet does not run pod {namespace}/{name}") from None

    async def kill(self, name: str, sig: int = signal.SIGKILL, namespace: str = "default") -> None:
        """Send ``sig`` to the pod's process (SIGKILL: a crash, reported as the container's exit)."""
        runtime = self.runtime(name, namespace)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self._signal(runtime, signal.SIGCONT)
        if not self._signal(runtime, sig):
            raise RuntimeError(f"pod {namespace}/{name} has no running process")

    async def oom_kill(self, name: str, namespace: str = "default") -> None:
        """Kill the pod's process as the OOM killer does (reason ``OOMKilled``)."""
        runtime = self.runtime(name, namespace)
        runtime.reason = "OOMKilled"
        await self.kill(name, signal.SIGKILL, namespace)

    async def evict(
        self, name: str, namespace: str = "default", *, grace_period: int | None = None, node_pressure: bool = False
    ) -> None:
        """Evict the pod: through the Eviction API, or as node pressure does (``node_pressure``: the kubelet itself)."""
        if not node_pressure:
            body: dict[str, Any] = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            }
            if grace_period is not None:
                body["deleteOptions"] = {"gracePeriodSeconds": grace_period}
            code, answer = await self._request(
                "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body, as_binder=True
            )
            if code != 201:
                raise RuntimeError(f"eviction of {namespace}/{name} failed: {answer}")
            return
        runtime = self.runtime(name, namespace)
        runtime.evicted = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. "
        await self._patch_status(
            runtime,
            {
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "TerminationByKubelet",
                        "message": "The node was low on resource: memory.",
                        "lastTransitionTime": now(),
                        "lastProbeTime": None,
                    }
                ]
            },
        )
        self._signal(runtime, signal.SIGCONT)
        if grace_period:
            self._signal(runtime, signal.SIGTERM)
            await asyncio.sleep(grace_period)
        self._signal(runtime, signal.SIGKILL)

    async def lose_node(self, name: str, namespace: str = "default") -> None:
        """Report the pod as on an unresponsive node (phase Unknown, reason NodeLost), as the node controller would."""
        runtime = self.runtime(name, namespace)
        await self._patch_status(
            runtime,
            {
                "phase": "Unknown",
                "reason": "NodeLost",
                "message": f"Node {self.node_name} which was running pod {name} is unresponsive",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "Unknown",
                        "reason": "NodeLost",
                        "lastTransitionTime": now(),
                        "lastProbeTime": None,
                    }
                ],
            },
        )
        runtime.lost = True
        self._signal(runtime, signal.SIGCONT)
        self._signal(runtime, signal.SIGKILL)

    async def lose_whole_node(self) -> None:
        """The node vanishes as a real one does: every process SIGKILLed, and from now on no status, no
        lease renewal, no deletion confirmed. Unlike ``lose_node`` it writes nothing: on the real
        server the node lifecycle controller then marks the node and its pods (Ready Unknown/False
        after ``--node-monitor-grace-period``, the ``unreachable`` NoExecute taint) and the taint
        eviction controller deletes the pods (after their 300 s toleration); the pods stay
        Terminating, since no kubelet confirms. kubesim runs neither controller: there the pods
        stay as last reported."""
        self.node_lost = True
        if self._lease_task is not None:
            self._lease_task.cancel()
        for runtime in self.pods.values():
            runtime.lost = True
            self._signal(runtime, signal.SIGCONT)
            self._signal(runtime, signal.SIGKILL)

    async def pause(self, name: str, namespace: str = "default") -> None:
        """Freeze the pod's process (SIGSTOP): alive, doing nothing."""
        runtime = self.runtime(name, namespace)
        runtime.paused = self._signal(runtime, signal.SIGSTOP)

    async def resume(self, name: str, namespace: str = "default") -> None:
        """Let a paused pod's process go on (SIGCONT)."""
        runtime = self.runtime(name, namespace)
        self._signal(runtime, signal.SIGCONT)
        runtime.paused = False


def _session(access: ApiAccess) -> aiohttp.ClientSession:
    context = access.ssl_context()
    connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
    return aiohttp.ClientSession(connector=connector, headers=access.headers())


async def wait_process(process: subprocess.Popen[bytes]) -> int:
    """The exit status of ``process``, with a watcher of its own (never a shared, bounded pool).

    A pidfd (Linux 5.3+) becomes readable when the process ends and the event loop watches it:
    no thread per pod. Without pidfds, a dedicated daemon thread waits instead.
    """
    if process.returncode is not None:
        return process.returncode
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        return await _wait_in_own_thread(process)
    ended: asyncio.Future[None] = loop.create_future()
    try:
        loop.add_reader(fd, _settle, ended, None)
        try:
            await ended
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    return process.wait()


async def _wait_in_own_thread(process: subprocess.Popen[bytes]) -> int:
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[int] = loop.create_future()

    def wait() -> None:
        code = process.wait()
        loop.call_soon_threadsafe(_settle, ended, code)

    threading.Thread(target=wait, name=f"wait-{process.pid}", daemon=True).start()
    return await ended


def _settle(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _read_log(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read()
    except FileNotFoundError:
        return b""


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion (``$$`` escapes; unknown references stay as they are)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, text)


def _field_ref(pod: dict[str, Any], path: str) -> str:
    meta = pod["metadata"]
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path in ("status.podIP", "status.hostIP"):
        value = "127.0.0.1"
    return "" if value is None else str(value)


class KubeletThread:
    """The kubelet on its own thread and event loop, with synchronous fault injection for tests."""

    def __init__(
        self,
        api: str | ApiAccess,
        workdir: Path,
        *,
        known_images: Iterable[str] = KNOWN_IMAGES,
        base_env: dict[str, str] | None = None,
        node_name: str = NODE_NAME,
        binder: ApiAccess | None = None,
        serving_tls: ssl.SSLContext | None = None,
        lease_interval: float = LEASE_SECONDS / 4,
    ) -> None:
        self.kubelet = Kubelet(
            api,
            workdir=workdir,
            known_images=known_images,
            base_env=base_env,
            node_name=node_name,
            binder=binder,
            serving_tls=serving_tls,
            lease_interval=lease_interval,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kubelet", daemon=True)

    def start(self) -> KubeletThread:
        """Start the kubelet on a thread of its own; returns once it runs."""
        self._thread.start()
        self._run(self.kubelet.start())
        return self

    def stop(self) -> None:
        """Stop the kubelet (its pods' processes killed) and the thread."""
        try:
            self._run(self.kubelet.stop(), timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # Synchronous faces of the async API (namespace defaults to "default").
    def kill(self, name: str, sig: int = signal.SIGKILL, namespace: str = "default") -> None:
        """``Kubelet.kill`` from this thread."""
        self._run(self.kubelet.kill(name, sig, namespace))

    def oom_kill(self, name: str, namespace: str = "default") -> None:
        """``Kubelet.oom_kill`` from this thread."""
        self._run(self.kubelet.oom_kill(name, namespace))

    def evict(
        self, name: str, namespace: str = "default", *, grace_period: int | None = None, node_pressure: bool = False
    ) -> None:
        """``Kubelet.evict`` from this thread."""
        self._run(
            self.kubelet.evict(name, namespace, grace_period=grace_period, node_pressure=node_pressure),
            timeout=60 + (grace_period or 0),
        )

    def lose_node(self, name: str, namespace: str = "default") -> None:
        """``Kubelet.lose_node`` from this thread."""
        self._run(self.kubelet.lose_node(name, namespace))

    def lose_whole_node(self) -> None:
        """``Kubelet.lose_whole_node`` from this thread."""
        self._run(self.kubelet.lose_whole_node())

    def pause(self, name: str, namespace: str = "default") -> None:
        """``Kubelet.pause`` from this thread."""
        self._run(self.kubelet.pause(name, namespace))

    def resume(self, name: str, namespace: str = "default") -> None:
        """``Kubelet.resume`` from this thread."""
        self._run(self.kubelet.resume(name, namespace))

    def log_path(self, name: str, namespace: str = "default") -> Path:
        """Where the pod's output is written."""
        return self.kubelet.runtime(name, namespace).log_path

    def logs(self, name: str, namespace: str = "default") -> str:
        """The pod's output so far ("" before any)."""
        path = self.log_path(name, namespace)
        return path.read_text(errors="replace") if path.exists() else ""

    def pid(self, name: str, namespace: str = "default") -> int | None:
        """The pid of the pod's process, or ``None`` when it has none (not started, ended)."""
        process = self.kubelet.runtime(name, namespace).process
        return process.pid if process is not None else None

    def signals(self, name: str, namespace: str = "default") -> list[int]:
        """Signals the kubelet sent to the pod's process group, in order."""
        return list(self.kubelet.runtime(name, namespace).signals)
