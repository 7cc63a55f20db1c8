from agentrun import END, START, InMemoryCheckpointer, StateGraph, assistant


async def test_two_node_graph_completes_and_persists() -> None:
    graph = StateGraph()
    graph.add_node("a", lambda s: {"messages": [assistant("hi")]})
    graph.add_edge(START, "a")
    graph.add_edge("a", END)
    cp = InMemoryCheckpointer()
    app = graph.compile(cp)
    out = await app.ainvoke("hello", {"thread_id": "t"})
    assert [m.role for m in out["messages"]] == ["user", "assistant"]
    snap = await app.aget_state("t")
    assert snap is not None and snap.status == "completed" and snap.version == 2
