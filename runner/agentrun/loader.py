"""Resolve a ``module:attribute`` graph reference (used by the CLI and the runner pod).

The reference may name an agentrun ``StateGraph`` or a graph compiled from
one; either way the caller's store runs it. Two cases work but may not be
what the author meant, so each gets a WARNING line naming the reference and
what happens instead: an uncompiled ``StateGraph`` (compiled here on the
caller's store), and a graph compiled with a checkpointer of its own
(``graph.compile(checkpointer=SqliteCheckpointer("agentrun.db"))``), which
the caller's store replaces: nothing is read from or written to the
module's checkpointer. They stay warnings, not errors, so the module that
runs locally on its own store also runs unchanged as an AgentRun.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys

from .checkpoint.base import Checkpointer
from .engine import CompiledGraph
from .errors import GraphReferenceError
from .graph import StateGraph

# module.path:attribute, the attribute a dotted path as in an entry point (pkg.mod:factory.graph).
REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

log = logging.getLogger("agentrun.loader")


def load_graph(reference: str) -> StateGraph:
    """Import ``module:attribute`` and return its ``StateGraph``; ``GraphReferenceError`` if impossible."""
    return _graph_of(load_target(reference), reference)


def _graph_of(target: object, reference: str) -> StateGraph:
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
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise GraphReferenceError(f"graph reference {reference!r}: module has no attribute {attribute!r}") from None
    return target


def compile_reference(reference: str, checkpointer: Checkpointer) -> CompiledGraph:
    """The graph ``reference`` names, compiled on ``checkpointer``; ``GraphReferenceError`` if impossible.

    Logs a warning for an uncompiled graph and for a checkpointer of the module's that ``checkpointer``
    replaces (see the module docstring).
    """
    target = load_target(reference)
    graph = _graph_of(target, reference)
    graph.validate()
    for warning in reference_warnings(target, reference, checkpointer):
        log.warning("%s", warning)
    return CompiledGraph(graph, checkpointer=checkpointer, name=reference)


def reference_warnings(target: object, reference: str, store: Checkpointer) -> list[str]:
    """What running ``target`` on ``store`` does that its module may not expect, one sentence each."""
    if isinstance(target, StateGraph):
        return [
            f"graph reference {reference!r} is an uncompiled StateGraph: it is compiled here and runs on this "
            f"run's store ({_store_name(store)}); if the module compiles it (app = graph.compile(...)), name "
            "that instead to silence this"
        ]
    if isinstance(target, CompiledGraph) and not target._ephemeral and not _same_store(target.checkpointer, store):
        return [
            f"graph reference {reference!r} was compiled with its own checkpointer "
            f"({_store_name(target.checkpointer)}); it runs on this run's store ({_store_name(store)}) instead: "
            "nothing is read from or written to the module's checkpointer. Compile it without one "
            "(graph.compile()) to silence this"
        ]
    return []


def _store_name(store: Checkpointer) -> str:
    # The type and, for SQLite, the file; never a DSN (it may carry a password).
    path = getattr(store, "path", None)
    return f"{type(store).__name__} {path}" if isinstance(path, str) else type(store).__name__


def _same_store(a: Checkpointer, b: Checkpointer) -> bool:
    """Whether two checkpointers hold their threads in one place (a SQLite file, a PostgreSQL DSN)."""
    a, b = getattr(a, "inner", a), getattr(b, "inner", b)  # a cache or a stop channel in front of a store
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    path_a, path_b = getattr(a, "path", None), getattr(b, "path", None)
    if isinstance(path_a, str) and isinstance(path_b, str):
        return os.path.abspath(path_a) == os.path.abspath(path_b)
    dsn_a, dsn_b = getattr(a, "dsn", None), getattr(b, "dsn", None)
    return isinstance(dsn_a, str) and dsn_a == dsn_b
