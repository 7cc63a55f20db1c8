"""The runner pod for one attempt (DESIGN §3-4): name, ownership, security and the env contract.

Every manifest is validated against the Kubernetes 1.30 Pod schema
(kubernetes_validate, strict: unknown fields fail) and checked against the
restricted Pod Security Standard rule by rule.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from agentrun_operator.decide.podspec import RunRef, build_pod, pod_name
from agentrun_operator.decide.spec import AgentRunSpec, InvalidSpec, parse_spec
from agentrun_operator.settings import OperatorSettings

NAMESPACE = "shop"
RUN_NAME = "support-order-4821"
RUN_UID = "6f1c2d3e-0000-4000-8000-00000000abcd"
SETTINGS = OperatorSettings(
    default_image="ghcr.io/agentrun/agentrun:9.9.9", runner_metrics_port=9191, pod_grace_seconds=45
)
DSN = "postgresql://agent:s3cr3t@db.internal:5432/agentrun"

FULL_TEMPLATE: dict[str, Any] = {
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "nodeSelector": {"kubernetes.io/arch": "amd64", "pool": "agents"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"}],
    "env": [
        {"name": "OPENAI_BASE_URL", "value": "http://llm.internal/v1"},
        {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llm", "key": "apiKey"}}},
    ],
    "labels": {"team": "support", "app.kubernetes.io/name": "spoofed", "agentrun.dev/run": "someone-else"},
    "annotations": {"prometheus.io/scrape": "true"},
}


def make_spec(**fields: Any) -> AgentRunSpec:
    return parse_spec({"graph": "examples.support_agent:app", "threadId": "order-4821", **fields})


def run(spec_raw: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": RUN_NAME, "namespace": NAMESPACE, "uid": RUN_UID, "generation": 1},
        "spec": spec_raw or {},
    }


def pod_for(spec: AgentRunSpec, attempt: int = 1, *, resume: dict[str, Any] | None = None) -> dict[str, Any]:
    return build_pod(RunRef.from_body(run()), spec, attempt=attempt, settings=SETTINGS, resume=resume)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod["spec"]["containers"]
    assert len(containers) == 1, "the runner pod has exactly one container"
    return containers[0]


def env(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entries = container(pod)["env"]
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {e["name"]: e for e in entries}


# --- the restricted Pod Security Standard, rule by rule ---------------------------------------------------------------

RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The checks of the restricted profile (baseline included), plus our read-only root filesystem."""
    spec = pod["spec"]
    pod_sc = spec.get("securityContext") or {}
    problems: list[str] = []
    problems += [f"spec.{key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes") or []:
        if set(volume) - {"name"} - RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} type {sorted(set(volume) - {'name'})}")
    problems += [f"sysctl {s['name']}" for s in pod_sc.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        problems.append(f"pod seccomp {pod_seccomp}")
    every = [*(spec.get("initContainers") or []), *spec["containers"], *(spec.get("ephemeralContainers") or [])]
    for c in every:
        sc = c.get("securityContext") or {}
        where = f"container {c['name']}"
        if sc.get("privileged"):
            problems.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{where}: runAsNonRoot must be true")
        if sc.get("runAsUser") == 0:
            problems.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccomp must be RuntimeDefault or Localhost, is {seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{where}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {caps['add']}")
        if (sc.get("procMount") or "Default") != "Default":
            problems.append(f"{where}: procMount")
        problems += [f"{where}: hostPort" for p in c.get("ports") or [] if p.get("hostPort")]
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: root filesystem must be read-only")
    return problems


def test_the_restricted_checker_catches_an_unsafe_pod() -> None:
    unsafe = {
        "spec": {
            "hostNetwork": True,
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [
                {
                    "name": "c",
                    "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
                    "ports": [{"containerPort": 80, "hostPort": 80}],
                }
            ],
        }
    }
    problems = restricted_violations(unsafe)
    for fragment in (
        "hostNetwork",
        "hostPath",
        "privileged",
        "allowPrivilegeEscalation",
        "runAsNonRoot",
        "seccomp",
        "drop ALL",
        "SYS_ADMIN",
        "hostPort",
        "read-only",
    ):
        assert any(fragment in p for p in problems), f"the checker misses {fragment}: it would prove nothing"


@pytest.mark.parametrize("template", [None, FULL_TEMPLATE], ids=["bare", "full-template"])
@pytest.mark.parametrize("resume", [None, {"values": {"int-1": True}}], ids=["first", "resume"])
def test_pod_is_a_valid_kubernetes_pod(template: dict[str, Any] | None, resume: dict[str, Any] | None) -> None:
    spec = make_spec(podTemplate=template, userId="customer-118", input={"messages": []}) if template else make_spec()
    pod = pod_for(spec, 2, resume=resume)
    try:
        kubernetes_validate.validate(pod, "1.30", strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"the runner pod is not a valid 1.30 Pod: {e.message}")


@pytest.mark.parametrize("template", [None, FULL_TEMPLATE], ids=["bare", "full-template"])
def test_pod_meets_the_restricted_pod_security_profile(template: dict[str, Any] | None) -> None:
    pod = pod_for(make_spec(podTemplate=template))
    assert restricted_violations(pod) == [], "the runner pod breaks the restricted Pod Security profile"
    sc = container(pod)["securityContext"]
    assert sc["runAsNonRoot"] is True and pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] != 0
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True


def test_runner_pod_gets_no_kubernetes_api_token() -> None:
    pod = pod_for(make_spec(podTemplate=FULL_TEMPLATE))
    assert pod["spec"]["automountServiceAccountToken"] is False, "runner pods must have no API credentials"
    assert "serviceAccountName" not in pod["spec"] and "serviceAccount" not in pod["spec"]


def test_pod_is_named_run_attempt_and_owned_by_the_agentrun() -> None:
    pod = pod_for(make_spec(), 3)
    assert pod["metadata"]["name"] == pod_name(RUN_NAME, 3) == f"{RUN_NAME}-3", "pod names must be deterministic"
    assert pod["metadata"]["namespace"] == NAMESPACE
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentRun",
            "name": RUN_NAME,
            "uid": RUN_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ], "without a controller owner reference the pod outlives its AgentRun"


