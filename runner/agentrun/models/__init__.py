"""Model nodes: a deterministic scripted model and an OpenAI-compatible chat client.

Also here: ``langchain`` (any LangChain chat model as a node, the ``agentrun[langchain]`` extra, not
imported here) and ``metering`` (what every adapter reports about each request).
"""

from .openai import OpenAIChatModel
from .scripted import ScriptedModel

__all__ = ["OpenAIChatModel", "ScriptedModel"]
