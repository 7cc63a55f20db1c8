"""Every error code lives in ``runner/agentrun/errors.py`` and nowhere else (``make lint``).

A code (``TOOL_ERROR_001``, ``STORAGE_CONFLICT_001``: words joined by ``_``, then three digits) is part of
the contract: logs, metrics and AgentRun status reasons reuse it, so one spelled twice can drift from
its definition. Two rules, each printed as ``path:line: ...``, exit status 1 if any is broken:

- outside errors.py, no string literal in code holds a code: name it by its class (``ToolError.code``,
  ``ModelError.HTTP``), in an f-string where it is part of a text. Docstrings and comments may mention
  one, since they document it;
- every code mentioned anywhere (docstrings, comments, README.md, the CRD) is one errors.py defines, so
  no text documents a code that does not exist.

Tests are left out: a test spells the codes it pins on purpose, so that a renumbered code fails it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ERRORS = Path("runner/agentrun/errors.py")
CODE = re.compile(r"\b[A-Z]+(?:_[A-Z]+)+_\d{3}\b")
# Python sources held to both rules; the texts only to the second.
SOURCES = ("runner", "operator", "devtools", "kubesim/src", "hack", "bench", "examples")
TEXTS = ("README.md", "crds", "deploy", "helm")


def defined(errors: Path) -> set[str]:
    """The codes ``errors.py`` defines: its string constants that are a code."""
    tree = ast.parse(errors.read_text(), str(errors))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE.fullmatch(node.value)
    }


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of ``tree``'s module, classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literals(path: Path, display: str) -> Iterator[str]:
    """``display:line: ...`` for each string literal in code (not a docstring) of ``path`` that holds a code."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for code in CODE.findall(node.value):
                yield f"{display}:{node.lineno}: the code {code} as a literal: name it from agentrun.errors"


def unknown(path: Path, display: str, codes: set[str]) -> Iterator[str]:
    """``display:line: ...`` for each code ``path`` mentions that ``codes`` does not hold."""
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for code in CODE.findall(line):
            if code not in codes:
                yield f"{display}:{number}: {code} is no code agentrun.errors defines"


def _files(root: Path, tops: tuple[str, ...], suffixes: tuple[str, ...]) -> Iterator[Path]:
    for top in tops:
        base = root / top
        paths = [base] if base.is_file() else sorted(base.rglob("*"))
        yield from (p for p in paths if p.is_file() and p.suffix in suffixes)


def problems(root: Path) -> list[str]:
    """Every broken rule under ``root`` (a checkout), in words."""
    codes = defined(root / ERRORS)
    found: list[str] = []
    for path in _files(root, SOURCES, (".py",)):
        display = str(path.relative_to(root))
        if path == root / ERRORS:
            continue
        found += [*literals(path, display), *unknown(path, display, codes)]
    for path in _files(root, TEXTS, (".md", ".yaml", ".yml", ".tpl")):
        found += unknown(path, str(path.relative_to(root)), codes)
    return found


def main() -> int:
    """Print each broken rule of the checkout (or of the tree given as the argument); 1 if there is one."""
    found = problems(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
    for entry in found:
        print(entry)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
