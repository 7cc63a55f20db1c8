"""The operator's liveness probe fails when its event loop is stuck, and recovers when it turns again.

How the loop is frozen, and why this way: the failure ``/healthz`` must catch
is a blocking call inside a coroutine (a synchronous client, a long CPU walk):
the process is up, the port is open, nothing reconciles. SIGSTOP would stop
every thread, probe server included, which is a different failure (a probe
timeout). So the real operator process is started with its debug hook
``AGENTRUN_OPERATOR_DEBUG_FREEZE_SIGNAL`` (off by default), and SIGUSR2 makes
its own loop run a synchronous ``time.sleep`` -- exactly a blocking call on
the loop -- while the probe server, on its own thread, keeps answering.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubesim import EmulatedCluster
from tests.cluster.operator_harness import OperatorProcess, start_operator

pytestmark = pytest.mark.timeout(60)


def probe(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_probe(port: int, code: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        try:
            seen = probe(port)
        except OSError:
            seen = None
        if seen is not None and seen[0] == code:
            return seen[1]
        time.sleep(0.2)
    raise AssertionError(f"/healthz never answered {code} within {timeout}s (last: {seen!r})")


@pytest.fixture
def frozen_operator(cluster: EmulatedCluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = start_operator(
        cluster,
        tmp_path,
        AGENTRUN_OPERATOR_LIVENESS_TIMEOUT_SECONDS="2",
        AGENTRUN_OPERATOR_DEBUG_FREEZE_SIGNAL=str(int(signal.SIGUSR2)),
        AGENTRUN_OPERATOR_DEBUG_FREEZE_SECONDS="10",  # a 503 window of about 8 s, even on a loaded machine
    )
    try:
        yield process
    finally:
        process.stop()


def test_liveness_fails_while_the_event_loop_is_blocked_and_recovers(frozen_operator: OperatorProcess) -> None:
    port = frozen_operator.port
    assert wait_probe(port, 200, 20) == "ok", frozen_operator.log()
    frozen_operator.proc.send_signal(signal.SIGUSR2)
    body = wait_probe(port, 503, 9)
    assert "event loop unresponsive" in body, "liveness: a blocked loop must fail /healthz with the reason"
    # Prometheus still scrapes a stuck operator: /metrics is not served by the loop.
    assert "agentrun_operator_event_loop_lag_seconds" in frozen_operator.metrics()
    assert frozen_operator.proc.poll() is None
    assert wait_probe(port, 200, 15) == "ok", "liveness: /healthz must recover once the loop turns again"
    assert "debug hook: the event loop runs again" in frozen_operator.log()
