"""Measuring what one client puts on the API server: a counting proxy, and pods held Running without processes.

``CountingProxy`` sits between one client (the operator) and the emulated API
server: the client's kubeconfig points at the proxy, which forwards every
request (watch streams too, chunk by chunk) and records it, so a test counts
exactly that client's requests whatever HTTP library it uses, and no other
client's (kubectl, the kubelet stand-in, the test itself).

``hold_running`` stands in for a kubelet that started every runner pod and
then went quiet (the benchmark's "kubelet paused"): it reports the operator's
pods Running, once each, and starts no process, so a thousand runs can be
Running on a laptop and the only thing left moving is the operator. On the
real API server, which runs no scheduler here and lets no pod be Running
unbound, it binds each pod to ``node`` first (a Node object the caller made).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from kubesim.access import ApiAccess

HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})
MANAGED_BY = "app.kubernetes.io/managed-by=agentrun-operator"


@dataclass(frozen=True)
class Seen:
    """One request the proxy forwarded: when, its method and path."""

    at: float  # time.monotonic()
    method: str
    path: str
    watch: bool


@dataclass
class CountingProxy:
    """A proxy in front of ``upstream`` (an API server) that counts every request through it (``start()``, ``url``)."""

    upstream: str
    host: str = "127.0.0.1"
    url: str = ""
    requests: list[Seen] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None

    def start(self) -> CountingProxy:
        """Serve on a free port (``url``) from a thread of its own; returns once it listens."""
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main(ready)), name="api-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the counting proxy did not start")
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def count(self, since: float, until: float | None = None, *, watches: bool = False) -> Counter[str]:
        """Requests made in [since, until) by "METHOD path-kind"; watch requests only when ``watches``."""
        end = time.monotonic() if until is None else until
        return Counter(
            f"{s.method} {_kind(s.path)}"
            for s in list(self.requests)
            if since <= s.at < end and (watches or not s.watch)
        )

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=8 << 20)

        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._forward(session, request)

        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"
        ready.set()
        await self._stop.wait()
        await runner.cleanup()
        await session.close()

    async def _forward(self, session: aiohttp.ClientSession, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        self.requests.append(Seen(time.monotonic(), request.method, request.path, watch))
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with session.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            try:  # the client may hang up at any moment (a watch it stops, an operator that exits)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionResetError, aiohttp.ClientError):
                pass
            return response


def _kind(path: str) -> str:
    """``/api/v1/namespaces/n/pods/x`` -> ``pods/{name}``; ``../agentruns/x/status`` -> ``agentruns/{name}/status``."""
    parts = [p for p in path.split("/") if p]
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        rest = parts[parts.index("namespaces") + 2 :]
        return "/".join([rest[0], *(["{name}"] if len(rest) > 1 else []), *rest[2:]])
    return "/".join(parts[-2:])


def _request(api: ApiAccess, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": content_type, **api.headers()}
    req = urllib.request.Request(api.server + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=30, context=api.ssl_context()) as response:
        return json.loads(response.read() or b"{}")


def running_status() -> dict[str, Any]:
    """The status of a pod a kubelet started and reports Running (``RunningHolder``)."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "phase": "Running",
        "startTime": stamp,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
        "containerStatuses": [
            {
                "name": "runner",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "image": "agentrun:test",
                "imageID": "",
                "state": {"running": {"startedAt": stamp}},
            }
        ],
    }


def hold_running(
    api: str | ApiAccess, namespace: str = "default", *, marked: set[str] | None = None, node: str | None = None
) -> set[str]:
    """Report every operator pod of ``namespace`` not yet in ``marked`` as Running (bound to ``node`` first when
    given and the pod is unbound); returns ``marked``, updated. ``api``: a URL, or an identity on a server."""
    api = ApiAccess(api) if isinstance(api, str) else api
    marked = set() if marked is None else marked
    pods = _request(api, "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={MANAGED_BY}")
    for pod in pods.get("items") or []:
        name = pod["metadata"]["name"]
        if name in marked or pod["metadata"].get("deletionTimestamp"):
            continue
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        if node is not None and not pod["spec"].get("nodeName"):
            target = {"apiVersion": "v1", "kind": "Node", "name": node}
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": target}
            _request(api, "POST", f"{path}/binding", binding)
        _request(api, "PATCH", f"{path}/status", {"status": running_status()}, "application/merge-patch+json")
        marked.add(name)
    return marked


class RunningHolder:
    """``hold_running`` every ``interval`` seconds on a thread until stopped (pods created later are held too)."""

    def __init__(
        self, api: str | ApiAccess, namespace: str = "default", interval: float = 0.3, *, node: str | None = None
    ) -> None:
        self.api, self.namespace, self.interval, self.node = api, namespace, interval, node
        self.marked: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="running-holder", daemon=True)

    def start(self) -> RunningHolder:
        """Start holding the operator's pods Running."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop holding and wait for the thread."""
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                hold_running(self.api, self.namespace, marked=self.marked, node=self.node)
            except OSError:
                continue
