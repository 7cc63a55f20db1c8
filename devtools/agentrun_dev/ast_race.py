"""``ast.parse`` made atomic for test sessions on CPython 3.11 before 3.11.8 (CPython gh-106905).

Those releases keep the AST constructor's recursion depth in state the whole interpreter shares. The
constructor runs no Python code of its own, so it keeps the GIL, except when an allocation starts a garbage
collection: finalizers and weakref callbacks are Python code, and another thread may run there. If that
thread calls ``ast.parse`` too (on 3.11 formatting any traceback does, for its caret lines), the first
parse raises ``SystemError: AST constructor recursion depth mismatch`` for a tree it built correctly.

It happened in CI (stops 39 and 40): a test failed, pytest parsed the test's source to show the failure, a
runner thread of that test logged a traceback meanwhile, and the SystemError escaped pytest's report:
an internal error (exit 3) that ended the whole stream with a quarter of its tests unrun and the failure
itself unshown. With collection held off while a parse runs, no other thread can run inside it. Nothing is
caught or retried: every error is raised as the interpreter raises it.
"""

from __future__ import annotations

import ast
import gc
import sys
import threading
from typing import Any

_lock = threading.Lock()
_parsing = 0  # parses under way (in any thread)
_collecting = False  # whether collection was on when the first of them began
_original = ast.parse


def _parse(*args: Any, **kwargs: Any) -> Any:
    global _parsing, _collecting
    with _lock:
        if _parsing == 0:
            _collecting = gc.isenabled()
            gc.disable()
        _parsing += 1
    try:
        return _original(*args, **kwargs)
    finally:
        with _lock:
            _parsing -= 1
            if _parsing == 0 and _collecting:
                gc.enable()


def install() -> bool:
    """Make ``ast.parse`` atomic where the interpreter has the race; whether it did."""
    if not (3, 11) <= sys.version_info[:3] < (3, 11, 8) or ast.parse is _parse:
        return False
    ast.parse = _parse
    return True
