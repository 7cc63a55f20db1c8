"""``AGENTRUN_DEV_K8S=node make cluster`` (``agentrun-dev --api-server node``): the real node with the chart, kept
for a person, started and stopped the way a person does (issue 35 item 6).

The test runs ``agentrun-dev --api-server node`` as a process in its own process group (as a terminal
would), waits for its banner, does what the banner says with the real kubectl (``kubectl apply -f
examples/agentrun.yaml`` in namespace ``default``), and presses Ctrl-C (SIGINT to the group): the node
must leave nothing on this machine (``kubesim.nodehost.inventory``), and no process of the group is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrun.checkpoint.postgres import PgCheckpointer
from kubesim import nodehost
from tests.cluster.processes import alive, descendants
from tests.node.conftest import Images

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUN, THREAD = "support-order-4821", "default/order-4821"  # examples/agentrun.yaml's run and its thread


class DevNode:
    """``agentrun-dev --api-server node`` in its own process group, its output in a file."""

    def __init__(self, workdir: Path, images: Images) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_DEV_"))}
        env.update(PATH=os.pathsep.join([str(BIN), env.get("PATH", "")]), AGENTRUN_IMAGE_CACHE=str(images.cache))
        self.out = workdir.parent / "agentrun-dev.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "agentrun-dev"), "--api-server", "node", "--workdir", str(workdir)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def read_until(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (match := re.search(pattern, self.output, re.MULTILINE)) is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"agentrun-dev never printed {pattern!r}; output:\n{self.output}")
            time.sleep(0.5)
        return match

    def interrupt(self, timeout: float = 180) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env.update(KUBECONFIG=kubeconfig, PATH=os.pathsep.join([str(BIN), env.get("PATH", "")]))
    return subprocess.run(["kubectl", *args], capture_output=True, text=True, env=env, timeout=60, check=False)


def wait_phase(kubeconfig: str, phase: str, timeout: float = 300) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        got = kubectl(kubeconfig, "get", "agentrun", RUN, "-o", "json")
        run = json.loads(got.stdout) if got.returncode == 0 else {}
        if run.get("status", {}).get("phase") == phase:
            return dict(run)
        if time.monotonic() > deadline:
            pods = kubectl(kubeconfig, "get", "pods", "-A", "-o", "wide").stdout
            raise AssertionError(f"{RUN} never reached {phase}: {run.get('status')}\n{pods}")
        time.sleep(1)


def ledger(dsn: str) -> list[str]:
    async def read() -> list[str]:
        store = PgCheckpointer(dsn)
        try:
            return sorted(entry.tool_name for entry in await store.ledger_list(THREAD))
        finally:
            await store.aclose()

    return asyncio.run(read())


def test_make_cluster_node_runs_the_example_on_the_chart_and_ctrl_c_leaves_nothing(
    images: Images, tmp_path: Path
) -> None:
    dev = DevNode(tmp_path / "dev", images)
    try:
        kubeconfig = dev.read_until(r"^export KUBECONFIG=(\S+)$", timeout=600)[1]
        node_name = dev.read_until(r"node (agentrun-node-\d+),", timeout=5)[1]
        store_dsn = dev.read_until(r"store\s+PostgreSQL (\S+)", timeout=5)[1]
        slot = nodehost.Slot(int(node_name.removeprefix(nodehost.PREFIX)))
        assert not nodehost.inventory(slot).empty(), "the banner's node must be the one running (its slot in use)"

        # What the banner says to type: the example as it is, in namespace default, with the Secret in place.
        applied = kubectl(kubeconfig, "apply", "-f", "examples/agentrun.yaml")
        assert applied.returncode == 0, applied.stderr
        run = wait_phase(kubeconfig, "Succeeded")
        pods = json.loads(kubectl(kubeconfig, "get", "pods", "-l", f"agentrun.dev/run={RUN}", "-o", "json").stdout)
        assert len(pods["items"]) == 1, f"one runner pod: {run.get('status')}"
        pod = pods["items"][0]
        assert pod["spec"]["nodeName"] == node_name, "the runner ran as a container on the real node"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
        operators = kubectl(
            kubeconfig,
            "get",
            "pods",
            "-n",
            "agentrun-system",
            "-l",
            "app.kubernetes.io/component=operator",
            "-o",
            "name",
        )
        assert len(operators.stdout.split()) == 2, f"the chart's operator Deployment runs it: {operators}"
        assert ledger(store_dsn) == ["charge_card", "lookup_order", "send_receipt"], "charged once, in the store"
        group = descendants(dev.proc.pid)

        assert dev.interrupt() == 0, dev.output
    finally:
        dev.kill()
    assert "stopped." in dev.output, dev.output
    left = nodehost.inventory(slot)
    assert left.empty(), f"Ctrl-C must leave nothing of the node: {left}"
    assert [pid for pid in group if alive(pid)] == [], "every process agentrun-dev started must be gone"


def test_a_postgres_dsn_with_node_mode_is_a_clear_error(tmp_path: Path) -> None:
    """The node's store is its own: a DSN from the other modes' environment is refused, naming what to unset."""
    env = {**os.environ, "AGENTRUN_DEV_POSTGRES_DSN": "postgresql://postgres@127.0.0.1/elsewhere"}
    done = subprocess.run(
        [str(BIN / "agentrun-dev"), "--api-server", "node", "--workdir", str(tmp_path / "dev")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert "AGENTRUN_DEV_POSTGRES_DSN" in done.stderr and "unset it" in done.stderr, done.stderr
    assert not (tmp_path / "dev").exists(), "nothing started"
