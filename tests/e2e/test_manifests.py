"""deploy/ and hack/e2e-kind.sh, checked without a cluster (they run only where kind can).

deploy/*.yaml is generated from the Helm chart (`make deploy-manifests`; tests/chart fails when
it drifts and checks every combination of the chart's values). These tests read the generated
files as a `kubectl apply` user gets them: every object is valid Kubernetes 1.30 (strict: no
unknown fields), the operator's RBAC is exactly what its code calls (a wider grant must change
this test on purpose), every pod meets the restricted Pod Security profile, and the manifests
agree with the code they configure (settings defaults, label filters, Secret keys) and with the
script that installs the chart on kind.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from agentrun_operator.decide.podspec import MANAGED_BY
from agentrun_operator.settings import OperatorSettings

pytestmark = pytest.mark.chart

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCRIPT = ROOT / "hack" / "e2e-kind.sh"
SHIPPED_IMAGE = "ghcr.io/agentrun/agentrun:0.1.0"
RELEASE = "agentrun"
SYSTEM = "agentrun-system"


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def default(field: str) -> Any:
    return OperatorSettings.model_fields[field].default  # the code's default, not this machine's env


OPERATOR = load("operator.yaml")
STORE = load("dev-store.yaml")
ALL = [(f"{f}:{o['kind']}/{o['metadata']['name']}", o) for f in ("operator.yaml", "dev-store.yaml") for o in load(f)]
DEPLOYMENT = find(OPERATOR, "Deployment", "agentrun-operator")
POD = DEPLOYMENT["spec"]["template"]
CONTAINER = POD["spec"]["containers"][0]


@pytest.mark.parametrize("obj", [o for _, o in ALL], ids=[i for i, _ in ALL])
def test_every_object_is_valid_kubernetes_1_30(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, "1.30", strict=True)


@pytest.mark.parametrize("obj", [o for _, o in ALL], ids=[i for i, _ in ALL])
def test_every_object_carries_app_kubernetes_io_labels(obj: dict[str, Any]) -> None:
    labels = obj["metadata"].get("labels") or {}
    assert {"app.kubernetes.io/name", "app.kubernetes.io/part-of"} <= set(labels), labels


def test_cluster_rbac_is_exactly_what_the_operator_calls() -> None:
    """Least privilege: each rule comes from a call in the code (see the comments in deploy/operator.yaml)."""
    rules = find(OPERATOR, "ClusterRole", "agentrun-operator")["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert not any("resourceNames" in rule for rule in rules)
    assert granted == {
        # kopf: watch + metadata patches; the reconciler: get.
        *{("agentrun.dev", "agentruns", v) for v in ("get", "list", "watch", "delete")},
        ("agentrun.dev", "agentruns/status", "patch"),
        ("agentrun.dev", "agentruns/finalizers", "update"),  # blockOwnerDeletion on runner pods
        *{("", "pods", v) for v in ("get", "list", "watch", "create", "delete")},
        # the SecretCache: read once per (namespace, name), kept current by a watch.
        *{("", "secrets", v) for v in ("get", "list", "watch")},
        ("", "events", "create"),
        *{("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")},  # kopf observation
    }, "the operator's ClusterRole changed: widen it only for a call the code makes"
    binding = find(OPERATOR, "ClusterRoleBinding", "agentrun-operator")
    assert binding["roleRef"]["name"] == "agentrun-operator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agentrun-operator", "namespace": SYSTEM}]


def test_leader_election_rbac_is_one_lease_in_the_operator_namespace() -> None:
    role = find(OPERATOR, "Role", "agentrun-operator-leader-election")
    assert role["metadata"]["namespace"] == SYSTEM == DEPLOYMENT["metadata"]["namespace"]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [default("lease_name")],
            "verbs": ["get", "update"],
        },
    ]
    binding = find(OPERATOR, "RoleBinding", "agentrun-operator-leader-election")
    assert binding["metadata"]["namespace"] == SYSTEM and binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agentrun-operator", "namespace": SYSTEM}]


def test_operator_deployment_runs_two_electing_replicas() -> None:
    assert DEPLOYMENT["spec"]["replicas"] == 2
    assert POD["spec"]["serviceAccountName"] == "agentrun-operator"
    assert CONTAINER["command"] == ["python", "-m", "agentrun_operator"]
    env = {e["name"]: e for e in CONTAINER["env"]}
    assert env["AGENTRUN_OPERATOR_LEASE_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["AGENTRUN_OPERATOR_IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["AGENTRUN_OPERATOR_DEFAULT_IMAGE"]["value"] == CONTAINER["image"] == SHIPPED_IMAGE
    assert set(env) <= {f"AGENTRUN_OPERATOR_{f.upper()}" for f in OperatorSettings.model_fields}, (
        "every variable must be a setting the operator reads"
    )
    # The operator's pods must not look like runner pods: kopf reacts to pods with this label.
    assert not set(MANAGED_BY.items()) & set(POD["metadata"]["labels"].items())
    assert DEPLOYMENT["spec"]["selector"]["matchLabels"].items() <= POD["metadata"]["labels"].items()


def test_operator_env_is_read_by_the_operator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    downward = {"AGENTRUN_OPERATOR_LEASE_NAMESPACE": SYSTEM, "AGENTRUN_OPERATOR_IDENTITY": "agentrun-operator-x1"}
    for var in CONTAINER["env"]:
        monkeypatch.setenv(var["name"], var["value"] if "value" in var else downward[var["name"]])
    settings = OperatorSettings()
    assert settings.lease_namespace == SYSTEM and settings.identity == "agentrun-operator-x1"
    assert settings.default_image == SHIPPED_IMAGE and settings.image_pull_policy == "IfNotPresent"
    assert settings.log_format == "json" and settings.metrics_port == 8080
    assert settings.lease_name == default("lease_name") and settings.default_store_secret == default(
        "default_store_secret"
    )
    assert settings.namespaces == [], "the manifest's RBAC is cluster-wide: the operator must watch all namespaces"


def test_operator_probes_and_metrics_use_the_port_it_serves() -> None:
    port = int(next(e["value"] for e in CONTAINER["env"] if e["name"] == "AGENTRUN_OPERATOR_METRICS_PORT"))
    assert port == default("metrics_port") == 8080
    assert CONTAINER["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert CONTAINER["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # /readyz answers 200 "standby" or "leader": both replicas are Ready, the standby takes over.
    assert CONTAINER["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert set(CONTAINER["resources"]) == {"requests", "limits"}


def pods_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"] for o in objects if o["kind"] == "Deployment"]


@pytest.mark.parametrize(
    "pod", pods_of(OPERATOR) + pods_of(STORE), ids=lambda p: p["metadata"]["labels"]["app.kubernetes.io/name"]
)
def test_every_pod_meets_the_restricted_pod_security_profile(pod: dict[str, Any]) -> None:
    """agentrun-system enforces "restricted": a pod that does not meet it is never created."""
    spec = pod["spec"]
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(spec)
    assert all(set(v) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"} for v in spec.get("volumes", []))
    for container in spec["containers"]:
        merged = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        assert merged.get("runAsNonRoot") is True and merged.get("runAsUser", 1) != 0
        assert merged.get("seccompProfile") == {"type": "RuntimeDefault"}
        sc = container.get("securityContext", {})
        assert sc.get("allowPrivilegeEscalation") is False and not sc.get("privileged")
        assert sc.get("capabilities") == {"drop": ["ALL"]}
        assert "resources" in container


def test_operator_container_is_hardened_beyond_the_profile() -> None:
    sc = CONTAINER["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"] is True and sc["runAsUser"] == 65532 == POD["spec"]["securityContext"]["runAsUser"]
    )


def test_operator_namespace_enforces_the_restricted_profile() -> None:
    labels = find(OPERATOR, "Namespace", SYSTEM)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_dev_store_secret_points_at_the_dev_store_services() -> None:
    secret = find(STORE, "Secret", default("default_store_secret"))
    assert secret["metadata"]["namespace"] == "default"
    assert set(secret["stringData"]) == {"postgresDsn", "redisUrl"}, "the keys the runner pod's secretKeyRefs name"
    postgres = find(STORE, "Deployment", "agentrun-postgres")["spec"]["template"]["spec"]["containers"][0]
    for key, service in (("postgresDsn", "agentrun-postgres"), ("redisUrl", "agentrun-redis")):
        url = urlsplit(secret["stringData"][key])
        svc = find(STORE, "Service", service)
        assert url.hostname == f"{service}.{svc['metadata']['namespace']}.svc.cluster.local"
        assert url.port == svc["spec"]["ports"][0]["port"]
    database = urlsplit(secret["stringData"]["postgresDsn"]).path.lstrip("/")
    assert {"name": "POSTGRES_DB", "value": database} in postgres["env"]


def test_the_e2e_script_installs_the_chart_with_the_dev_store() -> None:
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text and "trap cleanup EXIT" in text
    assert 'CHART="$ROOT/helm/agentrun"' in text and f'RELEASE="{RELEASE}"' in text
    assert 'hc upgrade --install "$RELEASE" "$CHART" --namespace "$SYSTEM_NS"' in text
    # The image the script built, as the chart's image (operator and default runner image).
    assert '--set-string image.repository="$IMAGE_REPOSITORY" --set-string image.tag="$IMAGE_TAG"' in text
    assert "--set devStore.enabled=true" in text and "devStore.secretNamespaces={default}" in text
    # The demo target: the tests' AgentRuns run examples/ graphs, which the runtime image lacks.
    assert 'docker build --target demo -t "$IMAGE"' in text
    # What the script then waits for and port-forwards is what the chart names so.
    for deployment in ("postgres", "redis", "operator"):
        assert find(OPERATOR + STORE, "Deployment", f"{RELEASE}-{deployment}")
    assert 'service/"$RELEASE"-postgres "$PG_PORT:5432"' in text and find(STORE, "Service", f"{RELEASE}-postgres")
    checked = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    makefile = (ROOT / "Makefile").read_text()
    assert "e2e-kind: $(STAMP)" in makefile and "bash hack/e2e-kind.sh" in makefile


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_e2e_script_is_shellcheck_clean() -> None:
    checked = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
