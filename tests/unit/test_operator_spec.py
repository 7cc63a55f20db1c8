"""The AgentRun spec model and the operator settings (DESIGN §4), without a cluster.

The spec model is the operator's second line of validation (the CRD schema
is the first): every refusal is an ``InvalidSpec`` that names the field, so
the run's Failed status tells the user what to fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_operator.decide.spec import AgentRunSpec, InvalidSpec, ResumeSpec, parse_spec, thread_key
from agentrun_operator.settings import OperatorSettings
from tests.unit.crd_support import crd_schema, drift

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agentrun.yaml"
VALID: dict[str, Any] = {"graph": "examples.support_agent:app", "threadId": "order-4821"}


def with_(**fields: Any) -> dict[str, Any]:
    return {**VALID, **fields}


def test_the_spec_model_and_the_crd_declare_the_same_fields_required_and_bounds() -> None:
    """A field the CRD lacks is pruned by the API server; one the model forbids or bounds tighter refuses a run."""
    assert drift(AgentRunSpec, crd_schema("spec"), "spec") == [], "GUARANTEE BROKEN: AgentRunSpec and the CRD drifted"


def test_the_shipped_example_is_a_valid_spec() -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    spec = parse_spec(manifest["spec"])
    assert spec.graph == "examples.support_agent:app"
    assert spec.threadId == "order-4821"
    assert spec.store is not None and spec.store.secretRef.name == "agentrun-store"
    assert spec.config.tool_timeout == 60


def test_a_full_spec_parses_with_defaults_filled() -> None:
    spec = parse_spec(
        with_(
            image="registry.local/agents:7",
            userId="customer-118",
            input={"messages": []},
            config={"toolTimeoutSeconds": 0, "nodeTimeoutSeconds": 300, "recursionLimit": 10},
            stop=False,
            resume={"values": {"int-1": {"ok": True}}},
            restartPolicy={"maxRestarts": 100, "backoffSeconds": 0},
            podTemplate={
                "resources": {"limits": {"memory": "1Gi"}},
                "nodeSelector": {"pool": "a"},
                "tolerations": [{"operator": "Exists"}],
                "env": [{"name": "X", "value": "1"}],
                "labels": {"team": "t"},
                "annotations": {"a": "b"},
            },
        )
    )
    assert spec.restartPolicy.maxRestarts == 100 and spec.restartPolicy.backoffSeconds == 0
    assert spec.resume is not None and spec.resume.values == {"int-1": {"ok": True}}
    defaults = parse_spec(VALID)
    assert defaults.restartPolicy.maxRestarts == 3 and defaults.restartPolicy.backoffSeconds == 5
    assert defaults.stop is False and defaults.resume is None and defaults.podTemplate is None


def test_thread_id_of_the_longest_length_that_fits_the_store_is_accepted() -> None:
    """<namespace (63)>/<threadId (189)> is 253, the store's thread id limit."""
    assert len(parse_spec(with_(threadId="a" * 189)).threadId) == 189


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(with_(graph="examples.support_agent"), "spec.graph", id="graph-without-attribute"),
        pytest.param(with_(graph="examples/support_agent:app"), "spec.graph", id="graph-path-not-module"),
        pytest.param(with_(graph="1examples:app"), "spec.graph", id="graph-bad-identifier"),
        pytest.param(with_(graph="examples:app:extra"), "spec.graph", id="graph-two-colons"),
        pytest.param({"threadId": "t"}, "spec.graph", id="graph-missing"),
        pytest.param({"graph": "a:b"}, "spec.threadId", id="thread-missing"),
        pytest.param(with_(threadId="a" * 190), "spec.threadId", id="thread-too-long"),
        pytest.param(with_(threadId=""), "spec.threadId", id="thread-empty"),
        pytest.param(with_(threadId="order 4821"), "spec.threadId", id="thread-space"),
        pytest.param(with_(threadId="other-ns/order-4821"), "spec.threadId", id="thread-slash-escapes-namespace"),
        pytest.param(with_(threadId="-order"), "spec.threadId", id="thread-leading-dash"),
        pytest.param(with_(threadId="order\n"), "spec.threadId", id="thread-newline"),
        pytest.param(
            with_(config={"toolTimeoutSeconds": -1}), "spec.config.toolTimeoutSeconds", id="negative-tool-timeout"
        ),
        pytest.param(
            with_(config={"nodeTimeoutSeconds": -0.5}), "spec.config.nodeTimeoutSeconds", id="negative-node-timeout"
        ),
        pytest.param(with_(config={"recursionLimit": 0}), "spec.config.recursionLimit", id="recursion-limit-zero"),
        pytest.param(with_(config={"retries": 3}), "spec.config.retries", id="unknown-config-field"),
        pytest.param(
            with_(restartPolicy={"maxRestarts": 101}), "spec.restartPolicy.maxRestarts", id="max-restarts-over-100"
        ),
        pytest.param(
            with_(restartPolicy={"maxRestarts": -1}), "spec.restartPolicy.maxRestarts", id="max-restarts-negative"
        ),
        pytest.param(
            with_(restartPolicy={"backoffSeconds": -1}), "spec.restartPolicy.backoffSeconds", id="negative-backoff"
        ),
        pytest.param(with_(priority="high"), "spec.priority", id="unknown-field"),
        pytest.param(with_(thread_id="x"), "spec.thread_id", id="snake-case-field"),
        pytest.param(with_(store={"secretRef": {"name": ""}}), "spec.store.secretRef.name", id="empty-secret-name"),
        pytest.param(with_(store={}), "spec.store.secretRef", id="store-without-secret"),
        pytest.param(with_(resume={"value": 1, "id": "int-1"}), "spec.resume.id", id="unknown-resume-field"),
        pytest.param(
            with_(podTemplate={"serviceAccountName": "admin"}),
            "spec.podTemplate.serviceAccountName",
            id="template-service-account",
        ),
        pytest.param(
            with_(podTemplate={"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}),
            "spec.podTemplate.volumes",
            id="template-volumes",
        ),
        pytest.param(
            with_(podTemplate={"securityContext": {"runAsUser": 0}}),
            "spec.podTemplate.securityContext",
            id="template-security-context",
        ),
        pytest.param(with_(podTemplate={"hostNetwork": True}), "spec.podTemplate.hostNetwork", id="template-host-net"),
        pytest.param(
            with_(podTemplate={"containers": [{"name": "x"}]}), "spec.podTemplate.containers", id="template-containers"
        ),
        pytest.param(
            with_(podTemplate={"automountServiceAccountToken": True}),
            "spec.podTemplate.automountServiceAccountToken",
            id="template-token",
        ),
        pytest.param(
            with_(podTemplate={"env": [{"name": "1BAD", "value": "x"}]}),
            "spec.podTemplate.env.0.name",
            id="template-env-bad-name",
        ),
        pytest.param(
            with_(podTemplate={"env": [{"name": "X", "value": "x", "secret": True}]}),
            "spec.podTemplate.env.0.secret",
            id="template-env-unknown-key",
        ),
    ],
)
def test_invalid_spec_is_refused_naming_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(raw)
    assert field in str(caught.value), f"the refusal does not name {field}: {caught.value}"
    assert caught.value.__cause__ is None, "InvalidSpec is the whole message; no pydantic chain for the user"


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec({"graph": "bad", "threadId": "a b", "restartPolicy": {"maxRestarts": 1000}})
    message = str(caught.value)
    for field in ("spec.graph", "spec.threadId", "spec.restartPolicy.maxRestarts"):
        assert field in message, f"{field} missing: users would fix one error per apply"


