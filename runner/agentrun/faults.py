"""Crash-test fault points: inert in production, a real SIGKILL at a named point in tests.

Like FoundationDB's BUGGIFY, the points stay in the product code so that the
crash tests exercise the code users run, not a copy. They are inert and
cheap when unused: the variable is read once at import, and an unarmed
``fault_point`` call is one string comparison (``tests/integration/test_faults.py``
checks that an unarmed point never fires). The operator lets a user set only
this one ``AGENTRUN_`` variable in ``podTemplate.env``: it can make nothing
but the user's own runner kill itself.

Set ``AGENTRUN_FAULT_POINT`` to ``<point>`` or ``<point>:<detail>`` (for tool
points the detail is the tool name), e.g. ``after_ledger_record:charge_card``.
A suffix ``@<attempt>`` arms it in that runner attempt only (``AGENTRUN_ATTEMPT``),
e.g. ``after_tool:charge_card@1``: through the operator the variable reaches every
attempt of a run, and a point armed in all of them (one before a ledger record, say)
would crash every replay in turn until ``maxRestarts`` (the fault campaign,
``bench/chaos.py``, arms one attempt). Points:

- ``before_tool``          intent recorded, tool not started
- ``after_tool``           tool returned, result not yet recorded
- ``after_ledger_record``  result recorded, node not finished
- ``after_ledger_group_commit``  a batch of parallel results committed in one transaction
                           (``checkpoint.group``), no call of it told yet; the detail is
                           the number of results in the batch (2 or more)
- ``before_checkpoint``    node finished, its checkpoint not written
- ``after_checkpoint``     checkpoint committed, next node not started
- ``ahead_of_checkpoint``  the next node, a pure one (``agentrun.ahead``), computed while this
                           step's checkpoint write is in flight (not yet acknowledged); the
                           detail is that next node's name
- ``in_checkpoint_txn``    (PostgreSQL) state row and messages inserted, transaction not
                           committed; the detail is the version being written
- ``after_lg_writes_held`` (LangGraph, ``AgentrunSaver``) a task's pending writes held for the
                           checkpoint after them, not stored; the detail is the task's node
- ``after_lg_step_commit`` (LangGraph) a checkpoint and the held writes of its parent's tasks
                           committed in one statement; the detail is those tasks' nodes
- ``after_progress_ride``  (LangGraph run as an AgentRun, PostgreSQL) a run's progress row
                           committed in the statement of the next checkpoint (with its parent's
                           held writes); the detail is those writes' nodes and the row's
                           LangGraph step, e.g. ``model:3``
"""

from __future__ import annotations

import os
import signal
import sys

from .contract import Env

_SPEC = os.environ.get(Env.FAULT_POINT, "")
_ARMED, _AT, _ATTEMPT = _SPEC.rpartition("@") if "@" in _SPEC else (_SPEC, "", "")
if _ATTEMPT and os.environ.get(Env.ATTEMPT, "1") != _ATTEMPT:
    _ARMED = ""  # armed for another attempt of the run
_POINT, _, _DETAIL = _ARMED.partition(":")


def armed(point: str) -> bool:
    """Whether ``point`` may fire in this process (a store arranges for it, e.g. keeps a transaction open)."""
    return point == _POINT


def fault_point(point: str, detail: str = "") -> None:
    """SIGKILL this process at ``point`` when ``Env.FAULT_POINT`` names it (crash tests); a no-op otherwise."""
    if not _POINT or point != _POINT or (_DETAIL and detail != _DETAIL):
        return
    # A marker the test can wait for; then a real SIGKILL: no finally blocks, no flushes.
    sys.stderr.write(f"AGENTRUN-FAULT {point}:{detail} pid={os.getpid()}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    # Still here: we are PID 1 of a container. The kernel drops signals that an init process
    # has no handler for when they come from inside its own PID namespace, SIGKILL included and
    # even from itself, so the kill above did nothing. os._exit is the same crash for the test:
    # no finally blocks, no atexit, no flushes, and 137 is the status a SIGKILL would give
    # (128 + 9), which the operator classifies as a crash, like the real thing.
    os._exit(128 + signal.SIGKILL)
