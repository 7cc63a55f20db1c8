"""``examples.billing_mcp`` (the MCP examples' payment provider) over streamable HTTP, as its own process."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def billing_over_http(env: dict[str, str], log: Path) -> Iterator[str]:
    """Starts the server on a free loopback port and yields its URL (``http://127.0.0.1:<port>/mcp``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.billing_mcp", "http", str(port)], env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the billing MCP server did not listen:\n{log.read_text()}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(timeout=10)
