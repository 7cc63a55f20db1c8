"""AgentRuns on real containers (issue 35 item 4 a, b, h, i): the chart's operator pod launches every runner pod.

The operator and the history server are the chart's Deployments on the node (``agentrun_chart``,
``tests/node/support.py``); a runner is a container that containerd and runc start, with the
restricted security context the operator gives it. The support agent of ``examples/`` keeps its
payment provider's records in a SQLite file in the pod's ``/tmp`` (an emptyDir, the only writable
place); the test keeps that file from the node's disk (``KeptFiles``), so charges are counted on
what the provider recorded in each pod, not on what the runner says it did. The store's ledger is
read from PostgreSQL, logs through ``kubectl logs`` (the API server asks the real kubelet).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.support_agent import count_effects
from tests.node.support import ROOT, InstalledChart, KeptFiles, dump

pytestmark = pytest.mark.timeout(600)

EXAMPLE = ROOT / "examples" / "agentrun.yaml"
EFFECTS = "support_effects.db"  # examples/agentrun.yaml's SUPPORT_EFFECTS_DB, in the pod's /tmp
RUN = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]  # support-order-4821
THREAD_ID = yaml.safe_load(EXAMPLE.read_text())["spec"]["threadId"]


def effects(kept: KeptFiles, pod: dict[str, Any]) -> dict[str, int]:
    """The payment provider's rows written by ``pod`` (all zero when it never wrote its file)."""
    path = kept.path(pod)
    if path is None:
        return {"tool_invocations": 0, "charges": 0, "receipts": 0, "refunds": 0}
    return count_effects(str(path))


def started_tools(log: str, tool: str) -> list[str]:
    """The runner's "tool started" lines for ``tool`` in a pod's log."""
    return [line for line in log.splitlines() if "tool started:" in line and f"({tool})" in line]


def exit_code(pod: dict[str, Any]) -> int | None:
    state = (pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}
    code = (state.get("terminated") or {}).get("exitCode")
    return None if code is None else int(code)


def test_kubectl_apply_of_the_example_succeeds_and_charges_once(
    agentrun_chart: InstalledChart, run_namespace: str
) -> None:
    """Item 4 a: ``kubectl apply -f examples/agentrun.yaml``, the file as it is."""
    chart, ns = agentrun_chart, run_namespace
    leader = chart.wait_for_leader()
    with KeptFiles(chart, EFFECTS).keep() as kept:
        applied = chart.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
        assert applied.returncode == 0, applied.stderr
        status = chart.wait_phase(ns, RUN, "Succeeded", "Failed")
        chart.wait_pod_ended(ns, f"{RUN}-1")
    (pod,) = chart.runner_pods(ns, RUN)
    log = chart.logs(ns, pod["metadata"]["name"])
    ledger = chart.ledger(f"{ns}/{THREAD_ID}")
    leader_log = chart.kubectl("logs", "-n", chart.namespace, leader).stdout

    assert status["phase"] == "Succeeded", dump(status)
    assert (status["attempt"], status.get("restarts", 0), status.get("disruptions", 0)) == (1, 0, 0), dump(status)
    assert status["toolCalls"] == {"executed": 3, "replayed": 0}, dump(status)
    assert pod["metadata"]["name"] == f"{RUN}-1" and pod["status"]["phase"] == "Succeeded" and exit_code(pod) == 0
    assert pod["spec"]["nodeName"] == chart.node.name
    assert pod["spec"]["containers"][0]["image"] == "localhost/agentrun-demo:dev"  # the chart's runner.image
    assert f"created pod {RUN}-1" in leader_log  # launched by the operator pod that leads
    # Charged once: the provider's own record in the pod, and one execution in the runner's log and the ledger.
    assert effects(kept, pod) == {"tool_invocations": 2, "charges": 1, "receipts": 1, "refunds": 0}
    assert len(started_tools(log, "charge_card")) == 1, log
    assert sorted(entry.tool_name for entry in ledger) == ["charge_card", "lookup_order", "send_receipt"]


# --- b: SIGKILL by the runtime right after charge_card was recorded ---------------------------------------------------


@dataclass
class KilledRun:
    """The run of scenario b, for its test and for the kubectl tests that read it afterwards."""

    namespace: str
    name: str
    status: dict[str, Any]
    pods: list[dict[str, Any]]
    recorded_at_kill: list[str]
    kept: KeptFiles


