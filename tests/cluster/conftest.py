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

from collections.abc import Sequence
from pathlib import Path

import pytest

from kubesim import KOPF_PEERING_CRDS, default_base_env

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "agentrun.dev_agentruns.yaml"
CRD_FILES = (*sorted((ROOT / "crds").glob("*.yaml")), KOPF_PEERING_CRDS)
EXAMPLE = ROOT / "examples" / "agentrun.yaml"
INVALID_MANIFESTS = sorted((Path(__file__).parent / "manifests").glob("invalid-*.yaml"))
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
