"""Operator decisions for infrastructure faults and bad input (issue 8), pure: no API server, no store, no clock.

Store outages are disruptions (exit 8, the operator's own failed read), store configuration errors fail
at once (InvalidStore), pods that cannot start fail with the kubelet's words, inputs travel through the
store, Secrets only by permission, hostile specs are refused without recursion, messages are for people.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import pytest

from agentrun.errors import StoreConfigError, StoreUnavailableError
from agentrun_operator.decide import hostile, outage
from agentrun_operator.decide.access import image_problem, referenced_secrets, secret_problem, store_secret_problem
from agentrun_operator.decide.classify import Outcome, classify
from agentrun_operator.decide.conditions import status_patch
from agentrun_operator.decide.decision import Decision
from agentrun_operator.decide.messages import REASON_BY_CODE, human, reason_for
from agentrun_operator.decide.podspec import RunRef, build_pod
from agentrun_operator.decide.reasons import Phase, Reason
from agentrun_operator.decide.spec import InvalidSpec, parse_spec
from agentrun_operator.decide.status import AgentRunStatus, iso
from agentrun_operator.io.stores import StoreRegistry, redact
from agentrun_operator.settings import OperatorSettings
from tests.unit.decisions_support import (
    LIMITS,
    NOW,
    PENDING,
    RUNNING,
    applied,
    decide,
    later,
    make_spec,
    manifest,
    run_status,
    running,
    terminated,
    view,
    waiting,
)

SLOW_STORE = {"backoffSeconds": 2, "storeUnavailableTimeoutSeconds": 120}
RUNNER_LINE = "STORAGE_UNAVAILABLE_001: PostgreSQL unavailable for 60s (retry bound 60s); last: ConnectionRefusedError"


def _status(raw: dict[str, Any]) -> AgentRunStatus:
    return AgentRunStatus.parse(raw)


def _guard(d: Decision, raw: dict[str, Any], *, store_down: str | None, timeout: float = 120, **kw: Any) -> Decision:
    return outage.guard(
        d,
        status=_status(raw),
        timeout=timeout,
        store_down=store_down,
        pod_running=kw.get("pod_running", False),
        now=kw.get("now", NOW),
    )


# --- messages for people ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (
            "2026-12-03 06:19:03,280 ERROR agentrun.runner: exit 5: [GRAPH_UPDATE_001] node x returned 3",
            "GRAPH_UPDATE_001: node x returned 3",
        ),
        (
            "GRAPH_REFERENCE_001: [GRAPH_REFERENCE_001] no module examples.nope",
            "GRAPH_REFERENCE_001: no module examples.nope",
        ),
        ("STORAGE_CONFIG_001: authentication failed", "STORAGE_CONFIG_001: authentication failed"),
        ('{"time": "t", "level": "ERROR", "message": "exit 5: [NODE_ERROR_001] boom"}', "NODE_ERROR_001: boom"),
        ("Traceback (most recent call last):\n  File x\nValueError: boom", "ValueError: boom"),
        ("line one\n\n  THREAD_STATE_001:   spread\tover   spaces  \n", "THREAD_STATE_001: spread over spaces"),
        ("", ""),
    ],
    ids=["log-tail", "doubled-code", "runner-line", "json-record", "traceback", "whitespace", "empty"],
)
def test_status_message_is_code_and_text_without_log_prefixes(raw: str, shown: str) -> None:
    assert human(raw) == shown


def test_the_reason_comes_from_the_error_code() -> None:
    assert REASON_BY_CODE["STORAGE_CONFIG_001"] is Reason.INVALID_STORE
    assert reason_for("STORAGE_CONFIG_001: wrong password") is Reason.INVALID_STORE
    assert reason_for("GRAPH_REFERENCE_001: nope") is Reason.RUN_FAILED
    assert reason_for("") is Reason.RUN_FAILED


def test_exit_5_with_a_log_tail_shows_the_code_and_text_on_one_line() -> None:
    tail = (
        "2026-12-03 06:19:02,001 INFO agentrun.runner: attempt 1\n"
        "2026-12-03 06:19:03,280 ERROR agentrun.runner: exit 5: [GRAPH_UPDATE_001] bad"
    )
    d = decide(make_spec(), run_status(RUNNING), view(terminated(5, message=tail)), None, NOW, LIMITS)
    assert d.status["phase"] == Phase.FAILED and d.status["reason"] == Reason.RUN_FAILED
    assert d.status["message"] == "GRAPH_UPDATE_001: bad" and "\n" not in d.status["message"]


def test_runner_store_config_error_fails_invalid_store_in_one_attempt() -> None:
    pod = view(terminated(5, message="STORAGE_CONFIG_001: PostgreSQL store at db:5432/x: authentication failed"))
    d = decide(make_spec(), run_status(RUNNING), pod, None, NOW, LIMITS)
    assert d.status["phase"] == Phase.FAILED and d.status["reason"] == Reason.INVALID_STORE
    assert d.create_attempt is None and "restarts" not in d.status


# --- pods that cannot start ------------------------------------------------------------------------------------------


def test_start_error_fails_at_once_with_the_kubelet_reason_and_message() -> None:
    message = "failed to create containerd task: exec: argument list too long"
    pod = view(terminated(128, reason="StartError", message=message))
    assert classify(pod) is Outcome.START_ERROR
    d = decide(make_spec(), run_status(PENDING), pod, None, NOW, LIMITS)
    assert d.status["phase"] == Phase.FAILED and d.status["reason"] == Reason.START_ERROR
    assert d.status["message"] == f"StartError: {message}"
    assert d.create_attempt is None and "restarts" not in d.status, "a StartError is no crash to retry"


def test_create_container_config_error_message_carries_the_kubelet_reason() -> None:
    pod = view(waiting("CreateContainerConfigError", 'secret "nope" not found'))
    d = decide(make_spec(), run_status(PENDING), pod, None, NOW, LIMITS)
    assert d.status["reason"] == Reason.CREATE_CONTAINER_CONFIG_ERROR
    assert d.status["message"] == 'CreateContainerConfigError: secret "nope" not found'


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff"])
def test_image_pull_fails_only_past_the_image_pull_timeout(reason: str) -> None:
    spec = make_spec(restartPolicy={"imagePullTimeoutSeconds": 600})
    pod = manifest(phase="Pending", state={"waiting": {"reason": reason, "message": "pull access denied"}})
    pod["metadata"]["creationTimestamp"] = iso(NOW - timedelta(seconds=599))
    d = decide(spec, run_status(PENDING), view(pod), None, NOW, LIMITS)
    assert "phase" not in d.status and d.delete_pod is None, "a pull still within its bound must wait"
    pod["metadata"]["creationTimestamp"] = iso(NOW - timedelta(seconds=600))
    d = decide(spec, run_status(PENDING), view(pod), None, NOW, LIMITS)
    assert d.status["phase"] == Phase.FAILED and d.status["reason"] == reason
    assert d.status["message"].startswith(f"{reason}: pull access denied") and d.delete_pod is not None


def test_image_pull_timeout_defaults_to_five_minutes() -> None:
    assert make_spec().restartPolicy.imagePullTimeoutSeconds == 300
    assert make_spec().restartPolicy.storeUnavailableTimeoutSeconds == 900


# --- store outages ---------------------------------------------------------------------------------------------------


def test_exit_8_is_a_disruption_with_backoff_never_a_restart() -> None:
    spec = make_spec(restartPolicy={**SLOW_STORE, "maxRestarts": 0})
    pod = view(terminated(8, message=RUNNER_LINE))
    assert classify(pod) is Outcome.STORE_UNAVAILABLE
    d = decide(spec, run_status(RUNNING), pod, None, NOW, LIMITS)
    assert d.status["phase"] == Phase.PENDING and d.status["reason"] == Reason.STORE_UNAVAILABLE
    assert d.status["disruptions"] == 1 and "restarts" not in d.status, "a store outage must not spend maxRestarts"
    assert d.create_attempt is None and d.status["nextAttemptTime"] == iso(later(2))
    assert d.status["storeUnavailableSince"] == iso(NOW)
    assert d.conditions[outage.CONDITION] == (False, outage.DOWN_REASON, RUNNER_LINE)
    waited = applied(run_status(RUNNING), d)
    assert decide(spec, waited, pod, None, later(1), LIMITS).create_attempt is None
    again = decide(spec, waited, pod, None, later(2), LIMITS)
    assert again.create_attempt == 2 and again.status["attempt"] == 2


def test_exit_8_backoff_grows_with_the_outage_and_stops_at_the_deadline() -> None:
    spec = make_spec(restartPolicy=SLOW_STORE)
    pod = view(terminated(8, message=RUNNER_LINE))
    since = run_status(RUNNING, storeUnavailableSince=iso(NOW - timedelta(seconds=70)))
    d = decide(spec, since, pod, None, NOW, LIMITS)
    assert d.status["nextAttemptTime"] == iso(later(50)), "70 s into a 120 s outage: wait the 50 s left, no more"
    assert d.status["storeUnavailableSince"] == iso(NOW - timedelta(seconds=70)), "the clock runs from the first"
    early = run_status(RUNNING, storeUnavailableSince=iso(NOW - timedelta(seconds=10)))
    assert decide(spec, early, pod, None, NOW, LIMITS).status["nextAttemptTime"] == iso(later(10))


def test_exit_8_past_the_timeout_fails_store_unavailable() -> None:
    spec = make_spec(restartPolicy=SLOW_STORE)
    long_ago = run_status(RUNNING, storeUnavailableSince=iso(NOW - timedelta(seconds=121)))
    d = decide(spec, long_ago, view(terminated(8, message=RUNNER_LINE)), None, NOW, LIMITS)
    assert d.status["phase"] == Phase.FAILED and d.status["reason"] == Reason.STORE_UNAVAILABLE
    assert "121s" in d.status["message"] and RUNNER_LINE in d.status["message"]


def test_exit_8_respects_the_disruption_cap() -> None:
    spec = make_spec(restartPolicy=SLOW_STORE)
    d = decide(spec, run_status(RUNNING, disruptions=3), view(terminated(8)), None, NOW, LIMITS)
    assert d.status["reason"] == Reason.DISRUPTION_LIMIT_EXCEEDED


def test_operator_read_failing_holds_the_next_pod_and_sets_the_condition() -> None:
    start = decide(make_spec(), {}, None, None, NOW, LIMITS)
    assert start.create_attempt == 1
    held = _guard(start, {}, store_down="STORAGE_UNAVAILABLE_001: connection refused")
    assert held.create_attempt is None and not held.events[1:], "no pod while the operator cannot reach the store"
    assert held.status["phase"] == Phase.PENDING and held.status["reason"] == Reason.STORE_UNAVAILABLE
    assert held.conditions[outage.CONDITION][0] is False
    assert held.status["storeUnavailableSince"] == iso(NOW)


def test_operator_read_failing_past_the_timeout_fails_the_waiting_run() -> None:
    raw = run_status(PENDING, storeUnavailableSince=iso(NOW - timedelta(seconds=121)), nextAttemptTime=iso(NOW))
    d = decide(make_spec(restartPolicy=SLOW_STORE), raw, view(terminated(8)), None, NOW, LIMITS)
    assert d.create_attempt == 2
    failed = _guard(d, raw, store_down="STORAGE_UNAVAILABLE_001: connection refused", timeout=120)
    assert failed.status["phase"] == Phase.FAILED and failed.status["reason"] == Reason.STORE_UNAVAILABLE
    assert failed.create_attempt is None


def test_operator_read_failing_while_a_pod_runs_only_marks_the_condition() -> None:
    d = decide(make_spec(), run_status(RUNNING), view(running()), None, NOW, LIMITS)
    marked = _guard(
        d, run_status(RUNNING), store_down="STORAGE_UNAVAILABLE_001: CannotConnectNowError", pod_running=True
    )
    assert "phase" not in marked.status and marked.delete_pod is None, "the runner rides out a short outage itself"
    assert marked.conditions[outage.CONDITION] == (
        False,
        outage.DOWN_REASON,
        "STORAGE_UNAVAILABLE_001: CannotConnectNowError",
    )


def test_store_answering_again_turns_the_condition_true_and_ends_the_outage_clock() -> None:
    down = {"type": "StoreAvailable", "status": "False", "reason": "StoreUnavailable", "message": "x"}
    raw = run_status(RUNNING, conditions=[down], storeUnavailableSince=iso(NOW - timedelta(seconds=9)))
    d = decide(make_spec(), raw, view(running()), None, NOW, LIMITS)
    up = _guard(d, raw, store_down=None, pod_running=True)
    assert up.conditions[outage.CONDITION][0] is True and up.status["storeUnavailableSince"] is None
    quiet = _guard(
        decide(make_spec(), run_status(RUNNING), view(running()), None, NOW, LIMITS),
        run_status(RUNNING),
        store_down=None,
    )
    assert not quiet.conditions, "a run that never saw an outage gets no StoreAvailable churn"


def test_store_condition_survives_phase_changes_and_moves_its_time_only_on_a_flip() -> None:
    current = _status(run_status(PENDING))
    patch = status_patch(
        current,
        {"phase": Phase.RUNNING, "reason": Reason.RUNNING, "message": "m"},
        now=NOW,
        generation=1,
        conditions={"StoreAvailable": (False, "StoreUnavailable", "down")},
    )
    kinds = {c["type"]: c for c in patch["conditions"]}
    assert kinds["StoreAvailable"]["status"] == "False" and kinds["Running"]["status"] == "True"
    after = _status({**run_status(RUNNING), "conditions": patch["conditions"]})
    finished = status_patch(
        after, {"phase": Phase.SUCCEEDED, "reason": Reason.COMPLETED, "message": "done"}, now=later(5), generation=1
    )
    assert "StoreAvailable" in {c["type"] for c in finished["conditions"]}, "a phase change dropped StoreAvailable"
    same = status_patch(
        after, {}, now=later(9), generation=1, conditions={"StoreAvailable": (False, "StoreUnavailable", "down")}
    )
    assert "conditions" not in same, "an unchanged condition must not be rewritten"
    flipped = status_patch(
        after, {}, now=later(9), generation=1, conditions={"StoreAvailable": (True, "StoreAnswered", "ok")}
    )
    store = next(c for c in flipped["conditions"] if c["type"] == "StoreAvailable")
    assert store["lastTransitionTime"] == iso(later(9)) and store["status"] == "True"


# --- the operator's own store connection -----------------------------------------------------------------------------


class _Kube:
    pass


def _registry_with(dsn: str) -> StoreRegistry:
    from agentrun_operator.io.caches import MISSING, SecretCache
    from agentrun_operator.io.stores import _Resolved, _sensitive

    registry = StoreRegistry(SecretCache(_Kube()))  # type: ignore[arg-type]
    registry._resolved[("shop", "agentrun-store")] = _Resolved(MISSING, dsn, None, _sensitive(dsn, None))  # type: ignore[arg-type]
    return registry


def test_store_config_errors_are_invalid_store_and_never_quote_the_password() -> None:
    dsn = "postgresql://agentrun:S3cr3t-pw@db:5432/agentrun"
    registry = _registry_with(dsn)
    error = StoreConfigError(f"malformed PostgreSQL DSN: cannot parse {dsn}")
    problem = registry.explain("shop", "agentrun-store", error)
    assert not isinstance(problem, str) and problem.reason is Reason.INVALID_STORE
    assert problem.message.startswith("STORAGE_CONFIG_001: ") and "S3cr3t-pw" not in problem.message


def test_a_raw_authentication_error_in_the_chain_is_a_config_error() -> None:
    class InvalidPasswordError(Exception):
        pass

    try:
        try:
            raise InvalidPasswordError('password authentication failed for user "agentrun"')
        except InvalidPasswordError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as e:
        problem = _registry_with("postgresql://a:pw123@db/x").explain("shop", "agentrun-store", e)
    assert not isinstance(problem, str) and problem.reason is Reason.INVALID_STORE


def test_an_outage_is_a_cause_not_a_problem_and_is_redacted() -> None:
    dsn = "postgresql://agentrun:S3cr3t-pw@db:5432/agentrun"
    cause = _registry_with(dsn).explain("shop", "agentrun-store", StoreUnavailableError(f"down; dsn {dsn}"))
    assert isinstance(cause, str) and cause.startswith("STORAGE_UNAVAILABLE_001: ") and "S3cr3t-pw" not in cause


def test_redact_removes_urls_and_passwords_in_any_form() -> None:
    dsn = "postgresql://u:p%40ss-word@h/d?sslmode=require"
    from agentrun_operator.io.stores import _sensitive

    text = redact(f"bad {dsn} and p@ss-word and p%40ss-word", _sensitive(dsn))
    assert "ss-word" not in text


# --- large inputs travel through the store ---------------------------------------------------------------------------


def test_inputs_in_store_keep_input_and_resume_out_of_the_environment() -> None:
    spec = make_spec(input={"messages": [{"role": "user", "content": "x" * (1 << 20)}]})
    ref = RunRef(namespace="shop", name="big", uid="u-1")
    pod = build_pod(
        ref, spec, attempt=2, settings=OperatorSettings(), resume={"value": "y" * (1 << 20)}, inputs_in_store=True
    )
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_INPUTS_IN_STORE"]["value"] == "true"
    assert "AGENTRUN_RESUME" not in env and json.loads(env["AGENTRUN_INPUT"]["value"]) is None
    assert max(len(e.get("value", "")) for e in env.values()) < 4096, "something large still travels in env"


# --- Secrets by permission, images by allow-list ---------------------------------------------------------------------


def _env_spec(*refs: str) -> Any:
    env = [{"name": f"V{i}", "valueFrom": {"secretKeyRef": {"name": r, "key": "k"}}} for i, r in enumerate(refs)]
    env.append({"name": "PLAIN", "value": "x"})
    env.append({"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}})
    return make_spec(podTemplate={"env": env})


def test_referenced_secrets_are_the_secret_key_refs_without_repeats() -> None:
    assert referenced_secrets(_env_spec("a", "b", "a")) == ["a", "b"]
    assert referenced_secrets(make_spec()) == []


def test_an_unlabelled_secret_is_refused_with_how_to_allow_it() -> None:
    problem = secret_problem("api-key", namespace="shop", labels={"team": "x"}, store_secret="agentrun-store")
    assert problem is not None and "shop/api-key" in problem
    assert 'kubectl label secret -n shop api-key agentrun.dev/runner-access="true"' in problem


def test_a_labelled_secret_is_allowed_and_a_missing_one_is_not() -> None:
    labelled = {"agentrun.dev/runner-access": "true"}
    assert secret_problem("api-key", namespace="shop", labels=labelled, store_secret="agentrun-store") is None
    assert "does not exist" in (secret_problem("gone", namespace="shop", labels=None, store_secret="s") or "")
    assert secret_problem("k", namespace="shop", labels={"agentrun.dev/runner-access": "True"}, store_secret="s")


def test_the_store_secret_is_refused_even_when_labelled() -> None:
    labelled = {"agentrun.dev/runner-access": "true"}
    problem = secret_problem("agentrun-store", namespace="shop", labels=labelled, store_secret="agentrun-store")
    assert problem is not None and "store Secret" in problem


def test_image_allow_list_empty_allows_any_and_otherwise_needs_a_prefix() -> None:
    assert image_problem("evil.example/miner:1", []) is None
    assert image_problem(None, ["ghcr.io/acme/"]) is None, "the operator's default image is always allowed"
    assert image_problem("ghcr.io/acme/agent:1", ["ghcr.io/acme/"]) is None
    problem = image_problem("evil.example/miner:1", ["ghcr.io/acme/", "registry.internal/"])
    assert problem is not None and "ghcr.io/acme/" in problem


def test_allowed_image_prefixes_setting_reads_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_OPERATOR_ALLOWED_IMAGE_PREFIXES", "ghcr.io/acme/, registry.internal/")
    assert OperatorSettings().allowed_image_prefixes == ["ghcr.io/acme/", "registry.internal/"]


# --- hostile specs ---------------------------------------------------------------------------------------------------


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"a": value}
    return value


def _raw(**fields: Any) -> dict[str, Any]:
    return {"graph": "examples.support_agent:app", "threadId": "t", **fields}


def test_input_nested_ten_thousand_levels_is_invalid_spec_without_recursion() -> None:
    # At Python's default limit: other tiers in this process (the emulator) raise it for their own reasons.
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        with pytest.raises(InvalidSpec, match=r"spec\.input(\.a)*: nested deeper than 100 levels"):
            parse_spec(_raw(input=_nested(10_000)))
    finally:
        sys.setrecursionlimit(previous)


def test_resume_nested_too_deep_is_refused_too() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.resume"):
        parse_spec(_raw(resume={"value": [[[[_nested(200)]]]]}))


def test_nesting_within_the_bound_and_a_one_mib_string_are_fine() -> None:
    spec = parse_spec(_raw(input={"deep": _nested(90), "big": "x" * (1 << 20), "text": "héllo ✓ 𝄞 日本"}))
    assert spec.input is not None and len(spec.input["big"]) == 1 << 20


@pytest.mark.parametrize(
    ("value", "what"),
    [("a\x00b", "NUL"), ("\ud800", "unpaired UTF-16 surrogate")],
    ids=["nul", "lone-surrogate"],
)
def test_text_the_store_cannot_hold_is_invalid_spec(value: str, what: str) -> None:
    with pytest.raises(InvalidSpec, match=what):
        parse_spec(_raw(input={"messages": [{"content": value}]}))
    with pytest.raises(InvalidSpec, match=what):
        parse_spec(_raw(input={value: 1}))


def test_hostile_problem_names_the_path() -> None:
    assert hostile.problem({"input": {"messages": [{"content": "a\x00"}]}}) == (
        "spec.input.messages[0].content: contains a NUL character (\\u0000), which the store's JSON cannot hold"
    )


def test_a_store_secret_other_than_the_default_needs_the_label() -> None:
    labelled = {"agentrun.dev/runner-access": "true"}
    kwargs: dict[str, Any] = {"namespace": "shop", "default_store_secret": "agentrun-store"}
    problem = store_secret_problem("team-db", labels={}, **kwargs)
    assert problem is not None and "shop/team-db" in problem and "runner-access" in problem
    assert store_secret_problem("team-db", labels=labelled, **kwargs) is None
    assert store_secret_problem("agentrun-store", labels={}, **kwargs) is None, "the admin's default is trusted"
    assert store_secret_problem("gone", labels=None, **kwargs) is None, "a missing Secret is the store check's"


@pytest.mark.parametrize(
    "annotation",
    [
        "container.apparmor.security.beta.kubernetes.io/runner",
        "seccomp.security.alpha.kubernetes.io/pod",
        "io.kubernetes.cri-o.userns-mode",
        "io.containerd.runc.v2.privileged",
    ],
)
def test_confinement_annotations_are_refused(annotation: str) -> None:
    with pytest.raises(InvalidSpec, match="confinement"):
        parse_spec({"graph": "a:b", "threadId": "t", "podTemplate": {"annotations": {annotation: "unconfined"}}})
    parse_spec({"graph": "a:b", "threadId": "t", "podTemplate": {"annotations": {"team.example.com/owner": "x"}}})


@pytest.mark.parametrize("name", ["AGENTRUN_POSTGRES_DSN", "agentrun_graph", "AgentRun_Thread_Id"])
def test_contract_env_names_are_refused_not_dropped(name: str) -> None:
    with pytest.raises(InvalidSpec, match=f"{name} is reserved"):
        parse_spec({"graph": "a:b", "threadId": "t", "podTemplate": {"env": [{"name": name, "value": "x"}]}})
    parse_spec(
        {"graph": "a:b", "threadId": "t", "podTemplate": {"env": [{"name": "AGENTRUN_FAULT_POINT", "value": "x"}]}}
    )