@pytest.fixture(scope="module")
def killed_run(agentrun_chart: InstalledChart) -> Iterator[KilledRun]:
    """The example, with send_receipt slowed down (the node is still running after charge_card was
    recorded), its first runner SIGKILLed through containerd as soon as the ledger holds the charge."""
    chart = agentrun_chart
    ns = chart.new_namespace("killed")
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["podTemplate"]["env"].append({"name": "SUPPORT_TOOL_DELAY_SEND_RECEIPT", "value": "15"})
    manifest["spec"]["restartPolicy"] = {"maxRestarts": 3, "backoffSeconds": 1}
    thread = f"{ns}/{THREAD_ID}"
    with KeptFiles(chart, EFFECTS).keep() as kept:
        applied = chart.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        assert applied.returncode == 0, applied.stderr
        first = chart.wait_runner(ns, f"{RUN}-1")

        def charge_recorded() -> list[str] | None:
            names = sorted(entry.tool_name for entry in chart.ledger(thread))
            return names if "charge_card" in names else None

        recorded = chart.wait_for(charge_recorded, timeout=120, message="charge_card in the ledger", interval=0.1)
        chart.kill_container(first, signal.SIGKILL)
        status = chart.wait_phase(ns, RUN, "Succeeded", "Failed", timeout=240)
        chart.wait_pod_ended(ns, f"{RUN}-2")
    yield KilledRun(ns, RUN, status, chart.runner_pods(ns, RUN), recorded, kept)
    chart.delete_namespace(ns)


def test_a_runner_sigkilled_by_the_runtime_after_the_charge_is_replayed_in_a_new_pod_and_charges_once(
    agentrun_chart: InstalledChart, killed_run: KilledRun
) -> None:
    """Item 4 b."""
    chart, run, status = agentrun_chart, killed_run, killed_run.status
    names = [p["metadata"]["name"] for p in run.pods]
    assert names == [f"{RUN}-1", f"{RUN}-2"], dump(names)
    first, second = run.pods
    first_log, second_log = chart.logs(run.namespace, names[0]), chart.logs(run.namespace, names[1])

    assert run.recorded_at_kill == ["charge_card", "lookup_order"]  # killed while send_receipt still ran
    assert exit_code(first) == 137 and first["status"]["phase"] == "Failed", dump(first["status"])
    assert exit_code(second) == 0 and second["status"]["phase"] == "Succeeded", dump(second["status"])
    assert status["phase"] == "Succeeded", dump(status)
    assert (status["attempt"], status["restarts"], status.get("disruptions", 0)) == (2, 1, 0), dump(status)
    assert status["attempts"][0]["exitCode"] == 137, dump(status["attempts"])
    # Attempt 1 executed lookup_order and charge_card and was killed in send_receipt (its intent recorded, no
    # result: in doubt); attempt 2 replayed the two and ran send_receipt again (its policy: retry, same key).
    assert status["toolCalls"] == {"executed": 3, "replayed": 2, "inDoubt": 1}, dump(status)
    # The provider's records, pod by pod: the charge was made once, by the first pod.
    assert effects(run.kept, first)["charges"] == 1 and effects(run.kept, first)["receipts"] == 0
    assert effects(run.kept, second) == {"tool_invocations": 1, "charges": 0, "receipts": 1, "refunds": 0}
    assert len(started_tools(first_log, "charge_card")) == 1, first_log
    assert started_tools(second_log, "charge_card") == [], second_log
    assert re.search(r"tool replayed: \S+ \(charge_card\) from the ledger", second_log), second_log


# --- h: the runner container, from inside ----------------------------------------------------------------------------

# Run in the runner container with kubectl exec: the runner (process 1) and this process, as the kernel reports them.
INSIDE = """
import errno, json, os
def status(pid):
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status") if ":" in line)
    return {k: fields[k].split() for k in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "Seccomp", "NoNewPrivs")}
try:
    open("/written-by-the-test", "w")
    root = "writable"
except OSError as e:
    root = errno.errorcode[e.errno]
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
print(json.dumps({
    "runner": status(1), "exec": status("self"), "cmdline": open("/proc/1/cmdline").read().split("\\0")[:3],
    "root": root, "tmp_writable": os.access("/tmp", os.W_OK), "token": os.path.exists(sa + "/token"),
    "sa_dir": os.path.exists(sa),
    "mounts_with_secrets": [line.split()[1] for line in open("/proc/1/mounts") if "secret" in line],
}))
"""


