"""The only module that talks to the Kubernetes API (besides kopf's watches, which log in with its credentials).

Where the credentials come from is ``io/kubeconfig.py``: lightkube reads the
kubeconfig (a ``KUBECONFIG`` list merged) or the in-cluster service account and
builds the TLS context; the token file is re-read as the kubelet rotates it, and
exec credential plugins run there. The requests themselves go over aiohttp
(which kopf uses too): lightkube's own transport, httpx2, cost four times the
client CPU per request (0.8 ms against 0.2 ms, measured against the emulator),
and the operator is meant to stay within a few percent of a core at 1,000 runs.
The verbs are few (and a watch, ``watch``: io/informer.py), plain JSON, every request visible and counted in
``metrics.KUBE_REQUESTS`` (each HTTP exchange, a request retried after a 401
included), and they work against the test emulator exactly as against a real
API server.

Errors: an answer >= 400 raises ``ApiError`` (``NotFound`` for 404,
``Conflict`` for 409); no answer raises ``TimeoutError`` or ``ConnectionError``
(an ``OSError``), and so does a credential that cannot be had (``CredentialsError``:
an exec plugin that fails, a token file that is gone), since both mean "try
again later" to every caller. A 401 is retried once with a fresh credential
when there is one to be had (a rotated token file, a new plugin run).
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf
from lightkube.config.models import User

from agentrun.contract import API_VERSION, PLURAL

from . import kubeconfig, metrics
from .kubeconfig import SA_DIR, ConfigError, SingleConfig

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT_SECONDS = 30.0


class ApiError(Exception):
    """An API server's error answer: status code, reason, message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404 Not Found."""


class Conflict(ApiError):
    """409: AlreadyExists on create, or a stale resourceVersion on update."""


class CredentialsError(ConnectionError):
    """No credential to send: the exec plugin failed or the token file is unreadable (retry like no answer)."""


