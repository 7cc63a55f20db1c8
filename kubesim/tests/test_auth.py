"""Opt-in bearer-token authentication of the emulated API server (``ClusterEmulator.bearer_tokens``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from kubesim import EmulatedCluster

UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}


def get(cluster: EmulatedCluster, authorization: str | None) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": authorization} if authorization else {}
    request = urllib.request.Request(cluster.url + "/api/v1/namespaces/default", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def configure(cluster: EmulatedCluster, tokens: set[str] | None, *, anonymous: bool = True) -> None:
    def apply() -> None:
        assert cluster.emulator is not None
        cluster.emulator.bearer_tokens = None if tokens is None else frozenset(tokens)
        cluster.emulator.anonymous_auth = anonymous

    cluster.call(apply)


def test_off_by_default_every_request_is_allowed(cluster: EmulatedCluster) -> None:
    assert get(cluster, None)[0] == 200
    assert get(cluster, "Bearer anything")[0] == 200


def test_a_wrong_token_is_refused_as_kube_apiserver_refuses_it(cluster: EmulatedCluster) -> None:
    configure(cluster, {"right"})
    assert get(cluster, "Bearer right")[0] == 200
    assert get(cluster, "Bearer wrong") == (401, UNAUTHORIZED)
    assert get(cluster, "Basic dXNlcjpwdw==") == (401, UNAUTHORIZED)
    assert get(cluster, None)[0] == 200, "no credentials: the anonymous user (--anonymous-auth=true)"
    configure(cluster, {"right"}, anonymous=False)
    assert get(cluster, None) == (401, UNAUTHORIZED)
    configure(cluster, {"rotated"}, anonymous=False)  # tokens may change while serving
    assert get(cluster, "Bearer right") == (401, UNAUTHORIZED)
    assert get(cluster, "Bearer rotated")[0] == 200
