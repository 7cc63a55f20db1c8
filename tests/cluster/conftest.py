"""Cluster tier: the emulated Kubernetes cluster (kubesim), driven with the real ``kubectl``.

What it tests: the AgentRun CRD as the API server enforces it (schema,
defaults, printer columns, ``kubectl explain``, CEL rules), the real operator
on the emulated cluster with runner pods run as local processes by the kubelet
stand-in (crashes, evictions, lost nodes, stops, leader election, metrics),
and the Helm chart installed, upgraded and uninstalled by real Helm 4
(server-side apply). The emulator's own self-tests live beside it, in
``kubesim/tests``.

The ``cluster`` and ``kubelet`` fixtures come from kubesim's pytest plugin
(``kubesim/README.md``); this conftest configures them for agentrun: the
cluster serves the AgentRun CRD from ``crds/`` and kopf's peering CRDs, the
kubelet "has" the runner images the operator asks for, and pods import this
repository (``examples.*``, ``tests.cluster.graphs``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agentrun_dev.databases import throwaway_database
from kubesim import KOPF_PEERING_CRDS, EmulatedCluster, default_base_env
from kubesim.kubelet import KubeletThread
from kubesim.pytest_plugin import emulated_kubelet
from kubesim.real import RealControlPlane
from tests.cluster.operator_harness import OperatorProcess, start_operator, store_secret
from tests.cluster.servers import RealCluster

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "agentrun.dev_agentruns.yaml"
CRD_FILES = (*sorted((ROOT / "crds").glob("*.yaml")), KOPF_PEERING_CRDS)
EXAMPLE = ROOT / "examples" / "agentrun.yaml"
INVALID_MANIFESTS = sorted((Path(__file__).parent / "manifests").glob("invalid-*.yaml"))
# The one field each invalid manifest gets wrong (test_crd.py checks the schema, test_kubectl.py the server).
EXPECTED_FIELD = {
    "invalid-missing-graph.yaml": "spec.graph",
    "invalid-graph-pattern.yaml": "spec.graph",
    "invalid-negative-timeout.yaml": "spec.config.toolTimeoutSeconds",
    "invalid-max-restarts.yaml": "spec.restartPolicy.maxRestarts",
    "invalid-unknown-field.yaml": "spec.retries",
    "invalid-thread-id-too-long.yaml": "spec.threadId",
}
AGENTRUNS = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
PODS = "/api/v1/namespaces/default/pods"
# The images runner pods may use: the operator harness's, the test pods' and the operator's default (the demo).
KNOWN_IMAGES = ("agentrun:test", "python:3.11", "ghcr.io/agentrun/agentrun:*")


@pytest.fixture
def kubesim_crd_files() -> Sequence[Path]:
    return CRD_FILES


@pytest.fixture
def kubesim_known_images() -> Sequence[str]:
    return KNOWN_IMAGES


@pytest.fixture
def kubesim_base_env() -> dict[str, str]:
    return default_base_env(pythonpath=[ROOT])


# --- two API servers (tests/cluster/servers.py) ---------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--api-server",
        choices=("auto", "both", "kubesim", "real"),
        default="auto",
        help=(
            "the API server of tests marked real_server: auto (the default) runs them on the real control plane,"
            " and on kubesim too when also marked kubesim_too; both, kubesim or real for all of them"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_server: run this cluster test on the real control plane")
    config.addinivalue_line(
        "markers",
        "kubesim_too: a real_server test kubesim adds something to (the emulator's fidelity on the same"
        " requests, or a fault path only its timing reaches): run on both servers by default",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "api_server" not in metafunc.fixturenames:
        return
    # The real server for every scenario it can run, kubesim where it adds something (issue 25): a scenario on
    # both by default costs CI minutes and proves the same thing twice.
    chosen = metafunc.config.getoption("--api-server")
    if not metafunc.definition.get_closest_marker("real_server"):
        servers = ["kubesim"]
    elif chosen == "both":
        servers = ["kubesim", "real"]
    elif chosen in ("kubesim", "real"):
        servers = [chosen]
    else:
        servers = ["kubesim", "real"] if metafunc.definition.get_closest_marker("kubesim_too") else ["real"]
    metafunc.parametrize("api_server", servers, scope="function")


@pytest.fixture(scope="session")
def real_agentrun_cluster(real_cluster: RealControlPlane) -> RealCluster:
    """The session's real control plane with the AgentRun CRD, and ``default`` under restricted Pod Security."""
    cluster = RealCluster(real_cluster, CRD_FILES)
    labelled = real_cluster.kubectl(
        "label", "--overwrite", "namespace", "default", "pod-security.kubernetes.io/enforce=restricted"
    )
    assert labelled.returncode == 0, labelled.stderr
    return cluster


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, api_server: str, tmp_path: Path, kubesim_crd_files: Sequence[Path]
) -> Iterator[EmulatedCluster | RealCluster]:
    """kubesim's emulator, or the real control plane (tests marked ``real_server`` run on both)."""
    if api_server == "real":
        real: RealCluster = request.getfixturevalue("real_agentrun_cluster")
        real.watch("agentruns")  # history(), as kubesim keeps it
        real.watch("pods")
        try:
            yield real
        finally:
            real.reset()
        return
    emulated = EmulatedCluster(tmp_path / "cluster", crd_files=tuple(kubesim_crd_files)).start()
    try:
        yield emulated
    finally:
        emulated.stop()
    assert not emulated.internal_errors, f"the emulator failed while serving: {emulated.internal_errors!r}"


@pytest.fixture
def kubelet(
    request: pytest.FixtureRequest,
    api_server: str,
    cluster: EmulatedCluster | RealCluster,
    tmp_path: Path,
    kubesim_known_images: Sequence[str],
    kubesim_base_env: dict[str, str],
) -> Iterator[KubeletThread]:
    """The kubelet stand-in on the test's server (a node of its own on the real one)."""
    if api_server == "real":
        yield request.getfixturevalue("real_kubelet")
        return
    assert isinstance(cluster, EmulatedCluster)
    with emulated_kubelet(cluster.url, tmp_path / "kubelet", kubesim_known_images, kubesim_base_env) as node:
        yield node


@pytest.fixture
def dsn(api_server: str, dsn: str) -> Iterator[str]:
    """The store's database: the module's on kubesim (tests/conftest.py); a fresh one for a test on the real
    server, which runs the same scenario (same namespace, names, threads and request keys) after its kubesim twin."""
    if api_server != "real":
        yield dsn
        return
    with throwaway_database() as database:
        yield database


@pytest.fixture
def operator(cluster: EmulatedCluster, kubelet: KubeletThread, dsn: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator process on the test's server, with the ``agentrun-store`` Secret for ``dsn`` (modules that
    need another setup, RBAC or a private store, define their own)."""
    store_secret(cluster, dsn)
    process = start_operator(cluster, tmp_path)
    try:
        yield process
    finally:
        process.stop()
