"""The repository's own lints (``make lint``): each refuses what it promises to, and the checkout passes it.

``hack/error_codes.py``: every error code is defined in ``agentrun/errors.py`` and named from there.
``hack/test_imports.py``: no test module imports another (shared builders live in support modules).
Each runs as ``make lint`` runs it, a process over a tree: a small one written here, then the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lint(script: str, tree: Path | None = None) -> tuple[int, list[str]]:
    """The exit status and output lines of ``hack/<script>`` over ``tree`` (the checkout by default)."""
    args = [sys.executable, str(ROOT / "hack" / script), *([str(tree)] if tree else [])]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout.splitlines()


def test_an_error_code_spelled_outside_errors_py_or_never_defined_is_refused(tmp_path: Path) -> None:
    package = tmp_path / "runner" / "agentrun"
    package.mkdir(parents=True)
    shutil.copy(ROOT / "runner" / "agentrun" / "errors.py", package / "errors.py")
    (package / "bad.py").write_text(
        '"""Fails with TOOL_ERROR_001 (a docstring may name a code)."""\n'
        "from .errors import ToolError\n"
        'FALLBACK = "TOOL_ERROR_001"  # a literal: refused\n'
        'NAMED = f"{ToolError.code}: a text"  # named from errors.py: fine\n'
        "# STORAGE_GONE_001 is documented here but defined nowhere\n"
    )
    (tmp_path / "README.md").write_text("A run fails with `GRAPH_REFERENCE_001` or `GRAPH_MISSING_001`.\n")
    status, lines = lint("error_codes.py", tmp_path)
    assert status == 1
    assert lines == [
        "runner/agentrun/bad.py:3: the code TOOL_ERROR_001 as a literal: name it from agentrun.errors",
        "runner/agentrun/bad.py:5: STORAGE_GONE_001 is no code agentrun.errors defines",
        "README.md:1: GRAPH_MISSING_001 is no code agentrun.errors defines",
    ]


def test_the_checkout_defines_every_error_code_in_errors_py_only() -> None:
    status, lines = lint("error_codes.py")
    assert (status, lines) == (0, []), "GUARANTEE BROKEN: an error code spelled outside agentrun/errors.py"


def test_a_test_module_imported_by_another_is_refused(tmp_path: Path) -> None:
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    (unit / "test_a.py").write_text("X = 1\n")
    (unit / "a_support.py").write_text("Y = 1\n")
    (unit / "test_b.py").write_text(
        "from tests.unit.test_a import X\n"
        "from tests.unit import test_a\n"
        "from .test_a import X as Z\n"
        "from tests.unit.a_support import Y\n"
        "from . import a_support\n"
    )
    status, lines = lint("test_imports.py", tmp_path)
    assert status == 1
    advice = "move what it shares to a support module"
    assert lines == [
        f"tests/unit/test_b.py:1: imports the test module tests.unit.test_a: {advice}",
        f"tests/unit/test_b.py:2: imports the test module tests.unit.test_a: {advice}",
        f"tests/unit/test_b.py:3: imports the test module tests.unit.test_a: {advice}",
    ]


def test_no_test_module_of_the_checkout_imports_another() -> None:
    status, lines = lint("test_imports.py")
    assert (status, lines) == (0, []), "GUARANTEE BROKEN: a test module imports another"
