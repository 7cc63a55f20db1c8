"""The run list (pure): the caller's AgentRuns and the deleted ones the store kept, searched, newest first, paged.

One entry shape for both (the list page's rows and the JSON API's items). A deleted run comes from the
store's turns (``PgCheckpointer.recorded_runs``: the request key the operator derived from the AgentRun,
``<namespace>/<name>/<digest>``), and is listed only beside a listing of its namespace that the API server
allowed the caller (the server asks the store only then): whoever may list AgentRuns there could see the run
while it existed. A run made with ``spec.requestId`` left no name in the store and is not listed once
deleted. A name that exists again lists the living run only.

Sorted newest first (creation time; a deleted run's first turn), then namespace and name. The search is a
case-insensitive substring of the name, graph, thread id or namespace; the phase filter takes ``Deleted``
too; the time filter keeps runs created within the last hour, day, week or 30 days. Pages of ``PAGE_SIZE``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun_operator.decide import toolerrors

PAGE_SIZE = 50
DELETED = "Deleted"


def alive(run: dict[str, Any]) -> dict[str, Any]:
    """An AgentRun as the list shows it."""
    meta, spec, status = run["metadata"], run.get("spec") or {}, run.get("status") or {}
    calls = status.get("toolCalls") or {}
    return {
        "namespace": meta.get("namespace"),
        "name": meta["name"],
        "phase": status.get("phase") or "Pending",
        "currentNode": status.get("currentNode"),
        "stateVersion": status.get("stateVersion"),
        "attempt": status.get("attempt"),
        "toolCalls": calls,
        # The list's words: "2 run, 3 failed" and, when calls failed, "3 failed tool calls" (a warning).
        "tools": toolerrors.summary(calls),
        "warning": toolerrors.failure_words(calls) or None,
        "graph": spec.get("graph"),
        "threadId": spec.get("threadId"),
        "created": meta.get("creationTimestamp"),
        "deleted": False,
        "storeStatus": None,
    }


def deleted(row: dict[str, Any]) -> dict[str, Any]:
    """A deleted run as the list shows it, from the store's row (``recorded_runs``)."""
    thread = str(row.get("thread_id") or "")
    started = row.get("started_at")
    created = (
        datetime.fromtimestamp(float(started), UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if started is not None else None
    )
    return {
        "namespace": row["namespace"],
        "name": row["name"],
        "phase": DELETED,
        "currentNode": None,
        "stateVersion": None,
        "attempt": None,
        "toolCalls": {},
        "tools": None,
        "warning": None,
        "graph": None,
        "threadId": thread.split("/", 1)[1] if "/" in thread else thread,
        "created": created,
        "deleted": True,
        "storeStatus": row.get("status"),  # the turn's last word in the store: completed, failed, stopped, ...
    }


def entries(runs: Iterable[dict[str, Any]], recorded: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The living runs and the deleted ones (a name that exists again: the living run only)."""
    living = [alive(r) for r in runs]
    names = {(x["namespace"], x["name"]) for x in living}
    gone = [deleted(r) for r in recorded if (r["namespace"], r["name"]) not in names]
    return living + gone


# The time filter's choices: created within the last hour, day, week, 30 days.
WITHIN = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30)}


def since(within: str | None, now: datetime) -> str | None:
    """The creation time (ISO-8601 UTC, as entries hold it) a ``within`` choice starts at, or None (any time)."""
    window = WITHIN.get(within or "")
    return (now - window).strftime("%Y-%m-%dT%H:%M:%SZ") if window else None


def matches(entry: dict[str, Any], *, phase: str | None, search: str | None, after: str | None = None) -> bool:
    """``entry`` is in ``phase`` (``Deleted`` for a deleted run), was created at ``after`` or later, and
    ``search`` is in one of its names."""
    if phase and entry["phase"] != phase:
        return False
    if after and str(entry.get("created") or "") < after:
        return False
    if not search:
        return True
    needle = search.casefold()
    fields = (entry["name"], entry["graph"], entry["threadId"], entry["namespace"])
    return any(needle in str(f).casefold() for f in fields if f)


def chosen(
    items: Iterable[dict[str, Any]], *, phase: str | None, search: str | None, after: str | None = None
) -> list[dict[str, Any]]:
    """The entries that match, newest first (then namespace and name)."""
    kept = [x for x in items if matches(x, phase=phase, search=search, after=after)]
    kept.sort(key=lambda x: (str(x.get("namespace") or ""), x["name"]))
    kept.sort(key=lambda x: str(x.get("created") or ""), reverse=True)  # ISO-8601 UTC: text order is time order
    return kept


def paged(items: Sequence[dict[str, Any]], page: int) -> tuple[list[dict[str, Any]], int, int]:
    """Page ``page`` of ``items`` (clamped to the pages there are): its entries, the page, the number of pages."""
    pages = max(1, -(-len(items) // PAGE_SIZE))
    page = min(max(1, page), pages)
    return list(items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]), page, pages


def page_number(text: str | None) -> int:
    """The ``page`` query parameter: a positive integer, else 1."""
    return int(text) if text and text.isdigit() and 0 < len(text) <= 6 and int(text) > 0 else 1
