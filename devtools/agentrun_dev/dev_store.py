"""The local cluster's store (``agentrun-dev``): PostgreSQL where ``scripts/services.sh`` provides it, else SQLite.

Why PostgreSQL by default: the run history (``agentrun_history``, behind
``kubectl agentrun history`` and ``ui``) reads PostgreSQL only; its reader is
SQL that PostgreSQL computes (digests, previews, one snapshot per history) and
SQLite records no attempt per row. ``make cluster`` runs ``scripts/services.sh``
(as ``make demo`` and ``make test`` do), so a fresh clone has that server on
127.0.0.1:5432; the cluster uses the database ``agentrun_dev`` on it, created
when missing, and its history works without any variable.

The choice, in order:

- ``AGENTRUN_DEV_STORE=sqlite`` (``--store sqlite``): a SQLite file in the work folder, no history server;
- ``AGENTRUN_DEV_POSTGRES_DSN`` (``--postgres-dsn``): that database, created when missing; an error naming what
  to do when it cannot be reached or created (the user asked for it: no silent SQLite);
- else ``DEFAULT_DSN`` (the server ``scripts/services.sh`` starts), created when missing; when that server does
  not answer, SQLite, and the banner says why the history is off and how to turn it on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

from agentrun.checkpoint.pg_url import parse_store_url

from .databases import with_database

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/agentrun_dev"
STORES = ("auto", "postgres", "sqlite")
CONNECT_TIMEOUT = 5.0


class StoreError(Exception):
    """The store the user named cannot be used; the message says what to do."""


@dataclass(frozen=True)
class DevStore:
    """The store the cluster's Secret names: its URL, whether it is PostgreSQL, and why not (for the banner)."""

    url: str
    postgres: bool
    created: bool = False  # the database did not exist and was created now
    why_not_postgres: str = ""


def _where(dsn: str) -> tuple[str, str]:
    """``(database, host:port)`` of ``dsn``, for messages (never its password)."""
    parts = urlsplit(dsn)
    return parts.path.lstrip("/") or "postgres", f"{parts.hostname or 'localhost'}:{parts.port or 5432}"


async def ensure_database(url: str) -> bool:
    """Create the database ``url`` names when it does not exist (True: created). Raises asyncpg's and OS errors.

    The database is created from the server's ``postgres`` maintenance database, as ``createdb`` does; a
    concurrent start creating it first is fine.
    """
    dsn = parse_store_url(url).dsn  # asyncpg must not see agentrun's own parameters
    try:
        conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT)
    except asyncpg.InvalidCatalogNameError:
        pass  # does not exist: create it below
    else:
        await conn.close()
        return False
    name, _ = _where(dsn)
    admin = await asyncpg.connect(with_database(dsn, "postgres"), timeout=CONNECT_TIMEOUT)
    try:
        quoted = '"' + name.replace('"', '""') + '"'
        await admin.execute(f"CREATE DATABASE {quoted}")
    except asyncpg.DuplicateDatabaseError:
        return False  # another start made it meanwhile
    finally:
        await admin.close()
    return True


def choose_store(
    workdir: Path, *, store: str = "auto", postgres_dsn: str | None = None, default_dsn: str = DEFAULT_DSN
) -> DevStore:
    """The cluster's store (see the module docstring); raises ``StoreError`` for a named one that cannot be had."""
    sqlite = f"sqlite:///{(workdir / 'agentrun.db').absolute()}"
    if store not in STORES:
        raise StoreError(f"--store {store!r} (AGENTRUN_DEV_STORE): one of {', '.join(STORES)}")
    if store == "sqlite":
        if postgres_dsn:
            raise StoreError("AGENTRUN_DEV_STORE=sqlite and AGENTRUN_DEV_POSTGRES_DSN both set: unset one of them")
        return DevStore(sqlite, postgres=False, why_not_postgres="AGENTRUN_DEV_STORE=sqlite")
    dsn = postgres_dsn or default_dsn
    try:
        created = asyncio.run(ensure_database(dsn))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:  # TimeoutError is an OSError
        name, server = _where(dsn)
        reason = f"{type(e).__name__}: {e}".strip().rstrip(":")
        if postgres_dsn or store == "postgres":
            raise StoreError(
                f"the PostgreSQL store {name} on {server} (AGENTRUN_DEV_POSTGRES_DSN) cannot be used: {reason}; "
                f"start the server (bash scripts/services.sh for the local one), create the database "
                f"(createdb -h {server.rsplit(':', 1)[0]} {name}) or point AGENTRUN_DEV_POSTGRES_DSN at one you may "
                "create databases on"
            ) from None
        return DevStore(
            sqlite,
            postgres=False,
            why_not_postgres=f"no PostgreSQL at {server} ({reason}): bash scripts/services.sh starts one "
            "(make cluster runs it), or set AGENTRUN_DEV_POSTGRES_DSN",
        )
    return DevStore(dsn, postgres=True, created=created)
