"""The emulated-cluster demo: kubectl apply an AgentRun, SIGKILL its runner mid-tool, watch it resume.

    make demo

Everything is real except the Kubernetes control plane and node: the API
server is kubesim's emulator (``kubesim/``: kmock made faithful, serving the
AgentRun CRD from ``crds/``), and its kubelet stand-in runs each pod as a
process on this machine. The
operator (``python -m agentrun_operator``), the runner pods
(``python -m agentrun.runner``), PostgreSQL and ``kubectl`` are the real
things. Files land in ``.demo/``; the KUBECONFIG printed at the start lets you
poke at the cluster from another terminal while the demo runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import yaml

from agentrun_dev import launch
from agentrun_dev.launch import OperatorProcess
from kubesim import KOPF_PEERING_CRDS, EmulatedCluster, KubeletThread, default_base_env

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentrun.checkpoint.base import Progress  # noqa: E402
from agentrun.checkpoint.postgres import PgCheckpointer  # noqa: E402
from examples.support_agent import count_effects  # noqa: E402

# Where it runs: .demo/ and database agentrun_demo, both made anew each time (a test names its own).
WORK = Path(os.environ.get("AGENTRUN_DEMO_DIR", ROOT / ".demo"))
DATABASE = os.environ.get("AGENTRUN_DEMO_DATABASE", "agentrun_demo")
ADMIN_DSN = os.environ.get("AGENTRUN_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DSN = urlunsplit(urlsplit(ADMIN_DSN)._replace(path=f"/{DATABASE}"))  # the same server, the demo's database
RUN = "support-order-4821"
THREAD = "default/order-4821"
CRD_FILES = (*sorted((ROOT / "crds").glob("*.yaml")), KOPF_PEERING_CRDS)
BIN = str(Path(sys.executable).parent)  # kubectl-agentrun is installed next to this Python
RUNNER_IMAGES = ("ghcr.io/agentrun/agentrun:*",)  # the operator's default image: the kubelet runs it from this venv


def shown(path: Path) -> Path:
    """``path`` as a person in the checkout would type it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def start_operator(cluster: EmulatedCluster) -> OperatorProcess:
    """The real operator, with a snappy lease and grace periods (it reacts to events: no loop to speed up)."""
    return launch.start_operator(
        cluster.kubeconfig,
        identity="demo-operator",
        log_path=WORK / "operator.log",
        settings={"lease_duration_seconds": 3, "stop_grace_seconds": 15, "pod_grace_seconds": 10},
        env={"PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def progress(thread: str) -> Progress | None:
    async def read() -> Progress | None:
        store = PgCheckpointer(DSN)
        try:
            return await store.aget_progress(thread)
        finally:
            await store.aclose()

    return asyncio.run(read())


def banner(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def kubectl(cluster: EmulatedCluster, *args: str, input: str | None = None, show: bool = True) -> str:
    """The real kubectl; ``kubectl agentrun`` finds the plugin in this virtualenv's bin, as a user's shell would."""
    if show:
        print("$ kubectl " + " ".join(args), flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env.update(KUBECONFIG=str(cluster.kubeconfig), PATH=os.pathsep.join([BIN, os.environ.get("PATH", "")]))
    result = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=env, timeout=60)
    output = (result.stdout + result.stderr).rstrip()
    if show and output:
        print(output, flush=True)
    return output


async def fresh_database() -> None:
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await admin.close()


def wait(predicate, timeout: float = 60, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"demo failed: timed out waiting for {what} (logs in {WORK})")


def recorded_tools(thread: str) -> set[str]:
    async def read() -> set[str]:
        store = PgCheckpointer(DSN)
        try:
            return {entry.tool_name for entry in await store.ledger_list(thread)}
        finally:
            await store.aclose()

    return asyncio.run(read())


def backing_off(cluster: EmulatedCluster, name: str) -> str | None:
    """The status message of a run waiting out its restart backoff (reason BackOff), else None."""
    status = (cluster.get("agentruns", name) or {}).get("status") or {}
    if status.get("reason") == "BackOff" or status.get("attempt", 1) > 1:
        return str(status.get("message") or "restarted")
    return None


def phase(cluster: EmulatedCluster, name: str) -> str | None:
    run = cluster.get("agentruns", name) or {}
    return (run.get("status") or {}).get("phase")


def show_metrics(port: int, text: str) -> None:
    """Say where the operator's metrics are (and keep what it served), with the few lines this demo moved."""
    snapshot = WORK / "operator-metrics.txt"
    snapshot.write_text(text)
    banner("6. Metrics")
    wanted = (
        "agentrun_operator_reschedules_total{",
        "agentrun_operator_tool_calls_total{",
        "agentrun_operator_stop_latency_seconds_count",
        'agentrun_operator_runs{namespace="default",phase="Succeeded"}',
    )
    for line in text.splitlines():
        if line.startswith(wanted) and not line.rstrip().endswith(" 0.0"):
            print("  " + line)
    print(f"the operator served Prometheus metrics at http://127.0.0.1:{port}/metrics during the demo")
    print(f"  (liveness at /healthz, role at /readyz); what it served at the end: {shown(snapshot)}")
    print("  in a cluster: Service agentrun-operator-metrics:8080/metrics (helm value metrics.serviceMonitor.enabled")
    print("  for the Prometheus Operator), Grafana dashboard: helm/agentrun/dashboards/agentrun.json")


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir()
    asyncio.run(fresh_database())
    effects = WORK / "effects.db"
    cluster = EmulatedCluster(WORK / "cluster", crd_files=CRD_FILES).start()
    kubelet = KubeletThread(
        cluster.url, WORK / "kubelet", known_images=RUNNER_IMAGES, base_env=default_base_env(pythonpath=[ROOT])
    ).start()
    operator = None
    try:
        banner("1. An emulated cluster, a local kubelet, the real operator")
        print(f"export KUBECONFIG={cluster.kubeconfig}    # to follow along from another terminal")
        kubectl(cluster, "create", "secret", "generic", "agentrun-store", f"--from-literal=postgresDsn={DSN}")
        operator = start_operator(cluster)
        wait(lambda: operator.role() == "leader", 30, "the operator to lead")
        print(f"operator is {operator.role()} (log: {shown(operator.log_path)})")

        banner("2. kubectl apply -f examples/agentrun.yaml")
        manifest = yaml.safe_load((ROOT / "examples" / "agentrun.yaml").read_text())
        manifest["spec"]["podTemplate"]["env"] = [
            {"name": "SUPPORT_EFFECTS_DB", "value": str(effects)},
            {"name": "SUPPORT_TOOL_DELAY", "value": "0.2"},
            {"name": "SUPPORT_TOOL_DELAY_SEND_RECEIPT", "value": "4"},  # the node is still busy after the charge
        ]
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(manifest))
        wait(lambda: "charge_card" in recorded_tools(THREAD), 60, "charge_card to be recorded")
        kubelet.kill(f"{RUN}-1")

        banner(f"3. The runner of pod {RUN}-1 was SIGKILLed right after charge_card was recorded")
        print(
            f"charges so far: {count_effects(str(effects))['charges']}; "
            f"ledger: {', '.join(sorted(recorded_tools(THREAD)))}"
        )
        backoff = wait(lambda: backing_off(cluster, RUN), 60, "the operator to see the crash")
        print(f"the operator counts a crash and waits out the restart backoff: {backoff}")
        print("  (spec.restartPolicy.backoffSeconds, 5 s by default, doubling with each crash; evictions do not wait)")
        kubectl(cluster, "get", "ar")
        wait(lambda: phase(cluster, RUN) == "Succeeded", 90, "the run to succeed")

        banner("4. The operator rescheduled it; the new pod resumed from the checkpoint")
        kubectl(cluster, "get", "ar", "-o", "wide")
        kubectl(cluster, "get", "pods")
        kubectl(cluster, "agentrun", "describe", RUN)
        logs = kubelet.logs(f"{RUN}-2")
        for line in logs.splitlines():
            if "from the ledger" in line or "retrying with the same idempotency key" in line:
                print("  " + line.split(": ", 1)[-1])
        effects_now = count_effects(str(effects))
        print(f"charges: {effects_now['charges']}   receipts: {effects_now['receipts']}")

        banner("5. A run hung inside a tool, stopped with kubectl patch")
        manifest["metadata"]["name"] = "hung-order"
        manifest["spec"]["threadId"] = "hung-order"
        manifest["spec"]["podTemplate"]["env"][1:] = [{"name": "SUPPORT_TOOL_DELAY", "value": "3600"}]
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(manifest))
        wait(lambda: (p := progress("default/hung-order")) and p.current_node == "tools", 60, "the hung tool")
        time.sleep(0.5)
        asked = time.monotonic()
        kubectl(cluster, "patch", "ar", "hung-order", "--type", "merge", "-p", '{"spec":{"stop":true}}')
        wait(lambda: phase(cluster, "hung-order") == "Stopped", 60, "the run to stop")
        print(f"stopped {time.monotonic() - asked:.1f}s after the patch")
        kubectl(cluster, "get", "ar")

        ok = effects_now["charges"] == 1 and phase(cluster, RUN) == "Succeeded"
        print(
            "\n\033[32mcharged exactly once, across a SIGKILL and a new pod.\033[0m"
            if ok
            else "\n\033[31mDEMO FAILED\033[0m"
        )
        show_metrics(operator.port, operator.metrics())
        banner("7. Keep a cluster")
        print("this demo's cluster stops with it. For one that stays up, with your own AgentRuns and graphs:")
        print("  make cluster                                   # prints the export KUBECONFIG=... line")
        print("  kubectl apply -f examples/approval.yaml        # in another terminal")
        print("  kubectl agentrun watch refund-order-4821       # and: kubectl agentrun approve refund-order-4821")
        return 0 if ok else 1
    finally:
        if operator is not None:
            operator.stop()
        kubelet.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
