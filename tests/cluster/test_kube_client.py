"""The operator's Kubernetes client (io/kube.py, io/kubeconfig.py) against the emulated API server.

The credentials users have: a kubeconfig ``exec`` plugin (EKS, GKE, AKS,
OIDC), an in-cluster service-account token that the kubelet rotates, a
``KUBECONFIG`` list of files, client certificates given as data. The
emulator checks bearer tokens here (``bearer_tokens``, anonymous requests
refused), so a client that sends the wrong token, or none, fails these tests
with the real server's 401.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from lightkube.config.models import Cluster

from agentrun_operator.io import kubeconfig, metrics
from agentrun_operator.io.kube import ApiError, Conflict, CredentialsError, KubeClient, lease_path, run_path
from kubesim import EmulatedCluster
from tests.cluster.kubeconfigs import exec_user, kubeconfig_doc, write_plugin, write_yaml
from tests.cluster.operator_harness import agentrun, start_operator

pytestmark = pytest.mark.timeout(60)

NAMESPACE = "/api/v1/namespaces/default"
HARNESS_TOKEN = "emulated"  # what kubesim's own kubeconfig (and so kubectl) sends


def require_tokens(cluster: EmulatedCluster, *tokens: str) -> None:
    """From now on the emulator accepts only these bearer tokens (plus kubectl's) and no anonymous request."""

    def configure() -> None:
        assert cluster.emulator is not None
        cluster.emulator.bearer_tokens = frozenset({HARNESS_TOKEN, *tokens})
        cluster.emulator.anonymous_auth = False

    cluster.call(configure)


def runs(tmp: Path) -> list[str]:
    path = tmp / "runs"
    return path.read_text().splitlines() if path.exists() else []


def requests_counted(verb: str, code: str) -> float:
    return float(metrics.KUBE_REQUESTS.labels(verb=verb, code=code)._value.get())


@pytest.mark.parametrize(
    "api_version",
    ["client.authentication.k8s.io/v1beta1", "client.authentication.k8s.io/v1"],
)
async def test_exec_plugin_token_is_sent_and_one_run_serves_concurrent_requests(
    cluster: EmulatedCluster, tmp_path: Path, api_version: str
) -> None:
    """Guarantee: an ``exec`` kubeconfig user (as EKS/GKE/AKS write them) authenticates every request."""
    (tmp_path / "token").write_text("from-the-plugin")
    require_tokens(cluster, "from-the-plugin")
    plugin = write_plugin(tmp_path, api_version=api_version)
    path = write_yaml(
        tmp_path / "kubeconfig", kubeconfig_doc(cluster.url, exec_user(plugin, tmp_path, api_version=api_version))
    )
    kube = KubeClient.from_kubeconfig(str(path))
    try:
        answers = await asyncio.gather(*(kube.get(NAMESPACE) for _ in range(20)))
        assert all(a["metadata"]["name"] == "default" for a in answers)
        assert runs(tmp_path) == [api_version], "20 concurrent requests must share one plugin run"
        info = await kube.connection_info()  # kopf's login: the same token, no second run
        assert info.token == "from-the-plugin" and info.server == cluster.url
        assert runs(tmp_path) == [api_version]
    finally:
        await kube.close()


async def test_the_emulator_refuses_a_wrong_token_so_these_tests_can_fail(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    require_tokens(cluster, "right")
    wrong = KubeClient.from_kubeconfig(str(write_yaml(tmp_path / "wrong", kubeconfig_doc(cluster.url, {"token": "x"}))))
    anonymous = KubeClient.from_kubeconfig(str(write_yaml(tmp_path / "anon", kubeconfig_doc(cluster.url, {}))))
    try:
        for kube in (wrong, anonymous):
            with pytest.raises(ApiError) as refused:
                await kube.get(NAMESPACE)
            assert (refused.value.status, refused.value.reason, refused.value.message) == (
                401,
                "Unauthorized",
                "Unauthorized",
            )
    finally:
        await wrong.close()
        await anonymous.close()


async def test_exec_token_is_renewed_at_its_expiry_and_after_a_401(cluster: EmulatedCluster, tmp_path: Path) -> None:
    """Guarantee: a plugin token is used until its expirationTimestamp, and a refused one is replaced at once."""
    (tmp_path / "token").write_text("first")
    require_tokens(cluster, "first")
    path = write_yaml(
        tmp_path / "kubeconfig", kubeconfig_doc(cluster.url, exec_user(write_plugin(tmp_path), tmp_path, ttl=1.5))
    )
    kube = KubeClient.from_kubeconfig(str(path))
    try:
        await kube.get(NAMESPACE)
        await kube.get(NAMESPACE)
        assert len(runs(tmp_path)) == 1
        await asyncio.sleep(2)  # past expirationTimestamp (whole seconds): the next request runs the plugin first
        await kube.get(NAMESPACE)
        assert len(runs(tmp_path)) == 2

        # Revoked before its expiry (the server says 401): the request is retried once with a new token.
        (tmp_path / "token").write_text("second")
        require_tokens(cluster, "second")
        refused_before = requests_counted("GET", "401")
        await kube.get(NAMESPACE)
        assert len(runs(tmp_path)) == 3
        assert requests_counted("GET", "401") == refused_before + 1, "the refused request is counted too"

        # kopf logs in again after its own 401: it gets a token from a new run, not the one it had.
        first_login = await kube.connection_info()
        (tmp_path / "token").write_text("third")
        require_tokens(cluster, "third")
        again = await kube.connection_info()
        assert (first_login.token, again.token) == ("second", "third")
        assert again.expiration is not None and again.expiration > datetime.now(UTC) - timedelta(seconds=1)
    finally:
        await kube.close()


async def test_a_failing_plugin_is_a_retryable_error_that_names_it(cluster: EmulatedCluster, tmp_path: Path) -> None:
    broken = tmp_path / "broken-plugin"
    broken.write_text("#!/bin/sh\necho 'token expired, run: aws sso login' >&2\nexit 3\n")
    broken.chmod(0o755)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(broken)}}
    kube = KubeClient.from_kubeconfig(str(write_yaml(tmp_path / "kubeconfig", kubeconfig_doc(cluster.url, user))))
    try:
        with pytest.raises(CredentialsError, match="exited 3: token expired, run: aws sso login"):
            await kube.get(NAMESPACE)
        assert isinstance(CredentialsError("x"), OSError), "callers retry OSError (the leader loop does)"
    finally:
        await kube.close()


