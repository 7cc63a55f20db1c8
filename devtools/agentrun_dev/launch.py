"""The real operator process (``python -m agentrun_operator``) on one machine, against a kubeconfig.

The one launcher for every operator that runs outside a Deployment: ``agentrun-dev`` (``cluster.py``),
``make demo``, the cluster tests, the operator benchmark (``bench/operator.py``) and the chaos campaign
(``bench/chaos``). It gives the process a clean
environment (none of the caller's ``KUBE*``/``AGENTRUN_*`` variables leak in), a free metrics port to
probe it on, and settings checked against ``OperatorSettings`` before it starts: a misspelled knob is an
error here, not a setting the operator silently ignores.

HAZARD: the process runs in a session of its own, so a Ctrl-C in the terminal reaches the caller only and
the caller stops it in order (``stop()``: SIGTERM, the lease released). A caller that dies without
``stop()`` leaves it running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agentrun_operator.settings import OperatorSettings

from .servers import free_port

ENV_PREFIX = "AGENTRUN_OPERATOR_"
HOST = "127.0.0.1"
# What every operator on one machine needs: several runners share its ports, so their metrics would collide.
LOCAL_SETTINGS: Mapping[str, object] = {"lease_namespace": "default", "runner_metrics_port": 0}


class OperatorNotReady(Exception):
    """The operator exited, or did not lead in time; the message names its log."""


@dataclass
class OperatorProcess:
    """A started operator: its process, its probe port (``/readyz``, ``/metrics``) and its log file."""

    proc: subprocess.Popen[bytes]
    identity: str
    port: int
    log_path: Path

    def log(self) -> str:
        """Everything the operator wrote so far ("" before its first line)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _get(self, path: str, timeout: float) -> str:
        with urllib.request.urlopen(f"http://{HOST}:{self.port}{path}", timeout=timeout) as response:
            body: bytes = response.read()
            return body.decode()

    def role(self, timeout: float = 2) -> str | None:
        """``leader``, ``standby`` or ``starting`` (``/readyz``); None while it does not answer."""
        try:
            return self._get("/readyz", timeout)
        except OSError:
            return None

    def metrics(self) -> str:
        """The Prometheus text it serves now; raises ``OSError`` when it does not answer."""
        return self._get("/metrics", 2)

    def wait_until_leader(self, timeout: float = 60) -> None:
        """Returns once it leads; raises ``OperatorNotReady`` when it exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise OperatorNotReady(
                    f"the operator exited with code {self.proc.returncode}; its log: {self.log_path}"
                )
            if (self.role() or "").strip() == "leader":
                return
            time.sleep(0.2)
        raise OperatorNotReady(f"the operator did not become ready in {timeout:g}s; its log: {self.log_path}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` and wait for the process to end (SIGKILL by default: a crash, no lease released)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM (kopf shuts down, the lease is released), SIGKILL after ``timeout`` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _as_env(settings: Mapping[str, object]) -> dict[str, str]:
    return {
        ENV_PREFIX + name.upper(): json.dumps(value) if isinstance(value, dict | list | bool) else str(value)
        for name, value in settings.items()
    }


def _check_names(environment: Mapping[str, str]) -> None:
    names = {k.removeprefix(ENV_PREFIX).lower() for k in environment if k.startswith(ENV_PREFIX)}
    unknown = sorted(names - set(OperatorSettings.model_fields))
    if unknown:
        raise ValueError(f"not operator settings: {', '.join(unknown)} (see agentrun_operator/settings.py)")


def start_operator(
    kubeconfig: Path,
    *,
    identity: str,
    log_path: Path,
    settings: Mapping[str, object] = {},
    env: Mapping[str, str] = {},
    cwd: Path | None = None,
) -> OperatorProcess:
    """Start ``python -m agentrun_operator`` against ``kubeconfig``; it does not wait for it to lead.

    ``settings`` are ``OperatorSettings`` fields by name (an unknown name raises ``ValueError``), over
    ``LOCAL_SETTINGS``; ``env`` is set last (``PYTHONPATH``, or ``AGENTRUN_OPERATOR_*`` variables, which
    are checked the same way). Its output goes to ``log_path`` (appended).
    """
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    environment.update(_as_env({**LOCAL_SETTINGS, **settings, "identity": identity, "metrics_port": port}))
    environment.update(env, KUBECONFIG=str(kubeconfig))
    _check_names(environment)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrun_operator"],
            env=environment,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C reaches the caller, which stops it in order
        )
    return OperatorProcess(proc, identity, port, log_path)
