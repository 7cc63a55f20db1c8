"""Property-based AgentRun specs through the API server, with the real operator running (issue 13).

On kubesim and on the real control plane (``real_server``): there the refusals are kube-apiserver's own
words for the same schema and CEL rules, the reference kubesim's messages are held to.

Two properties, each over specs drawn by hypothesis (derandomized: CI sees
the same examples every time; no shrinking, so a failure costs one run):

- a spec the CRD schema refuses is refused by the API server with the
  schema's own message (the field path and, for a CEL rule, the rule's
  message), and nothing of it is stored or reaches the operator; so is an
  update its transition rules refuse (immutable fields, a one-way stop);
- every spec the schema accepts ends in a phase with a reason: on its own
  (Succeeded, Failed, Stopped, or waiting with a reason: Interrupted,
  Pending) or, for a run that waits, once it is stopped; meanwhile the
  operator never crashes and never stalls a well-formed sentinel run,
  which must finish within its usual time.

The accepted specs are odd on purpose: graphs that do not exist or are not
graphs, inputs that are not chat messages or are nested around the 100-level
limit or hold NUL characters, zero and extreme deadlines, a stop or a resume
at creation, a missing store Secret, images that cannot be pulled, a node
selector no node matches, environment variables named like the runner's
contract, request ids of any text, a TTL that deletes the run as it ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agentrun_dev.databases import create_database, drop_database
from kubesim import EmulatedCluster, KubeletThread
from tests.cluster.operator_harness import OperatorProcess, agentrun, apply, start_operator, status, store_secret

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.timeout(300), pytest.mark.real_server]

PATH = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
TERMINAL = {"Succeeded", "Failed", "Stopped"}
PHASES = TERMINAL | {"Pending", "Running", "Interrupted", "Stopping"}
SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "phases": [Phase.explicit, Phase.reuse, Phase.generate],
    "suppress_health_check": list(HealthCheck),
}


@pytest.fixture
def operator(cluster: EmulatedCluster, kubelet: KubeletThread, tmp_path: Path) -> Iterator[OperatorProcess]:
    import asyncio

    dsn = asyncio.run(create_database())
    store_secret(cluster, dsn)
    # The harness's 3 s lease gives up leadership (and exits) when a renewal waits behind a burst of work on
    # this shared 2-core machine; this test is about specs, not takeover time (io/leader.py names the hazard).
    process = start_operator(cluster, tmp_path, AGENTRUN_OPERATOR_LEASE_DURATION_SECONDS="15")
    try:
        yield process
    finally:
        process.stop()
        asyncio.run(drop_database(dsn))


# --- valid specs ------------------------------------------------------------------------------------------------------

IDENT = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9._:@-]{0,20}[A-Za-z0-9])?\Z")
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40) | st.sampled_from(
    ["a\x00b", "\u202eevil", "é✓ 𝄞", ""]
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


def nested(depth: int) -> dict[str, Any]:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return {"messages": [{"role": "user", "content": "hi"}], "nested": value}


inputs = st.one_of(
    st.builds(lambda t: {"messages": [{"role": "user", "content": t}]}, text),
    st.builds(
        lambda r, t: {"messages": [{"role": r, "content": t}]}, st.sampled_from(["robot", "system", "tool"]), text
    ),
    st.dictionaries(st.text(max_size=8), json_value, max_size=4),
    st.sampled_from([97, 98, 99, 100, 101]).map(nested),
)
GRAPHS = [
    "examples.support_agent:app",
    "tests.cluster.graphs:approval",
    "tests.badinput.graphs:nasty_calls",
    "no_such_module:app",
    "examples.support_agent:no_such_attribute",
    "os:sep",  # importable, not a graph
    "tests.badinput.graphs:BIG",
]
env_var = st.fixed_dictionaries(
    {
        "name": st.sampled_from(
            ["AGENTRUN_GRAPH", "agentrun_thread_id", "AGENTRUN_POSTGRES_DSN", "SUPPORT_TOOL_DELAY", "PYTHONPATH", "X"]
        ),
        "value": text,
    }
)
pod_template = st.fixed_dictionaries(
    {},
    optional={
        "env": st.lists(env_var, max_size=3, unique_by=lambda e: e["name"]),
        "labels": st.dictionaries(st.sampled_from(["team", "app.kubernetes.io/name"]), st.sampled_from(["a", "b"])),
        "nodeSelector": st.sampled_from([{}, {"kubernetes.io/hostname": "no-such-node"}]),
        "resources": st.sampled_from([{"requests": {"cpu": "1m"}}, {"limits": {"memory": "1Ei"}}]),
    },
)
valid_spec = st.fixed_dictionaries(
    {"graph": st.sampled_from(GRAPHS), "threadId": IDENT},
    optional={
        "userId": IDENT,
        "input": inputs,
        "image": st.sampled_from(
            ["agentrun:test", "agentrun:test", "Not A Valid Image!", "registry.invalid/unknown:1"]
        ),
        "config": st.fixed_dictionaries(
            {},
            optional={
                "toolTimeoutSeconds": st.sampled_from([0, 0.001, 1e9]),
                "nodeTimeoutSeconds": st.sampled_from([0, 0.001, 1e9]),
                "recursionLimit": st.sampled_from([1, 2, 10000]),
                "durableCheckpointEveryStep": st.booleans(),
                "failOnToolError": st.booleans(),
            },
        ),
        "stop": st.booleans(),
        "resume": st.one_of(
            # A null value is pruned by the API server (the field is not nullable): then neither is set.
            st.builds(lambda v: {"value": v}, json_value.filter(lambda v: v is not None)),
            st.builds(lambda v: {"values": {"x": v}}, json_value),
        ),
        "restartPolicy": st.fixed_dictionaries(
            {},
            optional={
                "maxRestarts": st.integers(0, 100),
                "backoffSeconds": st.integers(0, 2),
                "storeUnavailableTimeoutSeconds": st.integers(0, 5),
                "imagePullTimeoutSeconds": st.integers(0, 3),
            },
        ),
        "requestId": st.text(min_size=1, max_size=40),
        "retry": st.integers(0, 1000),
        "activeDeadlineSeconds": st.integers(1, 5),
        "ttlSecondsAfterFinished": st.integers(0, 2),
        "store": st.sampled_from(
            [{"secretRef": {"name": n}} for n in ("agentrun-store", "agentrun-store", "no-such-secret")]
        ),
        "podTemplate": pod_template,
    },
)


@settings(max_examples=6, **SETTINGS)  # type: ignore[arg-type]
@given(specs=st.lists(valid_spec, min_size=4, max_size=6))
def test_every_accepted_spec_ends_in_a_phase_with_a_reason_and_a_sentinel_run_keeps_going(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path, specs: list[dict[str, Any]]
) -> None:
    global batch
    batch += 1
    sentinel = f"sentinel-{batch}"
    apply(
        cluster,
        agentrun(sentinel, thread=sentinel, effects=tmp_path / f"{sentinel}.db", env={"SUPPORT_TOOL_DELAY": "1"}),
    )
    names = []
    for i, spec in enumerate(specs):
        name = f"fz-{batch}-{i}"
        body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}
        created = cluster.api("POST", PATH, body, timeout=30)
        assert created.status == 201, f"a spec valid by the schema was refused: {json.dumps(spec)[:1000]}: {created}"
        names.append(name)
    shown = {n: json.dumps(s, ensure_ascii=True)[:3000] for n, s in zip(names, specs, strict=True)}

    # The sentinel finishes meanwhile, in its usual time.
    began = time.monotonic()
    done = _wait(cluster, operator, [sentinel], lambda s: s.get("phase") in TERMINAL, timeout=60, what="finished")
    assert done[sentinel].get("phase") == "Succeeded", f"the sentinel run was disturbed: {done[sentinel]}"
    print(f"batch {batch}: sentinel Succeeded in {time.monotonic() - began:.1f}s beside {len(names)} fuzzed runs")

    # Every fuzzed run settles with a phase and a reason: finished, or waiting for something named.
    settled = _wait(
        cluster, operator, names, _settled, timeout=60, what="settled with a phase and a reason", shown=shown
    )
    waiting = [n for n, s in settled.items() if s and s.get("phase") not in TERMINAL]
    for name in waiting:  # anything still waiting must end when stopped
        stopped = cluster.kubectl("patch", "ar", name, "--type", "merge", "-p", '{"spec":{"stop":true}}')
        assert stopped.returncode == 0 or "NotFound" in stopped.stderr, stopped.stderr
    final = _wait(cluster, operator, names, _finished, timeout=60, what="finished after a stop", shown=shown)
    print(
        f"batch {batch}: "
        + ", ".join(f"{s.get('phase')}/{s.get('reason')}: {str(s.get('message'))[:90]}" for s in final.values())
    )
    for name, state in final.items():
        assert state.get("reason"), f"{name} ended without a reason: {state}; spec {shown[name]}"
        assert state.get("phase") in TERMINAL, f"{name}: {state}"
        # None of these graphs hangs: a forced stop means a pod nobody could stop through the store.
        assert state.get("reason") != "ForcedStop", (
            f"{name} needed a forced stop: {state}; spec {shown[name]}; its pod: {_pod_states(cluster, name)}"
        )
    assert operator.proc.poll() is None, f"GUARANTEE BROKEN: the operator died:\n{operator.log()[-4000:]}"
    log = operator.log()
    for sign in ("Traceback", "RecursionError", "failed with an exception"):
        assert sign not in log, f"the operator failed on a fuzzed spec ({sign}):\n{_around(log, sign)}"
    for name in names:
        cluster.api("DELETE", f"{PATH}/{name}")


batch = 0


def _settled(state: dict[str, Any]) -> bool:
    return state.get("phase") in PHASES - {"Running", "Stopping"} and bool(state.get("reason"))


def _finished(state: dict[str, Any]) -> bool:
    return state.get("phase") in TERMINAL


def _wait(
    cluster: EmulatedCluster,
    operator: OperatorProcess,
    names: list[str],
    ok: Any,
    *,
    timeout: float,
    what: str,
    shown: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """The last status of each run once ``ok`` holds for all (a run deleted by its TTL: its last stored status)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {n: _last_status(cluster, n) for n in names}
        pending = [n for n, s in seen.items() if not ok(s)]
        if not pending:
            return seen
        if time.monotonic() > deadline:
            details = "\n".join(f"{n}: {json.dumps(seen[n])[:600]}\n  spec {(shown or {}).get(n)}" for n in pending)
            raise AssertionError(
                f"GUARANTEE BROKEN: runs never {what}:\n{details}\noperator log tail:\n{operator.log()[-3000:]}"
            )
        time.sleep(0.3)


