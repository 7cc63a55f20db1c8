"""Which graph references the runner accepts as LangGraph graphs, and the one-line refusals (issue 23, bad input)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from agentrun.errors import GraphReferenceError
from agentrun.integrations.langgraph import run as lg_run
from agentrun.loader import is_langgraph


def _graph() -> StateGraph[MessagesState]:
    graph = StateGraph(MessagesState)
    graph.add_node("noop", lambda state: {})
    graph.add_edge(START, "noop")
    return graph


def test_a_compiled_graph_and_an_uncompiled_state_graph_are_accepted() -> None:
    compiled = _graph().compile()
    assert is_langgraph(compiled) and is_langgraph(_graph())
    assert lg_run.prepare(compiled, "m:app") is compiled
    assert lg_run.prepare(_graph(), "m:graph").checkpointer is None


def test_an_uncompiled_state_graph_is_compiled_with_a_warning_and_a_compiled_one_without(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentrun"):
        lg_run.prepare(_graph().compile(), "m:app")
        assert not caplog.records, "a compiled graph is what the runner expects: nothing to warn about"
        lg_run.prepare(_graph(), "m:graph")
    [warning] = [r.getMessage() for r in caplog.records]
    assert "'m:graph' is an uncompiled LangGraph StateGraph: it is compiled here" in warning, warning


def test_a_graph_compiled_with_its_own_checkpointer_is_refused_with_what_to_do() -> None:
    with pytest.raises(
        GraphReferenceError, match=r"compiled with its own checkpointer \(InMemorySaver\).*graph\.compile\(\)"
    ):
        lg_run.prepare(_graph().compile(checkpointer=InMemorySaver()), "m:app")


def test_a_langgraph_object_that_is_no_graph_is_refused() -> None:
    with pytest.raises(GraphReferenceError, match="not a compiled LangGraph graph"):
        lg_run.prepare(InMemorySaver(), "m:saver")


@pytest.mark.parametrize("version", ["1.1.9", "2.0.0", "0.6.4"])
def test_a_langgraph_outside_the_supported_range_is_refused(monkeypatch: Any, version: str) -> None:
    monkeypatch.setattr(lg_run.importlib.metadata, "version", lambda name: version)
    with pytest.raises(GraphReferenceError, match=f"LangGraph {version} is installed but agentrun supports 1.2"):
        lg_run.prepare(_graph().compile(), "m:app")
