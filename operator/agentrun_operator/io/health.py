"""Liveness that can fail: a heartbeat of the operator's event loop, and the HTTP endpoints on their own thread.

Everything the operator does (kopf's watches, every reconcile, leader
renewal) runs on ONE asyncio loop. A blocking call inside a coroutine (a
synchronous client, a CPU-bound walk of a huge object, a deadlock on a
threading lock) freezes all of it while the process stays up. Were
``/healthz`` served by that same loop it could only time out, and a probe
that answers from elsewhere while nothing reconciles would be a lie; so:

- ``Heartbeat.beat`` is a task on the loop that ticks every ``interval``;
  each tick records when it ran and how late (``agentrun_operator_event_loop_lag_seconds``).
- The endpoints (``/healthz``, ``/readyz``, ``/metrics``) are served by a
  small threaded HTTP server, not by the loop: ``/healthz`` answers 503 with
  the stall's length once the last tick is older than ``timeout``, and
  ``/metrics`` stays scrapeable while the loop is stuck (the lag gauge keeps
  its last value until the loop turns again; the 503 is the signal).

LIMIT: the heartbeat proves the loop turns, not that every kopf task is
healthy; a crashed kopf operator task ends the process instead (``__main__``),
which Kubernetes restarts. The kubelet restarts the container after
``failureThreshold`` failed probes: keep ``timeout`` above the longest
legitimate synchronous step (default 30 s) and the probe period short.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import metrics

log = logging.getLogger("agentrun_operator")


class Heartbeat:
    """The loop's last tick, written on the loop and read from the HTTP thread (a float: atomic under the GIL)."""

    def __init__(self, *, interval: float = 1.0, timeout: float = 30.0) -> None:
        self.interval = interval
        self.timeout = timeout
        self.last = time.monotonic()

    async def beat(self) -> None:
        """Tick forever; cancel to stop."""
        while True:
            expected = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            self.last = now
            metrics.LOOP_LAG.set(max(0.0, now - expected))

    def stalled_for(self) -> float:
        """Seconds since the last tick beyond the tick interval (0 while the loop turns)."""
        return max(0.0, time.monotonic() - self.last - self.interval)

    def alive(self) -> bool:
        """Whether the event loop's heartbeat is within ``timeout``."""
        return self.stalled_for() < self.timeout


class HealthServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on ``port``, served from a daemon thread."""

    def __init__(self, port: int, heartbeat: Heartbeat, role: Callable[[], str]) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, body, kind = server.answer(self.path)
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes and scrapes every few seconds: no access log

        self.heartbeat = heartbeat
        self.role = role
        self.httpd = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="agentrun-health", daemon=True)

    def answer(self, path: str) -> tuple[int, bytes, str]:
        """The status, body and content type for ``path`` (``/healthz``, ``/readyz``, ``/metrics``)."""
        route = path.split("?", 1)[0]
        if route == "/healthz":
            stalled = self.heartbeat.stalled_for()
            if stalled >= self.heartbeat.timeout:
                text = f"event loop unresponsive for {stalled:.1f}s (limit {self.heartbeat.timeout:g}s)"
                return 503, text.encode(), "text/plain; charset=utf-8"
            return 200, b"ok", "text/plain; charset=utf-8"
        if route == "/readyz":
            return 200, self.role().encode(), "text/plain; charset=utf-8"
        if route == "/metrics":
            return 200, generate_latest(), CONTENT_TYPE_LATEST
        return 404, b"not found", "text/plain; charset=utf-8"

    def start(self) -> HealthServer:
        """Serve from a thread of its own."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()


def freeze_on_signal(loop: asyncio.AbstractEventLoop, signum: int, seconds: float) -> None:
    """Debug hook (``debugFreezeSignal``): on ``signum``, block the loop for ``seconds`` with a synchronous sleep.

    This is what a blocking call inside a coroutine does to the operator, so the liveness probe can be
    tested against the real failure it exists for. Off unless configured.
    """

    def freeze() -> None:
        log.warning("debug hook: blocking the event loop for %gs", seconds)
        time.sleep(seconds)  # deliberately synchronous: the loop cannot run anything meanwhile
        log.warning("debug hook: the event loop runs again")

    loop.add_signal_handler(signum, freeze)
