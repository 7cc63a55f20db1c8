"""The history server serves TLS itself (chart value history.tls) and turns away requests without a token."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from agentrun_dev.servers import free_port
from kubesim.pki import CertificateAuthority

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_history_server_serves_tls_and_wants_a_token(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "pki")
    pair = ca.issue("history", "agentrun-history", server=True, ip_addresses=("127.0.0.1",))
    kubeconfig = tmp_path / "kubeconfig"  # the API server is never asked here: no request carries a token
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(
        KUBECONFIG=str(kubeconfig),
        PYTHONPATH=str(ROOT),
        AGENTRUN_HISTORY_POSTGRES_DSN="postgresql://nobody@127.0.0.1:9/none",  # reads never happen here
        AGENTRUN_HISTORY_HOST="127.0.0.1",
        AGENTRUN_HISTORY_PORT=str(port),
        AGENTRUN_HISTORY_TLS_CERT_FILE=str(pair.cert),
        AGENTRUN_HISTORY_TLS_KEY_FILE=str(pair.key),
    )
    with (tmp_path / "history.log").open("w") as log:
        server = subprocess.Popen([sys.executable, "-m", "agentrun_history"], env=env, stdout=log, stderr=log)
    try:
        context = ssl.create_default_context(cafile=str(ca.pair.cert))
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", context=context, timeout=5) as response:
                    assert response.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "history.log").read_text()) from None
                time.sleep(0.2)
        request = urllib.request.Request(url + "/api/v1/namespaces/default/agentruns/x/history")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=5)
        with refused.value as answer:
            assert answer.code == 401 and json.loads(answer.read())["reason"] == "Unauthorized"
            assert "default-src 'self'" in answer.headers["Content-Security-Policy"]
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain http on the TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).close()
    finally:
        server.terminate()
        server.wait(timeout=10)
