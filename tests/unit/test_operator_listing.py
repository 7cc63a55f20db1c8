"""The operator's own listings feed its indexes (``io/handlers.py``, ``io/informer.py``): nothing is reconciled
before every listing is whole, then every run once; a relist prunes what it no longer shows (a run or a pod
deleted while the watch's version had expired) as a deletion; a run's DELETED event leaves no trace in the
indexes. The informers' requests themselves run against both API servers in tests/cluster/test_operator_listing.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrun_operator.io.assemble import Operator, assemble
from agentrun_operator.settings import OperatorSettings

pytestmark = pytest.mark.timeout(30)


def run(name: str, uid: str, thread: str = "t") -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": "shop", "uid": uid, "generation": 1},
        "spec": {"graph": "g:app", "threadId": thread},
        "status": {"phase": "Pending"},
    }


def pod(name: str, owner: str) -> dict[str, Any]:
    ref = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "name": "x", "uid": owner, "controller": True}
    return {"metadata": {"name": name, "namespace": "shop", "uid": f"p-{name}", "ownerReferences": [ref]}}


def spied(monkeypatch: pytest.MonkeyPatch) -> tuple[Operator, list[str], list[str]]:
    parts = assemble(object(), OperatorSettings())  # type: ignore[arg-type]
    kicked: list[str] = []
    deleted: list[str] = []

    async def delete_pods(namespace: str, name: str, uid: str) -> None:
        deleted.append(uid)

    monkeypatch.setattr(parts.wakeups, "kick", kicked.append)
    monkeypatch.setattr(parts.reconciler, "delete_pods", delete_pods)
    return parts, kicked, deleted


async def test_nothing_is_reconciled_before_every_listing_is_whole_then_every_run_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts, kicked, _ = spied(monkeypatch)
    handlers = parts.handlers
    runs, pods = _feeds(handlers)
    _list(runs, [run("a", "u1"), run("b", "u2")])
    _list(pods, [pod("a-1", "u1")], whole=False)
    assert kicked == [] and not handlers.ready, "a run was reconciled before the pods' listing was whole"
    await handlers.wake("u1")  # a wake-up from elsewhere (a timer, a store) does nothing yet
    assert parts.runs.get("u1") is not None and parts.runs.get("u1").reconciled is False  # type: ignore[union-attr]
    pods.listed()
    assert handlers.ready and sorted(kicked) == ["u1", "u2"], kicked
    runs.event("MODIFIED", run("b", "u2"))  # a status echo: the same generation
    assert sorted(kicked) == ["u1", "u2"], "an echo was reconciled again"
    pods.event("MODIFIED", pod("a-1", "u1"))
    assert kicked[-1] == "u1", "a pod event did not reconcile its run"


async def test_a_relist_prunes_a_run_and_a_pod_it_no_longer_shows_as_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    parts, _, deleted = spied(monkeypatch)
    handlers = parts.handlers
    runs, pods = _feeds(handlers)
    _list(runs, [run("a", "u1"), run("b", "u2")])
    _list(pods, [pod("a-1", "u1"), pod("b-1", "u2")])
    runs.listing()  # the watch's version expired: listed again, b was deleted meanwhile (no DELETED seen)
    runs.event(None, run("a", "u1"))
    runs.listed()
    await asyncio.sleep(0.01)
    assert "u2" not in handlers.index.bodies and [p.uid for p in handlers.index.peers(("shop", "t"))] == ["u1"]
    assert deleted == ["u2"], "the pruned run's pods were not deleted as a DELETED event's are"
    pods.listing()
    pods.event(None, pod("a-1", "u1"))
    pods.listed()
    assert ("shop", "b-1") not in parts.reconciler.pods.index, "a pod the relist no longer showed was kept"


def _list(feed: Any, bodies: list[dict[str, Any]], *, whole: bool = True) -> None:
    """A listing of ``bodies`` handed to ``feed`` (``whole``: and completed)."""
    feed.listing()
    for body in bodies:
        feed.event(None, body)
    if whole:
        feed.listed()


def _feeds(handlers: Any) -> tuple[Any, Any]:
    if not handlers.feeds:
        handlers.informers()  # makes the feeds: runs then pods for each scope
    return handlers.feeds[0], handlers.feeds[1]


def evicted(pod_body: dict[str, Any]) -> dict[str, Any]:
    terminated = {"exitCode": 6, "reason": "Error"}
    pod_body["status"] = {
        "phase": "Failed",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        "containerStatuses": [{"name": "runner", "state": {"terminated": terminated}}],
    }
    return pod_body


async def test_a_pod_deleted_right_after_it_ended_is_read_once_as_it_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    # An eviction: the runner's exit, then the pod's deletion, back to back on the watch. The reconcile the exit
    # queued runs after both were indexed; it must still see how the attempt ended (Disrupted, not Deleted).
    parts, _, _ = spied(monkeypatch)
    runs, pods = _feeds(parts.handlers)
    _list(runs, [run("a", "u1")])
    _list(pods, [pod("a-1", "u1")])
    pods.event("MODIFIED", evicted(pod("a-1", "u1")))
    pods.event("DELETED", evicted(pod("a-1", "u1")))
    cache = parts.reconciler.pods
    seen = await cache.get("shop", "a-1")
    assert seen is not None and (seen.exit_code, seen.disruption) == (6, "EvictionByEvictionAPI"), seen
    assert await cache.get("shop", "a-1") is None, "read once: the next reconcile sees the pod gone"
    assert ("shop", "a-1") not in cache.index and cache.of_owner("shop", "u1") == []
    pods.event("DELETED", pod("a-2", "u1"))  # deleted while running (no exit): gone at once, as before
    assert await cache.get("shop", "a-2") is None
