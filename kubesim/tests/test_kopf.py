"""A real kopf operator process against the emulated cluster (handlers, finalizers, events, peering)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesim import EmulatedCluster

HANDLERS = Path(__file__).parent / "operators" / "kopf_smoke.py"
NAME = "smoke"
WIDGET = {"apiVersion": "kubesim.dev/v1", "kind": "Widget", "metadata": {"name": NAME}, "spec": {"owner": "me"}}


@pytest.fixture
def kopf_operator(cluster: EmulatedCluster, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    peering = cluster.api(
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "default"}},
    )
    assert peering.status == 201
    marker = tmp_path / "deleted"
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "KOPF_SMOKE_MARKER": str(marker),
    }
    log = tmp_path / "kopf.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "kopf", "run", "--all-namespaces", "--peering=default", "--verbose", str(HANDLERS)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process, marker
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, f"kopf failed against the emulator:\n{text[-5000:]}"


def phase(cluster: EmulatedCluster) -> Any:
    return (cluster.get("widgets", NAME) or {}).get("status", {}).get("phase")


def test_kopf_handlers_finalizers_events_and_peering_work(
    cluster: EmulatedCluster, kopf_operator: tuple[subprocess.Popen[bytes], Path]
) -> None:
    process, marker = kopf_operator
    assert cluster.api("POST", "/apis/kubesim.dev/v1/namespaces/default/widgets", WIDGET).status == 201
    cluster.wait_for(lambda: phase(cluster) == "Running", timeout=20, message="kopf's create handler ran")
    obj = cluster.get("widgets", NAME)
    assert obj is not None and obj["metadata"]["finalizers"] == ["kubesim.dev/kopf-smoke"]
    peers = cluster.wait_for(
        lambda: (cluster.get("clusterkopfpeerings", "default", None) or {}).get("status"),
        message="kopf's peering keep-alive",
    )
    assert len(peers) == 1, f"one operator, one peer: {peers}"

    assert cluster.kubectl("patch", "wd", NAME, "--type", "merge", "-p", '{"spec":{"stop":true}}').returncode == 0
    cluster.wait_for(lambda: phase(cluster) == "Stopped", timeout=20, message="kopf's field handler ran")
    events = cluster.wait_for(
        lambda: [e for e in cluster.list_objects("events", "default") if e["involvedObject"]["name"] == NAME],
        message="kopf posted an event",
    )
    assert any("started by the smoke operator" in e["message"] for e in events)

    result = cluster.kubectl("delete", "wd", NAME, "--timeout=30s")
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == NAME, "kopf's delete handler did not run before the finalizer was released"
    assert cluster.get("widgets", NAME) is None
    assert process.poll() is None, "kopf exited on its own"