def test_pod_is_never_restarted_by_the_kubelet() -> None:
    # Restarts are the operator's (counted, backed off, capped); a kubelet restart would bypass all three.
    assert pod_for(make_spec())["spec"]["restartPolicy"] == "Never"


def test_pod_carries_the_run_and_recommended_labels() -> None:
    labels = pod_for(make_spec(), 2)["metadata"]["labels"]
    assert labels["agentrun.dev/run"] == RUN_NAME, (
        "a deleted run's pods are found by this label (and kubectl agentrun logs)"
    )
    assert labels["agentrun.dev/attempt"] == "2"
    assert labels["app.kubernetes.io/name"] == "agentrun-runner"
    assert labels["app.kubernetes.io/instance"] == RUN_NAME
    assert labels["app.kubernetes.io/managed-by"] == "agentrun-operator"


def test_operator_labels_win_over_template_labels() -> None:
    labels = pod_for(make_spec(podTemplate=FULL_TEMPLATE))["metadata"]["labels"]
    assert labels["agentrun.dev/run"] == RUN_NAME, "a template label hijacked the run selector"
    assert labels["app.kubernetes.io/name"] == "agentrun-runner"
    assert labels["team"] == "support", "a harmless template label was dropped"


def test_store_credentials_come_only_from_the_secret() -> None:
    with pytest.raises(InvalidSpec, match="AGENTRUN_POSTGRES_DSN is reserved"):  # refused, not dropped
        make_spec(podTemplate={"env": [{"name": "AGENTRUN_POSTGRES_DSN", "value": DSN}]})
    spec = make_spec(store={"secretRef": {"name": "shop-store"}}, podTemplate={"env": [{"name": "X", "value": DSN}]})
    pod = pod_for(spec)
    variables = env(pod)
    assert variables["AGENTRUN_POSTGRES_DSN"] == {
        "name": "AGENTRUN_POSTGRES_DSN",
        "valueFrom": {"secretKeyRef": {"name": "shop-store", "key": "postgresDsn"}},
    }, "the DSN must be a secretKeyRef, never a value"
    redis = variables["AGENTRUN_REDIS_URL"]
    assert "value" not in redis and redis["valueFrom"]["secretKeyRef"]["name"] == "shop-store"
    assert redis["valueFrom"]["secretKeyRef"]["key"] == "redisUrl"
    assert all(v["name"] != "AGENTRUN_POSTGRES_DSN" or "valueFrom" in v for v in pod["spec"]["containers"][0]["env"])