def _last_status(cluster: EmulatedCluster, name: str) -> dict[str, Any]:
    current = status(cluster, name)
    if current or cluster.get("agentruns", name) is not None:
        return current
    history = [((h or {}).get("status") or {}) for h in cluster.history("agentruns", name)]
    return next((s for s in reversed(history) if s), {})


def _pod_states(cluster: EmulatedCluster, run: str) -> list[Any]:
    return [(p or {}).get("status") for pod in (f"{run}-1", f"{run}-2") for p in cluster.history("pods", pod)[-1:]]


def _around(log: str, sign: str) -> str:
    at = log.index(sign)
    return log[max(0, at - 1500) : at + 1500]


# --- invalid specs ----------------------------------------------------------------------------------------------------

# (where, change, what the API's message must say): one broken rule of the CRD schema per mutation.
MUTATIONS: list[tuple[str, Any, list[str]]] = [
    ("threadId", "", ["spec.threadId"]),
    ("threadId", "team-a/secret", ["spec.threadId", "should match"]),
    ("threadId", "../../x", ["spec.threadId", "should match"]),
    ("threadId", "x" * 190, ["spec.threadId", "189"]),
    ("threadId", 42, ["spec.threadId", "string"]),
    ("graph", "not a reference", ["spec.graph", "should match"]),
    ("graph", "a:b:c", ["spec.graph", "should match"]),
    ("graph", None, ["spec.graph", "Required value"]),
    ("userId", "user one", ["spec.userId", "should match"]),
    ("config.recursionLimit", 0, ["spec.config.recursionLimit", "greater than or equal to 1"]),
    ("config.recursionLimit", 10001, ["spec.config.recursionLimit", "less than or equal to 10000"]),
    ("config.recursionLimit", "50", ["spec.config.recursionLimit", "integer"]),
    ("config.toolTimeoutSeconds", -1, ["spec.config.toolTimeoutSeconds", "greater than or equal to 0"]),
    ("config.failOnToolError", "yes", ["spec.config.failOnToolError", "boolean"]),
    ("restartPolicy.maxRestarts", 101, ["spec.restartPolicy.maxRestarts", "less than or equal to 100"]),
    ("restartPolicy.backoffSeconds", -5, ["spec.restartPolicy.backoffSeconds", "greater than or equal to 0"]),
    ("stop", "true", ["spec.stop", "boolean"]),
    ("resume", {"value": 1, "values": {"a": 2}}, ['"spec.resume" must validate one and only one schema (oneOf)']),
    ("resume", {}, ['"spec.resume" must validate one and only one schema (oneOf)']),
    ("store", {"secretRef": {}}, ["spec.store.secretRef.name", "Required value"]),
    ("store", {"secretRef": {"name": "Upper_Case"}}, ["spec.store.secretRef.name", "should match"]),
    ("podTemplate.env", [{"name": "1-bad"}], ["spec.podTemplate.env[0].name", "should match"]),
    ("activeDeadlineSeconds", 0, ["spec.activeDeadlineSeconds", "greater than or equal to 1"]),
    ("ttlSecondsAfterFinished", -1, ["spec.ttlSecondsAfterFinished", "greater than or equal to 0"]),
    ("retry", 1001, ["spec.retry", "less than or equal to 1000"]),
    ("requestId", "", ["spec.requestId"]),
    ("input", ["not", "an", "object"], ["spec.input", "object"]),
]


