"""``kubectl agentrun`` through the real kubectl binary against the emulated cluster and the real operator.

kubectl discovers the plugin on PATH (the virtualenv's ``bin``, where
``pip install`` put ``kubectl-agentrun``), exactly as a user's kubectl does;
the plugin reads the AgentRun, its Events and its pods and patches the spec,
with nothing but the kubeconfig. Runner pods are real processes on the
kubelet stand-in, the store is the real PostgreSQL.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.support_agent import count_effects
from kubesim import KUBECTL, EmulatedCluster, KubeletThread
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    executions,
    status,
    wait_phase,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.real_server]  # every scenario also on the real control plane

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def plugin_env(cluster: EmulatedCluster) -> dict[str, str]:
    """The user's shell: KUBECONFIG set, the virtualenv's bin (with kubectl-agentrun) on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin:/bin")])
    return env


def agentrun_cli(cluster: EmulatedCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun ARGS``: the real kubectl, which finds the plugin on PATH."""
    return subprocess.run(
        [KUBECTL, "agentrun", *args], capture_output=True, text=True, env=plugin_env(cluster), timeout=timeout
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"kubectl agentrun failed ({result.returncode}): {result.stderr}{result.stdout}"
    return result.stdout


def approval_run(name: str, effects: Path) -> dict[str, Any]:
    """examples/approval.yaml, with the effects file in the test's folder."""
    manifest = yaml.safe_load((ROOT / "examples" / "approval.yaml").read_text())
    manifest["metadata"]["name"] = name
    manifest["spec"]["threadId"] = name
    manifest["spec"]["podTemplate"]["env"] = [{"name": "SUPPORT_EFFECTS_DB", "value": str(effects)}]
    return dict(manifest)


def test_kubectl_finds_the_plugin_on_path(cluster: EmulatedCluster) -> None:
    plugins = subprocess.run(
        [KUBECTL, "plugin", "list"], capture_output=True, text=True, env=plugin_env(cluster), timeout=30
    )
    assert str(BIN / "kubectl-agentrun") in plugins.stdout, plugins.stdout + plugins.stderr
    assert "No AgentRuns" in ok(agentrun_cli(cluster, "list")) + agentrun_cli(cluster, "list").stderr


def test_unknown_run_is_a_clear_error(cluster: EmulatedCluster) -> None:
    for command in ("describe", "approve", "reject", "stop", "logs", "watch"):
        result = agentrun_cli(cluster, command, "no-such-run")
        assert result.returncode == 1, f"{command}: {result.stdout}{result.stderr}"
        assert 'agentrun "no-such-run" not found in namespace "default"' in result.stderr, (command, result.stderr)
        assert "Traceback" not in result.stderr


def test_a_crash_and_a_replay_show_in_list_describe_logs_and_watch(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    manifest = agentrun(
        "replayed",
        thread="replayed",
        effects=effects,
        # The receipt is sent slowly (8 s): the SIGKILL lands while it is, however late the watch shows attempt 1.
        env={"SUPPORT_TOOL_DELAY": "0.2", "SUPPORT_TOOL_DELAY_SEND_RECEIPT": "8"},
        restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
    )
    apply(cluster, manifest)
    watch = subprocess.Popen(
        [KUBECTL, "agentrun", "watch", "replayed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(cluster),
    )
    lines: list[str] = []

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            lines.append(line)

    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    try:
        # The card is charged (and recorded) and the watch shows attempt 1 running (its start, two kubectl
        # processes, took seconds on a loaded CI machine); the receipt is still being sent: a SIGKILL now.
        cluster.wait_for(lambda: count_effects(str(effects))["charges"] == 1, timeout=60, message="the charge")
        cluster.wait_for(
            lambda: any("Running" in line and "attempt=1" in line for line in lines),
            timeout=60,
            message=f"the watch to show attempt 1 running: {lines}",
        )
        time.sleep(0.3)
        kubelet.kill("replayed-1")
        wait_phase(cluster, operator, "replayed", "Succeeded", timeout=90)
        watch.wait(timeout=30)
        reading.join(timeout=30)
        err = watch.stderr.read()  # type: ignore[union-attr]
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        for stream in (watch.stdout, watch.stderr):
            if stream is not None:
                stream.close()
    out = "".join(lines)
    assert watch.returncode == 0, f"watch must exit 0 on Succeeded: {out}{err}"
    shown = out.splitlines()
    assert any("Running" in line and "attempt=1" in line for line in shown), out
    assert any("attempt=2" in line for line in shown), out
    assert "Succeeded" in shown[-2] or "Succeeded" in shown[-1], out
    assert len(shown) == len(set(shown)), f"watch printed identical lines: {out}"

    listing = ok(agentrun_cli(cluster, "list")).splitlines()
    assert listing[0].split() == ["NAME", "PHASE", "NODE", "VERSION", "ATTEMPT", "TOOLS", "AGE", "WAITING"]
    row = next(line.split() for line in listing if line.startswith("replayed "))
    assert row[1:3] == ["Succeeded", "__end__"] and row[4] == "2", listing

    described = ok(agentrun_cli(cluster, "describe", "replayed"))
    attempts = described[described.index("Attempts:") : described.index("Events:")].splitlines()
    assert len(attempts) == 4, f"two attempts and a header: {described}"
    first, second = attempts[2].split(), attempts[3].split()
    assert first[:2] == ["1", "replayed-1"] and "Crashed" in first and "137" in first, described
    assert second[:2] == ["2", "replayed-2"] and "Completed" in second, described
    assert "replayed from the ledger 2" in described, f"the replayed calls must show: {described}"
    assert "BackOff" in described and "Completed" in described, "the run's Events must show"

    logs = ok(agentrun_cli(cluster, "logs", "replayed"))
    one, two = logs.split("==> attempt 2, pod replayed-2 <==")
    assert one.startswith("==> attempt 1, pod replayed-1 <==")
    assert "executed " in one and "(charge_card)" in one, f"attempt 1 ran the charge: {one}"
    assert "replayed " in two and "(charge_card) from the ledger" in two, f"attempt 2 replayed it: {two}"
    only = ok(agentrun_cli(cluster, "logs", "replayed", "--attempt", "2"))
    assert only.startswith("==> attempt 2") and "attempt 1" not in only
    missing = agentrun_cli(cluster, "logs", "replayed", "--attempt", "7")
    assert missing.returncode == 1 and "has no attempt 7 (attempts: 1, 2)" in missing.stderr
    assert count_effects(str(effects))["charges"] == 1


def test_approve_resumes_an_interrupted_run_to_succeeded(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, approval_run("refund", effects))
    paused = wait_phase(cluster, operator, "refund", "Interrupted")
    assert paused["waitingFor"] == "refund 49.99 for order 4821?", paused
    got = cluster.kubectl("get", "ar", "refund")
    assert got.returncode == 0 and "refund 49.99 for order 4821?" in got.stdout, "kubectl get ar: what it waits for"
    listing = ok(agentrun_cli(cluster, "list"))
    assert "refund 49.99 for order 4821?" in listing, listing
    described = ok(agentrun_cli(cluster, "describe", "refund"))
    assert "Waiting for:  refund 49.99 for order 4821?" in described, described
    assert paused["interrupt"]["id"] in described and '"amount_cents": 4999' in described, described

    bad = agentrun_cli(cluster, "approve", "refund", "--value", "{amount: 10}")
    assert bad.returncode == 1 and "--value is not JSON" in bad.stderr, bad.stderr
    wrong = agentrun_cli(cluster, "approve", "refund", "--id", "nope")
    assert wrong.returncode == 1 and "not nope" in wrong.stderr, wrong.stderr
    assert status(cluster, "refund")["phase"] == "Interrupted", "a refused answer must not resume the run"

    follow = subprocess.Popen(
        [KUBECTL, "agentrun", "logs", "refund", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(cluster),
    )
    try:
        said = ok(agentrun_cli(cluster, "approve", "refund", "--value", '{"amount_cents": 2000}'))
        assert "approved" in said
        final = wait_phase(cluster, operator, "refund", "Succeeded")
        followed, _ = follow.communicate(timeout=30)  # -f ends by itself once the run ended
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, followed
    assert "==> attempt 1, pod refund-1 <==" in followed and "==> attempt 2, pod refund-2 <==" in followed
    resumed = followed.split("==> attempt 2")[1]
    assert "(refund) in " in resumed and "(lookup_order) from the ledger" in resumed, followed
    assert final["result"]["message"] == "Your refund is on its way."
    assert "waitingFor" not in final, "an answered run waits for nothing"
    assert count_effects(str(effects))["refunds"] == 1
    again = agentrun_cli(cluster, "approve", "refund")
    assert again.returncode == 1, again.stdout
    assert "agentrun refund is not waiting for approval: its phase is Succeeded" in again.stderr, again.stderr


def test_reject_answers_false_and_the_run_declines(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, approval_run("declined", effects))
    wait_phase(cluster, operator, "declined", "Interrupted")
    ok(agentrun_cli(cluster, "reject", "declined"))
    final = wait_phase(cluster, operator, "declined", "Succeeded")
    assert "not approved" in final["result"]["message"]
    assert count_effects(str(effects))["refunds"] == 0, "a rejected refund must not be paid"
    assert [a["outcome"] for a in final["attempts"]] == ["Interrupted", "Completed"], final["attempts"]


def test_retry_reopens_a_failed_run_and_refuses_a_run_it_cannot_reopen(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    # Its first attempt crashes inside its node; no restart allowed: Failed BackoffLimitExceeded.
    flaky = agentrun(
        "flaky",
        thread="flaky",
        graph="tests.cluster.crashes_once:app",
        effects=tmp_path / "e.db",
        env={"CLUSTER_CRASH": "node:1"},
        restartPolicy={"maxRestarts": 0, "backoffSeconds": 0},
    )
    apply(cluster, flaky)
    failed = wait_phase(cluster, operator, "flaky", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert "kubectl agentrun retry flaky" in ok(agentrun_cli(cluster, "describe", "flaky"))
    said = ok(agentrun_cli(cluster, "retry", "flaky"))
    assert "agentrun flaky: retry 1 requested (it failed: BackoffLimitExceeded" in said, said
    final = wait_phase(cluster, operator, "flaky", "Succeeded")
    assert (final["observedRetry"], final["attempt"], final["restarts"]) == (1, 2, 0), final
    assert (cluster.get("agentruns", "flaky") or {})["spec"]["retry"] == 1
    assert executions(tmp_path / "e.db") == ["work:1", "work:2"], "the retry ran the node once more"
    done = agentrun_cli(cluster, "retry", "flaky")
    assert done.returncode == 1 and "flaky succeeded: there is nothing to retry" in done.stderr, done.stderr

    # A stop is one-way: the command says so and what to do instead, and changes nothing.
    apply(cluster, agentrun("halted", thread="halted", effects=tmp_path / "h.db", stop=True))
    wait_phase(cluster, operator, "halted", "Stopped")
    refused = agentrun_cli(cluster, "retry", "halted")
    assert refused.returncode == 1 and "spec.stop is one-way" in refused.stderr, refused.stderr
    assert "new AgentRun with the same threadId" in refused.stderr
    assert (cluster.get("agentruns", "halted") or {})["spec"].get("retry", 0) == 0, "nothing patched"


def test_stop_ends_a_run_hung_in_a_tool(cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path) -> None:
    apply(cluster, agentrun("hung", thread="hung", effects=tmp_path / "e.db", env={"SUPPORT_TOOL_DELAY": "3600"}))
    cluster.wait_for(
        lambda: status(cluster, "hung").get("currentNode") == "tools", timeout=60, message="hung inside its tools"
    )
    time.sleep(0.5)
    not_waiting = agentrun_cli(cluster, "approve", "hung")
    assert not_waiting.returncode == 1 and "is not waiting for approval: its phase is Running" in not_waiting.stderr
    said = ok(agentrun_cli(cluster, "stop", "hung"))
    assert "stop requested" in said
    final = wait_phase(cluster, operator, "hung", "Stopped", timeout=30)
    assert final["reason"] == "Stopped", final
    (attempt,) = final["attempts"]
    assert attempt["outcome"] == "Stopped" and attempt["exitCode"] == 4, attempt
    assert "exit 4 is no failure" in attempt.get("message", ""), "the pod must say why it ended with a non-zero code"
    late = agentrun_cli(cluster, "stop", "hung")
    assert late.returncode == 1 and "already ended (Stopped)" in late.stderr, late.stderr


def watched(stream: str) -> list[dict[str, Any]]:
    """The objects ``kubectl get -w -o json`` printed, in order."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while stream[at:].strip():
        at += len(stream[at:]) - len(stream[at:].lstrip())
        obj, at = decoder.raw_decode(stream, at)
        objects.append(obj)
    return objects


def test_kubectl_get_w_prints_no_status_row_that_repeats_the_one_before(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, tmp_path: Path
) -> None:
    watch = subprocess.Popen(
        [KUBECTL, "get", "ar", "--watch", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(cluster),
    )
    try:
        time.sleep(1)  # the watch is open before the run exists, as a user's terminal would be
        apply(cluster, agentrun("quiet", thread="quiet", effects=tmp_path / "e.db", env={"SUPPORT_TOOL_DELAY": "0.3"}))
        wait_phase(cluster, operator, "quiet", "Succeeded")
        time.sleep(1.5)
    finally:
        watch.terminate()
        out, _ = watch.communicate(timeout=30)
    objects = [o for o in watched(out) if o["metadata"]["name"] == "quiet"]
    # What each printed row shows: the CRD's printer columns but AGE (the watch prints one row per event).
    columns = ("phase", "currentNode", "stateVersion", "attempt", "restarts", "disruptions", "reason")
    shown = [(*((o.get("status") or {}).get(k) for k in columns), o["spec"].get("threadId")) for o in objects]
    assert shown[0][0] == "Pending", f"the first row, the run's creation, shows the CRD's default phase: {shown}"
    assert shown[-1][0] == "Succeeded", shown
    assert all(row[0] for row in shown), f"a row without a phase: {shown}"
    repeated = [(i, row) for i, (before, row) in enumerate(itertools.pairwise(shown), start=1) if before == row]
    assert not repeated, f"kubectl get ar -w printed a row identical to the one before it: {repeated} of {shown}"
    ours = [
        (o["metadata"].get("finalizers"), [k for k in o["metadata"].get("annotations") or {} if "agentrun.dev" in k])
        for o in objects
    ]
    assert all(f is None and not a for f, a in ours), f"the operator wrote the run's metadata: {ours}"


def test_a_run_waiting_on_two_interrupts_is_answered_by_id(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, agentrun("two", thread="two", graph="tests.cluster.graphs:two_sign_offs", effects=effects))
    paused = wait_phase(cluster, operator, "two", "Interrupted")
    ids = paused["interrupt"]["ids"]
    assert len(ids) == 2, paused
    assert "2 interrupts:" in ok(agentrun_cli(cluster, "list"))
    which = agentrun_cli(cluster, "approve", "two")
    assert which.returncode == 1 and f"waits on 2 interrupts ({ids[0]}, {ids[1]})" in which.stderr, which.stderr
    assert "--id ID" in which.stderr and "--all" in which.stderr
    ok(agentrun_cli(cluster, "approve", "two", "--id", ids[0], "--value", '"yes"'))
    # The answered call goes on; the other asks again, as the only interrupt left.
    cluster.wait_for(
        lambda: (s := status(cluster, "two")).get("phase") == "Interrupted" and s.get("attempt") == 2,
        timeout=60,
        message="two waiting again on the unanswered interrupt",
    )
    assert status(cluster, "two")["interrupt"]["ids"] == [ids[1]]
    ok(agentrun_cli(cluster, "reject", "two"))
    final = wait_phase(cluster, operator, "two", "Succeeded")
    assert final["attempt"] == 3
    done = executions(effects)
    assert sorted(done) == ['sign_off:finance:"yes"', "sign_off:legal:false"], done


def waiting_on(cluster: EmulatedCluster, name: str, interrupt_id: str, question: str, amount: str) -> str:
    """The run's status as the operator writes it for a question (the status subresource): its merge patch."""
    interrupt = {"id": interrupt_id, "ids": [interrupt_id], "message": question, "payload": {"amount": amount}}
    patch = json.dumps({"status": {"phase": "Interrupted", "interrupt": interrupt}})
    done = cluster.kubectl("patch", "agentrun", name, "--subresource=status", "--type", "merge", "-p", patch)
    assert done.returncode == 0, done.stderr
    return patch


def test_an_answer_names_and_shows_the_question_and_never_lands_on_another(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    # No operator: the test writes the status, so the run can move on at the exact moment that matters.
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "payout"},
        "spec": {"graph": "tests.cluster.graphs:approval", "threadId": "payout"},
    }
    apply(cluster, manifest)
    spoof = "Refund to IBAN \u202e1234 5678 9000 00DE\u202c - approve?"
    waiting_on(cluster, "payout", "r-1", spoof, "\u202e00.0001\u202c")
    described = agentrun_cli(cluster, "describe", "payout")
    assert "\u202e" not in described.stdout, "GUARANTEE BROKEN: the terminal got a bidi override it draws backwards"
    assert "Refund to IBAN \\u202e1234 5678 9000 00DE\\u202c" in described.stdout, described.stdout
    assert '"amount": "\\u202e00.0001\\u202c"' in described.stdout, described.stdout
    assert "--id r-1" in described.stdout and "U+202E RIGHT-TO-LEFT OVERRIDE" in described.stderr, described.stderr

    wrong = agentrun_cli(cluster, "approve", "payout", "--id", "r-0")
    assert wrong.returncode == 1 and "waits on interrupt(s) r-1, not r-0" in wrong.stderr, wrong.stderr
    assert "\\u202e1234" in wrong.stderr and "\u202e" not in wrong.stderr

    # The run moves on to r-2 between the command's read and its patch: the patch must not land on r-2.
    real = Path(KUBECTL).resolve()
    wrapper = tmp_path / "kubectl"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# The real kubectl; once, just before the plugin's patch, the run moves on (as the operator would).\n"
        'for arg in "$@"; do\n'
        '  if [ "$arg" = patch ] && [ -e "$MOVE_MARK" ]; then\n'
        '    rm -f "$MOVE_MARK"\n'
        f'    "{real}" patch agentrun payout --subresource=status --type merge -p "$MOVE_PATCH" >/dev/null\n'
        "  fi\n"
        "done\n"
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    mark = tmp_path / "move-once"
    mark.touch()
    move = {"id": "r-2", "ids": ["r-2"], "message": "refund $1,000,000?", "payload": {"amount": "1000000.00"}}
    env = plugin_env(cluster)
    env.update(KUBECTL=str(wrapper), MOVE_MARK=str(mark), MOVE_PATCH=json.dumps({"status": {"interrupt": move}}))
    raced = subprocess.run(
        [KUBECTL, "agentrun", "approve", "payout"], capture_output=True, text=True, env=env, timeout=60
    )
    assert not mark.exists(), "the run was not moved on: the race never happened"
    assert raced.returncode == 1, (
        f"GUARANTEE BROKEN: an answer read for r-1 was patched in after the run moved on to r-2: {raced.stdout}"
    )
    assert "nothing was answered" in raced.stderr and "refund $1,000,000?" in raced.stderr, raced.stderr
    assert "resume" not in (cluster.get("agentruns", "payout") or {})["spec"]

    said = ok(agentrun_cli(cluster, "approve", "payout"))
    assert 'approved interrupt r-2, "refund $1,000,000?" (payload {"amount": "1000000.00"})' in said, said
    assert (cluster.get("agentruns", "payout") or {})["spec"]["resume"] == {"values": {"r-2": True}}