def test_default_store_secret_is_used_when_the_run_names_none() -> None:
    variables = env(pod_for(make_spec()))
    assert variables["AGENTRUN_POSTGRES_DSN"]["valueFrom"]["secretKeyRef"]["name"] == SETTINGS.default_store_secret


def test_thread_id_is_namespace_qualified() -> None:
    assert env(pod_for(make_spec()))["AGENTRUN_THREAD_ID"]["value"] == f"{NAMESPACE}/order-4821", (
        "two namespaces with the same threadId would share a thread"
    )


def test_env_contract_values() -> None:
    spec = make_spec(userId="customer-118", input={"messages": [{"role": "user", "content": "hi"}]})
    variables = env(pod_for(spec, 4))
    assert variables["AGENTRUN_GRAPH"]["value"] == "examples.support_agent:app"
    assert variables["AGENTRUN_RUN_NAME"]["value"] == RUN_NAME
    assert variables["AGENTRUN_RUN_UID"]["value"] == RUN_UID
    assert variables["AGENTRUN_ATTEMPT"]["value"] == "4"
    assert variables["AGENTRUN_USER_ID"]["value"] == "customer-118"
    assert json.loads(variables["AGENTRUN_INPUT"]["value"]) == {"messages": [{"role": "user", "content": "hi"}]}
    assert variables["AGENTRUN_METRICS_PORT"]["value"] == "9191"
    assert all("value" in v or "valueFrom" in v for v in variables.values())


@pytest.mark.parametrize(
    "name",
    [
        "AGENTRUN_GRAPH",
        "AGENTRUN_THREAD_ID",
        "AGENTRUN_ATTEMPT",
        "AGENTRUN_RESUME",
        "AGENTRUN_STORE",
        "agentrun_graph",
        "Agentrun_Thread_Id",
    ],
)
def test_template_env_cannot_override_the_contract(name: str) -> None:
    """Refused with a message (issue 22), not dropped silently: the contract's variables are the operator's."""
    with pytest.raises(InvalidSpec, match=f"{name} is reserved"):
        make_spec(
            podTemplate={"env": [{"name": name, "value": "evil.module:app"}, {"name": "LOG_LEVEL", "value": "d"}]}
        )


def test_template_safe_subset_is_copied() -> None:
    pod = pod_for(make_spec(podTemplate=FULL_TEMPLATE))
    assert container(pod)["resources"] == FULL_TEMPLATE["resources"]
    assert pod["spec"]["nodeSelector"] == FULL_TEMPLATE["nodeSelector"]
    assert pod["spec"]["tolerations"] == FULL_TEMPLATE["tolerations"]
    assert pod["metadata"]["annotations"] == FULL_TEMPLATE["annotations"]
    variables = env(pod)
    assert variables["OPENAI_BASE_URL"] == FULL_TEMPLATE["env"][0]
    assert variables["OPENAI_API_KEY"] == FULL_TEMPLATE["env"][1], "a template secretKeyRef env was altered"


def test_without_template_nothing_optional_appears() -> None:
    pod = pod_for(make_spec())
    assert container(pod)["resources"] == SETTINGS.runner_resources, "no spec resources: the operator's default"
    for key in ("nodeSelector", "tolerations", "affinity", "serviceAccountName", "hostNetwork"):
        assert key not in pod["spec"]
    assert pod["metadata"]["annotations"] == {}
    assert set(env(pod)) == {
        "AGENTRUN_GRAPH",
        "AGENTRUN_THREAD_ID",
        "AGENTRUN_RUN_NAME",
        "AGENTRUN_RUN_UID",
        "AGENTRUN_ATTEMPT",
        "AGENTRUN_CONFIG",
        "AGENTRUN_INPUT",
        "AGENTRUN_REQUEST_KEY",
        "AGENTRUN_INPUTS_IN_STORE",
        "AGENTRUN_METRICS_PORT",
        "AGENTRUN_POSTGRES_DSN",
        "AGENTRUN_REDIS_URL",
    }


def test_the_runner_gets_the_request_key_of_the_run() -> None:
    derived = env(pod_for(make_spec()))["AGENTRUN_REQUEST_KEY"]["value"]
    assert derived.startswith(f"{NAMESPACE}/"), "the derived request key is scoped by namespace and run name"
    explicit = env(pod_for(make_spec(requestId="order-4821-charge")))["AGENTRUN_REQUEST_KEY"]["value"]
    assert explicit == "order-4821-charge", "spec.requestId is the request key as is"


