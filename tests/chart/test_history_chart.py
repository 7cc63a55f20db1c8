"""The chart's history server (templates/history.yaml): least privilege, one Secret, TLS and Ingress off by default."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import yaml

from agentrun_history.__main__ import HistorySettings
from tests.chart.conftest import NAMESPACE, RELEASE, pod_templates, rendering, restricted_violations

pytestmark = pytest.mark.chart

HISTORY = f"{RELEASE}-history"
RBAC_KINDS = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def render(chart: helm_python.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def history_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == HISTORY]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def secrets_referenced(pod: dict[str, Any]) -> set[tuple[str, str]]:
    found = set()
    for container in pod["containers"]:
        for var in container.get("env") or []:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                found.add((ref["name"], ref["key"]))
        assert not container.get("envFrom"), "no whole Secret in the environment"
    for volume in pod.get("volumes") or []:
        if "secret" in volume:
            found.add((volume["secret"]["secretName"], "*"))
    return found


@pytest.mark.parametrize("name", ["default", "namespaced", "everything"])
def test_the_history_server_holds_no_kubernetes_rights(name: str) -> None:
    r = rendering(name)
    account = r.find("ServiceAccount", HISTORY)
    assert account["automountServiceAccountToken"] is False
    pod = history_pod(r.objects)
    assert pod["serviceAccountName"] == HISTORY and pod["automountServiceAccountToken"] is False
    bound = [
        o["metadata"]["name"]
        for o in r.objects
        if o["kind"] in RBAC_KINDS
        for subject in o.get("subjects") or []
        if subject.get("name") == HISTORY
    ]
    assert bound == [], f"GUARANTEE BROKEN: the history server got rights of its own through {bound}"
    # Its only Secret is the store DSN, injected by the kubelet (no `get` on Secrets needed).
    if name == "everything":  # devStore on: the dev store's DSN, no Secret at all
        assert secrets_referenced(pod) == set()
    else:
        assert secrets_referenced(pod) == {("agentrun-store", "postgresDsn"), ("agentrun-store", "postgresListenDsn")}
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "agentrun_history"]
    assert restricted_violations(pod) == []
    # The API server's CA without a token: the kube-root-ca.crt ConfigMap.
    assert {"name": "kube-ca", "configMap": {"name": "kube-root-ca.crt"}} in pod["volumes"]


def test_the_rendered_environment_is_what_the_server_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    (container,) = history_pod(rendering("default").objects)["containers"]
    for var in container["env"]:
        if var["name"] != "AGENTRUN_HISTORY_POSTGRES_LISTEN_DSN":  # optional: absent from the Secret here
            monkeypatch.setenv(var["name"], var.get("value", "postgresql://from-the-secret"))
    settings = HistorySettings()
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert settings.port == port == 8080 and settings.postgres_dsn == "postgresql://from-the-secret"
    assert settings.kube_ca_file == "/etc/agentrun/kube-ca/ca.crt" and settings.token_login is False
    assert settings.tls_cert_file == ""
    service = rendering("default").find("Service", HISTORY)
    assert service["spec"]["ports"][0]["targetPort"] == "http" and service["spec"]["type"] == "ClusterIP"


def test_tls_ingress_and_token_login_are_off_by_default_and_work_when_on(chart: helm_python.Chart) -> None:
    assert "Ingress" not in rendering("default").kinds()
    values = {
        "history": {
            "tls": {"enabled": True, "secretName": "history-tls"},
            "tokenLogin": {"enabled": True},
            "ingress": {"enabled": True, "host": "runs.example.com", "tlsSecretName": "runs-tls"},
            "store": {"secretName": "history-reader"},
        }
    }
    objects = render(chart, values)
    pod = history_pod(objects)
    assert secrets_referenced(pod) == {
        ("history-reader", "postgresDsn"),
        ("history-reader", "postgresListenDsn"),
        ("history-tls", "*"),
    }
    env = {v["name"]: v.get("value") for v in pod["containers"][0]["env"]}
    assert env["AGENTRUN_HISTORY_TOKEN_LOGIN"] == "true" and env["AGENTRUN_HISTORY_TLS_CERT_FILE"]
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (ingress,) = [o for o in objects if o["kind"] == "Ingress"]
    assert ingress["spec"]["rules"][0]["host"] == "runs.example.com"
    assert ingress["spec"]["tls"] == [{"hosts": ["runs.example.com"], "secretName": "runs-tls"}]


def test_the_chart_says_when_tls_is_in_front_and_the_server_reads_it(
    chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    def settings_for(history: dict[str, Any]) -> HistorySettings:
        (container,) = history_pod(render(chart, {"history": {"tokenLogin": {"enabled": True}, **history}}))[
            "containers"
        ]
        for var in container["env"]:
            monkeypatch.setenv(var["name"], var.get("value", "postgresql://from-the-secret"))
        return HistorySettings()

    ingress = {"enabled": True, "host": "runs.example.com"}
    behind_tls = settings_for({"ingress": {**ingress, "tlsSecretName": "runs-tls"}})
    assert behind_tls.tls_in_front, "GUARANTEE BROKEN: the chart's TLS ingress leaves the token cookie without Secure"
    assert not behind_tls.allow_plain_http_login and not behind_tls.tls_cert_file
    assert not settings_for({"ingress": ingress}).tls_in_front, "an ingress without TLS is no TLS"
    assert not settings_for({}).tls_in_front
    own_proxy = settings_for({"tlsInFront": True, "tokenLogin": {"enabled": True, "allowPlainHttp": True}})
    assert own_proxy.tls_in_front and own_proxy.allow_plain_http_login and own_proxy.token_login


def test_history_can_be_left_out(chart: helm_python.Chart) -> None:
    objects = render(chart, {"history": {"enabled": False}})
    assert not [o for o in objects if o["metadata"]["name"] == HISTORY]
    assert all("history" not in where for where, _ in pod_templates(objects))


def test_the_schema_names_a_bad_history_key(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmValuesError) as raised:
        chart.render(values={"history": {"tokenlogin": True}}, name=RELEASE, namespace=NAMESPACE)
    assert "tokenlogin" in str(raised.value)
