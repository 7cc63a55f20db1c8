"""Where the operator's Kubernetes credentials come from: one source for its own client and for kopf's watches.

Resolved as client-go resolves them. In a pod (``KUBERNETES_SERVICE_HOST`` and a
service-account token present): the service account's token file, CA and
namespace. Otherwise the kubeconfig files ``KUBECONFIG`` lists (``:``-separated,
merged: the first file to name a cluster, user or context wins, the first
``current-context`` wins, missing files are skipped), else ``~/.kube/config``.

Parsing (kubeconfig and in-cluster) and the TLS context are lightkube's:
decoded ``*-data`` certificates and keys live in temporary files (mode 0600)
only while the SSL context loads them. The ``Authorization`` header is made
here (``Credentials``), for the operator's aiohttp client and kopf's login
alike: a token file (the service account's) is re-read every minute and at
once after a 401, so the kubelet's rotated tokens are picked up; an exec
credential plugin (``aws eks get-token``, ``gke-gcloud-auth-plugin``,
``kubelogin``) runs once for every concurrent request until the credential's
``expirationTimestamp`` or a 401, and kopf logs in with the same token
(``connection_info``).

Limits: a plugin that answers with a client certificate instead of a token, the
removed ``auth-provider`` plugins, ``proxy-url`` and ``tls-server-name`` are not
supported (the client fails at start, naming what it cannot do). Token-file
credentials handed to kopf are read at each kopf login; kopf logs in again when
the API answers 401, which a rotated-out token gets once it expires.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import yaml
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import User, UserExec
from lightkube.core.exceptions import ConfigError

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
    "client.authentication.k8s.io/v1alpha1",
)
EXEC_TIMEOUT_SECONDS = 60.0
TOKEN_FILE_REREAD_SECONDS = 60.0  # a plugin that hangs (an IdP that does not answer) must not stall every request

__all__ = [
    "ConfigError",
    "Credentials",
    "SingleConfig",
    "connection_info",
    "credentials_for",
    "load",
    "load_kubeconfig",
]


def load(*, service_account: Path = SA_DIR) -> SingleConfig:
    """In-cluster credentials when running in a pod, else the merged kubeconfig's current context.

    Raises ``ConfigError`` when neither is there or the kubeconfig names no usable context.
    """
    in_pod = os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")
    if in_pod and (service_account / "token").exists():
        config = KubeConfig.from_service_account(service_account).get()
        assert config is not None
        return config
    paths = os.environ.get("KUBECONFIG") or str(DEFAULT_KUBECONFIG)
    return load_kubeconfig(paths)


def load_kubeconfig(paths: str, *, context: str | None = None) -> SingleConfig:
    """The context ``context`` (default: the current one) of the kubeconfig files ``paths`` (os.pathsep-separated).

    Merged as kubectl merges ``KUBECONFIG``: for every named cluster, user and context the first file that
    has it wins, and so does the first ``current-context``; files that do not exist are skipped.
    """
    files = [Path(p).expanduser() for p in paths.split(os.pathsep) if p.strip()]
    merged: dict[str, Any] = {"current-context": None, "clusters": [], "contexts": [], "users": []}
    seen: dict[str, set[str]] = {"clusters": set(), "contexts": set(), "users": set()}
    found = []
    for path in files:
        if not path.is_file():
            continue
        found.append(path)
        document = yaml.safe_load(path.read_text()) or {}
        merged["current-context"] = merged["current-context"] or document.get("current-context") or None
        for section in ("clusters", "contexts", "users"):
            for entry in document.get(section) or []:
                if entry.get("name") not in seen[section]:
                    seen[section].add(entry["name"])
                    merged[section].append(_absolute(section, entry, path.parent))
    if not found:
        raise ConfigError(f"no kubeconfig found at {paths!r}")
    config = KubeConfig.from_dict(merged).get(context)
    assert config is not None  # get() without a default raises instead
    return config


# Relative paths in a kubeconfig are relative to the file that holds them; made absolute before merging,
# since the merged config has no single file to resolve them against.
_PATH_FIELDS = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


def _absolute(section: str, entry: dict[str, Any], base: Path) -> dict[str, Any]:
    if section not in _PATH_FIELDS:
        return entry
    key, fields = _PATH_FIELDS[section]
    body = dict(entry.get(key) or {})
    for field in fields:
        if body.get(field) and not Path(body[field]).expanduser().is_absolute():
            body[field] = str(base / body[field])
    command = (body.get("exec") or {}).get("command")
    if command and os.sep in command and not Path(command).is_absolute():  # kubectl: a bare name is a $PATH look-up
        body["exec"] = {**body["exec"], "command": str(base / command)}
    return {**entry, key: body}


class Credentials:
    """What the client sends as ``Authorization``: a static token, a token file, an exec plugin, or none.

    ``header()`` gives the current value; after a 401, ``header(stale=refused)`` gives a fresh one (the token
    file read anew, the plugin run anew) or the same when there is none to be had (the caller gives up).
    Raises ``ConfigError`` when a credential cannot be had at all.
    """

    async def header(self, *, stale: str | None = None) -> str | None:
        """The ``Authorization`` value to send (``None``: none); ``stale``: the one just refused with a 401."""
        return None

    async def bearer_token(self, *, refresh: bool) -> str | None:
        """The bearer token itself (kopf's login); ``refresh``: the last one was refused."""
        return None

    expiration: datetime | None = None


class StaticToken(Credentials):
    def __init__(self, value: str) -> None:
        self.value = value

    async def header(self, *, stale: str | None = None) -> str | None:
        return f"Bearer {self.value}"

    async def bearer_token(self, *, refresh: bool) -> str | None:
        return self.value


class BasicAuth(Credentials):
    def __init__(self, username: str, password: str) -> None:
        self.value = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    async def header(self, *, stale: str | None = None) -> str | None:
        return self.value


class TokenFile(Credentials):
    """A token file (the service account's, projected and rotated by the kubelet).

    Read at the first request, again after ``TOKEN_FILE_REREAD_SECONDS`` (client-go's period) and at once
    when the API answers 401: the kubelet rewrites the file well before the old token expires.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._value: str | None = None
        self._read_at = 0.0

    async def header(self, *, stale: str | None = None) -> str | None:
        now = time.monotonic()
        if self._value is None or stale is not None or now - self._read_at >= TOKEN_FILE_REREAD_SECONDS:
            self._value, self._read_at = _read_token(self.path), now
        return f"Bearer {self._value}"

    async def bearer_token(self, *, refresh: bool) -> str | None:
        return _read_token(self.path)


class ExecPlugin(Credentials):
    """Bearer tokens from a kubeconfig ``exec`` credential plugin, as client-go runs one.

    The plugin gets the process environment plus the kubeconfig's ``env`` and ``KUBERNETES_EXEC_INFO``, no
    stdin (never interactive) and ``EXEC_TIMEOUT_SECONDS``. Its token is cached until its
    ``expirationTimestamp`` (none: until the API answers 401); of many requests that need a new token at
    once, one runs the plugin and the others wait for it. Raises ``ConfigError`` when the plugin fails or
    answers without a token.
    """

    def __init__(self, spec: UserExec) -> None:
        if spec.apiVersion not in EXEC_API_VERSIONS:
            raise ConfigError(
                f"exec credential plugin apiVersion {spec.apiVersion!r} is not one of {EXEC_API_VERSIONS}"
            )
        self.spec = spec
        self.token: str | None = None
        self.expiration: datetime | None = None
        self._lock = asyncio.Lock()

    def _fresh(self) -> bool:
        return self.token is not None and (self.expiration is None or datetime.now(UTC) < self.expiration)

    async def get_token(self, *, stale: str | None = None) -> str:
        """The current token; runs the plugin when there is none, it expired, or it is ``stale`` (was refused)."""
        async with self._lock:
            if self._fresh() and (stale is None or self.token != stale):
                assert self.token is not None
                return self.token
            self.token, self.expiration = await self._run()
            return self.token

    async def _run(self) -> tuple[str, datetime | None]:
        env = dict(os.environ)
        env.update({item.name: item.value for item in self.spec.env or []})
        exec_info = {"apiVersion": self.spec.apiVersion, "kind": "ExecCredential", "spec": {"interactive": False}}
        env["KUBERNETES_EXEC_INFO"] = json.dumps(exec_info)
        command = [self.spec.command, *(self.spec.args or [])]
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as e:
            hint = f" ({self.spec.installHint.strip()})" if self.spec.installHint else ""
            raise ConfigError(f"exec credential plugin {self.spec.command!r} could not start: {e}{hint}") from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(), EXEC_TIMEOUT_SECONDS)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ConfigError(
                f"exec credential plugin {command[0]!r} gave no answer in {EXEC_TIMEOUT_SECONDS:g}s"
            ) from None
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip()[:500]
            raise ConfigError(f"exec credential plugin {command[0]!r} exited {proc.returncode}: {text}")
        try:
            status = json.loads(out)["status"]
            token = str(status["token"])
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"exec credential plugin {command[0]!r} printed no ExecCredential with status.token "
                "(client certificates from a plugin are not supported)"
            ) from e
        expiry = status.get("expirationTimestamp")
        return token, datetime.fromisoformat(expiry.replace("Z", "+00:00")) if expiry else None

    async def header(self, *, stale: str | None = None) -> str | None:
        refused = stale.removeprefix("Bearer ") if stale else None
        return f"Bearer {await self.get_token(stale=refused)}"

    async def bearer_token(self, *, refresh: bool) -> str | None:
        return await self.get_token(stale=self.token if refresh else None)


def credentials_for(user: User | None) -> Credentials:
    """``user``'s credentials, in lightkube's order: token file, token, exec plugin, basic auth, none.

    Raises ``ConfigError`` for what is not supported (the removed ``auth-provider`` plugins).
    """
    if user is None:
        return Credentials()
    if user.token_file is not None:
        return TokenFile(user.token_file)
    if user.token is not None:
        return StaticToken(user.token)
    if user.exec is not None:
        return ExecPlugin(user.exec)
    if user.username and user.password:
        return BasicAuth(user.username, user.password)
    if user.auth_provider:
        raise ConfigError("auth-provider credentials (removed in Kubernetes 1.26) are not supported: use exec")
    return Credentials()


def ssl_context(config: SingleConfig) -> ssl.SSLContext:
    """The TLS context of ``config`` (CA, client certificate), built by lightkube."""
    return verify_cluster(config.cluster, config.user or User(), config.abs_file, trust_env=False)


def _path(config: SingleConfig, path: str | None, *, unless: str | None) -> str | None:
    return str(config.abs_file(path)) if path and not unless else None


def _read_token(path: str) -> str:
    try:
        return Path(path).read_text().strip()  # a few hundred bytes, once a minute
    except OSError as e:
        raise ConfigError(f"token file {path}: {e}") from e


async def connection_info(
    config: SingleConfig, credentials: Credentials, *, trust_env: bool, refresh: bool
) -> kopf.ConnectionInfo:
    """kopf's login for ``config``: the same server, TLS material and identity as the operator's client.

    ``refresh``: kopf logs in again after the API refused its credentials (or they expired): read the token
    file anew and run the exec plugin anew rather than hand back what was refused.
    """
    cluster, user = config.cluster, config.user or User()
    token = await credentials.bearer_token(refresh=refresh)
    return kopf.ConnectionInfo(
        server=cluster.server,
        # Where a kubeconfig gives both a path and data, the data wins (as in kubectl and lightkube).
        ca_path=_path(config, cluster.certificate_auth, unless=cluster.certificate_auth_data),
        ca_data=cluster.certificate_auth_data,
        insecure=cluster.insecure or None,
        certificate_path=_path(config, user.client_cert, unless=user.client_cert_data),
        certificate_data=user.client_cert_data,
        private_key_path=_path(config, user.client_key, unless=user.client_key_data),
        private_key_data=user.client_key_data,
        username=user.username,
        password=user.password,
        token=token,
        default_namespace=config.context.namespace,
        trust_env=trust_env,
        expiration=credentials.expiration,
    )
