"""Named fault points for crash tests: the process SIGKILLs itself exactly there.

Set ``AGENTRUN_FAULT_POINT`` to ``<point>`` or ``<point>:<detail>`` (for tool
points the detail is the tool name), e.g. ``after_ledger_record:charge_card``.
Unset (always, in production) a fault point costs one dict lookup. Points:

- ``before_tool``          intent recorded, tool not started
- ``after_tool``           tool returned, result not yet recorded
- ``after_ledger_record``  result recorded, node not finished
- ``before_checkpoint``    node finished, its checkpoint not written
- ``after_checkpoint``     checkpoint committed, next node not started
- ``in_checkpoint_txn``    (PostgreSQL) state row and messages inserted, transaction not
                           committed; the detail is the version being written
"""

from __future__ import annotations

import os
import signal
import sys

_SPEC = os.environ.get("AGENTRUN_FAULT_POINT", "")
_POINT, _, _DETAIL = _SPEC.partition(":")


def fault_point(point: str, detail: str = "") -> None:
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
