"""A node's input is a copy: what it changes in place reaches the run only through its update."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, TypedDict

from agentrun import END, START, InMemoryCheckpointer, StateGraph
from agentrun.state import copy_value, node_input


@dataclasses.dataclass
class Box:
    items: list[int]


def test_every_level_of_a_json_value_is_a_new_object() -> None:
    value = {"a": [1, 2, {"b": [3]}], "c": {"d": "e"}, "f": [1, "x", None, 2.5, True]}
    copied = copy_value(value)
    assert copied == value
    assert copied is not value and copied["a"] is not value["a"] and copied["a"][2]["b"] is not value["a"][2]["b"]
    assert copied["c"] is not value["c"] and copied["f"] is not value["f"]
    copied["a"][2]["b"].append(4)
    copied["f"].append(0)
    assert value == {"a": [1, 2, {"b": [3]}], "c": {"d": "e"}, "f": [1, "x", None, 2.5, True]}


def test_other_objects_are_deep_copied() -> None:
    box = Box([1])
    state = {"box": box, "pair": ([1], 2), "tags": {"x"}}
    copied = node_input(state)
    copied["box"].items.append(2)
    copied["pair"][0].append(2)
    copied["tags"].add("y")
    assert box.items == [1] and state["pair"] == ([1], 2) and state["tags"] == {"x"}


class Items(TypedDict, total=False):
    items: list[Any]


def test_a_change_in_place_does_not_reach_the_next_node() -> None:
    seen: list[Any] = []

    def mutate(state: dict[str, Any]) -> dict[str, Any]:
        state["items"].append("leaked")
        state["items"][0]["n"] = 99
        return {}

    def look(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(state["items"])
        return {}

    graph = StateGraph(Items)
    graph.add_node("mutate", mutate)
    graph.add_node("look", look)
    graph.add_edge(START, "mutate")
    graph.add_edge("mutate", "look")
    graph.add_edge("look", END)
    asyncio.run(graph.compile(InMemoryCheckpointer()).ainvoke({"items": [{"n": 1}]}, {"thread_id": "t"}))
    assert seen == [[{"n": 1}]]
