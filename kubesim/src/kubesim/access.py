"""How a client reaches an API server: its URL and who it is there.

kubesim's emulator is plain HTTP and needs no credentials; the real kube-apiserver is HTTPS with
a CA of its own and authenticates every request (a bearer token, or a client certificate whose CN
is the user and whose O fields are the groups). One record carries either, so the kubelet
stand-in and the test helpers speak to both servers with the same code.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ApiAccess:
    """A server URL and one identity on it (a token, a client certificate, or nothing)."""

    server: str
    ca_file: Path | None = None
    token: str | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context for an https server (verifying it against ``ca_file``), else None."""
        if not self.server.startswith("https:"):
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header of this identity (none for an anonymous one)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def kubeconfig(self, *, namespace: str = "default", name: str = "kubesim") -> dict[str, object]:
        """A kubeconfig (as a dict, for ``yaml.safe_dump``) with this identity as its only context."""
        cluster: dict[str, str] = {"server": self.server}
        if self.ca_file is not None:
            cluster["certificate-authority"] = str(self.ca_file)
        user: dict[str, str] = {}
        if self.token:
            user["token"] = self.token
        if self.cert_file is not None and self.key_file is not None:
            user["client-certificate"] = str(self.cert_file)
            user["client-key"] = str(self.key_file)
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": cluster}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
            "current-context": name,
        }
