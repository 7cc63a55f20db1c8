"""The only module that talks to the Kubernetes API (besides kopf's watches, which log in with its credentials).

The credentials, TLS and HTTP transport are lightkube's (``io/kubeconfig.py``
says where they come from: in-cluster service account with rotated tokens
re-read, ``KUBECONFIG`` lists merged, exec credential plugins). The verbs are
ours and few: the operator needs a handful of them on a handful of resources,
as plain JSON bodies, so every request stays visible, is counted in
``metrics.KUBE_REQUESTS`` (each HTTP exchange, including one retried after a
401) and works against the test emulator exactly as against a real API server.

Errors: an answer >= 400 raises ``ApiError`` (``NotFound`` for 404,
``Conflict`` for 409); no answer raises ``TimeoutError`` or ``ConnectionError``
(an ``OSError``), and so does a credential that cannot be had (``CredentialsError``:
an exec plugin that fails, a token file that is gone), since both mean "try
again later" to every caller.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2 as httpx
import kopf
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.models import User

from . import kubeconfig, metrics
from .kubeconfig import SA_DIR, ConfigError, SingleConfig

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT_SECONDS = 30.0

# httpx2 logs every request at INFO: a line per status patch and pod GET would drown the operator's own log.
# The requests are counted in metrics.KUBE_REQUESTS instead; failures reach the caller as exceptions.
logging.getLogger("httpx2").setLevel(logging.WARNING)


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


class CredentialsError(ConnectionError):
    """No credential to send: the exec plugin failed or the token file is unreadable (retry like no answer)."""


class KubeClient:
    """The operator's client for ``config`` (see ``from_environment``); one connection pool, one credential."""

    def __init__(self, config: SingleConfig, *, timeout: float = TIMEOUT_SECONDS) -> None:
        self.config = config._replace(user=config.user or User())  # a context may name no user (kubectl proxy)
        self.server = config.cluster.server.rstrip("/")
        self.timeout = timeout
        self.auth = kubeconfig.auth_for(self.config.user)
        # TLS is set up here, once: lightkube decodes *-data certificates into temp files only while loading them.
        self._params = ConnectionParams(timeout=httpx.Timeout(timeout)).httpx_params(self.config)
        self._params["auth"] = self.auth
        self._http: httpx.AsyncClient | None = None
        self._logins = 0

    @classmethod
    def from_environment(cls, *, service_account: Path = SA_DIR) -> KubeClient:
        """In-cluster credentials when running in a pod, else the (merged) kubeconfig's current context."""
        return cls(kubeconfig.load(service_account=service_account))

    @classmethod
    def from_kubeconfig(cls, path: str, *, context: str | None = None) -> KubeClient:
        """``path``: one kubeconfig file or several, os.pathsep-separated (merged as kubectl does)."""
        return cls(kubeconfig.load_kubeconfig(path, context=context))

    def _client(self) -> httpx.AsyncClient:
        if self._http is None or self._http.is_closed:
            self._http = httpx.AsyncClient(**self._params, event_hooks={"response": [_count]})
        return self._http

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            headers["Content-Type"] = content_type
            content = json.dumps(body).encode()
        try:
            response = await self._client().request(method, path, content=content, headers=headers, params=params)
        except httpx.TimeoutException as e:
            metrics.kube_request(method, None)
            raise TimeoutError(f"{method} {path}: no answer within {self.timeout:g}s") from e
        except httpx.TransportError as e:
            metrics.kube_request(method, None)
            raise ConnectionError(f"{method} {path}: {e!r}") from e
        except ConfigError as e:
            metrics.kube_request(method, None)
            raise CredentialsError(f"{method} {path}: {e}") from e
        text = response.text
        payload = json.loads(text) if text and text.lstrip().startswith("{") else {}
        if response.status_code >= 400:
            reason = payload.get("reason") or response.reason_phrase or ""
            message = payload.get("message") or text[:300]
            error = {404: NotFound, 409: Conflict}.get(response.status_code, ApiError)
            raise error(response.status_code, reason, message)
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

    async def connection_info(self, *, trust_env: bool = False) -> kopf.ConnectionInfo:
        """kopf's login (``@kopf.on.login``): this client's server, TLS material and identity.

        kopf calls it at start and again when the API refused (401) or expired what it had: from the second
        call on, the token file is read anew and the exec plugin run anew.
        """
        self._logins += 1
        try:
            return await kubeconfig.connection_info(
                self.config, self.auth, trust_env=trust_env, refresh=self._logins > 1
            )
        except ConfigError as e:
            raise kopf.LoginError(str(e)) from e

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


async def _count(response: httpx.Response) -> None:
    metrics.kube_request(response.request.method, response.status_code)


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
