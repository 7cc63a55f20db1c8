"""A graph whose first attempt crashes the way ``CLUSTER_CRASH`` says, and whose second runs to the end.

``CLUSTER_CRASH`` (issue 31 item 9: every crash kind under the CRD's default backoff):

- ``import:<code>``: the module ends its process with ``<code>`` while it is imported (no progress at all);
- ``node:<code>``: the node ends the process with ``<code>`` (the store shows the run at node ``work``);
- ``hang``: the node sleeps until the test kills the pod (SIGKILL, the OOM killer).

Each run of the node appends ``work:<attempt>`` to ``CLUSTER_EFFECTS`` first, so the test knows the first
attempt is inside it and counts the attempts that got there.
"""

from __future__ import annotations

import os
import time
from typing import Any

from agentrun import END, START, StateGraph, assistant
from agentrun.contract import Env

_FIRST = os.environ.get(Env.ATTEMPT) == "1"
_HOW, _, _CODE = os.environ.get("CLUSTER_CRASH", "").partition(":")
if _FIRST and _HOW == "import":
    os._exit(int(_CODE))


def _work(state: dict[str, Any]) -> dict[str, Any]:
    with open(os.environ["CLUSTER_EFFECTS"], "a") as f:
        f.write(f"work:{os.environ.get(Env.ATTEMPT)}\n")
    if _FIRST and _HOW == "node":
        os._exit(int(_CODE))
    if _FIRST and _HOW == "hang":
        time.sleep(3600)
    return {"messages": [assistant("worked")]}


_graph = StateGraph()
_graph.add_node("work", _work)
_graph.add_edge(START, "work")
_graph.add_edge("work", END)
app = _graph
