"""Model nodes: a deterministic scripted model and an OpenAI-compatible chat client."""

from .openai import OpenAIChatModel
from .scripted import ScriptedModel

__all__ = ["OpenAIChatModel", "ScriptedModel"]
