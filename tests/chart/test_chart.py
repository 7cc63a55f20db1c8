"""The Helm chart helm/agentrun, through real Helm: lint, render, validate, RBAC, security, schema."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from agentrun_operator.decide.podspec import MANAGED_BY, RunRef, build_pod
from agentrun_operator.decide.spec import AgentRunSpec
from agentrun_operator.settings import OperatorSettings
from tests.chart.conftest import (
    CHART,
    COMBINATIONS,
    NAMESPACE,
    RELEASE,
    ROOT,
    Rendering,
    pod_templates,
    rendering,
    restricted_violations,
)

pytestmark = pytest.mark.chart

# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schemas we have.
KUBERNETES_VERSIONS = ("1.29", "1.37")
# Kinds from other projects' CRDs: kubernetes-validate has no schema for them.
FOREIGN_KINDS = {"ServiceMonitor", "PodMonitor"}
OPERATOR = f"{RELEASE}-operator"

# The operator's rules on namespaced resources, each from a call in its code (the reasons are
# in templates/_helpers.tpl and deploy/README.md). A wider grant must change this on purpose.
NAMESPACED_GRANTS = {
    # kopf: watch (no finalizer, no annotations); the reconciler: get; spec.ttlSecondsAfterFinished: delete.
    *{("agentrun.dev", "agentruns", v) for v in ("get", "list", "watch", "delete")},
    ("agentrun.dev", "agentruns/status", "patch"),  # the only writer of status, merge patches
    ("agentrun.dev", "agentruns/finalizers", "update"),  # blockOwnerDeletion on runner pods
    *{("", "pods", v) for v in ("get", "list", "watch", "create", "delete")},
    # the Secrets a run names: read once by name, then followed by a watch (io/caches.py)
    *{("", "secrets", v) for v in ("get", "list", "watch")},
    ("", "events", "create"),  # one Event per phase transition
}
# kopf's observation of the CRD itself: cluster-wide mode only (a Role cannot grant it).
CRD_GRANTS = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def operator_container(r: Rendering) -> dict[str, Any]:
    pod = r.find("Deployment", OPERATOR)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def operator_env(r: Rendering) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in operator_container(r)["env"]}


def settings_from(r: Rendering, monkeypatch: pytest.MonkeyPatch) -> OperatorSettings:
    """The OperatorSettings the operator would read from the rendered Deployment's environment."""
    downward = {"AGENTRUN_OPERATOR_LEASE_NAMESPACE": NAMESPACE, "AGENTRUN_OPERATOR_IDENTITY": f"{OPERATOR}-x1"}
    for name, var in operator_env(r).items():
        monkeypatch.setenv(name, var["value"] if "value" in var else downward[name])
    return OperatorSettings()


