"""Run the emulated cluster in a background thread and drive it like a user would.

``EmulatedCluster`` starts ``ClusterEmulator`` behind kmock's HTTP server on
127.0.0.1 (a free port unless given one), in its own thread and event loop, so
that separate processes — the real ``kubectl``, Helm, an operator, pods —
reach it over TCP exactly as they would reach a cluster. It writes a
kubeconfig, runs the real ``kubectl`` against it, calls the API over HTTP, and
reads stored objects directly (as snapshots taken on the server's loop, so a
test never sees a half-applied write).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from kubesim.emulator import ClusterEmulator

T = TypeVar("T")
KUBECTL = shutil.which("kubectl") or "kubectl"


def write_kubeconfig(path: Path, server: str, namespace: str = "default") -> Path:
    """A kubeconfig for the emulator, with the token ``emulated`` (all-powerful once authentication is on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kubesim", "cluster": {"server": server}}],
                "users": [{"name": "kubesim", "user": {"token": "emulated"}}],
                "contexts": [
                    {
                        "name": "kubesim",
                        "context": {
                            "cluster": "kubesim",
                            "user": "kubesim",
                            "namespace": namespace,
                        },
                    }
                ],
                "current-context": "kubesim",
            }
        )
    )
    return path


class ApiResponse:
    """One answer of the emulated API server: status, decoded body, headers."""

    def __init__(self, status: int, body: Any, headers: dict[str, str]) -> None:
        self.status, self.body, self.headers = status, body, headers

    def __repr__(self) -> str:
        return f"ApiResponse({self.status}, {self.body!r})"


def emulator_faults(errors: list[Exception]) -> list[Exception]:
    """``errors`` without a client hanging up mid-response (``ConnectionResetError`` while writing, e.g.
    "Cannot write to closing transport"): kmock records those too, but they are the client's doing (a
    blocked or stopped client's connection closed), not a fault of the emulator."""
    return [e for e in errors if not isinstance(e, ConnectionResetError)]


class EmulatedCluster:
    """The emulated API server on a background thread; see the module docstring."""

    def __init__(
        self, workdir: Path, *, host: str = "127.0.0.1", port: int = 0, crd_files: Iterable[Path] = ()
    ) -> None:
        self.workdir = workdir
        self.host, self.port = host, port
        self.crd_files = tuple(crd_files)
        self.kubeconfig = workdir / "kubeconfig"
        self.url = ""
        self.emulator: ClusterEmulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._errors: list[Exception] | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 15) -> EmulatedCluster:
        """Serve on a free port (``url``, ``kubeconfig``) from a thread of its own; returns once it answers."""
        self._thread = threading.Thread(target=self._run, name="emulated-apiserver", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the emulated API server did not start in time")
        if self._failure is not None:
            raise RuntimeError("the emulated API server failed to start") from self._failure
        write_kubeconfig(self.kubeconfig, self.url)
        return self

    def stop(self, timeout: float = 15) -> None:
        """Stop serving and wait for the thread."""
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("the emulated API server did not stop in time")

    def __enter__(self) -> EmulatedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported to start() or by stop()
            self._failure = e
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        emulator = ClusterEmulator(crd_files=self.crd_files)
        async with emulator, kmock.Server(emulator, host=self.host, port=self.port) as server:
            self.emulator = emulator
            self.url = f"http://{server.host}:{server.port}"
            self._ready.set()
            await self._stop.wait()
            self._errors = list(emulator.errors)
            emulator.close_streams()

    @property
    def internal_errors(self) -> list[Exception]:
        """Exceptions the emulator itself raised while serving (its bugs, not API errors)."""
        if self._errors is not None:  # stopped
            return emulator_faults(self._errors)
        assert self.emulator is not None
        return emulator_faults(self.call(lambda: list(self.emulator.errors) if self.emulator else []))

    # --- running things on the server's loop -----------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run ``coro`` on the server's event loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 30) -> T:
        """Run ``fn`` on the server's loop (between requests) and return its result."""

        async def wrapper() -> T:
            return fn()

        return self.run(wrapper(), timeout)

    def get(self, resource: str, name: str, namespace: str | None = "default") -> dict[str, Any] | None:
        """A snapshot of a stored object, or None."""

        def read() -> dict[str, Any] | None:
            assert self.emulator is not None
            rdef = self.emulator.resource_def(resource)
            obj = self.emulator.registry.get(rdef, namespace if rdef.namespaced else None, name)
            return copy.deepcopy(obj)

        return self.call(read)

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored objects of ``resource`` (in ``namespace``, or all), read on the server's loop."""

        def read() -> list[dict[str, Any]]:
            assert self.emulator is not None
            rdef = self.emulator.resource_def(resource)
            return copy.deepcopy(self.emulator.registry.items(rdef, namespace))

        return self.call(read)

    def history(self, resource: str, name: str, namespace: str | None = "default") -> list[dict[str, Any] | None]:
        """Every stored version of an object (None marks a deletion), oldest first."""

        def read() -> list[dict[str, Any] | None]:
            assert self.emulator is not None
            rdef = self.emulator.resource_def(resource)
            key = (rdef.key, namespace if rdef.namespaced else None, name)
            if key not in self.emulator.objects:
                return []
            return [None if v is None else copy.deepcopy(v.raw) for v in self.emulator.objects[key].history]

        return self.call(read)

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

    # --- clients ---------------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the REAL kubectl against the emulator; returns the completed process (text)."""
        return subprocess.run(
            self._kubectl_argv(args),
            input=input,
            capture_output=True,
            text=True,
            env=self._kubectl_env(),
            check=check,
            timeout=timeout,
        )

    def kubectl_popen(self, *args: str) -> subprocess.Popen[str]:
        """Start a long-running kubectl (``get -w``, ``wait``, ``logs -f``); the caller ends it."""
        return subprocess.Popen(
            self._kubectl_argv(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self._kubectl_env()
        )

    def _kubectl_argv(self, args: tuple[str, ...]) -> list[str]:
        return [KUBECTL, f"--cache-dir={self.workdir / 'kubectl-cache'}", *args]

    def _kubectl_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env["KUBECONFIG"] = str(self.kubeconfig)
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
    ) -> ApiResponse:
        """One HTTP request to the API (JSON in, JSON out); never raises on HTTP errors."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return ApiResponse(response.status, json.loads(response.read() or b"null"), dict(response.headers))
        except urllib.error.HTTPError as e:
            with e:
                return ApiResponse(e.code, json.loads(e.read() or b"null"), dict(e.headers))


def poll(predicate: Callable[[], T | None], *, timeout: float, interval: float, message: str) -> T:
    """Poll until ``predicate()`` is truthy and return it; AssertionError naming ``message`` on timeout.

    The ``wait_for`` of both servers' test handles (``EmulatedCluster``, ``real.RealControlPlane``).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {message}")
        time.sleep(interval)
