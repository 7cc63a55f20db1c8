"""Tier ``node``: real containers on this machine, no imitation of the runtime.

What this tier proves: the images built here from the project's Dockerfile (``make image``,
``hack/image/build.sh``: podman, a base from Debian's packages when the upstream one cannot be
pulled, wheels checked against the lock's hashes) run agentrun as a non-root user on a read-only
root filesystem, without test or development code; and, on a real node (kubelet, containerd, runc),
that the promises a platform engineer checks first hold in real containers.

The images are built (or found up to date, which returns at once) after collection and before the
first test, outside any test's timeout: a cold build takes minutes. A build that fails fails every
test that asks for the images with the script's last words; it never skips them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubesim.node import NodeCluster
    from kubesim.real import Binaries
    from tests.node.support import InstalledChart

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "hack" / "image" / "build.sh"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Images:
    """The images ``hack/image/build.sh`` made: in podman's local store and as OCI archives in ``cache``."""

    cache: Path
    runtime: str = "localhost/agentrun:dev"
    demo: str = "localhost/agentrun-demo:dev"
    pause: str = "localhost/agentrun-pause:dev"

    @property
    def base(self) -> str:
        """The base image the Dockerfile was built on (its PYTHON_IMAGE), as the build recorded it."""
        return (self.cache / "base-image").read_text().strip()

    def archive(self, image: str) -> Path:
        """The OCI archive of ``image`` (``ctr -n k8s.io images import`` loads it)."""
        name = image.removeprefix("localhost/").split(":", 1)[0]
        return self.cache / f"{name}.oci.tar"


_built: Images | str | None = None  # the build's outcome: the images, or why there are none


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the images once, before any test runs, when a test of this tier was selected."""
    global _built
    if session.config.option.collectonly or _built is not None:
        return
    if not any(Path(str(item.fspath)).is_relative_to(HERE) for item in session.items):
        return
    # Its progress goes to the terminal, past pytest's capture (a cold build is long); its stdout is the cache folder.
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        _built = f"hack/image/build.sh failed (exit {done.returncode}): see its output above; run `make image`"
    else:
        _built = Images(cache=Path(lines[-1]))


@pytest.fixture(scope="session")
def images() -> Images:
    """The runtime, demo and pause images, built from this checkout (fails, never skips, when they cannot be)."""
    if isinstance(_built, Images):
        return _built
    pytest.fail(_built or "the images were not built: this fixture needs tests/node/conftest.py's collection hook")


@pytest.fixture(scope="session")
def node_cluster(
    images: Images, real_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeCluster]:
    """A real node (containerd, runc, kubelet, kube-proxy, kube-scheduler: ``kubesim.node``) with the images
    imported, joined to a real control plane bound to the node's host address, for the session. Fails in
    one line naming what is missing when it cannot start; stopped (pods first, nothing left) at the end."""
    from kubesim.node import NodeCluster, NodeError
    from kubesim.real import ControlPlaneError

    archives = {image: images.archive(image) for image in (images.runtime, images.demo, images.pause)}
    cluster = NodeCluster(tmp_path_factory.mktemp("node"), archives=archives, bins=real_binaries)
    try:
        cluster.start()
    except (NodeError, ControlPlaneError) as e:
        pytest.fail(f"the real node cannot start: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def agentrun_chart(
    node_cluster: NodeCluster, images: Images, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InstalledChart]:
    """helm/agentrun installed on the node with real Helm (``tests/node/support.py``): the operator (two
    replicas, one leader) and the history server as Deployments, a PostgreSQL of their own on the node's
    host address; for the session. Fails with Helm's words and the pods' state when it cannot."""
    from tests.node.support import ChartError, install_chart

    try:
        with install_chart(node_cluster, images, tmp_path_factory.mktemp("chart")) as chart:
            yield chart
    except ChartError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def run_namespace(agentrun_chart: InstalledChart) -> Iterator[str]:
    """A namespace of the test's own on the chart's cluster: restricted Pod Security, the store Secret
    ``agentrun-store`` (as examples/*.yaml name it); deleted after the test."""
    name = agentrun_chart.new_namespace()
    yield name
    agentrun_chart.delete_namespace(name)