def test_pod_spec_has_only_operator_chosen_keys() -> None:
    # Whatever the template holds, the pod spec is the operator's: no template key can add privileges.
    pod = pod_for(make_spec(podTemplate=FULL_TEMPLATE))
    assert set(pod["spec"]) <= {
        "restartPolicy",
        "automountServiceAccountToken",
        "enableServiceLinks",
        "terminationGracePeriodSeconds",
        "securityContext",
        "containers",
        "volumes",
        "nodeSelector",
        "tolerations",
    }
    assert pod["spec"]["terminationGracePeriodSeconds"] == 45


def test_resume_env_only_when_resuming() -> None:
    assert "AGENTRUN_RESUME" not in env(pod_for(make_spec(), 2)), "a fresh attempt must not carry a resume value"
    answer = {"values": {"int-1": {"approved": True}}}
    variables = env(pod_for(make_spec(), 3, resume=answer))
    assert json.loads(variables["AGENTRUN_RESUME"]["value"]) == answer


def test_run_config_contains_only_what_the_user_set() -> None:
    assert json.loads(env(pod_for(make_spec()))["AGENTRUN_CONFIG"]["value"]) == {}, (
        "operator-side defaults would override the runtime's own"
    )
    spec = make_spec(config={"toolTimeoutSeconds": 60, "durableCheckpointEveryStep": False})
    assert json.loads(env(pod_for(spec))["AGENTRUN_CONFIG"]["value"]) == {
        "toolTimeoutSeconds": 60,
        "durableCheckpointEveryStep": False,
    }


def test_image_and_command_come_from_the_run_or_the_settings() -> None:
    assert container(pod_for(make_spec()))["image"] == SETTINGS.default_image
    assert container(pod_for(make_spec(image="registry.local/agents:7")))["image"] == "registry.local/agents:7"
    assert container(pod_for(make_spec()))["command"] == SETTINGS.runner_command
    assert container(pod_for(make_spec()))["name"] == "runner", "PodView reads the container named runner"


def test_build_pod_does_not_share_state_between_calls() -> None:
    spec = make_spec(podTemplate=FULL_TEMPLATE)
    first = pod_for(spec)
    first["metadata"]["labels"]["x"] = "y"
    container(first)["command"].append("--evil")
    second = pod_for(spec)
    assert "x" not in second["metadata"]["labels"]
    assert container(second)["command"] == SETTINGS.runner_command


def test_long_run_names_still_make_valid_label_values() -> None:
    from agentrun_operator.decide.podspec import label_value

    name = "r" * 200
    assert len(label_value(name)) <= 63 and label_value(name) == label_value(name)
    assert label_value(name) != label_value("r" * 199 + "s")
    assert label_value("short") == "short"


def test_the_fault_point_is_the_only_agentrun_variable_a_template_may_set() -> None:
    spec = make_spec(podTemplate={"env": [{"name": "AGENTRUN_FAULT_POINT", "value": "after_tool:charge_card"}]})
    variables = env(pod_for(spec))
    assert variables["AGENTRUN_FAULT_POINT"] == {"name": "AGENTRUN_FAULT_POINT", "value": "after_tool:charge_card"}
    assert variables["AGENTRUN_GRAPH"]["value"] == "examples.support_agent:app"


def test_runner_resources_default_is_not_best_effort_and_empty_leaves_them_unset() -> None:
    """Runner pods without spec.podTemplate.resources get the operator's default (requests: not BestEffort)."""
    assert SETTINGS.runner_resources["requests"], "the default must request resources"
    bare = OperatorSettings(runner_resources={})
    pod = build_pod(RunRef.from_body(run()), make_spec(), attempt=1, settings=bare)
    assert "resources" not in container(pod)


def test_metrics_port_0_leaves_the_pod_without_a_port() -> None:
    """kube-apiserver refuses containerPort 0 (Required value): found on the real control plane."""
    pod = build_pod(RunRef.from_body(run()), make_spec(), attempt=1, settings=OperatorSettings(runner_metrics_port=0))
    assert "ports" not in container(pod)
    assert container(pod_for(make_spec()))["ports"] == [
        {"name": "metrics", "containerPort": SETTINGS.runner_metrics_port}
    ]
