"""kubesim's self-tests: the emulated API server, the kubelet stand-in and the plugin's fixtures.

The ``cluster`` and ``kubelet`` fixtures come from kubesim's own pytest plugin;
here the cluster serves a test CRD (``crds/widgets.yaml``: a namespaced kind
with a status subresource, printer columns, defaults, CEL rules) and kopf's
peering CRDs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from kubesim import KOPF_PEERING_CRDS

HERE = Path(__file__).parent
CRD_FILES = (HERE / "crds" / "widgets.yaml", KOPF_PEERING_CRDS)


@pytest.fixture
def kubesim_crd_files() -> Sequence[Path]:
    return CRD_FILES