def load_render_script() -> ModuleType:
    path = ROOT / "hack" / "render_manifests.py"
    spec = importlib.util.spec_from_file_location("render_manifests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("render_manifests", module)
    spec.loader.exec_module(module)
    return module


# -- Helm itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_helm_lint_is_clean(name: str) -> None:
    """`helm lint --strict` (warnings are errors) with each combination of values."""
    report = helm_python.lint(CHART, COMBINATIONS[name], strict=True, namespace=NAMESPACE, kube_version="v1.29.0")
    assert report["errors"] == [], report
    # Severity 1 is informational ("icon is recommended"); 2 warning, 3 error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_the_chart_crd_is_the_repository_crd_byte_for_byte(chart: helm_python.Chart) -> None:
    """One CRD: helm/agentrun/crds/ holds crds/'s file itself (a symlink), not a drifting copy."""
    source = ROOT / "crds" / "agentrun.dev_agentruns.yaml"
    shipped = CHART / "crds" / "agentrun.dev_agentruns.yaml"
    assert shipped.read_bytes() == source.read_bytes(), "helm/agentrun/crds/ differs from crds/: re-link it"
    assert [Path(c["filename"]).name for c in chart.crds] == [source.name], "the chart ships exactly this CRD"
    assert chart.crds[0]["data"] == source.read_text(), "what Helm loads is crds/'s file"


def test_deploy_manifests_are_the_chart_rendering() -> None:
    """deploy/*.yaml is generated (make deploy-manifests): it must not drift from the chart."""
    script = load_render_script()
    for path, text in script.expected().items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `make deploy-manifests`"


def test_deploy_operator_yaml_holds_the_default_rendering_and_its_namespace() -> None:
    objects = [d for d in yaml.safe_load_all((ROOT / "deploy" / "operator.yaml").read_text()) if d]
    default = rendering("default").objects
    assert [o["kind"] for o in objects].count("Namespace") == 1
    assert sorted(map(repr, [o for o in objects if o["kind"] != "Namespace"])) == sorted(map(repr, default))
    namespace = next(o for o in objects if o["kind"] == "Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# -- every object ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(each: Rendering, version: str) -> None:
    """Strict schema validation (no unknown fields). ServiceMonitor and PodMonitor come from the
    Prometheus Operator's CRDs, which kubernetes-validate has no schema for: they are checked
    field by field in test_monitors_* instead."""
    checked = 0
    for obj in each.objects:
        if obj["kind"] in FOREIGN_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{each.name}: {obj['kind']}/{obj['metadata']['name']} is invalid for {version}: {e}")
        checked += 1
    assert checked >= 8


def test_every_object_carries_the_recommended_labels(each: Rendering) -> None:
    for obj in each.objects:
        labels = obj["metadata"].get("labels") or {}
        where = f"{each.name}: {obj['kind']}/{obj['metadata']['name']}"
        assert {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/part-of"} <= set(labels), (
            where
        )
        assert labels["app.kubernetes.io/part-of"] == "agentrun" and labels["helm.sh/chart"] == "agentrun-0.1.0", where
        # The operator watches pods by app.kubernetes.io/managed-by=agentrun-operator.
        assert "app.kubernetes.io/managed-by" not in labels, where


def test_namespaced_objects_live_where_they_should(each: Rendering) -> None:
    allowed = {NAMESPACE, *each.values.get("watchNamespaces", [])}
    allowed |= set((each.values.get("devStore") or {}).get("secretNamespaces", ["default"]))
    for obj in each.objects:
        if obj["kind"] in {"ClusterRole", "ClusterRoleBinding"}:
            assert "namespace" not in obj["metadata"]
        else:
            assert obj["metadata"].get("namespace") in allowed, f"{obj['kind']}/{obj['metadata']['name']}"


# -- RBAC --------------------------------------------------------------------------------------


def test_cluster_wide_rbac_is_exactly_what_the_operator_calls() -> None:
    r = rendering("default")
    role = r.find("ClusterRole", OPERATOR)
    assert not any("resourceNames" in rule for rule in role["rules"])
    assert grants(role["rules"]) == NAMESPACED_GRANTS | CRD_GRANTS, (
        "the operator's ClusterRole changed: widen it only for a call the code makes"
    )
    binding = r.find("ClusterRoleBinding", OPERATOR)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
    assert "AGENTRUN_OPERATOR_NAMESPACES" not in operator_env(r), "cluster-wide RBAC: the operator watches all"


@pytest.mark.parametrize("name", ["namespaced", "everything"])
def test_watch_namespaces_grants_roles_there_and_nothing_cluster_wide(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = rendering(name)
    namespaces = COMBINATIONS[name]["watchNamespaces"]
    # The user roles (aggregated into view/edit/admin) grant nothing by themselves; the operator gets nothing
    # cluster-wide.
    assert [o["metadata"]["name"] for o in r.all("ClusterRole")] == USER_ROLES
    assert not r.all("ClusterRoleBinding"), "no cluster-wide grant when namespaced"
    for namespace in namespaces:
        role = r.find("Role", OPERATOR, namespace)
        assert grants(role["rules"]) == NAMESPACED_GRANTS, f"Role in {namespace}"
        binding = r.find("RoleBinding", OPERATOR, namespace)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
    granted = {o["metadata"]["namespace"] for o in r.all("Role") if o["metadata"]["name"] == OPERATOR}
    assert granted == set(namespaces)
    # The operator serves exactly the namespaces it was granted, through its own setting.
    assert settings_from(r, monkeypatch).namespaces == namespaces


@pytest.mark.parametrize("name", ["default", "namespaced"])
def test_leader_election_rbac_is_one_lease_in_the_release_namespace(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = rendering(name)
    role = r.find("Role", f"{OPERATOR}-leader-election", NAMESPACE)
    settings = settings_from(r, monkeypatch)
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [settings.lease_name],
            "verbs": ["get", "update"],
        },
    ]
    assert settings.lease_name == OperatorSettings.model_fields["lease_name"].default == OPERATOR
    assert settings.lease_namespace == NAMESPACE and settings.leader_election
    binding = r.find("RoleBinding", f"{OPERATOR}-leader-election", NAMESPACE)
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]


USER_ROLES = [f"{RELEASE}-view", f"{RELEASE}-edit"]
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


@pytest.mark.parametrize("name", ["default", "namespaced"])
def test_user_roles_fold_agentruns_into_view_edit_and_admin(name: str) -> None:
    r = rendering(name)
    view, edit = (r.find("ClusterRole", role) for role in USER_ROLES)
    aggregated = {
        role: {
            k.removeprefix(AGGREGATE)
            for k, v in o["metadata"]["labels"].items()
            if k.startswith(AGGREGATE) and v == "true"
        }
        for role, o in zip(USER_ROLES, (view, edit), strict=True)
    }
    assert aggregated == {USER_ROLES[0]: {"view", "edit", "admin"}, USER_ROLES[1]: {"edit", "admin"}}
    # view: what `kubectl get ar` and `kubectl agentrun list|describe|logs|watch` read (pods, pods/log and events
    # come with the built-in view role); edit: what apply, delete and `kubectl agentrun approve|reject|stop` write.
    assert grants(view["rules"]) == {
        ("agentrun.dev", resource, verb)
        for resource in ("agentruns", "agentruns/status")
        for verb in ("get", "list", "watch")
    }
    assert grants(edit["rules"]) == {
        ("agentrun.dev", "agentruns", verb) for verb in ("create", "update", "patch", "delete", "deletecollection")
    }, "status stays the operator's: no user role writes agentruns/status"


def test_user_roles_can_be_left_out(chart: helm_python.Chart) -> None:
    rendered = chart.render(values={"rbac": {"aggregateToDefaultRoles": False}}, name=RELEASE, namespace=NAMESPACE)
    assert not any(path.endswith("userroles.yaml") and text.strip() for path, text in rendered.items())


def test_rbac_create_false_renders_no_rbac(chart: helm_python.Chart) -> None:
    rendered = chart.render(values={"rbac": {"create": False}}, name=RELEASE, namespace=NAMESPACE)
    manifests = [text for path, text in rendered.items() if path.endswith(".yaml")]
    kinds = {d["kind"] for text in manifests for d in yaml.safe_load_all(text) if d}
    assert "Deployment" in kinds
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


# -- the operator Deployment ----------------------------------------------------------------------


def test_operator_runs_two_electing_replicas_behind_a_disruption_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    r = rendering("default")
    deployment = r.find("Deployment", OPERATOR)
    pod = deployment["spec"]["template"]
    container = operator_container(r)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert pod["spec"]["serviceAccountName"] == OPERATOR == r.find("ServiceAccount", OPERATOR)["metadata"]["name"]
    assert container["command"] == ["python", "-m", "agentrun_operator"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    # The operator's pods must not look like runner pods: kopf reacts to pods with this label.
    assert not set(MANAGED_BY.items()) & set(pod["metadata"]["labels"].items())
    pdb = r.find("PodDisruptionBudget", OPERATOR)
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    # Every variable is a setting the operator reads, and they say what the chart means.
    env = operator_env(r)
    assert set(env) <= {f"AGENTRUN_OPERATOR_{f.upper()}" for f in OperatorSettings.model_fields}
    settings = settings_from(r, monkeypatch)
    assert settings.identity == f"{OPERATOR}-x1" and settings.log_format == "json"
    assert settings.default_image == container["image"] == "ghcr.io/agentrun/agentrun:0.1.0"
    assert settings.image_pull_policy == container["imagePullPolicy"] == "IfNotPresent"
    assert (
        settings.default_store_secret
        == "agentrun-store"
        == OperatorSettings.model_fields["default_store_secret"].default
    )
    assert settings.namespaces == []


def test_operator_probes_and_metrics_use_the_port_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    r = rendering("default")
    container = operator_container(r)
    port = settings_from(r, monkeypatch).metrics_port
    assert port == OperatorSettings.model_fields["metrics_port"].default == 8080
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # /readyz answers 200 "standby" or "leader": both replicas are Ready, the standby takes over.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert set(container["resources"]) == {"requests", "limits"}
    service = r.find("Service", f"{OPERATOR}-metrics")
    pod_labels = r.find("Deployment", OPERATOR)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]


def test_image_digest_pins_both_the_operator_and_the_runner_image(monkeypatch: pytest.MonkeyPatch) -> None:
    r = rendering("everything")
    pinned = "ghcr.io/agentrun/agentrun@sha256:" + "0" * 64
    assert operator_container(r)["image"] == pinned == settings_from(r, monkeypatch).default_image


# -- Pod Security ----------------------------------------------------------------------------------


def test_every_pod_meets_the_restricted_pod_security_profile(each: Rendering) -> None:
    """The release namespace should enforce "restricted": a pod that does not meet it is never created."""
    for where, pod in pod_templates(each.objects):
        assert restricted_violations(pod["spec"]) == [], f"{each.name}: {where}"
        assert pod["spec"].get("automountServiceAccountToken") is not None, f"{where}: say whether it needs a token"
        for container in pod["spec"]["containers"]:
            assert container.get("resources", {}).get("requests"), f"{where}: requests (not BestEffort)"


@pytest.mark.parametrize(
    ("breach", "problem"),
    [
        ({"hostNetwork": True}, "hostNetwork is set"),
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "volume h has type ['hostPath']"),
        ({"securityContext": {"runAsNonRoot": True}}, "c: seccompProfile is unset"),
        ({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}, "c: runAsNonRoot is not true"),
    ],
    ids=["host-network", "host-path", "no-seccomp", "root"],
)
def test_the_restricted_profile_check_catches_what_it_must(breach: dict[str, Any], problem: str) -> None:
    """The checker above is only as good as what it rejects."""
    sc = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    good = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": sc}],
    }
    assert restricted_violations(good) == []
    assert any(v.startswith(problem) for v in restricted_violations({**good, **breach})), restricted_violations(
        {**good, **breach}
    )


