"""kubesim: an emulated Kubernetes cluster for tests and local development.

The API server (``ClusterEmulator``, kmock's ``KubernetesEmulator`` made
faithful to kube-apiserver's documented behaviour) runs on a background thread
behind a real HTTP port (``EmulatedCluster``), so separate processes — the
real ``kubectl``, Helm, an operator, pods — reach it over TCP; a kubelet
stand-in (``Kubelet`` / ``KubeletThread``) runs the pods as local processes
and injects faults. ``kubesim.pytest_plugin`` gives tests ``cluster`` and
``kubelet`` fixtures. README.md says what is faithful and what is left out.
"""

from __future__ import annotations

from kubesim.cluster import KUBECTL, ApiResponse, EmulatedCluster, write_kubeconfig
from kubesim.emulator import KOPF_PEERING_CRDS, ClusterEmulator
from kubesim.kubelet import KNOWN_IMAGES, Kubelet, KubeletThread, default_base_env
from kubesim.testing import python_pod, terminated

__all__ = [
    "KNOWN_IMAGES",
    "KOPF_PEERING_CRDS",
    "KUBECTL",
    "ApiResponse",
    "ClusterEmulator",
    "EmulatedCluster",
    "Kubelet",
    "KubeletThread",
    "default_base_env",
    "python_pod",
    "terminated",
    "write_kubeconfig",
]
