"""The emulated API server accepts what a real one accepts and refuses what it refuses.

Hostile-object tests (a 1 MiB input, input nested thousands of levels deep)
prove something only if the emulator takes the same objects as a real server:
bodies up to 3 MiB, stored objects up to etcd's 1.5 MiB, JSON nested up to
10,000 levels, with the real messages beyond (see ``kubesim/src/kubesim/limits.py``).
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from pathlib import Path
from typing import Any

from kubesim import EmulatedCluster, limits

WIDGETS = "/apis/kubesim.dev/v1/namespaces/default/widgets"
MERGE = "application/merge-patch+json"
MIB = 1024 * 1024


def widget(name: str, input_: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubesim.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"owner": name, "input": input_},
    }


def nested_document(name: str, levels: int) -> str:
    """A Widget whose JSON nests ``levels`` deep in all (the object, spec and input count)."""
    inner = '"leaf"'
    for _ in range(levels - 2):
        inner = '{"a":' + inner + "}"
    head = json.dumps(widget(name, None))[:-2]  # drop the closing '}}' of spec and the object
    return head.removesuffix('"input": null') + '"input": ' + inner + "}}"


def depth(value: Any) -> int:
    """How deep the ``{"a": ...}`` chain of a nested input goes."""
    levels = 0
    while isinstance(value, dict):
        levels, value = levels + 1, value.get("a")
    return levels


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(text)
    return str(path)


def test_a_one_mib_input_is_stored_and_read_back(cluster: EmulatedCluster, tmp_path: Path) -> None:
    text = "x" * MIB
    path = write(tmp_path, "big", json.dumps(widget("big", {"text": text})))
    result = cluster.kubectl("create", "-f", path)
    assert result.returncode == 0, f"a real API server stores a 1 MiB spec.input: {result.stderr}"
    read = cluster.kubectl("get", "widget", "big", "-o", "jsonpath={.spec.input.text}")
    assert read.returncode == 0 and read.stdout == text, "the 1 MiB input did not come back whole"


def test_client_side_apply_of_a_large_object_hits_the_annotation_limit(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    path = write(tmp_path, "big", json.dumps(widget("big", {"text": "x" * 300_000})))
    result = cluster.kubectl("apply", "-f", path)
    assert result.returncode != 0
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in result.stderr, result.stderr
    server_side = cluster.kubectl("apply", "--server-side", "-f", path)
    assert server_side.returncode == 0, server_side.stderr


def test_an_object_over_etcds_limit_is_refused_with_the_real_message(cluster: EmulatedCluster, tmp_path: Path) -> None:
    path = write(tmp_path, "huge", json.dumps(widget("huge", {"text": "x" * 2 * MIB})))
    result = cluster.kubectl("create", "-f", path)
    assert result.returncode != 0
    assert f'Error from server: error when creating "{path}": etcdserver: request is too large' in result.stderr
    assert cluster.get("widgets", "huge") is None

    assert cluster.kubectl("create", "-f", write(tmp_path, "grows", json.dumps(widget("grows", {})))).returncode == 0
    grown = cluster.api("PATCH", f"{WIDGETS}/grows", {"spec": {"input": {"text": "x" * 2 * MIB}}}, content_type=MERGE)
    assert grown.status == 500 and grown.body["message"] == "etcdserver: request is too large", grown.body
    assert "reason" not in grown.body, "kube-apiserver passes etcd's error on without a reason"


def test_a_body_over_three_mib_is_refused_with_413(cluster: EmulatedCluster, tmp_path: Path) -> None:
    path = write(tmp_path, "vast", json.dumps(widget("vast", {"text": "x" * 4 * MIB})))
    result = cluster.kubectl("create", "-f", path)
    assert result.returncode != 0
    assert "Error from server (RequestEntityTooLarge)" in result.stderr, result.stderr
    assert "Request entity too large: limit is 3145728" in result.stderr
    assert cluster.internal_errors == []


def test_an_object_nested_ten_thousand_levels_is_stored_patched_and_watched(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    path = write(tmp_path, "deep", nested_document("deep", limits.MAX_JSON_DEPTH))
    result = cluster.kubectl("create", "-f", path)
    assert result.returncode == 0, f"a real API server accepts 10,000 levels: {result.stderr}"
    stored = cluster.api("GET", f"{WIDGETS}/deep").body
    assert depth(stored["spec"]["input"]) == limits.MAX_JSON_DEPTH - 2

    labelled = cluster.kubectl("label", "widget", "deep", "hostile=yes")
    assert labelled.returncode == 0, labelled.stderr
    patched = cluster.api("PATCH", f"{WIDGETS}/deep", {"spec": {"stop": True}}, content_type=MERGE)
    assert patched.status == 200, patched.body

    url = urllib.parse.urlsplit(cluster.url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    connection.request("GET", f"{WIDGETS}?watch=true&timeoutSeconds=2")
    try:
        with connection.getresponse() as response:
            event = json.loads(response.readline())
    finally:
        connection.close()
    assert event["type"] == "ADDED" and depth(event["object"]["spec"]["input"]) == limits.MAX_JSON_DEPTH - 2
    assert cluster.kubectl("delete", "widget", "deep").returncode == 0
    assert cluster.internal_errors == [], "the emulator broke on a deep object a real server handles"


def test_json_deeper_than_ten_thousand_levels_is_refused(cluster: EmulatedCluster) -> None:
    response = cluster.api("POST", WIDGETS, nested_document("deeper", limits.MAX_JSON_DEPTH + 1))
    assert response.status == 400 and response.body["reason"] == "BadRequest", response.body
    assert response.body["message"].startswith(
        "the object provided is unrecognized (must be of type Widget): couldn't get version/kind; "
        "json parse error: exceeded max depth"
    )
    hostile = cluster.api("POST", WIDGETS, "[" * (2 * MIB))  # a million levels: refused, not a crash
    assert hostile.status == 400, hostile.body
    assert cluster.internal_errors == []


def test_depth_counts_only_structure_outside_strings() -> None:
    assert not limits.too_deep(json.dumps({"text": "[" * 20_000}).encode())
    assert not limits.too_deep(("[]" * 20_000).encode())
    assert limits.too_deep(b"[" * 10_001 + b"]" * 10_001)
    assert not limits.too_deep(b"[" * 10_000 + b"]" * 10_000)
    assert not limits.too_deep(json.dumps({"s": '"\\"[' * 20_000}).encode())