def _mutate(spec: dict[str, Any], where: str, change: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(spec))
    *parents, leaf = where.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    if change is None:
        node.pop(leaf, None)
    else:
        node[leaf] = change
    return spec


@pytest.mark.kubesim_too  # kubesim's validator is held to kube-apiserver's messages
@settings(max_examples=40, **SETTINGS)  # type: ignore[arg-type]
@given(base=valid_spec, mutation=st.sampled_from(MUTATIONS), by_kubectl=st.booleans())
def test_a_spec_the_schema_refuses_is_refused_with_the_schemas_message(
    cluster: EmulatedCluster,
    operator: OperatorProcess,
    base: dict[str, Any],
    mutation: tuple[str, Any, list[str]],
    by_kubectl: bool,
) -> None:
    where, change, words = mutation
    spec = _mutate(base, where, change)
    body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "refused"}, "spec": spec}
    if by_kubectl:
        made = cluster.kubectl("create", "-f", "-", input=json.dumps(body))
        assert made.returncode != 0, f"kubectl created a spec the schema forbids ({where}={change!r})"
        message = made.stderr
    else:
        response = cluster.api("POST", PATH, body)
        assert response.status == 422, f"the API accepted a spec the schema forbids ({where}={change!r}): {response}"
        assert response.body["reason"] == "Invalid", response.body
        message = response.body["message"]
    for word in words:
        assert word in message, f"the refusal of {where}={change!r} does not say {word!r}: {message[:1000]}"
    assert cluster.get("agentruns", "refused") is None, "a refused spec was stored"
    assert operator.proc.poll() is None