def test_the_operator_container_is_hardened_beyond_the_profile() -> None:
    r = rendering("default")
    pod = r.find("Deployment", OPERATOR)["spec"]["template"]["spec"]
    sc = operator_container(r)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsUser"] == 65532 == pod["securityContext"]["runAsUser"]


def test_runner_pods_the_operator_builds_with_the_chart_settings_are_restricted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runner pod is built by the operator's code from the chart's settings; it must be restricted too."""
    settings = settings_from(rendering("default"), monkeypatch)
    spec = AgentRunSpec.model_validate({"graph": "examples.support_agent:app", "threadId": "t-1"})
    pod = build_pod(RunRef(namespace="team-a", name="r", uid="u-1"), spec, attempt=1, settings=settings)
    assert restricted_violations(pod["spec"]) == []
    assert pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    assert container["image"] == settings.default_image and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090}], "the PodMonitor scrapes this port name"
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}, (
        "runner pods without spec.podTemplate.resources must get runner.resources (not BestEffort)"
    )


def test_runner_resources_come_from_the_value_and_a_run_s_own_resources_win(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"runner": {"resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}}}
    rendered = helm_python.Chart.load(CHART).render(values=values, name=RELEASE, namespace=NAMESPACE)
    docs = [d for path, text in rendered.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text)]
    settings = settings_from(
        Rendering(name="runner-resources", values=values, objects=[d for d in docs if d], notes=""), monkeypatch
    )
    ref = RunRef(namespace="team-a", name="r", uid="u-1")
    spec = AgentRunSpec.model_validate({"graph": "examples.support_agent:app", "threadId": "t-1"})
    (container,) = build_pod(ref, spec, attempt=1, settings=settings)["spec"]["containers"]
    # Helm merges a user's map into the default: the default memory limit stays unless set to null.
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
    own = {"requests": {"cpu": "2", "memory": "4Gi"}}
    spec = AgentRunSpec.model_validate(
        {"graph": "examples.support_agent:app", "threadId": "t-1", "podTemplate": {"resources": own}}
    )
    (container,) = build_pod(ref, spec, attempt=1, settings=settings)["spec"]["containers"]
    assert container["resources"] == own, "spec.podTemplate.resources must win over the chart's default"


# -- monitors, NetworkPolicy, dev store, NOTES -------------------------------------------------------


def test_monitors_are_off_by_default_and_select_what_exists_when_on() -> None:
    assert not rendering("default").kinds() & FOREIGN_KINDS
    r = rendering("monitors")
    monitor = r.find("ServiceMonitor", OPERATOR)
    service = r.find("Service", f"{OPERATOR}-metrics")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    pods = r.find("PodMonitor", f"{RELEASE}-runners")
    runner_labels = {"app.kubernetes.io/name": "agentrun-runner", **MANAGED_BY}  # operator podspec labels
    assert pods["spec"]["selector"] == {"matchLabels": runner_labels}
    assert pods["spec"]["namespaceSelector"] == {"any": True}
    assert [e["port"] for e in pods["spec"]["podMetricsEndpoints"]] == ["metrics"]
    scoped = rendering("everything").find("PodMonitor", f"{RELEASE}-runners")
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_a_service_monitor_without_the_service_fails_with_a_reason(chart: helm_python.Chart) -> None:
    values = {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}
    with pytest.raises(helm_python.HelmRenderError, match=r"needs metrics\.service\.enabled"):
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)


def test_network_policy_is_optional_and_opens_only_the_metrics_port() -> None:
    assert "NetworkPolicy" not in rendering("default").kinds()
    r = rendering("network-policy")
    (policy,) = r.all("NetworkPolicy")
    selector = r.find("Deployment", OPERATOR)["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"] == {"matchLabels": selector}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    everything = rendering("everything")
    ports = {
        p["metadata"]["name"]: p["spec"]["ingress"][0]["ports"][0]["port"] for p in everything.all("NetworkPolicy")
    }
    assert ports == {OPERATOR: "metrics", f"{RELEASE}-postgres": 5432, f"{RELEASE}-redis": 6379}


def test_dev_store_is_off_by_default_and_its_secret_points_at_its_services() -> None:
    assert not [
        o for o in rendering("default").objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == "store"
    ]
    r = rendering("everything")
    for namespace in ("team-a", "team-b"):
        secret = r.find("Secret", "agentrun-store", namespace)
        assert set(secret["stringData"]) == {"postgresDsn", "redisUrl"}, "the keys the runner's secretKeyRefs name"
        assert secret["stringData"]["postgresDsn"] == (
            f"postgresql://postgres@{RELEASE}-postgres.{NAMESPACE}.svc.cluster.local:5432/agentrun"
        )
        assert secret["stringData"]["redisUrl"] == f"redis://{RELEASE}-redis.{NAMESPACE}.svc.cluster.local:6379/0"
    for part in ("postgres", "redis"):
        service = r.find("Service", f"{RELEASE}-{part}")
        pod = r.find("Deployment", f"{RELEASE}-{part}")["spec"]["template"]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["automountServiceAccountToken"] is False
    assert "NOT FOR PRODUCTION" in r.notes


@pytest.mark.parametrize("name", ["default", "dev-store"])
def test_notes_tell_the_next_three_commands(name: str) -> None:
    notes = rendering(name).notes
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{OPERATOR}" in notes
    assert "kubectl apply -f examples/agentrun.yaml && kubectl get agentruns -w" in notes
    steps = [line for line in notes.splitlines() if line[:3] in {"1. ", "2. ", "3. "}]
    assert [s[:2] for s in steps] == ["1.", "2.", "3."], notes
    assert "kubectl -n NAMESPACE create secret generic agentrun-store" in notes
    assert ("svc.cluster.local" in notes) == (name == "dev-store"), "the dev store's DSN only when it exists"


# -- values.schema.json ----------------------------------------------------------------------------------


def test_default_values_pass_the_schema(chart: helm_python.Chart) -> None:
    chart.validate_schema(chart.values)
    for values in COMBINATIONS.values():
        chart.validate_schema(chart.merge_values(values))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": "two"}}, "at '/operator/replicas': got string, want integer"),
        ({"operator": {"replica": 2}}, "additional properties 'replica' not allowed"),
        ({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "/metrics/serviceMonitor/enabled"),
        ({"operator": {"logFormat": "xml"}}, "/operator/logFormat"),
    ],
    ids=["wrong-type", "typo", "namespaces-not-a-list", "bad-namespace", "bad-digest", "pull-policy", "bool", "log"],
)
def test_the_schema_rejects_bad_values_naming_the_key(
    chart: helm_python.Chart, values: dict[str, Any], message: str
) -> None:
    """What `helm install --set ...` prints: the offending key and what it wanted."""
    with pytest.raises(helm_python.HelmValuesError) as raised:
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(raised.value), str(raised.value)