def test_inside_the_runner_container_it_is_non_root_read_only_without_capabilities_or_token_under_seccomp(
    agentrun_chart: InstalledChart, run_namespace: str
) -> None:
    """Item 4 h: read from the running container (kubectl exec through the real kubelet), not from the manifest."""
    chart, ns = agentrun_chart, run_namespace
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["podTemplate"]["env"].append({"name": "SUPPORT_TOOL_DELAY", "value": "3600"})  # hung in a tool
    applied = chart.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
    assert applied.returncode == 0, applied.stderr
    pod = chart.wait_runner(ns, f"{RUN}-1")
    done = chart.kubectl("exec", "-n", ns, f"{RUN}-1", "--", "python", "-c", INSIDE)
    assert done.returncode == 0, done.stderr
    inside = json.loads(done.stdout.strip().splitlines()[-1])

    for who in ("runner", "exec"):
        seen = inside[who]
        assert seen["Uid"] == ["65532"] * 4 and seen["Gid"] == ["65532"] * 4, dump(inside)  # real, effective, saved, fs
        assert seen["CapEff"] == seen["CapPrm"] == seen["CapBnd"] == ["0000000000000000"], dump(inside)
        assert seen["Seccomp"] == ["2"] and seen["NoNewPrivs"] == ["1"], dump(inside)  # a filter, no privilege gain
    assert inside["cmdline"] == ["python", "-m", "agentrun.runner"], dump(inside)  # the runner is process 1
    assert inside["root"] == "EROFS" and inside["tmp_writable"] is True, dump(inside)
    assert inside["token"] is False and inside["sa_dir"] is False, dump(inside)
    assert inside["mounts_with_secrets"] == [], dump(inside)
    # The same process seen from the host (containerd's task pid): a child of containerd's runc shim, as confined.
    host_pid = chart.container_pid(pod)
    on_host = dict(line.split(":", 1) for line in Path(f"/proc/{host_pid}/status").read_text().splitlines())
    parent = int(on_host["PPid"])
    assert Path(f"/proc/{parent}/comm").read_text().strip().startswith("containerd-shim"), parent
    assert on_host["Uid"].split() == ["65532"] * 4 and on_host["CapEff"].strip() == "0000000000000000"
    assert on_host["Seccomp"].strip() == "2" and on_host["NoNewPrivs"].strip() == "1"


# --- i: kubectl logs and kubectl agentrun through the real kubelet and the history server pod -------------------------


def test_kubectl_logs_and_kubectl_agentrun_logs_history_ui_read_the_killed_run_through_the_node(
    agentrun_chart: InstalledChart, killed_run: KilledRun
) -> None:
    """Item 4 i, on scenario b's run: two attempts, a SIGKILL, a replay."""
    chart, ns = agentrun_chart, killed_run.namespace
    plain = chart.kubectl("logs", "-n", ns, f"{RUN}-2")
    logs = chart.kubectl("agentrun", "-n", ns, "logs", RUN)
    history = chart.kubectl("agentrun", "-n", ns, "history", RUN, "-o", "json")
    table = chart.kubectl("agentrun", "-n", ns, "history", RUN)

    assert plain.returncode == 0 and "from the ledger" in plain.stdout, plain.stderr
    assert logs.returncode == 0, logs.stderr
    sections = re.findall(r"attempt (\d+)\b.*pod (\S+)", logs.stdout)
    assert [(a, p) for a, p in sections][:2] == [("1", f"{RUN}-1"), ("2", f"{RUN}-2")], logs.stdout
    assert len(started_tools(logs.stdout, "charge_card")) == 1, logs.stdout  # the first pod's, killed after it
    assert history.returncode == 0, history.stderr  # kubectl port-forward to the history Service, then its pod
    found = json.loads(history.stdout)
    assert [a["attempt"] for a in found["attempts"]] == [1, 2], dump(found["attempts"])
    (charge,) = [c for c in found["tool_calls"] if c["name"] == "charge_card"]
    assert charge["outcome"] == "replayed" and charge["attempt"] == 1 and charge["replayed_in"] == [2], dump(charge)
    assert table.returncode == 0 and any(
        line.strip().startswith("charge_card") and "replayed" in line for line in table.stdout.splitlines()
    ), table.stdout

    page = _through_ui(chart, ns)
    assert RUN in page and "Succeeded" in page, page[:2000]


def _through_ui(chart: InstalledChart, namespace: str) -> str:
    """``kubectl agentrun ui`` (its own port-forward to the history Service), then the run's page through it."""
    argv = ["kubectl", "agentrun", "-n", namespace, "ui", "--port", "0", "--no-browser"]
    errors = chart.workdir / "kubectl-agentrun-ui.log"
    with (
        errors.open("w") as err,
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=chart.kubectl_env()) as ui,
    ):
        try:
            assert ui.stdout is not None
            line = ui.stdout.readline()
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            assert found, f"kubectl agentrun ui printed no address: {line!r}\n{errors.read_text()}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{found.group(0)}/runs/{namespace}/{RUN}", timeout=30) as response:
                        return str(response.read().decode())
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
        finally:
            ui.send_signal(signal.SIGINT)
            try:
                ui.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ui.kill()
