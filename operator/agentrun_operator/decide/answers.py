"""An answer to an interrupt that its attempt never checkpointed: carried on to the next attempt (pure).

``spec.resume`` starts exactly one attempt with the answer, and the answer is in the
store for that attempt only (``run_inputs``). The runner puts it into a checkpoint
as soon as it resumes; an attempt that ends before that (SIGKILLed, evicted, its node
lost) leaves the thread interrupted with the answer in no checkpoint. Its successor
then started without it, found the thread waiting and exited 3, and the same
``spec.resume`` starts nothing twice: the run waited for an answer it had been given
(found by the fault campaign, ``bench/RELIABILITY.md``). So the next attempt of the
run gets its predecessor's answer, but only while that answer names exactly the
interrupts the thread still waits on: an answer is never applied to another interrupt
(the runner would bind a lone value to whatever single interrupt is pending).
"""

from __future__ import annotations

from typing import Any

from agentrun.checkpoint.base import Progress

from .status import InterruptInfo

WAITING_CHARS = 60


def waiting_words(interrupt: InterruptInfo | None) -> str:
    """What an Interrupted run waits for in a few words: ``status.waitingFor``, the ``Waiting`` column.

    The question (``interrupt(..., message=...)``), prefixed by the count when several calls interrupted at
    once; the interrupt's id when it has no question. Cut at ``WAITING_CHARS``: a column, not the question
    (``kubectl agentrun describe`` and the run's page show it whole, with the payload)."""
    info = interrupt or {}
    ids = [str(i) for i in info.get("ids") or [info.get("id")] if i]
    message = " ".join(str(info.get("message") or "").split())
    words = message or (f"interrupt {ids[0]}" if ids else "an answer in spec.resume")
    if len(ids) > 1:
        words = f"{len(ids)} interrupts: {words}"
    return words if len(words) <= WAITING_CHARS else words[: WAITING_CHARS - 1] + "…"


def carried_answer(previous: dict[str, Any] | None, progress: Progress | None) -> dict[str, Any] | None:
    """The resume value for the next attempt: ``previous`` (the last attempt's) if still unanswered, else None.

    ``previous`` is the resume value the last attempt was started with (``{"values": {id: value}}``
    as the operator writes it, or ``{"value": ...}``); ``progress`` the thread's latest state.
    """
    if not previous or progress is None or progress.status != "interrupted":
        return None
    values = previous.get("values")
    pending = {i.get("id") for i in progress.interrupts}
    if not isinstance(values, dict) or not pending or None in pending or set(values) != pending:
        return None
    return previous
