"""The real operator process on the emulated cluster, plus helpers the operator tests share."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrun.checkpoint.base import Progress
from agentrun.checkpoint.postgres import PgCheckpointer
from kubesim import EmulatedCluster

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int
    identity: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def role(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as response:
                body: bytes = response.read()
                return body.decode()
        except OSError:
            return None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as response:
            body: bytes = response.read()
            return body.decode()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_operator(cluster: EmulatedCluster, workdir: Path, identity: str = "op-1", **env: str) -> OperatorProcess:
    port = free_port()
    log_path = workdir / f"operator-{identity}-{time.monotonic_ns()}.log"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    environment.update(
        KUBECONFIG=str(cluster.kubeconfig),
        PYTHONPATH=str(ROOT),
        AGENTRUN_OPERATOR_IDENTITY=identity,
        AGENTRUN_OPERATOR_METRICS_PORT=str(port),
        AGENTRUN_OPERATOR_LEASE_NAMESPACE="default",
        AGENTRUN_OPERATOR_LEASE_DURATION_SECONDS="3",
        AGENTRUN_OPERATOR_STOP_GRACE_SECONDS="15",
        AGENTRUN_OPERATOR_POD_GRACE_SECONDS="10",
        AGENTRUN_OPERATOR_RUNNER_METRICS_PORT="0",
        AGENTRUN_OPERATOR_DEFAULT_IMAGE="agentrun:test",
    )
    environment.update(env)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrun_operator"], env=environment, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    return OperatorProcess(proc, log_path, port, identity)


def agentrun(
    name: str,
    *,
    thread: str,
    graph: str = "examples.support_agent:app",
    effects: Path,
    text: str = "charge my saved card for order 4821 and email me the receipt",
    env: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    variables = [
        {"name": "SUPPORT_EFFECTS_DB", "value": str(effects)},
        {"name": "CLUSTER_EFFECTS", "value": str(effects) + ".log"},
    ]
    variables += [{"name": k, "value": v} for k, v in (env or {}).items()]
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "graph": graph,
            "threadId": thread,
            "input": {"messages": [{"role": "user", "content": text}]},
            "store": {"secretRef": {"name": "agentrun-store"}},
            "podTemplate": {"env": variables},
            **spec,
        },
    }


def apply(cluster: EmulatedCluster, manifest: dict[str, Any], namespace: str = "default") -> None:
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    assert result.returncode == 0, result.stderr


def progress(dsn: str, thread: str) -> Progress | None:
    async def read() -> Progress | None:
        store = PgCheckpointer(dsn)
        try:
            return await store.aget_progress(thread)
        finally:
            await store.aclose()

    return asyncio.run(read())


def executions(effects: Path) -> list[str]:
    path = Path(str(effects) + ".log")
    return path.read_text().splitlines() if path.exists() else []