def test_invalid_spec_is_a_value_error() -> None:
    assert issubclass(InvalidSpec, ValueError)


def test_resume_digest_is_stable_and_distinct() -> None:
    a = ResumeSpec.model_validate({"values": {"int-1": {"x": 1, "y": 2}, "int-2": "no"}})
    b = ResumeSpec.model_validate({"values": {"int-2": "no", "int-1": {"y": 2, "x": 1}}})
    assert a.digest() == b.digest(), "the same answer in another key order must not start a second attempt"
    assert a.digest() == ResumeSpec.model_validate(a.model_dump()).digest()
    distinct = {
        ResumeSpec(value="yes").digest(),
        ResumeSpec(value="no").digest(),
        ResumeSpec(value={"approved": True}).digest(),
        ResumeSpec(value={"approved": False}).digest(),
        ResumeSpec(values={"int-1": "yes"}).digest(),
        ResumeSpec(values={"int-2": "yes"}).digest(),
        ResumeSpec(value=None).digest(),
        a.digest(),
    }
    assert len(distinct) == 8, "two different answers share a digest: the second would never be delivered"


def test_resume_digest_survives_the_api_round_trip() -> None:
    spec = parse_spec(with_(resume={"value": {"approved": True, "note": "ok"}}))
    again = parse_spec(with_(resume={"value": {"note": "ok", "approved": True}}))
    assert spec.resume is not None and again.resume is not None
    assert spec.resume.digest() == again.resume.digest()


