"""Checkpointers: one interface (``base``), one module per backend."""

from .base import Checkpoint, Checkpointer, CheckpointWrite, Intent, LedgerEntry
from .memory import InMemoryCheckpointer
from .sqlite import SqliteCheckpointer

__all__ = [
    "Checkpoint",
    "CheckpointWrite",
    "Checkpointer",
    "InMemoryCheckpointer",
    "Intent",
    "LedgerEntry",
    "SqliteCheckpointer",
]
