"""Resolve a ``module:attribute`` graph reference (used by the CLI and the runner pod)."""

from __future__ import annotations

import importlib
import os
import re
import sys

from .checkpoint.base import Checkpointer
from .engine import CompiledGraph
from .errors import GraphReferenceError
from .graph import StateGraph

REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def load_graph(reference: str) -> StateGraph:
    """Import ``module:attribute`` and return its ``StateGraph``; ``GraphReferenceError`` if impossible."""
    target = load_target(reference)
    if isinstance(target, CompiledGraph):
        target = target.graph
    if isinstance(target, StateGraph):
        return target
    raise GraphReferenceError(
        f"graph reference {reference!r} is a {type(target).__name__}, not a StateGraph or compiled graph "
        "(agentrun's, or a LangGraph graph compiled without a checkpointer)"
    )


def is_langgraph(target: object) -> bool:
    """Whether ``target`` is a LangGraph graph (run by ``agentrun.integrations.langgraph``), without importing it."""
    return type(target).__module__.startswith("langgraph.")


def load_target(reference: str) -> object:
    """Import ``module:attribute`` and return the attribute, whatever it is; ``GraphReferenceError`` if impossible."""
    if not REFERENCE.match(reference or ""):
        raise GraphReferenceError(f"graph reference {reference!r} must look like 'package.module:attribute'")
    module_name, attribute = reference.split(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to where you run it
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise GraphReferenceError(f"graph reference {reference!r}: no module named {e.name!r}") from e
        raise GraphReferenceError(f"graph reference {reference!r}: importing it failed: {e}") from e
    except Exception as e:
        raise GraphReferenceError(f"graph reference {reference!r}: importing it raised {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise GraphReferenceError(f"graph reference {reference!r}: module has no attribute {attribute!r}") from None


def compile_reference(reference: str, checkpointer: Checkpointer) -> CompiledGraph:
    graph = load_graph(reference)
    graph.validate()
    return CompiledGraph(graph, checkpointer=checkpointer, name=reference)
