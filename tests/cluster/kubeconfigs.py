"""What a Kubernetes client keeps on disk, for the cluster tests: kubeconfig files, an exec credential
plugin and the user entry that runs it, Helm's (client-go's) discovery cache of a server.

Shared by the client tests (test_kube_client.py), the history server's and the RBAC tests.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml


def write_plugin(directory: Path, *, api_version: str = "client.authentication.k8s.io/v1beta1") -> Path:
    """An exec credential plugin: prints the token in $TOKEN_SOURCE (valid for $TOKEN_TTL s) and logs each run."""
    plugin = directory / "credential-plugin"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import datetime, json, os, pathlib\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['spec']['interactive'] is False, info\n"
        "with open(os.environ['PLUGIN_RUNS'], 'a') as runs:\n"
        "    runs.write(info['apiVersion'] + '\\n')\n"
        "status = {'token': pathlib.Path(os.environ['TOKEN_SOURCE']).read_text().strip()}\n"
        "if os.environ.get('TOKEN_TTL'):\n"
        "    ttl = datetime.timedelta(seconds=float(os.environ['TOKEN_TTL']))\n"
        "    expiry = datetime.datetime.now(datetime.UTC) + ttl\n"
        "    status['expirationTimestamp'] = expiry.strftime('%Y-%m-%dT%H:%M:%SZ')\n"
        f"print(json.dumps({{'apiVersion': {api_version!r}, 'kind': 'ExecCredential', 'status': status}}))\n"
    )
    plugin.chmod(0o755)
    return plugin


def kubeconfig_doc(server: str, user: dict[str, Any], *, name: str = "test", **cluster: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **cluster}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}],
        "current-context": name,
    }


def exec_user(plugin: Path, tmp: Path, *, ttl: float | None = None, api_version: str | None = None) -> dict[str, Any]:
    env = [{"name": "TOKEN_SOURCE", "value": str(tmp / "token")}, {"name": "PLUGIN_RUNS", "value": str(tmp / "runs")}]
    if ttl is not None:
        env.append({"name": "TOKEN_TTL", "value": str(ttl)})
    spec = {"apiVersion": api_version or "client.authentication.k8s.io/v1beta1", "command": str(plugin), "env": env}
    return {"exec": spec}


def write_yaml(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document))
    return path


def discovery_cache(url: str) -> Path:
    """Where Helm (client-go) caches discovery for a server, for 6 hours: keyed by host and port only.

    The library reads KUBECACHEDIR when it loads (so a test cannot point it elsewhere), and a port
    reused by a later emulator serving other resources would be answered from the stale cache.
    """
    root = Path(os.environ.get("KUBECACHEDIR") or Path.home() / ".kube" / "cache")
    host = url.removeprefix("http://").removeprefix("https://")
    return root / "discovery" / re.sub(r"[^(\w/.)]", "_", host)