def test_thread_key_is_scoped_by_namespace() -> None:
    assert thread_key("shop", "order-4821") != thread_key("billing", "order-4821"), (
        "two namespaces with the same threadId would share a thread"
    )
    assert thread_key("shop", "order-4821") == "shop/order-4821"


def test_run_config_holds_only_fields_the_user_set() -> None:
    assert parse_spec(VALID).run_config() == {}
    spec = parse_spec(with_(config={"nodeTimeoutSeconds": 300, "recursionLimit": 50}))
    assert spec.run_config() == {"nodeTimeoutSeconds": 300, "recursionLimit": 50}


def test_spec_model_round_trips_its_camel_case_names() -> None:
    spec = parse_spec(with_(restartPolicy={"maxRestarts": 2}))
    dumped = spec.model_dump(exclude_none=True)
    assert "threadId" in dumped and "restartPolicy" in dumped
    assert AgentRunSpec.model_validate(dumped) == spec


# --- OperatorSettings -----------------------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for key in list(os.environ):
        if key.upper().startswith("AGENTRUN_OPERATOR_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_settings_namespaces_from_a_comma_separated_env_var(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENTRUN_OPERATOR_NAMESPACES", " shop, billing ,,")
    assert OperatorSettings().namespaces == ["shop", "billing"]


def test_settings_namespaces_from_a_json_list(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENTRUN_OPERATOR_NAMESPACES", '["shop", "billing"]')
    assert OperatorSettings().namespaces == ["shop", "billing"]


def test_settings_no_namespaces_means_the_whole_cluster(clean_env: pytest.MonkeyPatch) -> None:
    assert OperatorSettings().namespaces == []
    clean_env.setenv("AGENTRUN_OPERATOR_NAMESPACES", "")
    assert OperatorSettings().namespaces == []


def test_settings_runner_command_from_json(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENTRUN_OPERATOR_RUNNER_COMMAND", '["python", "-m", "agentrun.runner", "--log=json"]')
    assert OperatorSettings().runner_command == ["python", "-m", "agentrun.runner", "--log=json"]


def test_settings_defaults_and_typed_overrides(clean_env: pytest.MonkeyPatch) -> None:
    defaults = OperatorSettings()
    assert defaults.runner_command == ["python", "-m", "agentrun.runner"]
    assert defaults.default_store_secret == "agentrun-store"
    clean_env.setenv("AGENTRUN_OPERATOR_STOP_GRACE_SECONDS", "5")
    clean_env.setenv("AGENTRUN_OPERATOR_MAX_DISRUPTIONS", "7")
    clean_env.setenv("AGENTRUN_OPERATOR_LEADER_ELECTION", "false")
    settings = OperatorSettings()
    assert (settings.stop_grace_seconds, settings.max_disruptions, settings.leader_election) == (5.0, 7, False)


def test_settings_accept_lists_from_flags(clean_env: pytest.MonkeyPatch) -> None:
    assert OperatorSettings.model_validate({"namespaces": "a,b"}).namespaces == ["a", "b"]
    assert OperatorSettings(namespaces=["a"]).namespaces == ["a"]