class KubeClient:
    """The operator's client for ``config`` (see ``from_environment``); one connection pool, one credential."""

    def __init__(self, config: SingleConfig, *, timeout: float = TIMEOUT_SECONDS) -> None:
        self.config = config._replace(user=config.user or User())  # a context may name no user (kubectl proxy)
        self.server = config.cluster.server.rstrip("/")
        self.timeout = timeout
        self.credentials = kubeconfig.credentials_for(self.config.user)
        # Built once, here: lightkube decodes *-data certificates into temp files only while loading them.
        self._ssl: ssl.SSLContext | bool = kubeconfig.ssl_context(self.config)
        if self.config.cluster.insecure:
            self._ssl = False
        self._session: aiohttp.ClientSession | None = None
        self._logins = 0
        self._refused: str | None = None  # the credential a watch was refused with (401): not sent again

    @classmethod
    def from_environment(cls, *, service_account: Path = SA_DIR) -> KubeClient:
        """In-cluster credentials when running in a pod, else the (merged) kubeconfig's current context."""
        return cls(kubeconfig.load(service_account=service_account))

    @classmethod
    def from_kubeconfig(cls, path: str, *, context: str | None = None) -> KubeClient:
        """``path``: one kubeconfig file or several, os.pathsep-separated (merged as kubectl does)."""
        return cls(kubeconfig.load_kubeconfig(path, context=context))

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        """One API request; the decoded answer, or ``ApiError`` (``NotFound``, ``Conflict``) for an error."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        sent: str | None = None
        for _ in range(2):  # a second time only after a 401, with a fresh credential
            try:
                authorization = await self.credentials.header(stale=sent)
            except ConfigError as e:
                metrics.kube_request(method, None)
                raise CredentialsError(f"{method} {path}: {e}") from e
            if sent is not None and authorization == sent:
                break  # nothing fresher to offer: the 401 stands
            if authorization:
                headers["Authorization"] = authorization
            try:
                async with self._session.request(
                    method, self.server + path, data=data, headers=headers, params=params, ssl=self._ssl
                ) as response:
                    text = await response.text()
                    status, http_reason = response.status, response.reason
            except TimeoutError as e:
                metrics.kube_request(method, None)
                raise TimeoutError(f"{method} {path}: no answer within {self.timeout:g}s") from e
            except aiohttp.ClientError as e:
                metrics.kube_request(method, None)
                raise ConnectionError(f"{method} {path}: {e!r}") from e
            metrics.kube_request(method, status)
            if status != 401 or not authorization:
                break
            sent = authorization
        payload = json.loads(text) if text and text.lstrip().startswith("{") else {}
        if status >= 400:
            reason = payload.get("reason") or http_reason or ""
            message = payload.get("message") or text[:300]
            error = {404: NotFound, 409: Conflict}.get(status, ApiError)
            raise error(status, reason, message)
        return payload

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """A watch of ``path`` (``params`` name the version to start from): its events, decoded, until the server
        ends the stream. ``ApiError`` for an error answer (after a 401 the next call sends a fresh credential);
        no total timeout (the server ends a watch when it sees fit), connecting within the client's."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        headers = {"Accept": "application/json"}
        try:
            authorization = await self.credentials.header(stale=self._refused)
        except ConfigError as e:
            metrics.kube_request("WATCH", None)
            raise CredentialsError(f"WATCH {path}: {e}") from e
        if authorization:
            headers["Authorization"] = authorization
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)
        try:
            async with self._session.get(
                self.server + path, headers=headers, params=params, ssl=self._ssl, timeout=timeout
            ) as response:
                metrics.kube_request("WATCH", response.status)
                if response.status >= 400:
                    self._refused = authorization if response.status == 401 else None
                    text = await response.text()
                    payload = json.loads(text) if text.lstrip().startswith("{") else {}
                    message = payload.get("message") or text[:300]
                    raise ApiError(response.status, payload.get("reason") or response.reason or "", message)
                self._refused = None
                pending = b""
                async for chunk in response.content.iter_any():  # not by line: an object may exceed a line's limit
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
        except TimeoutError as e:
            metrics.kube_request("WATCH", None)
            raise TimeoutError(f"WATCH {path}: no answer within {self.timeout:g}s") from e
        except aiohttp.ClientError as e:
            metrics.kube_request("WATCH", None)
            raise ConnectionError(f"WATCH {path}: {e!r}") from e

    async def get(self, path: str) -> dict[str, Any]:
        """GET ``path``."""
        result: dict[str, Any] = await self.request("GET", path)
        return result

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path``; returns what was created."""
        result: dict[str, Any] = await self.request("POST", path, body)
        return result

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of ``path``; returns the patched object."""
        result: dict[str, Any] = await self.request("PATCH", path, body, content_type=MERGE_PATCH)
        return result

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT ``body`` at ``path`` (the resourceVersion in it guards the write); returns the stored object."""
        result: dict[str, Any] = await self.request("PUT", path, body)
        return result

    async def delete(self, path: str, *, grace_seconds: int | None = None) -> None:
        """DELETE ``path`` (background propagation; ``grace_seconds`` for a pod)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        with contextlib.suppress(NotFound):  # already gone: the goal of a delete
            await self.request("DELETE", path, body)

    async def connection_info(self, *, trust_env: bool = False) -> kopf.ConnectionInfo:
        """kopf's login (``@kopf.on.login``): this client's server, TLS material and identity.

        kopf calls it at start and again when the API refused (401) or expired what it had: from the second
        call on, the token file is read anew and the exec plugin run anew.
        """
        self._logins += 1
        try:
            return await kubeconfig.connection_info(
                self.config, self.credentials, trust_env=trust_env, refresh=self._logins > 1
            )
        except ConfigError as e:
            raise kopf.LoginError(str(e)) from e

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def q(value: str) -> str:
    """``value`` quoted for a URL path segment."""
    return quote(value, safe="")


def run_path(namespace: str | None, name: str | None = None, *, status: bool = False) -> str:
    """The API path of a namespace's AgentRuns (every namespace's: ``None``), of one (``name``), or of its status
    subresource."""
    base = (
        f"/apis/{API_VERSION}/namespaces/{q(namespace)}/{PLURAL}"
        if namespace is not None
        else f"/apis/{API_VERSION}/{PLURAL}"
    )
    if name is None:
        return base
    return f"{base}/{q(name)}" + ("/status" if status else "")


def pod_path(namespace: str | None, name: str | None = None) -> str:
    """The API path of a namespace's pods (every namespace's: ``None``), or of one."""
    base = f"/api/v1/namespaces/{q(namespace)}/pods" if namespace is not None else "/api/v1/pods"
    return base if name is None else f"{base}/{q(name)}"


def secret_path(namespace: str, name: str) -> str:
    """The API path of a Secret."""
    return f"/api/v1/namespaces/{q(namespace)}/secrets/{q(name)}"


def events_path(namespace: str) -> str:
    """The API path of a namespace's Events."""
    return f"/api/v1/namespaces/{q(namespace)}/events"


def lease_path(namespace: str, name: str | None = None) -> str:
    """The API path of a namespace's Leases, or of one."""
    base = f"/apis/coordination.k8s.io/v1/namespaces/{q(namespace)}/leases"
    return base if name is None else f"{base}/{q(name)}"
