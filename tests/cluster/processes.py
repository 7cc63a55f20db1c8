"""Processes as /proc shows them, for the tests that check nothing outlives what started it.

Shared by test_dev_cluster.py (``make cluster``'s Ctrl-C) and tests/node/test_dev_cluster_node.py.
"""

from __future__ import annotations

from pathlib import Path


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (from /proc), ``root`` included."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
