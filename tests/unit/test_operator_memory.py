"""What the operator keeps of each run, and what it gives back (``io/handlers.py``'s Memory, ``io/memory.py``).

The guarantees: the runs index keeps the reconcile's view packed and unpacks an equal, private copy, the pods
index a pod's view; the status our last patch returned is kept, as compact text, only until the watch delivers
it (one copy a run, not two), and a reconcile queued meanwhile still decides on the newest;
a burst of reconciles gives its memory back once drained, and a trickle never pays for a collection; the
initial listings come in pages of ``list_page_size``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from typing import Any

import kopf
import pytest

from agentrun_operator.decide.podspec import GROUP, PLURAL, VERSION
from agentrun_operator.decide.status import AgentRunStatus
from agentrun_operator.io.assemble import assemble
from agentrun_operator.io.memory import Releaser, dump, release
from agentrun_operator.io.reconcile import PackedRun, Pass, run_view, status_text
from agentrun_operator.io.wakeups import Wakeups
from agentrun_operator.settings import OperatorSettings

pytestmark = pytest.mark.timeout(60)


def agentrun(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {
            "name": "r1",
            "namespace": "shop",
            "uid": "u1",
            "generation": 2,
            "resourceVersion": "17",
            "creationTimestamp": "2026-12-06T06:00:00Z",
            "labels": {"team": "a"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}" * 100},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 5,
        },
        "spec": {"graph": "examples.support_agent:app", "threadId": "order-1", "input": {"messages": ["hi"] * 50}},
        "status": status if status is not None else {"phase": "Interrupted", "attempt": 1, "reason": "Interrupted"},
    }


async def test_an_indexed_run_keeps_its_view_packed_and_its_thread_peer() -> None:
    raw = agentrun()
    original = copy.deepcopy(raw)
    parts = assemble(object(), OperatorSettings())  # type: ignore[arg-type]
    parts.handlers.on_run(None, raw)  # listed
    index = parts.handlers.index
    (peer,) = index.peers(("shop", "order-1"))
    assert (peer.uid, peer.phase, peer.attempt) == ("u1", "Interrupted", 1)
    packed = index.bodies["u1"]
    assert (packed.uid, packed.namespace, packed.name, packed.thread) == ("u1", "shop", "r1", "order-1")
    assert packed.unpack() == run_view(original), "the packed view is not what a reconcile reads of the body"
    assert packed.unpack() is not packed.unpack(), "two reconciles would share one copy of the view"
    parts.handlers.on_run("DELETED", raw)
    assert index.bodies == {} and index.threads == {}, "a deleted run stayed in an index"


def test_a_pod_is_indexed_as_its_view() -> None:
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "name": "r1", "uid": "u1", "controller": True}
    raw: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "r1-1", "namespace": "shop", "uid": "p1", "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "runner", "env": [{"name": "X", "value": "y" * 1000}]}]},
        "status": {"phase": "Running"},
    }
    parts = assemble(object(), OperatorSettings())  # type: ignore[arg-type]
    parts.handlers.on_pod(None, raw)
    view = parts.reconciler.pods.index[("shop", "r1-1")]
    assert (view.phase, view.owner_uid) == ("Running", "u1")
    assert parts.reconciler.pods.of_owner("shop", "u1") == ["r1-1"]


def test_our_written_status_is_kept_until_the_watch_delivers_it() -> None:
    parts = assemble(object(), OperatorSettings())  # type: ignore[arg-type]
    record = parts.runs.record("u1")
    ours = {"reason": "PodRunning", "phase": "Running", "attempt": 2}  # the keys in another order than the watch's
    record.written = status_text(ours)
    older = PackedRun.of(agentrun()).unpack()
    assert parts.reconciler.status_of(older).attempt == 2, "an older watched status replaced our own write"
    assert record.written == status_text(ours), "our write was dropped before the watch delivered it"
    echoed = PackedRun.of(agentrun({"phase": "Running", "attempt": 2, "reason": "PodRunning"})).unpack()
    assert parts.reconciler.status_of(echoed).attempt == 2
    assert record.written is None, "our write is kept beside the watch's equal copy: two copies of every status"


def test_our_written_status_is_kept_as_compact_text_not_decoded_dicts() -> None:
    status = {
        "phase": "Interrupted",
        "attempt": 1,
        "reason": "Interrupted",
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-12-06T06:00:00Z"} for t in "ABC"],
        "attempts": [{"attempt": 1, "podName": "r1-1", "startTime": "2026-12-06T06:00:00Z"}],
    }
    text = status_text(status)
    assert isinstance(text, str) and json.loads(text) == status
    assert sys.getsizeof(text) * 3 < _deep_size(status), "the kept copy is not smaller than the decoded status"


def _deep_size(value: Any) -> int:
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(_deep_size(k) + _deep_size(v) for k, v in value.items())
    if isinstance(value, list):
        return sys.getsizeof(value) + sum(_deep_size(v) for v in value)
    return sys.getsizeof(value)


def test_the_echo_of_our_write_drops_our_copy_as_the_index_takes_it() -> None:
    parts = assemble(object(), OperatorSettings())  # type: ignore[arg-type]
    record = parts.runs.record("u1")
    record.handled = (2, False)  # its generation was reconciled: the echo queues nothing
    ours = {"phase": "Running", "attempt": 2, "reason": "PodRunning"}
    record.written = status_text(ours)
    parts.handlers.on_run("MODIFIED", agentrun())
    assert record.written == status_text(ours), "an older watched status dropped our newer write"
    parts.handlers.on_run("MODIFIED", agentrun(dict(ours)))
    assert record.written is None, (
        "our write is kept until the run's next reconcile (600 s for one waiting for a human): two copies a run"
    )
    assert json.loads(parts.handlers.index.bodies["u1"].text)["status"] == ours, "dropped, not in the index"


async def test_a_reconcile_queued_with_an_older_body_decides_on_our_write_after_its_echo_dropped_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race of 8039a43: a reconcile waits for the run's lock holding the body from before our write; the
    write's echo is indexed and our copy dropped meanwhile. It must decide on the written status, not the older."""
    parts = assemble(object(), OperatorSettings())  # type: ignore[arg-type]
    decided: list[int | None] = []

    async def spy(run: dict[str, Any], record: Any, status: AgentRunStatus, peers: Any) -> Pass:
        decided.append(status.attempt)  # what the verdict would be taken on
        return Pass(status)

    monkeypatch.setattr(parts.reconciler, "_reconcile", spy)
    record = parts.runs.record("u1")
    record.handled = (2, False)
    parts.handlers.on_run("MODIFIED", agentrun())
    older = parts.handlers.index.bodies["u1"]
    await record.lock.acquire()  # a reconcile of the run is under way: it writes ``ours``
    queued = asyncio.create_task(parts.handlers._reconcile(older))
    await asyncio.sleep(0.01)
    ours = {"phase": "Running", "attempt": 2, "reason": "PodRunning"}
    record.written = status_text(ours)
    parts.handlers.on_run("MODIFIED", agentrun(dict(ours)))  # the echo of that write
    assert record.written is None
    record.lock.release()
    await queued
    assert decided == [2], f"the queued reconcile decided on a status older than our own write: attempt {decided}"