def service_account(directory: Path, token: str) -> Path:
    directory.mkdir()
    (directory / "token").write_text(token)
    (directory / "namespace").write_text("agents")
    (directory / "ca.crt").write_text(self_signed(directory.parent)[0].read_text())
    return directory


async def test_in_cluster_token_rotated_by_the_kubelet_is_picked_up(
    cluster: EmulatedCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee: the in-cluster credentials re-read the projected token file, so a rotated token is used."""
    sa = service_account(tmp_path / "serviceaccount", "token-1")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "a-kubeconfig-that-must-not-be-read"))
    config = kubeconfig.load(service_account=sa)
    assert (config.cluster.server, config.namespace) == ("https://10.96.0.1:443", "agents")
    assert config.cluster.certificate_auth == str(sa / "ca.crt")
    # The emulator serves plain HTTP: the same in-cluster user, pointed at it.
    kube = KubeClient(config._replace(cluster=Cluster(server=cluster.url)))
    require_tokens(cluster, "token-1")
    try:
        await kube.get(NAMESPACE)
        (sa / "token").write_text("token-2\n")  # the kubelet rotates the projected token...
        require_tokens(cluster, "token-2")  # ...and the old one stops being accepted
        assert (await kube.get(NAMESPACE))["metadata"]["name"] == "default"
        assert (await kube.connection_info()).token == "token-2", "kopf's login reads the current token"
    finally:
        await kube.close()


def test_not_in_a_pod_the_kubeconfig_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = service_account(tmp_path / "serviceaccount", "t")
    path = write_yaml(tmp_path / "kubeconfig", kubeconfig_doc("http://127.0.0.1:1", {"token": "from-file"}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))
    config = kubeconfig.load(service_account=sa)
    assert config.user is not None and config.user.token == "from-file"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(kubeconfig.ConfigError, match="no kubeconfig found"):
        kubeconfig.load(service_account=tmp_path / "none")


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "client.crt", directory / "client.key"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=agentrun-test"],
            check=True, capture_output=True,
        )  # fmt: skip
    return cert, key


@pytest.fixture
def private_tempdir(tmp_path: Path) -> Iterator[Path]:
    """tempfile's directory for this test alone, so what is left in it is what this test left."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    saved = tempfile.tempdir
    tempfile.tempdir = str(directory)
    try:
        yield directory
    finally:
        tempfile.tempdir = saved


async def test_kubeconfig_list_is_merged_and_leaves_no_temp_files(
    cluster: EmulatedCluster, tmp_path: Path, private_tempdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee: KUBECONFIG=a:b is merged as kubectl merges it; decoded keys leave no file behind."""
    cert, key = self_signed(tmp_path)
    b64 = {name: base64.b64encode(path.read_bytes()).decode() for name, path in (("cert", cert), ("key", key))}
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    (second / "token").write_text("from-the-second-file")
    # The first file: the current context and the cluster (it wins over the second file's cluster of that name).
    write_yaml(
        first / "config",
        {
            "current-context": "work",
            "clusters": [
                {"name": "shared", "cluster": {"server": cluster.url, "certificate-authority-data": b64["cert"]}}
            ],
            "contexts": [{"name": "work", "context": {"cluster": "shared", "user": "me", "namespace": "agents"}}],
        },
    )
    # The second file: the user (a token file relative to this file, a client certificate as data) and a
    # cluster of the same name that must lose, and a current-context that must lose.
    write_yaml(
        second / "config",
        {
            "current-context": "elsewhere",
            "clusters": [{"name": "shared", "cluster": {"server": "http://127.0.0.1:9"}}],
            "users": [
                {
                    "name": "me",
                    "user": {
                        "tokenFile": "token",
                        "client-certificate-data": b64["cert"],
                        "client-key-data": b64["key"],
                    },
                }
            ],
            "contexts": [{"name": "elsewhere", "context": {"cluster": "shared", "user": "nobody"}}],
        },
    )
    require_tokens(cluster, "from-the-second-file")
    paths = os.pathsep.join([str(tmp_path / "absent"), str(first / "config"), str(second / "config")])
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", paths)
    kube = KubeClient.from_environment(service_account=tmp_path / "no-service-account")
    try:
        assert kube.config.context_name == "work" and kube.config.namespace == "agents"
        assert (await kube.get(NAMESPACE))["metadata"]["name"] == "default"
        info = await kube.connection_info()
        assert (info.server, info.token, info.default_namespace) == (cluster.url, "from-the-second-file", "agents")
        info.as_ssl_context()  # what kopf does with it: the key is loaded from data too
    finally:
        await kube.close()
    assert os.listdir(private_tempdir) == [], "decoded certificates or keys were left in the temp directory"


async def test_a_lease_round_trip_through_the_client(cluster: EmulatedCluster, tmp_path: Path) -> None:
    """The leader election's verbs (GET, POST, PUT with resourceVersion) on the new client; a stale PUT is 409."""
    kube = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        body = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
        created = await kube.create(
            lease_path("default"), {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **body}
        )
        created["spec"]["holderIdentity"] = "b"
        replaced = await kube.replace(lease_path("default", "l"), created)
        assert replaced["spec"]["holderIdentity"] == "b"
        with pytest.raises(Conflict):
            await kube.replace(lease_path("default", "l"), created)  # the resourceVersion we read is gone
        await kube.delete(lease_path("default", "l"))
        await kube.delete(lease_path("default", "l"))  # already gone: not an error
    finally:
        await kube.close()


async def create(cluster: EmulatedCluster, run: dict[str, Any]) -> None:
    kube = KubeClient.from_kubeconfig(str(cluster.kubeconfig))  # the harness's token
    try:
        await kube.create(run_path("default"), run)
    finally:
        await kube.close()


def test_the_operator_and_kopf_run_on_exec_credentials(cluster: EmulatedCluster, tmp_path: Path) -> None:
    """Guarantee: the real operator (its client, its Lease, kopf's watches and patches) runs on an exec plugin."""
    (tmp_path / "token").write_text("operator-token")
    require_tokens(cluster, "operator-token")
    path = write_yaml(
        tmp_path / "operator-kubeconfig", kubeconfig_doc(cluster.url, exec_user(write_plugin(tmp_path), tmp_path))
    )
    operator = start_operator(cluster, tmp_path, KUBECONFIG=str(path))
    try:
        # Not with kubectl: it sends no bearer token over plain HTTP, and this emulator refuses anonymous requests.
        asyncio.run(create(cluster, agentrun("exec-auth", thread="exec-auth", effects=tmp_path / "effects.db")))

        def seen() -> dict[str, Any] | None:
            run = cluster.get("agentruns", "exec-auth")
            if run is None or not cluster.get("leases", "agentrun-operator"):
                return None
            return run if (run.get("status") or {}).get("reason") else None  # the operator wrote its status

        try:
            run = cluster.wait_for(seen, timeout=30, message="the operator's status")
        except AssertionError:
            raise AssertionError(f"operator log (tail):\n{operator.log()[-4000:]}") from None
        # Its Secret GET got an answer (404), not a 401: the status says the Secret is missing.
        assert run["status"]["reason"] == "StoreSecretNotFound", json.dumps(run["status"])
        assert cluster.get("leases", "agentrun-operator")["spec"]["holderIdentity"] == "op-1"  # type: ignore[index]
        assert runs(tmp_path), "the plugin never ran"
    finally:
        operator.stop()
