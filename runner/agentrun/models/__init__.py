"""Model nodes: a deterministic scripted model and an OpenAI-compatible chat client."""

from .scripted import ScriptedModel

__all__ = ["ScriptedModel"]