@pytest.mark.looptime
async def test_a_burst_of_reconciles_gives_its_memory_back_once_drained_and_a_trickle_never() -> None:
    releaser = Releaser(burst=5, settle=10)

    async def reconcile(uid: str) -> None:
        await asyncio.sleep(1)

    wakeups = Wakeups(resync=3600, coalesce=1, run=reconcile, releaser=releaser)
    try:
        for i in range(8):
            wakeups.kick(f"u{i}")
        await asyncio.sleep(5)
        assert releaser.releases == 0, "memory was released before the burst's echoes could arrive"
        await asyncio.sleep(10)
        assert releaser.releases == 1, "a drained burst of 8 reconciles did not give its memory back"
        for i in range(3):
            wakeups.kick(f"v{i}")
            await asyncio.sleep(2)
        await asyncio.sleep(60)
        assert releaser.releases == 1, "reconciles one at a time paid for a full collection"
    finally:
        await wakeups.aclose()


def test_release_and_the_debug_dump_run_here(tmp_path: Any) -> None:
    before, after = release()
    assert before > 0 and after > 0, "no RSS read from /proc"
    dump(tmp_path / "memory.txt")
    text = (tmp_path / "memory.txt").read_text()
    assert text.startswith("rss_mb ") and "-- objects by type" in text and " dict" in text


def test_the_initial_listings_come_in_pages_of_the_setting() -> None:
    parts = assemble(object(), OperatorSettings(list_page_size=7, namespaces=["a", "b"]))  # type: ignore[arg-type]
    informers = parts.handlers.informers()
    assert [i.page_size for i in informers] == [7] * 4, "the runs or pods are listed in one answer"
    assert sorted(i.path for i in informers) == sorted(
        [f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in "ab"]
        + [f"/api/v1/namespaces/{ns}/pods" for ns in "ab"]
    )
    settings = kopf.OperatorSettings()
    parts.handlers.configure(settings=settings)
    assert settings.watching.chunk_size == 7, "kopf lists every Secret in one answer"
