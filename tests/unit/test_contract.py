"""The pod contract (agentrun.contract): one list of names and codes that the runner and operator share."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from pydantic import Field

from agentrun.config import RunConfig
from agentrun.contract import (
    ENV_PREFIX,
    RUN_CONFIG_KEYS,
    STORE_SECRET_KEYS,
    Env,
    ExitCode,
    RunConfigSpec,
    RunnerInputs,
    env_name,
)
from agentrun.loader import load_target
from agentrun.runner import InvalidEnvironment, RunnerSettings, main
from agentrun_operator.decide.spec import parse_spec
from tests.unit.crd_support import crd_schema, drift


def test_every_runner_input_has_exactly_one_variable_name() -> None:
    fields = set(RunnerInputs.model_fields)
    named = {member.value.removeprefix(ENV_PREFIX).lower() for member in Env} - {"fault_point"}
    assert fields == named, "RunnerInputs and Env drifted: the operator would set a name the runner does not read"


def test_the_runner_reads_what_the_operator_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = RunnerInputs(
        graph="examples.support_agent:app",
        thread_id="ns/order-1",
        run_name="r",
        run_uid="uid-1",
        user_id="customer-1",
        attempt=4,
        config={"toolTimeoutSeconds": 5},
        input={"messages": [{"role": "user", "content": "hi"}]},
        resume={"values": {"abc": True}},
        metrics_port=0,
    )
    for entry in sent.to_env():
        monkeypatch.setenv(entry["name"], entry["value"])
    received = RunnerSettings.from_environ()
    assert RunnerInputs.model_validate(received.model_dump()) == sent, "a value changed on its way into the pod"


def test_store_credentials_are_never_rendered_inline() -> None:
    inputs = RunnerInputs(graph="a:b", thread_id="ns/t", postgres_dsn="postgresql://u:secret@h/db", redis_url="r")
    names = {entry["name"] for entry in inputs.to_env()}
    assert not names & {variable.value for variable in STORE_SECRET_KEYS}, "a DSN would travel inline, not by secret"
    assert "secret" not in str(inputs.to_env())


@pytest.mark.parametrize(("code", "text"), [(7, "exit 7 (FENCED)"), (137, "exit 137 (crash)"), (None, "no exit code")])
def test_exit_codes_describe_themselves(code: int | None, text: str) -> None:
    assert ExitCode.describe(code) == text


def test_env_name_of_a_field() -> None:
    assert env_name("thread_id") is Env.THREAD_ID
    with pytest.raises(ValueError):
        env_name("no_such_field")


def test_a_bad_runner_environment_names_every_bad_variable() -> None:
    environ = {
        "AGENTRUN_THREAD_ID": "ns/t",
        "AGENTRUN_ATTEMPT": "four",
        "AGENTRUN_CONFIG": "{not json",
    }
    with pytest.raises(InvalidEnvironment) as caught:
        RunnerSettings.from_environ(environ)
    text = str(caught.value)
    assert "AGENTRUN_CONFIG: not valid JSON" in text
    assert "AGENTRUN_GRAPH: Field required" in text
    assert "AGENTRUN_ATTEMPT:" in text and "integer" in text


def test_a_bad_runner_environment_fails_the_attempt_with_a_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AGENTRUN_THREAD_ID", "ns/t")
    monkeypatch.setenv("AGENTRUN_INPUT", "[1,")
    monkeypatch.setenv("AGENTRUN_TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert main() == ExitCode.FAILED
    last_words = capsys.readouterr().err.splitlines()[-1]
    assert "invalid runner environment" in last_words
    assert (tmp_path / "termination-log").read_text() in last_words
    assert "AGENTRUN_INPUT: not valid JSON" in last_words and "AGENTRUN_GRAPH: Field required" in last_words


def test_the_crds_spec_config_is_the_run_config_wire_model() -> None:
    assert drift(RunConfigSpec, crd_schema("spec", "config"), "spec.config") == [], (
        "GUARANTEE BROKEN: the CRD's spec.config and contract.RunConfigSpec declare other keys, types or bounds"
    )

    class Wider(RunConfigSpec):
        new_knob: int = Field(default=1, alias="newKnob")

    assert drift(Wider, crd_schema("spec", "config"), "spec.config") == [
        "spec.config.newKnob: in the model, not in the CRD (the API server prunes it)"
    ], "the drift check must see a key the CRD lacks"


def test_every_run_config_key_sets_a_run_config_field_with_the_same_default() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert set(RUN_CONFIG_KEYS.values()) <= fields.keys(), "a spec.config key would land in RunConfig.extra, unused"
    for name, info in RunConfigSpec.model_fields.items():
        if info.default is not None:  # None: unset, the runtime's default applies
            assert info.default == fields[name], f"spec.config.{info.alias} defaults differently in the CRD and runtime"
    every = RunConfigSpec.model_validate({"toolTimeoutSeconds": 1, "nodeTimeoutSeconds": 2}).model_dump(by_alias=True)
    inputs = RunnerSettings(graph="a:b", thread_id="ns/t", config=every)
    config = RunConfig.from_any(inputs.run_config())
    assert config.extra == {}, f"spec.config keys the runner does not map: {config.extra}"
    assert (config.tool_timeout, config.node_timeout) == (1, 2)


def test_a_dotted_attribute_graph_reference_is_accepted_by_the_crd_the_operator_and_the_runner() -> None:
    assert parse_spec({"graph": "agentrun.contract:ExitCode.FENCED", "threadId": "t"}).graph.endswith("FENCED")
    assert load_target("agentrun.contract:ExitCode.FENCED") is ExitCode.FENCED, (
        "the runner must load what the CRD takes"
    )
