"""The reserved node names of every graph: where a run enters and where it ends.

A leaf module (it imports nothing), so the builder, the engine and the tool
node can all name them without importing each other.
"""

from __future__ import annotations

from typing import Final

START: Final = "__start__"
END: Final = "__end__"
