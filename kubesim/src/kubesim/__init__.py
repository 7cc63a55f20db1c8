"""kubesim: an emulated Kubernetes cluster for tests and local development.

The API server (``ClusterEmulator``, kmock's ``KubernetesEmulator`` made
faithful to kube-apiserver's documented behaviour) runs on a background thread
behind a real HTTP port (``EmulatedCluster``), so separate processes — the
real ``kubectl``, Helm, an operator, pods — reach it over TCP; a kubelet
stand-in (``Kubelet`` / ``KubeletThread``) runs the pods as local processes
and injects faults. ``kubesim.pytest_plugin`` gives tests ``cluster`` and
``kubelet`` fixtures. README.md says what is faithful and what is left out.

``kubesim.real`` (``RealControlPlane``) starts the real thing beside it: etcd,
kube-apiserver and kube-controller-manager built by ``hack/k8s/build.sh``, on
loopback with certificates from ``kubesim.pki``, and the same kubelet stand-in
as its node; the plugin's ``real_cluster`` and ``real_kubelet`` fixtures give it
to tests. ``kubesim.node`` (``RealNode``, ``NodeCluster``, ``python -m kubesim.node``)
adds a real node: containerd, runc, CNI, the kubelet, kube-proxy and kube-scheduler,
with ``kubesim.nodehost`` for what it puts on the host and the sweep that removes it.

Modules. The API server: ``emulator`` (the server and its routes), ``registry``
(what a write does to stored objects), ``resources`` (what is served: CRDs and
built-ins), ``schema`` (a CRD's structural schema: defaults, pruning,
validation), ``celrules`` (``x-kubernetes-validations``), ``admission`` (built-in
objects beyond storing them), ``fieldmanager`` (server-side apply),
``patching``, ``selectors``, ``tables`` (``kubectl get``'s Table), ``openapi``
(``kubectl explain`` and field validation), ``protobuf`` (bodies kubectl sends
that way), ``limits`` (sizes and nesting), ``apierrors`` (``v1 Status``),
``rbac`` (opt-in authorization). Around it: ``cluster`` (a server on a thread,
driven like a user would), ``access`` (a client's URL and identity),
``kubelet`` (the stand-in), ``real`` and ``pki`` (the real control plane and its
certificates), ``node`` and ``nodehost`` (the real node), ``pytest_plugin``,
``testing`` (small builders), ``__main__`` (``python -m kubesim``: the server,
its kubeconfig, optionally the kubelet).

The names below are imported on first use: pytest loads the plugin in every
session, and a session that uses no cluster should not pay for the emulator's
imports (kmock, aiohttp, the CEL engine, the upstream schemas).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubesim.cluster import KUBECTL, ApiResponse, EmulatedCluster, write_kubeconfig
    from kubesim.emulator import KOPF_PEERING_CRDS, ClusterEmulator
    from kubesim.kubelet import KNOWN_IMAGES, Kubelet, KubeletThread, default_base_env
    from kubesim.testing import python_pod, terminated

_HOMES = {
    "KUBECTL": "kubesim.cluster",
    "ApiResponse": "kubesim.cluster",
    "EmulatedCluster": "kubesim.cluster",
    "write_kubeconfig": "kubesim.cluster",
    "KOPF_PEERING_CRDS": "kubesim.emulator",
    "ClusterEmulator": "kubesim.emulator",
    "KNOWN_IMAGES": "kubesim.kubelet",
    "Kubelet": "kubesim.kubelet",
    "KubeletThread": "kubesim.kubelet",
    "default_base_env": "kubesim.kubelet",
    "python_pod": "kubesim.testing",
    "terminated": "kubesim.testing",
}

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


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kubesim' has no attribute {name!r}")
