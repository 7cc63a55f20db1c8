"""The operator's list-then-watch (``io/informer.py``) against the API server: one object its feed cannot take
is skipped, never the listing or the watch with it (a listing that never completed would keep every run from
being reconciled: ``Handlers.ready``). Both servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentrun_operator.io import informer as informer_module
from agentrun_operator.io import metrics
from agentrun_operator.io.informer import Informer
from agentrun_operator.io.kube import KubeClient
from kubesim import EmulatedCluster

pytestmark = [pytest.mark.timeout(120), pytest.mark.real_server]

PATH = "/api/v1/namespaces/default/configmaps"


class PickyFeed:
    """A feed that fails on the object named ``refused``, and records the rest."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.events: list[tuple[str | None, str]] = []
        self.listings = 0
        self.completed = 0

    def listing(self) -> None:
        self.listings += 1

    def event(self, type: str | None, body: dict[str, Any]) -> None:  # the API's name
        name = body["metadata"]["name"]
        if name == self.refused:
            raise ValueError(f"cannot take {name}")
        self.events.append((type, name))

    def listed(self) -> None:
        self.completed += 1


def _configmap(cluster: EmulatedCluster, name: str, value: str) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}
    made = cluster.api("POST", PATH, body)
    assert made.status == 201, made


async def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_an_object_the_feed_cannot_take_is_skipped_and_the_listing_and_watch_go_on(
    cluster: EmulatedCluster,
) -> None:
    for name in ("a", "b", "c"):
        _configmap(cluster, name, "1")
    feed = PickyFeed(refused="b")
    kube = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    # One object a page: the refused one is in the middle of the listing.
    informer = Informer(kube, PATH, feed, api_version="v1", kind="ConfigMap", page_size=1)
    task = asyncio.create_task(informer.run())
    try:
        await _until("the listing to complete", lambda: feed.completed == 1)
        listed = {name for type_, name in feed.events if type_ is None}
        assert {"a", "c"} <= listed and "b" not in listed, feed.events
        _configmap(cluster, "d", "1")  # the watch goes on past the refused object's events
        cluster.api("PATCH", f"{PATH}/b", {"data": {"v": "2"}}, content_type="application/merge-patch+json")
        _configmap(cluster, "e", "1")
        await _until("d and e watched", lambda: {("ADDED", "d"), ("ADDED", "e")} <= set(feed.events))
        assert feed.listings == 1 and informer.lists == 1, "a refused object made the informer list again"
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()


async def test_a_watch_the_server_ends_is_resumed_from_its_version_without_listing_again(
    cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "WATCH_SECONDS", 2)  # the server ends each watch after 1-2 s
    _configmap(cluster, "a", "1")
    feed = PickyFeed(refused="")
    kube = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    informer = Informer(kube, PATH, feed, api_version="v1", kind="ConfigMap", page_size=10)
    watches = metrics.KUBE_REQUESTS.labels(verb="WATCH", code="200")
    before = watches._value.get()
    task = asyncio.create_task(informer.run())
    try:
        await _until("the listing to complete", lambda: feed.completed == 1)
        await _until("three watches", lambda: watches._value.get() - before >= 3)
        _configmap(cluster, "b", "1")
        await _until("b watched", lambda: ("ADDED", "b") in feed.events)
        assert feed.listings == 1 and informer.lists == 1, "an ended watch made the informer list again"
        assert feed.events.count((None, "a")) == 1 and ("ADDED", "a") not in feed.events, "a was seen twice"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()
