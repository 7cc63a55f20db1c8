"""End-to-end tier: the issue-4 scenarios on a REAL Kubernetes cluster, plus the deploy manifests.

Two kinds of tests live here:

- ``test_manifests.py`` (marker ``chart``, always runs): every object of ``deploy/`` is valid
  for Kubernetes 1.30 (``kubernetes_validate``, strict), the operator's RBAC is exactly what
  its code calls, the pods satisfy the restricted Pod Security profile, and
  ``hack/e2e-kind.sh`` parses and substitutes what it means to.
- ``test_real_cluster.py`` (marker ``e2e``): the same guarantees as the emulated-cluster tier
  (tests/cluster), proven against a real API server, a real kubelet and the real image:
  ``kubectl apply`` -> Succeeded with the store's version in status, a runner killed
  mid-tool -> rescheduled and charged once, eviction through the Eviction API -> a
  disruption, ``kubectl patch`` stop -> Stopped, ``kubectl delete`` -> pods gone and thread
  data kept, an unknown graph -> Failed once. Skipped unless a cluster is configured:

  ``AGENTRUN_E2E_KUBECONFIG``      kubeconfig of a cluster where crds/, deploy/operator.yaml
                                   and a store Secret ``agentrun-store`` in ``default`` are applied
  ``AGENTRUN_E2E_POSTGRES_DSN``    that store's PostgreSQL as reachable from here (a port-forward)
  ``AGENTRUN_E2E_KIND_CLUSTER``    optional: the cluster is kind, its nodes are Docker containers
                                   (lets a test SIGKILL a container's PID 1 from its node)

  ``make e2e-kind`` (hack/e2e-kind.sh) sets all three up on a fresh kind cluster. The tests
  create AgentRuns with fresh names and threads in ``default`` and delete them afterwards;
  thread data stays in the store (deleting data is never implicit).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.realcluster import LEASE, OPERATOR_NAMESPACE, Kubectl, NewRun, Store, example_run, wait_for

KUBECONFIG = os.environ.get("AGENTRUN_E2E_KUBECONFIG", "")
POSTGRES_DSN = os.environ.get("AGENTRUN_E2E_POSTGRES_DSN", "")


@pytest.fixture(scope="session")
def kube() -> Kubectl:
    """kubectl for the configured cluster, once the operator has a leader (so the first test is not slower)."""
    if not KUBECONFIG:
        pytest.skip("no real cluster: AGENTRUN_E2E_KUBECONFIG is not set")
    client = Kubectl(KUBECONFIG)
    lease = Kubectl(KUBECONFIG, namespace=OPERATOR_NAMESPACE)
    wait_for(
        lambda: ((lease.json("lease", LEASE) or {}).get("spec") or {}).get("holderIdentity"),
        timeout=180,
        message=lambda: f"no operator replica took the leader lease\n{client.operator_log()}",
    )
    return client


@pytest.fixture(scope="session")
def store() -> Store:
    if not POSTGRES_DSN:
        pytest.fail(
            "AGENTRUN_E2E_KUBECONFIG is set but AGENTRUN_E2E_POSTGRES_DSN is not: the tests read the "
            "store to check what the cluster did (hack/e2e-kind.sh port-forwards it and sets both)"
        )
    return Store(POSTGRES_DSN)


@pytest.fixture
def new_run(kube: Kubectl) -> Iterator[NewRun]:
    """Apply examples/agentrun.yaml under a fresh name (also its thread id); returns the name.

    Every run a test made is deleted afterwards (its pods go with it, its thread stays).
    """
    made: list[str] = []

    def create(scenario: str, *, env: dict[str, str] | None = None, **spec: Any) -> str:
        name = f"e2e-{scenario}-{uuid.uuid4().hex[:6]}"
        kube.apply(example_run(name, thread=name, env=env, **spec))
        made.append(name)
        return name

    yield create
    for name in made:
        kube.run("delete", "agentrun", name, "--ignore-not-found", "--wait=false", check=False)
