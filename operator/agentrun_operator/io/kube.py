"""The only module that talks to the Kubernetes API (besides kopf's own watching).

A deliberately small aiohttp client: in-cluster service-account credentials,
or the current context of a kubeconfig (token, client certificate, CA). The
operator needs a handful of verbs on a handful of resources, and a thin
client keeps every request visible (and works against the test emulator
exactly as against a real API server).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from . import metrics

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: AlreadyExists on create, or a stale resourceVersion on update."""


def _write_temp(data: str) -> str:
    handle = tempfile.NamedTemporaryFile("w", delete=False, suffix=".pem")  # noqa: SIM115 - kept for ssl
    with handle:
        handle.write(data)
    return handle.name


class KubeClient:
    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        ssl_context: ssl.SSLContext | bool = True,
    ) -> None:
        self.server = server.rstrip("/")
        self.token = token
        # Bound service-account tokens rotate (about hourly): re-read the file for every request.
        self.token_file = token_file
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls) -> KubeClient:
        """In-cluster credentials when running in a pod, else the kubeconfig's current context."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port and (SA_DIR / "token").exists():
            context = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
            return cls(f"https://{host}:{port}", token_file=SA_DIR / "token", ssl_context=context)
        return cls.from_kubeconfig(os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config")))

    @classmethod
    def from_kubeconfig(cls, path: str) -> KubeClient:
        path = path.split(os.pathsep)[0]
        config = yaml.safe_load(Path(path).read_text())
        context_name = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user: dict[str, Any] = next(
            (u["user"] for u in config.get("users", []) if u["name"] == context.get("user")), {}
        )
        server = cluster["server"]
        ssl_context: ssl.SSLContext | bool = True
        if server.startswith("https"):
            if cluster.get("insecure-skip-tls-verify"):
                ssl_context = False
            else:
                ca = cluster.get("certificate-authority")
                if cluster.get("certificate-authority-data"):
                    ca = _write_temp(base64.b64decode(cluster["certificate-authority-data"]).decode())
                ssl_context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
                cert, key = user.get("client-certificate"), user.get("client-key")
                if user.get("client-certificate-data"):
                    cert = _write_temp(base64.b64decode(user["client-certificate-data"]).decode())
                    key = _write_temp(base64.b64decode(user["client-key-data"]).decode())
                if cert and key:
                    ssl_context.load_cert_chain(cert, key)
        token = user.get("token")
        if not token and user.get("tokenFile"):
            token = Path(user["tokenFile"]).read_text().strip()
        return cls(server, token=token, ssl_context=ssl_context)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        headers = {"Accept": "application/json"}
        token = self.token_file.read_text().strip() if self.token_file is not None else self.token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        try:
            async with self._session.request(
                method, self.server + path, data=data, headers=headers, params=params, ssl=self._ssl
            ) as response:
                text = await response.text()
                status, http_reason = response.status, response.reason
        except (aiohttp.ClientError, TimeoutError):
            metrics.kube_request(method, None)
            raise
        metrics.kube_request(method, status)
        payload = json.loads(text) if text and text.lstrip().startswith("{") else {}
        if status >= 400:
            reason = payload.get("reason") or http_reason or ""
            message = payload.get("message") or text[:300]
            error = {404: NotFound, 409: Conflict}.get(status, ApiError)
            raise error(status, reason, message)
        return payload

    async def get(self, path: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", path)
        return result

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("POST", path, body)
        return result

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("PATCH", path, body, content_type=MERGE_PATCH)
        return result

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("PUT", path, body)
        return result

    async def delete(self, path: str, *, grace_seconds: int | None = None) -> None:
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        with contextlib.suppress(NotFound):  # already gone: the goal of a delete
            await self.request("DELETE", path, body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def q(value: str) -> str:
    return quote(value, safe="")


def run_path(namespace: str, name: str | None = None, *, status: bool = False) -> str:
    base = f"/apis/agentrun.dev/v1alpha1/namespaces/{q(namespace)}/agentruns"
    if name is None:
        return base
    return f"{base}/{q(name)}" + ("/status" if status else "")


def pod_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{q(namespace)}/pods"
    return base if name is None else f"{base}/{q(name)}"


def secret_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{q(namespace)}/secrets/{q(name)}"


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{q(namespace)}/events"


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{q(namespace)}/leases"
    return base if name is None else f"{base}/{q(name)}"
