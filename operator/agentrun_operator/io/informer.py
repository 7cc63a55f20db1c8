"""The operator's own list-then-watch of AgentRuns and of its pods, feeding plain indexes (io/handlers.py).

Why not kopf's watches with kopf indexes (bench/REPORT.md, the operator at 10,000 runs): kopf starts no
handler before every index holds its initial listing, and until then it keeps, for every listed object, a
worker task, its coroutine frames, its queue, its ``Body`` wrapper and three loggers: about 20 KB an object,
a new leader's peak at 10,000 runs, whose pages the process kept afterwards. Here a page of the listing is
decoded, handed to the feed (which packs what it keeps: ``reconcile.PackedRun``, ``PodView``) and dropped
before the next page is asked for.

What the feed can rely on, as with client-go's informers:

- ``listing()``, then every object of the list as an event of type ``None``, then ``listed()``: the list is
  one snapshot (the API's limit/continue pages of one resourceVersion), and what it did not show is gone
  (a relist after the watch's version expired: an object deleted meanwhile sent no DELETED).
- Then the watch's events (``ADDED``, ``MODIFIED``, ``DELETED``) from exactly the list's version: no change
  is missed between the list and the watch, and none is seen twice out of order.
- A watch that ends is resumed from the last version seen; a version the server no longer has (410 Gone) is a
  new list. Errors are retried with a backoff, forever (the operator's readiness is the feed's to judge).

The feed's methods are synchronous: an event updates the indexes in one step, with no await in between, so a
reconcile never sees an index half-way through an event.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Protocol

from .kube import ApiError, KubeClient

log = logging.getLogger("agentrun_operator.informer")

BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0)  # after 1, 2, 3, 4+ failures in a row
WATCH_SECONDS = 600


class Feed(Protocol):
    """What an ``Informer`` feeds (module docstring)."""

    def listing(self) -> None:
        """A list begins: its objects follow as events of type None."""

    def event(self, type: str | None, body: dict[str, Any]) -> None:  # the API's name
        """One object: listed (None) or watched (ADDED, MODIFIED, DELETED)."""

    def listed(self) -> None:
        """The list is complete: what it did not show is gone."""


class Gone(Exception):
    """410: the version to watch from is no longer kept by the server (list again)."""


class Informer:
    """One collection (``path``: a namespace's or every namespace's), listed in pages, then watched."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        feed: Feed,
        *,
        api_version: str,
        kind: str,
        page_size: int,
        label_selector: str | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.feed = feed
        self.api_version = api_version
        self.kind = kind
        self.page_size = max(1, page_size)
        self.label_selector = label_selector
        self.lists = 0  # lists completed (the first one makes the feed complete)
        self.version: str | None = None  # the last resourceVersion seen (None: list again)

    async def run(self) -> None:
        """List, then watch, forever (cancel to stop)."""
        failures = 0
        while True:
            try:
                if self.version is None:
                    self.version = await self._list()
                    self.lists += 1
                await self._watch()
                failures = 0
            except Gone:
                log.info("%s: the watch's version expired; listing again", self.path)
                self.version = None
            except Exception as e:  # no answer, an error answer, a garbled event: never a watch that stops for good
                failures += 1
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1]
                log.warning("%s: %s; again in %gs", self.path, e, delay)
                await asyncio.sleep(delay)

    def _params(self) -> dict[str, str]:
        return {"labelSelector": self.label_selector} if self.label_selector else {}

    async def _list(self) -> str:
        """One snapshot, page by page; its resourceVersion (the watch starts there)."""
        params = {**self._params(), "limit": str(self.page_size)}
        self.feed.listing()
        while True:
            try:
                page: dict[str, Any] = await self.kube.request("GET", self.path, params=params)
            except ApiError as e:
                if e.status == 410 and "continue" in params:  # the snapshot expired between pages: start over
                    params.pop("continue")
                    self.feed.listing()
                    continue
                raise
            for body in page.get("items") or []:
                self._deliver(None, body)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                self.feed.listed()
                return str(meta.get("resourceVersion") or "")
            params["continue"] = str(meta["continue"])
            del page  # one page decoded at a time

    async def _watch(self) -> None:
        """Watch from ``self.version`` until the server ends the stream (``Gone``: the version expired)."""
        # The server ends the watch after timeoutSeconds (5-10 min, as client-go's): a connection that died
        # without a word (a node's NAT, a proxy) would otherwise be waited on forever.
        timeout = str(random.randint(WATCH_SECONDS // 2, WATCH_SECONDS))
        params = {**self._params(), "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": timeout}
        if self.version:
            params["resourceVersion"] = self.version
        try:
            async for event in self.kube.watch(self.path, params):
                type_, body = event.get("type"), event.get("object") or {}
                if type_ == "ERROR":
                    code = int(body.get("code") or 0)
                    if code == 410:
                        raise Gone
                    raise ApiError(code, str(body.get("reason") or ""), str(body.get("message") or ""))
                self.version = str((body.get("metadata") or {}).get("resourceVersion") or "") or self.version
                if type_ in ("ADDED", "MODIFIED", "DELETED"):
                    self._deliver(type_, body)
        except ApiError as e:
            if e.status == 410:
                raise Gone from e
            raise

    def _deliver(self, type_: str | None, body: dict[str, Any]) -> None:
        # A list's items carry no apiVersion and kind on a real API server (a watch's objects do).
        body.setdefault("apiVersion", self.api_version)
        body.setdefault("kind", self.kind)
        try:
            self.feed.event(type_, body)
        except Exception:
            # One object the feed cannot take is skipped (its next event tries again), as a failed kopf handler
            # was: retrying the watch would meet it again first, and a listing that never completes would keep
            # every other run from being reconciled.
            meta = body.get("metadata") or {}
            log.exception("%s: %s %s/%s skipped", self.path, type_ or "LISTED", meta.get("namespace"), meta.get("name"))
