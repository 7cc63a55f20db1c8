"""The API server, asked with the USER's token: the history server's only way to decide who sees what.

Every call takes the caller's bearer token and sends it as is; the server's
own identity is never used (it has none: the chart mounts no service account
token, and a kubeconfig's user is dropped). The API server's answer is the
authorization: 200 shows the run, 403 and 401 are passed on to the caller,
404 says the run does not exist (or, for a user who may not list, nothing).
"""

from __future__ import annotations

import json
import os
import ssl
from typing import Any, Self
from urllib.parse import quote

import aiohttp
from lightkube.config.models import User

from agentrun.contract import GROUP, PLURAL, VERSION
from agentrun_operator.io import kubeconfig

TIMEOUT_SECONDS = 15.0


class KubeError(Exception):
    """The API server refused or failed a call made with the user's token."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def run_path(namespace: str | None, name: str | None = None) -> str:
    """The API path of the AgentRuns of ``namespace`` (all namespaces when ``None``), or of one by ``name``."""
    if namespace is None:
        return f"/apis/{GROUP}/{VERSION}/{PLURAL}"
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}"
    return base if name is None else f"{base}/{quote(name, safe='')}"


class UserKube:
    """The API server's address and CA (in-cluster, else the kubeconfig's cluster); credentials come per call."""

    def __init__(self, server: str, ssl_context: ssl.SSLContext | bool) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls, *, ca_file: str | None = None) -> Self:
        """In a pod: ``KUBERNETES_SERVICE_HOST`` with ``ca_file`` (the chart mounts the ``kube-root-ca.crt``
        ConfigMap, not a token); elsewhere the kubeconfig's cluster. Never a user's or the pod's credentials."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port:
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            return cls(server, ssl.create_default_context(cafile=ca_file or str(kubeconfig.SA_DIR / "ca.crt")))
        config = kubeconfig.load_kubeconfig(os.environ.get("KUBECONFIG") or str(kubeconfig.DEFAULT_KUBECONFIG))
        config = config._replace(user=User())
        context: ssl.SSLContext | bool = False if config.cluster.insecure else kubeconfig.ssl_context(config)
        return cls(config.cluster.server, context)

    async def request(self, method: str, path: str, token: str, body: Any = None, *, patch: str = "") -> Any:
        """One API request with the caller's ``token``; ``KubeError`` with the API server's status and message."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS))
        headers = {"Accept": "application/json", "Authorization": f"Bearer {token}"}
        data = None
        if body is not None:
            headers["Content-Type"] = patch or "application/json"
            data = json.dumps(body)
        try:
            async with self._session.request(
                method, self.server + path, data=data, headers=headers, ssl=self._ssl
            ) as response:
                text = await response.text()
                status, http_reason = response.status, response.reason or ""
        except (aiohttp.ClientError, TimeoutError) as e:
            raise KubeError(502, "BadGateway", f"the Kubernetes API server did not answer: {e!r}") from e
        payload = json.loads(text) if text.lstrip().startswith("{") else {}
        if status >= 400:
            raise KubeError(
                status, str(payload.get("reason") or http_reason), str(payload.get("message") or text)[:500]
            )
        return payload

    async def get_run(self, token: str, namespace: str, name: str) -> dict[str, Any]:
        """The AgentRun ``namespace/name``, read as the caller."""
        run: dict[str, Any] = await self.request("GET", run_path(namespace, name), token)
        return run

    async def list_runs(self, token: str, namespace: str | None, *, limit: int = 0) -> list[dict[str, Any]]:
        """The AgentRuns the caller may list in ``namespace`` (every namespace when ``None``), at most ``limit``."""
        listing = await self.request("GET", run_path(namespace) + (f"?limit={limit}" if limit else ""), token)
        items: list[dict[str, Any]] = listing.get("items") or []
        return items

    async def merge_patch(self, token: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of the AgentRun as the caller (``spec.stop``); returns the patched object."""
        done: dict[str, Any] = await self.request(
            "PATCH", run_path(namespace, name), token, body, patch="application/merge-patch+json"
        )
        return done

    async def json_patch(self, token: str, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch of the AgentRun as the caller (an answer: its ops start with a ``test``); the patched object."""
        done: dict[str, Any] = await self.request(
            "PATCH", run_path(namespace, name), token, ops, patch="application/json-patch+json"
        )
        return done

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
