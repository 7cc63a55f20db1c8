"""The real ``kubectl`` against the emulated cluster: built-in kinds, the test CRD, discovery, watches."""

from __future__ import annotations

import base64
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from kubesim import KUBECTL, EmulatedCluster
from kubesim.testing import python_pod

CRD_FILE = Path(__file__).parent / "crds" / "widgets.yaml"
WIDGETS = "/apis/kubesim.dev/v1/namespaces/default/widgets"


def table(output: str) -> list[list[str]]:
    """kubectl's columns, cut at the header's offsets (so an empty cell stays an empty string)."""
    header, *rows = output.rstrip().splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [[line[a:b].strip() for a, b in bounds] for line in (header, *rows)]


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubesim.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"owner": "me", **spec},
    }


def test_printer_columns_short_names_and_priority_columns(cluster: EmulatedCluster) -> None:
    assert cluster.api("POST", WIDGETS, widget("w1", size=3)).status == 201
    patched = cluster.api(
        "PATCH", f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}}, content_type="application/merge-patch+json"
    )
    assert patched.status == 200, patched.body
    for resource in ("wd", "widgets", "widget", "widgets.kubesim.dev", "kubesim"):
        header, row = table(cluster.kubectl("get", resource).stdout)
        assert header == ["NAME", "PHASE", "SIZE", "AGE"] and row[:3] == ["w1", "Running", "3"], resource
    header, row = table(cluster.kubectl("get", "wd", "-o", "wide").stdout)
    assert header == ["NAME", "PHASE", "SIZE", "OWNER", "AGE"] and row[:4] == ["w1", "Running", "3", "me"]
    explained = cluster.kubectl("explain", "widgets.spec.size")
    assert explained.returncode == 0 and "How big the widget is." in explained.stdout, explained.stderr


def test_a_crd_can_be_reapplied_deleted_and_restored(cluster: EmulatedCluster) -> None:
    names = [row[0] for row in table(cluster.kubectl("get", "crd").stdout)[1:]]
    assert names == ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev", "widgets.kubesim.dev"]
    reapplied = cluster.kubectl("apply", "-f", str(CRD_FILE))
    assert reapplied.returncode == 0 and reapplied.stderr == "", reapplied.stderr
    crd = cluster.get("crds", "widgets.kubesim.dev", None)
    assert crd is not None
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]} == {
        "NamesAccepted": "True",
        "Established": "True",
    }
    assert cluster.api("POST", WIDGETS, widget("kept")).status == 201
    assert cluster.kubectl("delete", "crd", "widgets.kubesim.dev").returncode == 0
    assert cluster.api("GET", WIDGETS).status == 404, "a deleted CRD's resource is still served"
    assert cluster.kubectl("apply", "-f", str(CRD_FILE)).returncode == 0
    assert cluster.api("GET", WIDGETS).body["items"] == [], "custom resources outlived their CRD"
    assert cluster.api("POST", WIDGETS, widget("kept")).status == 201


def test_kubectl_apply_pod_and_get_pods(cluster: EmulatedCluster, tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(python_pod("hello", "print('hello')")))
    result = cluster.kubectl("apply", "-f", str(manifest))
    assert result.returncode == 0 and "pod/hello created" in result.stdout, result.stderr
    header, row = table(cluster.kubectl("get", "pods").stdout)
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row[:4] == ["hello", "0/1", "Pending", "0"]
    typo = tmp_path / "typo.yaml"
    bad = python_pod("typo", "pass")
    bad["spec"]["containers"][0]["commandd"] = ["x"]
    typo.write_text(yaml.safe_dump(bad))
    rejected = cluster.kubectl("apply", "-f", str(typo))
    assert rejected.returncode != 0 and 'unknown field "spec.containers[0].commandd"' in rejected.stderr


def test_kubectl_create_secret_and_get_it(cluster: EmulatedCluster) -> None:
    """kubectl create sends protobuf for built-ins: the emulator decodes the kinds users create."""
    result = cluster.kubectl(
        "create", "secret", "generic", "app-store", "--from-literal=postgresDsn=postgresql://app@db/app"
    )
    assert result.returncode == 0, result.stderr
    header, row = table(cluster.kubectl("get", "secrets").stdout)
    assert header == ["NAME", "TYPE", "DATA", "AGE"] and row[:3] == ["app-store", "Opaque", "1"]
    secret = cluster.get("secrets", "app-store")
    assert secret is not None
    assert base64.b64decode(secret["data"]["postgresDsn"]) == b"postgresql://app@db/app"
    assert cluster.kubectl("create", "configmap", "settings", "--from-literal=region=eu").returncode == 0
    assert (cluster.get("configmaps", "settings") or {}).get("data") == {"region": "eu"}
    assert cluster.kubectl("create", "serviceaccount", "runner").returncode == 0
    assert cluster.get("serviceaccounts", "runner") is not None


def test_watch_of_the_emulator_ends_when_the_cluster_stops(tmp_path: Path) -> None:
    """A client still watching must not keep the server from stopping (teardown stays fast)."""
    emulated = EmulatedCluster(tmp_path / "c").start()
    watch = subprocess.Popen(
        [KUBECTL, f"--kubeconfig={emulated.kubeconfig}", "get", "pods", "-w"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        started = time.monotonic()
        emulated.stop()
        # A hang guard, not a speed: a stop that waited for the watch would wait as long as kubectl watches (for
        # ever); 30 s leaves room for CI's load (four test processes on two cores).
        assert time.monotonic() - started < 30
    finally:
        watch.kill()
        watch.wait()
