"""RBAC authorization of the emulated API server, opt-in (``ClusterEmulator.authorization``).

Off by default: every authenticated request is allowed, as before. When on, each request is
authorized as kube-apiserver's RBAC authorizer does it, against the RBAC objects stored in the
emulator (ClusterRole, ClusterRoleBinding, Role, RoleBinding, written by ``kubectl apply``, Helm
or the API):

- WHO: a bearer token maps to a user and groups (``ClusterEmulator.token_users``;
  ``service_account()`` builds a ServiceAccount's identity: user
  ``system:serviceaccount:<ns>:<name>``, groups ``system:serviceaccounts``,
  ``system:serviceaccounts:<ns>``, ``system:authenticated``). With authorization on, a token that
  maps to no user is refused with the real 401 (no authenticator knows it). kubesim's own
  kubeconfig token (``HARNESS_TOKEN``) is ``HARNESS_USER``, in ``system:masters`` (allowed
  everything, as kube-apiserver allows that group before RBAC). So is a request with no
  credentials, by default (``ClusterEmulator.anonymous_user``): kubectl sends no bearer token to
  an ``http://`` server, nor do the kubelet stand-in or ``EmulatedCluster.api()``, and they must
  stay all-powerful; set ``ANONYMOUS`` there for the real ``system:anonymous`` user.
- WHAT: the request's attributes as kube-apiserver's RequestInfo derives them: GET of one object
  is ``get``, of a collection ``list`` (``watch`` with ``?watch=true``; the legacy
  ``GET .../NAME?watch=true`` stays ``get``, as upstream), POST ``create``, PUT ``update``, PATCH
  ``patch`` (server-side apply too), DELETE of one ``delete``, of a collection
  ``deletecollection``; the resource with its subresource (``agentruns/status``, ``pods/log``,
  ``pods/binding``); a list or watch with ``fieldSelector=metadata.name=X`` has name X; a
  namespace's own requests (``/api/v1/namespaces/NAME``) are in namespace NAME.
- RULES: ClusterRoleBindings grant their ClusterRole everywhere; a RoleBinding grants its Role,
  or a ClusterRole, in its own namespace only. Subjects of kind User, Group and ServiceAccount
  (its namespace defaulting to the binding's). A rule matches on ``apiGroups``, ``resources``
  (``*``, ``agentruns/status``, ``*/status``), ``resourceNames`` (a request without a name, such
  as create or list, never matches a rule that names some) and ``verbs`` (``*``).
- A denial is the real 403 ``Forbidden`` Status: ``agentruns.agentrun.dev "x" is forbidden: User
  "..." cannot delete resource "agentruns" in API group "agentrun.dev" in the namespace
  "default"`` (``... at the cluster scope`` without a namespace; ``User "..." cannot get path
  "/x"`` for a non-resource URL), with RBAC's own reason appended when a matching binding names
  a role that does not exist (``: RBAC: clusterrole.rbac.authorization.k8s.io "x" not found``).
- Non-resource URLs (discovery, ``/version``, ``/openapi/...``, ``/healthz``): allowed as the
  default roles ``system:discovery`` (every authenticated user) and ``system:public-info-viewer``
  (everyone) allow them, plus whatever ``nonResourceURLs`` rules stored ClusterRoles grant
  through ClusterRoleBindings.

Left out: the default ClusterRoles and bindings themselves (``cluster-admin``, ``view``, ``edit``,
``admin``, ``system:basic-user``, ...; none is seeded), aggregated ClusterRoles
(``aggregationRule``: an aggregated role's own ``rules`` are used as stored, nothing fills them),
the Node authorizer, impersonation, escalation checks on writing roles and bindings (``escalate``,
``bind``), and the OwnerReferencesPermissionEnforcement admission plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kubesim.apierrors import ApiError

HARNESS_TOKEN = "emulated"  # what kubesim's own kubeconfig (cluster.write_kubeconfig) carries
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
RBAC_GROUP = "rbac.authorization.k8s.io"


class User(NamedTuple):
    """An authenticated identity: a user name and its groups."""

    name: str
    groups: tuple[str, ...]


HARNESS_USER = User("kubesim-admin", (MASTERS, AUTHENTICATED))
ANONYMOUS = User("system:anonymous", (UNAUTHENTICATED,))

# What the default roles system:discovery (bound to system:authenticated) and
# system:public-info-viewer (bound to both) allow, with verb get.
PUBLIC_INFO_URLS = ("/healthz", "/livez", "/readyz", "/version", "/version/")
DISCOVERY_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", *PUBLIC_INFO_URLS)

# The stored RBAC objects of one plural ("clusterroles", ...), in one namespace or all (None).
Objects = Callable[[str, "str | None"], list[dict[str, Any]]]


def service_account(namespace: str, name: str) -> User:
    """The identity a ServiceAccount's token authenticates as."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
    )


