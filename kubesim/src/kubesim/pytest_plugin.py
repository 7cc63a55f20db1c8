"""The pytest plugin (entry point ``pytest11``): ``cluster`` and ``kubelet`` fixtures.

- ``cluster``: an ``EmulatedCluster`` started in the test's temporary folder
  (``.url``, ``.kubeconfig``, ``.kubectl(*args)`` running the real binary,
  ``.api(...)`` for raw HTTP, ``.get/.list_objects/.history`` for stored
  objects, ``.wait_for``); the test fails if the emulator itself raised while
  serving it (its bugs, not API errors).
- ``kubelet``: a ``KubeletThread`` bound to that cluster (fault injection:
  ``kill``, ``oom_kill``, ``evict``, ``lose_node``, ``pause``/``resume``; per
  pod ``logs``/``log_path``); every pod process is dead after the test.

The real control plane (``kubesim.real``) has its own pair:

- ``real_cluster`` (session-scoped): a ``RealControlPlane`` (etcd, kube-apiserver,
  kube-controller-manager) whose binaries come from ``hack/k8s/build.sh`` (built once,
  then cached); it FAILS the test, never skips it, when they are absent and cannot be built.
  The build runs right after collection when a collected test uses ``real_binaries`` (which
  ``real_cluster`` does): a cold build takes minutes, outside every test's timeout;
- ``real_binaries`` (session-scoped): those binaries (``kubesim.real.Binaries``);
- ``real_kubelet``: a ``KubeletThread`` on it, as node ``kubesim-<n>`` (a new node per test:
  nothing left by one test's kubelet runs under the next), same faults and helpers.

A project configures them by overriding these fixtures in its ``conftest.py``:

- ``kubesim_crd_files``: CRD files installed before the test (default none);
- ``kubesim_known_images``: the images the kubelet "has" (default ``KNOWN_IMAGES``);
- ``kubesim_base_env``: the pods' environment under their own (default
  ``default_base_env()``: this interpreter on PATH, the current folder on PYTHONPATH);
- ``kubesim_real_users`` (session-scoped): the real API server's static token users, name to
  groups (default one user ``tester`` in no group: authenticated, allowed nothing by RBAC).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures: a session without a cluster does not load the emulator
    from kubesim.cluster import EmulatedCluster
    from kubesim.kubelet import KubeletThread
    from kubesim.real import Binaries, RealControlPlane

_NODES = itertools.count(1)
_BINARIES = pytest.StashKey[object]()  # kubesim.real.Binaries, or the ControlPlaneError of the build


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build (or find) the real control plane's binaries once, before any test, when one needs them."""
    if not any("real_binaries" in getattr(item, "fixturenames", ()) for item in items):
        return
    from kubesim.real import ControlPlaneError, binaries

    try:
        config.stash[_BINARIES] = binaries()
    except ControlPlaneError as e:
        config.stash[_BINARIES] = e


@pytest.fixture
def kubesim_crd_files() -> Sequence[Path]:
    """CRD files the ``cluster`` fixture installs at start; override it in a conftest.py."""
    return ()


@pytest.fixture
def kubesim_known_images() -> Sequence[str]:
    """Image patterns (fnmatch) the ``kubelet`` fixture can "pull"; override it in a conftest.py."""
    from kubesim.kubelet import KNOWN_IMAGES

    return KNOWN_IMAGES


@pytest.fixture
def kubesim_base_env() -> dict[str, str]:
    """The environment of every pod process under the pod's own; override it in a conftest.py."""
    from kubesim.kubelet import default_base_env

    return default_base_env()


@pytest.fixture
def cluster(tmp_path: Path, kubesim_crd_files: Sequence[Path]) -> Iterator[EmulatedCluster]:
    """An emulated cluster for the test, with ``kubesim_crd_files`` installed; a server error fails the test."""
    from kubesim.cluster import EmulatedCluster

    emulated = EmulatedCluster(tmp_path / "cluster", crd_files=tuple(kubesim_crd_files)).start()
    try:
        yield emulated
    finally:
        emulated.stop()
    assert not emulated.internal_errors, f"the emulator failed while serving: {emulated.internal_errors!r}"


@pytest.fixture
def kubelet(
    cluster: EmulatedCluster,
    tmp_path: Path,
    kubesim_known_images: Sequence[str],
    kubesim_base_env: dict[str, str],
) -> Iterator[KubeletThread]:
    """A kubelet stand-in on ``cluster``; a task it leaks fails the test."""
    with emulated_kubelet(cluster.url, tmp_path / "kubelet", kubesim_known_images, kubesim_base_env) as node:
        yield node


@contextlib.contextmanager
def emulated_kubelet(
    url: str, workdir: Path, known_images: Sequence[str], base_env: dict[str, str]
) -> Iterator[KubeletThread]:
    """A kubelet stand-in on the emulator at ``url``; afterwards, every pod process it started must be gone."""
    from kubesim.kubelet import KubeletThread

    node = KubeletThread(url, workdir, known_images=known_images, base_env=base_env).start()
    with stopped_without_leaks(node):
        yield node


@contextlib.contextmanager
def stopped_without_leaks(node: KubeletThread) -> Iterator[None]:
    """Stop ``node`` when the block ends and check that none of its pods' process groups survived it."""
    try:
        yield
    finally:
        pids = [r.process.pid for r in node.kubelet.pods.values() if r.process is not None]
        node.stop()
        for pid in pids:  # the process group leader is reaped by the kubelet: no pid, no leak
            with pytest.raises(ProcessLookupError):
                os.killpg(pid, 0)


@pytest.fixture(scope="session")
def kubesim_real_users() -> Mapping[str, Sequence[str]]:
    """Static token users of the ``real_cluster`` (name -> groups); override it in a conftest.py."""
    return {"tester": ()}


@pytest.fixture(scope="session")
def real_binaries(pytestconfig: pytest.Config) -> Binaries:
    """The real control plane's binaries, built after collection (see the module docstring)."""
    from kubesim.real import Binaries, ControlPlaneError, binaries

    found = pytestconfig.stash.get(_BINARIES, None)
    if found is None:  # collected without the hook (a plugin reordering items, say): build now
        try:
            found = binaries()
        except ControlPlaneError as e:
            found = e
    if isinstance(found, ControlPlaneError):
        pytest.fail(f"the real control plane's binaries are absent and could not be built: {found}", pytrace=False)
    assert isinstance(found, Binaries)
    return found


@pytest.fixture(scope="session")
def real_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    kubesim_real_users: Mapping[str, Sequence[str]],
    real_binaries: Binaries,
) -> Iterator[RealControlPlane]:
    """The real control plane for the test session (``real_binaries``), with ``kubesim_real_users``."""
    from kubesim.real import RealControlPlane

    plane = RealControlPlane(tmp_path_factory.mktemp("real-cluster"), users=kubesim_real_users, bins=real_binaries)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def real_kubelet(
    real_cluster: RealControlPlane,
    tmp_path: Path,
    kubesim_known_images: Sequence[str],
    kubesim_base_env: dict[str, str],
) -> Iterator[KubeletThread]:
    """A kubelet stand-in on ``real_cluster``; a task it leaks fails the test."""
    node = real_cluster.start_kubelet(
        tmp_path / "kubelet",
        node_name=f"kubesim-{next(_NODES)}",
        known_images=kubesim_known_images,
        base_env=kubesim_base_env,
    )
    with stopped_without_leaks(node):
        yield node
