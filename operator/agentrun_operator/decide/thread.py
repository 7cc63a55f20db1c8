"""One thread, one live run at a time: which AgentRun on a thread may start (pure).

A thread (namespace + ``spec.threadId``) outlives its AgentRuns: a new
AgentRun for the next turn of a conversation is normal. Two of them live at
once would race on the thread's state, so the rule is **the newer waits**:

- a run that has not started (no attempt yet) does not create its pod while
  another live (not Stopped/Succeeded/Failed, not being deleted) AgentRun on
  the same thread has started, or is older (creationTimestamp, then name)
  and has not started either; it stays Pending with reason ``ThreadBusy``
  and a message naming the run it waits for;
- a run that has started is never held back (its own attempts follow each
  other as before); when the run it waited for ends or is deleted, the
  waiter starts.
- a deleted AgentRun can leave an unfinished turn in the store (its runner
  was stopped by the deletion, mid-node): ``orphaned_turn`` names that run.
  The next run on the thread waits (``ThreadBusy``) until the deleted run's
  pods are gone, then its runner closes that turn as stopped (fencing the
  deleted run off first) and starts its own turn. Closed rather than resumed:
  the deleted run's request was withdrawn with its AgentRun.

LIMIT: the operator sees other runs through a cache fed by the watch. A run
created an instant before another may not be in that cache yet when the
other is reconciled, so of two runs applied together the younger can win
the thread; the older then waits for it. Two runs never both start through
this rule; if they do anyway (created while no operator ran, the older
already started by a previous operator, ...), the store's fencing ends the
one that lost the thread Failed ``Superseded``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from agentrun.checkpoint.base import Progress

from .reasons import TERMINAL, Phase

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ThreadPeer:
    """What the rule needs of one AgentRun on a thread (this run or another)."""

    name: str
    uid: str
    created: datetime | None = None
    phase: Phase | None = None
    attempt: int = 0
    deleting: bool = False

    @property
    def started(self) -> bool:
        """Whether the run has started an attempt on its thread."""
        return self.attempt > 0

    @property
    def live(self) -> bool:
        """Whether the run still counts on its thread (not being deleted, not finished)."""
        return not self.deleting and self.phase not in TERMINAL

    def _age_key(self) -> tuple[datetime, str]:
        return (self.created or _EPOCH, self.name)


def blocker(me: ThreadPeer, others: Iterable[ThreadPeer]) -> ThreadPeer | None:
    """The run ``me`` must wait for before its first attempt, or None when it may start."""
    if me.started:
        return None
    waits_for: ThreadPeer | None = None
    for other in others:
        if other.uid == me.uid or not other.live:
            continue
        if other.started:
            return other
        if other._age_key() < me._age_key() and (waits_for is None or other._age_key() < waits_for._age_key()):
            waits_for = other
    return waits_for


@dataclass(frozen=True)
class OrphanedTurn:
    """The unfinished turn of a deleted AgentRun on this run's thread, and that run's pods still alive."""

    run_uid: str
    pods: tuple[str, ...] = ()


ENDED = ("completed", "stopped", "failed")


def orphaned_turn(progress: Progress | None, *, me: str, request_key: str, peers: Iterable[ThreadPeer]) -> str | None:
    """The uid of the deleted AgentRun whose turn the thread's latest is, unfinished; None if there is none.

    Not orphaned: an ended turn, this run's own (by uid, or by request key: a re-applied request resumes it),
    or the turn of an AgentRun that still exists (the thread rule above waits for it).
    """
    if progress is None or progress.status in ENDED or not progress.run_uid or progress.run_uid == me:
        return None
    if request_key and progress.request_key == request_key:
        return None
    if any(peer.uid == progress.run_uid for peer in peers):
        return None
    return progress.run_uid
