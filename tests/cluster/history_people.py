"""People for the history server's cluster tests: token identities bound to the chart's own user ClusterRoles.

On kubesim, static tokens mapped to users (``token_users``) with its RBAC authorizer on; on the real
kube-apiserver, ServiceAccounts with tokens from the TokenRequest API under its RBAC authorizer. Either
way the history server gets nothing but what each person's token may do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import yaml

from kubesim import EmulatedCluster
from kubesim.rbac import AUTHENTICATED, User

CHART = Path(__file__).resolve().parents[2] / "helm" / "agentrun"
TOKENS = {"alice": "alice-token-7f3a", "bob": "bob-token-19c2"}


def user_roles() -> list[dict[str, Any]]:
    """The chart's ClusterRoles for people (agentrun-view, agentrun-edit), as helm renders them."""
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values={}, name="agentrun", namespace="agentrun-system")
    text = next(t for path, t in rendered.items() if path.endswith("templates/userroles.yaml"))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def binding(namespace: str, subject: dict[str, str], role: str) -> dict[str, Any]:
    """A RoleBinding of ``subject`` to the ClusterRole ``role`` in ``namespace``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{subject['name']}-{role}", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject],
    }


def real_users(cluster: Any, namespace: str) -> dict[str, str]:
    """On the real API server: alice and bob are ServiceAccounts with tokens from the TokenRequest API."""
    tokens = {}
    for name in TOKENS:
        made = cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
        assert made.returncode == 0 or "already exists" in made.stderr or "AlreadyExists" in made.stderr, made.stderr
        token = cluster.kubectl("create", "token", name, "-n", namespace, "--duration=1h")
        assert token.returncode == 0, token.stderr
        tokens[name] = token.stdout.strip()
    return tokens


def people(cluster: Any, namespace: str, grants: list[tuple[str, str, str]]) -> dict[str, str]:
    """alice's and bob's tokens, with RBAC enforced and ``grants`` (person, namespace, ClusterRole) bound.

    Their ServiceAccounts (on the real server) live in ``namespace``."""
    real = not isinstance(cluster, EmulatedCluster)
    if real:
        tokens = real_users(cluster, namespace)
        subjects = {name: {"kind": "ServiceAccount", "name": name, "namespace": namespace} for name in TOKENS}
    else:
        tokens = dict(TOKENS)
        subjects = {name: {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name} for name in TOKENS}
    rbac = [*user_roles(), *(binding(ns, subjects[person], role) for person, ns, role in grants)]
    applied = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(rbac))
    assert applied.returncode == 0, applied.stderr
    if not real:

        def enforce() -> None:
            assert cluster.emulator is not None
            cluster.emulator.token_users = {tokens[name]: User(name, (AUTHENTICATED,)) for name in TOKENS}
            cluster.emulator.authorization = True

        cluster.call(enforce)
    return tokens
