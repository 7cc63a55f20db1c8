"""No function over 80 lines in runner/ and operator/ without a one-line reason (``make lint``).

The reason is a comment on the line right above the ``def`` (or above its decorators). Prints each
function over the limit without one; the exit status is 1 if there is any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LIMIT = 80
ROOTS = ("runner", "operator")


def unexplained(path: Path) -> list[str]:
    """``path:line name (n lines)`` for each function of ``path`` over ``LIMIT`` lines with no reason above it."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = lines[first - 2].strip() if first >= 2 else ""
            if length > LIMIT and not above.startswith("#"):
                found.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    return found


def main() -> int:
    """Print the unexplained long functions; 1 if there is one."""
    root = Path(__file__).resolve().parents[1]
    found = [f for top in ROOTS for path in sorted((root / top).rglob("*.py")) for f in unexplained(path)]
    for entry in found:
        print(f"over {LIMIT} lines without a reason comment above it: {entry}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
