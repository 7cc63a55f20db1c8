"""No test module imports another test module (``make lint``).

A test module holds tests; what several modules share (builders, fixtures, cluster helpers) lives in a
support module beside them (``tests/unit/decisions_support.py``, ``tests/cluster/servers.py``), so that
running, moving or deleting one test module never changes another. Prints each import of a
``test_*`` module by a module under ``tests/`` or ``kubesim/tests/``; the exit status is 1 if there is one.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("tests", "kubesim/tests")


def _imported(tree: ast.AST, package: list[str]) -> Iterator[tuple[int, str]]:
    """(line, dotted module) for each module ``tree`` imports, relative imports resolved against ``package``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module
            # ``from tests.cluster import test_kubectl`` imports a module by its name
            yield from ((node.lineno, f"{module}.{alias.name}") for alias in node.names)


def offending(path: Path, display: str) -> Iterator[str]:
    """``display:line: ...`` for each test module ``path`` imports."""
    package = list(Path(display).parent.parts)
    for line, module in _imported(ast.parse(path.read_text(), str(path)), package):
        if module.rsplit(".", 1)[-1].startswith("test_"):
            yield f"{display}:{line}: imports the test module {module}: move what it shares to a support module"


def problems(root: Path) -> list[str]:
    """Every import of a test module under ``root``'s test trees."""
    found: list[str] = []
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            found += offending(path, str(path.relative_to(root)))
    return found


def main() -> int:
    """Print each import of a test module in the checkout (or in the tree given as the argument); 1 if any."""
    found = problems(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
    for entry in found:
        print(entry)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