# (field, new value, the CEL rule's message): updates the schema's transition rules refuse.
UPDATES: list[tuple[str, Any, str]] = [
    ("threadId", "another-thread", "threadId is immutable"),
    ("graph", "examples.support_agent:graph", "graph is immutable"),
    ("userId", "someone-else", "userId is immutable"),
    ("stop", False, "stop cannot be undone"),
]


@pytest.mark.kubesim_too
@settings(max_examples=12, **SETTINGS)  # type: ignore[arg-type]
@given(update=st.sampled_from(UPDATES), with_retry=st.booleans())
def test_an_update_the_schema_refuses_is_refused_with_the_rules_message(
    cluster: EmulatedCluster, operator: OperatorProcess, update: tuple[str, Any, str], with_retry: bool
) -> None:
    """With or without a valid change beside it (``spec.retry``): the whole update is refused."""
    where, value, words = update
    if cluster.get("agentruns", "fixed") is None:
        spec = {"graph": "examples.support_agent:app", "threadId": "fixed", "userId": "u1", "stop": True}
        body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "fixed"}, "spec": spec}
        assert cluster.api("POST", PATH, body).status == 201
    before = cluster.get("agentruns", "fixed")
    assert before is not None
    patch = {"spec": {where: value, **({"retry": 1} if with_retry else {})}}
    response = cluster.api("PATCH", f"{PATH}/fixed", patch, content_type="application/merge-patch+json")
    assert response.status == 422, f"the API accepted {patch}: {response}"
    assert words in response.body["message"], response.body["message"]
    after = cluster.get("agentruns", "fixed")
    assert after is not None and after["spec"] == before["spec"], "a refused update changed the spec"
    assert operator.proc.poll() is None
