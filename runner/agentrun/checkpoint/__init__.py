"""Checkpointers: one interface (``base``), one module per backend."""

from .base import Checkpoint, Checkpointer, CheckpointWrite, Intent, LedgerEntry
from .memory import InMemoryCheckpointer
from .sqlite import SqliteCheckpointer


def from_url(url: str) -> Checkpointer:
    """A checkpointer for a store URL: ``sqlite:///path/file.db``, ``memory://``, ``postgresql://...``.

    A bare path is a SQLite file. Raises ``ValueError`` for an unknown scheme.
    """
    if url.startswith("memory:"):
        return InMemoryCheckpointer()
    if url.startswith("sqlite:///"):
        return SqliteCheckpointer(url.removeprefix("sqlite:///") or ":memory:")
    if url.startswith(("postgres://", "postgresql://")):
        from .postgres import PgCheckpointer

        return PgCheckpointer(url)
    if "://" not in url:
        return SqliteCheckpointer(url)
    raise ValueError(f"unknown store URL scheme in {url.split('://')[0]!r}:// (use sqlite:///, postgresql://)")


__all__ = [
    "Checkpoint",
    "CheckpointWrite",
    "Checkpointer",
    "InMemoryCheckpointer",
    "Intent",
    "LedgerEntry",
    "SqliteCheckpointer",
    "from_url",
]
