"""Model usage: the adapters' token counts (issue 12, item 4) and the turn's checkpointed usage (issue 9).

The checkpointed usage is what the operator exports (agentrun_operator_model_*), so a pod that ends before
its scrape still reports its tokens; these tests run once per checkpointer backend.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.messages.ai import UsageMetadata

from agentrun import END, START, Command, ModelError, StateGraph, assistant, interrupt
from agentrun.checkpoint import Checkpointer
from agentrun.metrics import MODEL_TOKENS
from agentrun.models import OpenAIChatModel
from agentrun.models.langchain import LangChainChatModel
from agentrun.usage import MODELS_MAX, OTHER_MODEL, ModelUsage
from tests.support.checkpointers import Backend


def tokens(model: str, kind: str) -> float:
    return float(MODEL_TOKENS.labels(model, kind)._value.get())


def test_a_completion_usage_block_is_counted_by_model_and_kind() -> None:
    model = OpenAIChatModel(base_url="http://127.0.0.1:9", model="usage-test-model", api_key_env=None)
    before = tokens("usage-test-model", "prompt"), tokens("usage-test-model", "completion")
    body = {
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22},
    }
    reply = model._parse(body)
    assert reply.content == "hi"
    assert tokens("usage-test-model", "prompt") == before[0] + 17
    assert tokens("usage-test-model", "completion") == before[1] + 5


def test_a_body_without_or_with_malformed_usage_counts_nothing() -> None:
    model = OpenAIChatModel(base_url="http://127.0.0.1:9", model="usage-none-model", api_key_env=None)
    for usage in (None, "lots", {"prompt_tokens": -3, "completion_tokens": True}):
        body: dict[str, object] = {"choices": [{"message": {"role": "assistant", "content": "x"}}]}
        if usage is not None:
            body["usage"] = usage
        model._parse(body)
    assert tokens("usage-none-model", "prompt") == 0
    assert tokens("usage-none-model", "completion") == 0


# -- the turn's usage, checkpointed for the operator (issue 9: model usage outlives a short pod) -----------------


def _usage(prompt: int, completion: int) -> UsageMetadata:
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}


def _gated_graph(model: LangChainChatModel) -> StateGraph:
    """model -> gate (asks a human once) -> model -> END: one turn spread over an interrupt and a resume."""

    def gate(state: dict[str, Any]) -> dict[str, Any]:
        interrupt({"ok?": True})
        return {}

    def after_model(state: dict[str, Any]) -> str:
        return "gate" if len([m for m in state["messages"] if m.role == "assistant"]) == 1 else END

    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("gate", gate)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", after_model, {"gate": "gate", END: END})
    graph.add_edge("gate", "model")
    return graph


async def test_a_turn_s_model_usage_is_checkpointed_kept_across_a_resume_and_reset_by_a_new_turn(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    fake = FakeMessagesListChatModel(
        responses=[
            AIMessage("asking", usage_metadata=_usage(10, 3)),
            AIMessage("done", usage_metadata=_usage(25, 4)),
            AIMessage("again", usage_metadata=_usage(7, 1)),
            AIMessage("and done", usage_metadata=_usage(1, 1)),
        ]
    )
    app = _gated_graph(LangChainChatModel(fake, model_label="usage-turn-model")).compile(checkpointer)

    await app.ainvoke("go", {"thread_id": t})
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and progress.status == "interrupted"
    usage = progress.model_usage["usage-turn-model"]
    assert usage["tokens"] == {"prompt": 10, "completion": 3}, "the paused turn's tokens must reach the store"
    assert usage["requests"] == {"ok": 1, "error": 0}
    assert usage["seconds"]["ok"] >= 0 and usage["seconds"]["error"] == 0

    await app.ainvoke(Command(resume="yes"), {"thread_id": t})
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and progress.status == "completed"
    usage = progress.model_usage["usage-turn-model"]
    assert usage["tokens"] == {"prompt": 35, "completion": 7}, "a resumed turn must continue its counts, not restart"
    assert usage["requests"] == {"ok": 2, "error": 0}

    await app.ainvoke("next", {"thread_id": t})  # a new turn on the thread starts at zero
    progress = await checkpointer.aget_progress(t)
    assert progress is not None
    assert progress.model_usage["usage-turn-model"]["tokens"] == {"prompt": 7, "completion": 1}


async def test_a_failed_model_request_is_checkpointed_as_an_error_with_the_failed_run(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()

    class Down(FakeMessagesListChatModel):
        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("connection refused")

    graph = StateGraph()
    graph.add_node("model", LangChainChatModel(Down(responses=[]), model_label="usage-down-model"))
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    with pytest.raises(ModelError):
        await graph.compile(checkpointer).ainvoke("go", {"thread_id": t})
    progress = await checkpointer.aget_progress(t)
    assert progress is not None and progress.status == "failed"
    usage = progress.model_usage["usage-down-model"]
    assert usage["requests"] == {"ok": 0, "error": 1}, "a failed request must be counted with the failed run"
    assert usage["tokens"] == {"prompt": 0, "completion": 0}


async def test_a_run_without_a_model_writes_no_model_usage(backend: Backend, checkpointer: Checkpointer) -> None:
    t = backend.thread()
    graph = StateGraph()
    graph.add_node("echo", lambda state: {"messages": [assistant("hi")]})
    graph.add_edge(START, "echo")
    graph.add_edge("echo", END)
    await graph.compile(checkpointer).ainvoke("go", {"thread_id": t})
    state = await checkpointer.aget(t)
    assert state is not None and "model_usage" not in state.meta, "older readers must see the meta they knew"


def test_model_usage_reads_malformed_meta_as_zero_and_keeps_the_number_of_models_bounded() -> None:
    usage = ModelUsage.from_meta(
        {
            "model_usage": {
                "good": {"tokens": {"prompt": 5, "completion": "x"}, "requests": {"ok": -1, "error": 2}},
                "junk": "not a mapping",
            }
        }
    )
    assert usage.as_dict() == {
        "good": {
            "tokens": {"prompt": 5, "completion": 0},
            "requests": {"ok": 0, "error": 2},
            "seconds": {"ok": 0.0, "error": 0.0},
        }
    }
    assert not ModelUsage.from_meta({"model_usage": ["nope"]})
    for i in range(MODELS_MAX + 5):
        usage.add_request(f"model-{i}", "ok", 0.5)
    assert len(usage.models) == MODELS_MAX + 1 and usage.models[OTHER_MODEL]["requests"]["ok"] == 6
    assert ModelUsage.from_meta({"model_usage": usage.as_dict()}) == usage, "meta must round-trip"
