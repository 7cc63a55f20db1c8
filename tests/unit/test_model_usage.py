"""Token usage of the OpenAI-compatible adapter (issue 12, item 4): counted per model and kind, bounded labels."""

from __future__ import annotations

from agentrun.metrics import MODEL_TOKENS
from agentrun.models import OpenAIChatModel


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
