"""Opt-in RBAC authorization of the emulated API server (``ClusterEmulator.authorization``, ``kubesim.rbac``).

The RBAC objects are written through the API by the harness (a request without credentials, kubesim's
admin by default); the requests under test carry a bearer token mapped to a user in ``token_users``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from kubesim import EmulatedCluster
from kubesim.rbac import ANONYMOUS, HARNESS_TOKEN, service_account

RBAC = "/apis/rbac.authorization.k8s.io/v1"
WIDGETS = "/apis/kubesim.dev/v1/namespaces/{ns}/widgets"
ALICE = ("alice", ("devs", "system:authenticated"))
ROBOT = service_account("team", "robot")
TOKENS = {"alice-token": ALICE, "robot-token": ROBOT}


def call(
    cluster: EmulatedCluster,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = "alice-token",
    params: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """One request as the user of ``token`` (None: no credentials); (status, decoded body)."""
    url = cluster.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        with e:
            text, status = e.read(), e.code
    try:
        return status, json.loads(text or b"null")
    except ValueError:
        return status, text.decode()  # a watch stream: JSON lines


def authorize(cluster: EmulatedCluster, on: bool = True, **settings: Any) -> None:
    def apply() -> None:
        assert cluster.emulator is not None
        cluster.emulator.authorization = on
        cluster.emulator.token_users = dict(TOKENS)
        for name, value in settings.items():
            setattr(cluster.emulator, name, value)

    cluster.call(apply)


def create(cluster: EmulatedCluster, path: str, body: dict[str, Any]) -> None:
    made = cluster.api("POST", path, body)  # as the harness (no credentials: the admin)
    assert made.status == 201, made


def namespace(cluster: EmulatedCluster, name: str) -> None:
    create(cluster, "/api/v1/namespaces", {"metadata": {"name": name}})


def widget(cluster: EmulatedCluster, name: str, ns: str = "default") -> None:
    create(cluster, WIDGETS.format(ns=ns), {"metadata": {"name": name}, "spec": {"owner": "me"}})


def rule(resources: list[str], verbs: list[str], group: str = "kubesim.dev", **extra: Any) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs, **extra}


def cluster_role(cluster: EmulatedCluster, name: str, *rules: dict[str, Any]) -> None:
    create(cluster, f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": list(rules)})


def role(cluster: EmulatedCluster, ns: str, name: str, *rules: dict[str, Any]) -> None:
    create(cluster, f"{RBAC}/namespaces/{ns}/roles", {"metadata": {"name": name}, "rules": list(rules)})


def subject(kind: str, name: str, ns: str | None = None) -> dict[str, Any]:
    if kind == "ServiceAccount":
        return {"kind": kind, "name": name, **({"namespace": ns} if ns else {})}
    return {"kind": kind, "name": name, "apiGroup": "rbac.authorization.k8s.io"}


def bind(
    cluster: EmulatedCluster,
    name: str,
    role_kind: str,
    role_name: str,
    *subjects: dict[str, Any],
    ns: str | None = None,
) -> None:
    """A RoleBinding in ``ns``, or a ClusterRoleBinding without it."""
    body = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": list(subjects) or [subject("User", "alice")],
    }
    create(cluster, f"{RBAC}/namespaces/{ns}/rolebindings" if ns else f"{RBAC}/clusterrolebindings", body)


def forbidden(message: str, kind: str, name: str | None = None, group: str | None = None) -> dict[str, Any]:
    details = {k: v for k, v in {"name": name, "group": group, "kind": kind}.items() if v}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": details,
        "code": 403,
    }


def test_off_by_default_every_request_is_allowed(cluster: EmulatedCluster) -> None:
    widget(cluster, "w")
    cluster_role(cluster, "nothing")
    bind(cluster, "nothing", "ClusterRole", "nothing")
    assert call(cluster, "GET", WIDGETS.format(ns="default") + "/w")[0] == 200
    assert call(cluster, "DELETE", WIDGETS.format(ns="default") + "/w", token="any-token")[0] == 200
    authorize(cluster, on=False)  # token_users set, authorization still off
    assert call(cluster, "GET", "/api/v1/pods", token="robot-token")[0] == 200


def test_each_verb_is_allowed_only_when_a_rule_grants_it(cluster: EmulatedCluster) -> None:
    widgets = WIDGETS.format(ns="default")
    widget(cluster, "w")
    cluster_role(cluster, "widget-reader", rule(["widgets"], ["get", "list", "watch"]))
    bind(cluster, "alice-reads", "ClusterRole", "widget-reader")
    authorize(cluster)
    assert call(cluster, "GET", f"{widgets}/w")[0] == 200
    assert call(cluster, "GET", widgets)[1]["kind"] == "WidgetList"
    status, stream = call(cluster, "GET", widgets, params={"watch": "true", "timeoutSeconds": "1"})
    assert status == 200 and '"ADDED"' in json.dumps(stream)
    user = 'User "alice"'
    in_default = 'in API group "kubesim.dev" in the namespace "default"'
    denied = {
        ("POST", widgets): ("create", None),
        ("PUT", f"{widgets}/w"): ("update", "w"),
        ("PATCH", f"{widgets}/w"): ("patch", "w"),
        ("DELETE", f"{widgets}/w"): ("delete", "w"),
        ("DELETE", widgets): ("deletecollection", None),
    }
    for (method, path), (verb, name) in denied.items():
        body = {"metadata": {"name": "w2"}, "spec": {"owner": "me"}} if method in ("POST", "PUT") else {}
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        subject_text = f'widgets.kubesim.dev "{name}"' if name else "widgets.kubesim.dev"
        message = f'{subject_text} is forbidden: {user} cannot {verb} resource "widgets" {in_default}'
        assert call(cluster, method, path, body, content_type=content) == (
            403,
            forbidden(message, "widgets", name, "kubesim.dev"),
        ), verb
    assert cluster.get("widgets", "w") is not None, "a denied request must change nothing"
    cluster_role(cluster, "widget-deleter", rule(["widgets"], ["delete"]))
    bind(cluster, "alice-deletes", "ClusterRole", "widget-deleter")
    assert call(cluster, "DELETE", f"{widgets}/w")[0] == 200
    assert call(cluster, "DELETE", widgets)[0] == 403, "delete does not grant deletecollection"


def test_a_wildcard_rule_grants_every_verb_group_and_resource(cluster: EmulatedCluster) -> None:
    cluster_role(cluster, "all", rule(["*"], ["*"], group="*"))
    bind(cluster, "alice-all", "ClusterRole", "all")
    authorize(cluster)
    assert call(cluster, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "c"}})[0] == 201
    assert call(cluster, "DELETE", "/api/v1/namespaces/default/configmaps")[0] == 200
    assert call(cluster, "GET", "/api/v1/nodes")[0] == 200
    assert call(cluster, "GET", "/api/v1/nodes", token="robot-token")[0] == 403, "bound to alice only"


def test_a_watch_needs_the_watch_verb(cluster: EmulatedCluster) -> None:
    cluster_role(cluster, "lister", rule(["pods"], ["list"], group=""))
    bind(cluster, "alice-lists", "ClusterRole", "lister")
    authorize(cluster)
    assert call(cluster, "GET", "/api/v1/namespaces/default/pods")[0] == 200
    message = 'pods is forbidden: User "alice" cannot watch resource "pods" in API group "" at the cluster scope'
    assert call(cluster, "GET", "/api/v1/pods", params={"watch": "1"}) == (403, forbidden(message, "pods"))


def test_a_subresource_is_its_own_resource(cluster: EmulatedCluster) -> None:
    widgets = WIDGETS.format(ns="default")
    widget(cluster, "w")
    cluster_role(cluster, "status-writer", rule(["widgets/status"], ["patch"]))
    bind(cluster, "alice-status", "ClusterRole", "status-writer")
    authorize(cluster)
    patch = {"status": {"phase": "Running"}}
    merge = "application/merge-patch+json"
    assert call(cluster, "PATCH", f"{widgets}/w/status", patch, content_type=merge)[0] == 200
    message = (
        'widgets.kubesim.dev "w" is forbidden: User "alice" cannot patch resource "widgets" '
        'in API group "kubesim.dev" in the namespace "default"'
    )
    assert call(cluster, "PATCH", f"{widgets}/w", patch, content_type=merge) == (
        403,
        forbidden(message, "widgets", "w", "kubesim.dev"),
    )
    message = (
        'widgets.kubesim.dev "w" is forbidden: User "alice" cannot update resource "widgets/status" '
        'in API group "kubesim.dev" in the namespace "default"'
    )
    assert call(cluster, "PUT", f"{widgets}/w/status", {}) == (403, forbidden(message, "widgets", "w", "kubesim.dev"))
    assert call(cluster, "GET", f"{widgets}/w")[0] == 403, "widgets/status grants nothing on widgets"
    cluster_role(cluster, "any-status", rule(["*/status"], ["get"]))
    bind(cluster, "alice-any-status", "ClusterRole", "any-status")
    assert call(cluster, "GET", f"{widgets}/w/status")[0] == 200
    assert call(cluster, "GET", f"{widgets}/w")[0] == 403


def test_role_and_rolebinding_grant_in_their_namespace_only(cluster: EmulatedCluster) -> None:
    namespace(cluster, "team")
    widget(cluster, "w", "team")
    widget(cluster, "w", "default")
    role(cluster, "team", "reader", rule(["widgets"], ["get", "list"]))
    bind(cluster, "alice-reads", "Role", "reader", ns="team")
    authorize(cluster)
    assert call(cluster, "GET", WIDGETS.format(ns="team") + "/w")[0] == 200
    assert call(cluster, "GET", WIDGETS.format(ns="team"))[0] == 200
    message = (
        'widgets.kubesim.dev "w" is forbidden: User "alice" cannot get resource "widgets" '
        'in API group "kubesim.dev" in the namespace "default"'
    )
    assert call(cluster, "GET", WIDGETS.format(ns="default") + "/w") == (
        403,
        forbidden(message, "widgets", "w", "kubesim.dev"),
    )
    message = (
        'widgets.kubesim.dev is forbidden: User "alice" cannot list resource "widgets" '
        'in API group "kubesim.dev" at the cluster scope'
    )
    assert call(cluster, "GET", "/apis/kubesim.dev/v1/widgets") == (
        403,
        forbidden(message, "widgets", None, "kubesim.dev"),
    )


def test_a_clusterrole_bound_by_a_rolebinding_grants_in_that_namespace_only(cluster: EmulatedCluster) -> None:
    namespace(cluster, "team")
    cluster_role(cluster, "pod-reader", rule(["pods"], ["list"], group=""))
    bind(cluster, "alice-pods", "ClusterRole", "pod-reader", ns="team")
    authorize(cluster)
    assert call(cluster, "GET", "/api/v1/namespaces/team/pods")[0] == 200
    assert call(cluster, "GET", "/api/v1/namespaces/default/pods")[0] == 403
    assert call(cluster, "GET", "/api/v1/pods")[0] == 403
    bind(cluster, "alice-pods", "ClusterRole", "pod-reader")  # now cluster-wide
    assert call(cluster, "GET", "/api/v1/namespaces/default/pods")[0] == 200
    assert call(cluster, "GET", "/api/v1/pods")[0] == 200


def test_resource_names_narrow_a_rule_to_named_objects(cluster: EmulatedCluster) -> None:
    widgets = WIDGETS.format(ns="default")
    widget(cluster, "mine")
    widget(cluster, "theirs")
    cluster_role(cluster, "mine-only", rule(["widgets"], ["get", "list", "delete"], resourceNames=["mine"]))
    bind(cluster, "alice-mine", "ClusterRole", "mine-only")
    authorize(cluster)
    assert call(cluster, "GET", f"{widgets}/mine")[0] == 200
    assert call(cluster, "GET", f"{widgets}/theirs")[0] == 403
    assert call(cluster, "GET", widgets)[0] == 403, "a list names no object"
    listed = call(cluster, "GET", widgets, params={"fieldSelector": "metadata.name=mine"})
    assert listed[0] == 200 and [w["metadata"]["name"] for w in listed[1]["items"]] == ["mine"]
    assert call(cluster, "GET", widgets, params={"fieldSelector": "metadata.name=theirs"})[0] == 403
    assert call(cluster, "DELETE", f"{widgets}/theirs")[0] == 403
    assert call(cluster, "DELETE", f"{widgets}/mine")[0] == 200


def test_service_account_and_group_subjects(cluster: EmulatedCluster) -> None:
    namespace(cluster, "team")
    cluster_role(cluster, "secret-reader", rule(["secrets"], ["list"], group=""))
    bind(cluster, "robot", "ClusterRole", "secret-reader", subject("ServiceAccount", "robot", "team"))
    authorize(cluster)
    assert call(cluster, "GET", "/api/v1/secrets", token="robot-token")[0] == 200
    message = (
        'secrets is forbidden: User "system:serviceaccount:team:robot" cannot list resource "secrets" '
        'in API group "" in the namespace "default"'
    )
    assert call(cluster, "GET", "/api/v1/namespaces/default/configmaps", token="robot-token")[0] == 403
    assert call(cluster, "GET", "/api/v1/namespaces/default/secrets", token="alice-token")[0] == 403
    # A ServiceAccount subject without a namespace is in the RoleBinding's.
    cluster_role(cluster, "cm-reader", rule(["configmaps"], ["list"], group=""))
    bind(cluster, "robot-cm", "ClusterRole", "cm-reader", subject("ServiceAccount", "robot"), ns="team")
    assert call(cluster, "GET", "/api/v1/namespaces/team/configmaps", token="robot-token")[0] == 200
    bind(cluster, "all-sas", "ClusterRole", "cm-reader", subject("Group", "system:serviceaccounts:team"))
    assert call(cluster, "GET", "/api/v1/configmaps", token="robot-token")[0] == 200
    assert call(cluster, "GET", "/api/v1/namespaces/default/secrets", token="robot-token")[0] == 200
    assert call(cluster, "GET", "/api/v1/namespaces/default/pods", token="robot-token") == (
        403,
        forbidden(message.replace("secrets", "pods"), "pods"),
    )


def test_a_missing_role_is_named_in_the_denial(cluster: EmulatedCluster) -> None:
    bind(cluster, "dangling", "ClusterRole", "not-there")
    authorize(cluster)
    message = (
        'pods "p" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace '
        '"default": RBAC: clusterrole.rbac.authorization.k8s.io "not-there" not found'
    )
    assert call(cluster, "GET", "/api/v1/namespaces/default/pods/p") == (403, forbidden(message, "pods", "p"))


def test_a_namespace_is_in_itself(cluster: EmulatedCluster) -> None:
    namespace(cluster, "team")
    role(cluster, "team", "ns-reader", rule(["namespaces"], ["get"], group=""))
    bind(cluster, "alice-ns", "Role", "ns-reader", ns="team")
    authorize(cluster)
    assert call(cluster, "GET", "/api/v1/namespaces/team")[0] == 200
    message = (
        'namespaces "default" is forbidden: User "alice" cannot get resource "namespaces" in API group "" '
        'in the namespace "default"'
    )
    assert call(cluster, "GET", "/api/v1/namespaces/default") == (403, forbidden(message, "namespaces", "default"))


def test_who_is_allowed_everything_and_who_is_refused(cluster: EmulatedCluster) -> None:
    authorize(cluster)
    assert call(cluster, "DELETE", "/api/v1/namespaces/default/pods", token=HARNESS_TOKEN)[0] == 200
    assert call(cluster, "GET", "/api/v1/pods", token=None)[0] == 200, "no credentials: the harness's admin"
    shown = cluster.kubectl("get", "pods", "-A")  # kubectl sends no token over http://
    assert shown.returncode == 0, shown.stderr
    unknown = call(cluster, "GET", "/api/v1/pods", token="nobody-knows-it")
    assert unknown[0] == 401 and unknown[1]["reason"] == "Unauthorized"
    authorize(cluster, anonymous_user=ANONYMOUS)
    message = (
        'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" at the cluster scope'
    )
    assert call(cluster, "GET", "/api/v1/pods", token=None) == (403, forbidden(message, "pods"))


@pytest.mark.parametrize("path", ["/api", "/apis", "/api/v1", "/apis/kubesim.dev/v1", "/version", "/openapi/v3"])
def test_discovery_is_allowed_to_every_authenticated_user(cluster: EmulatedCluster, path: str) -> None:
    authorize(cluster, anonymous_user=ANONYMOUS)
    assert call(cluster, "GET", path)[0] == 200
    if path == "/version":
        assert call(cluster, "GET", path, token=None)[0] == 200, "system:public-info-viewer: everyone"
    else:
        denied = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'forbidden: User "system:anonymous" cannot get path "{path}"',
            "reason": "Forbidden",
            "details": {},
            "code": 403,
        }
        assert call(cluster, "GET", path, token=None) == (403, denied)
