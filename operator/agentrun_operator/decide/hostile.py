"""Hostile specs (pure): refuse, before any parsing or encoding, what would break the operator or the store.

An API server accepts JSON nested up to 10,000 levels and strings up to its
object limit; Python's JSON encoder, ``copy.deepcopy`` and pydantic recurse
once per level, and PostgreSQL's JSONB cannot hold a NUL character or an
unpaired UTF-16 surrogate. ``problem`` walks the raw spec iteratively (no
recursion, so it cannot itself overflow) and names the first field that is
nested deeper than ``MAX_DEPTH`` or holds text the store cannot keep; the
run then ends Failed ``InvalidSpec`` with that message and no pod.

The operator process raises its recursion limit (``__main__``) so that
kopf's watch can still decode and copy such an object: this check is what
keeps the object from going further.
"""

from __future__ import annotations

from typing import Any

# Levels of nesting below spec (spec.input.messages[0].content = 4). Real inputs stay far below.
MAX_DEPTH = 100


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which the store's JSON cannot hold"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired UTF-16 surrogate, which is not valid Unicode text"
    return None


def problem(spec: Any, *, max_depth: int = MAX_DEPTH) -> str | None:
    """The first problem of the raw ``spec`` as ``"spec.<path>: <what>"``, or None."""
    stack: list[tuple[Any, str, int]] = [(spec, "spec", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list) and depth > max_depth:
            return f"{path}: nested deeper than {max_depth} levels; flatten the value or pass a reference to it"
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key[:64]}" if isinstance(key, str) and len(path) < 200 else path
                if isinstance(key, str) and (bad := _text_problem(key)):
                    return f"{path}: a key {bad}"
                stack.append((item, child, depth + 1))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                stack.append((item, f"{path}[{index}]" if len(path) < 200 else path, depth + 1))
        elif isinstance(value, str) and (bad := _text_problem(value)):
            return f"{path}: {bad}"
    return None