@dataclass(frozen=True)
class Attributes:
    """What a request asks, as kube-apiserver's RequestInfo derives it."""

    verb: str
    path: str
    resource_request: bool = False
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def resource_verb(method: str, *, named: bool, watch: bool) -> str:
    """The RBAC verb of an HTTP method on a resource path (``watch`` only counts on a collection)."""
    method = method.upper()
    if method in ("GET", "HEAD"):
        return "get" if named else "watch" if watch else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def name_from_field_selector(selector: str | None) -> str:
    """``metadata.name=X`` (or ``==``) in a list's field selector names the object, as upstream."""
    for term in (selector or "").split(","):
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        if sep and not key.endswith("!") and key.strip() == "metadata.name":
            return value.strip()
    return ""


def check(objects: Objects, user: User, attrs: Attributes) -> ApiError | None:
    """None when ``user`` may do ``attrs``; else the 403 the real server answers."""
    if MASTERS in user.groups:
        return None
    if not attrs.resource_request and _default_non_resource(user, attrs):
        return None
    errors: list[str] = []
    for rules in _rules_for(objects, user, attrs.namespace, errors):
        if any(_allows(rule, attrs) for rule in rules):
            return None
    reason = ""
    if errors:
        unique = list(dict.fromkeys(errors))
        reason = "RBAC: " + (unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]")
    return forbidden(user, attrs, reason)


def forbidden(user: User, attrs: Attributes, reason: str = "") -> ApiError:
    """kube-apiserver's ``responsewriters.Forbidden``: ``apierrors.NewForbidden`` of its message."""
    if not attrs.resource_request:
        message = f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
        return ApiError(status=403, reason="Forbidden", message=message + (f": {reason}" if reason else ""), details={})
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    why = f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {scope}'
    if reason:
        why += f": {reason}"
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    subject = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    details = {"name": attrs.name, "group": attrs.group, "kind": attrs.resource}
    return ApiError(
        status=403,
        reason="Forbidden",
        message=f"{subject} is forbidden: {why}",
        details={k: v for k, v in details.items() if v},  # empty fields are omitted (omitempty)
    )


# --- evaluation ------------------------------------------------------------------------------------


def _default_non_resource(user: User, attrs: Attributes) -> bool:
    if attrs.verb != "get":
        return False
    urls = DISCOVERY_URLS if AUTHENTICATED in user.groups else PUBLIC_INFO_URLS
    return any(_url_matches(url, attrs.path) for url in urls)


def _rules_for(objects: Objects, user: User, namespace: str, errors: list[str]) -> Iterable[list[dict[str, Any]]]:
    """The rules of every binding that applies to ``user`` (cluster-wide, then in ``namespace``).

    A binding whose role is missing adds RBAC's error to ``errors`` (the reason of a denial).
    """
    for binding in objects("clusterrolebindings", None):
        if _applies(binding, user, ""):
            yield _role_rules(objects, binding.get("roleRef") or {}, "", errors)
    if not namespace:
        return
    for binding in objects("rolebindings", namespace):
        if _applies(binding, user, namespace):
            yield _role_rules(objects, binding.get("roleRef") or {}, namespace, errors)


def _applies(binding: dict[str, Any], user: User, namespace: str) -> bool:
    for subject in binding.get("subjects") or []:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == user.name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount":
            account_namespace = subject.get("namespace") or namespace
            if user.name == f"system:serviceaccount:{account_namespace}:{name}":
                return True
    return False


def _role_rules(objects: Objects, ref: dict[str, Any], namespace: str, errors: list[str]) -> list[dict[str, Any]]:
    kind, name = ref.get("kind"), ref.get("name")
    if kind == "ClusterRole":
        found = [r for r in objects("clusterroles", None) if r["metadata"]["name"] == name]
    elif kind == "Role":
        found = [r for r in objects("roles", namespace) if r["metadata"]["name"] == name] if namespace else []
    else:
        errors.append(f'unsupported role reference kind: "{kind}"')
        return []
    if not found:  # the lister's NotFound, with the singular resource name
        errors.append(f'{str(kind).lower()}.{RBAC_GROUP} "{name}" not found')
        return []
    return list(found[0].get("rules") or [])


def _allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        return any(_url_matches(url, attrs.path) for url in rule.get("nonResourceURLs") or [])
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.group not in groups:
        return False
    if not _resource_matches(rule.get("resources") or [], attrs.resource, attrs.subresource):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _resource_matches(resources: list[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for entry in resources:
        if entry in ("*", combined):
            return True
        if subresource and entry == f"*/{subresource}":
            return True
    return False


def _url_matches(pattern: str, path: str) -> bool:
    """A ``nonResourceURLs`` entry: exact, ``*``, or a prefix ending in ``*``."""
    return pattern in ("*", path) or (pattern.endswith("*") and path.startswith(pattern[:-1]))
