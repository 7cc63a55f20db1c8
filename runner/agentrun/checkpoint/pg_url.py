"""agentrun's own parameters in a PostgreSQL store URL, taken out before asyncpg sees the URL.

A store URL reaches a runner pod as one Secret value (``postgresDsn``), so what
the store must know about the road to PostgreSQL travels in it:

- ``agentrun_pooler=transaction``: the URL names a pooler in transaction mode
  (PgBouncer ``pool_mode = transaction``, or any pooler that hands a server
  connection to a client for one transaction only). The store then keeps no
  session state (``PgCheckpointer``: no LISTEN, no prepared-statement cache,
  session settings as ``SET LOCAL`` in each transaction, the migration lock
  per transaction) and runs hear of stop requests on Redis or by polling.
  ``session`` and ``none`` say the session is kept (the default).
- ``agentrun_listen=off``: runs poll for stop requests instead of LISTENing
  (implied by ``agentrun_pooler=transaction``).
- ``agentrun_ledger_window_ms=2``: the group commit window of the tool ledger
  (``checkpoint.group``), in milliseconds (0 to 1000; 0: every record its own
  commit). A finished call's record waits at most this long for its parallel
  siblings' so they share one commit.

Any other ``agentrun_*`` parameter is refused (``ValueError``): a typo must not
pass for a setting, nor reach PostgreSQL as an unknown server setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TRANSACTION = "transaction"
_POOLERS = {"transaction": TRANSACTION, "session": None, "none": None}
_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"1", "true", "yes", "on"})
_PARAM = re.compile(r"([?&])(agentrun_[A-Za-z0-9_]*)=([^&#]*)")


@dataclass(frozen=True)
class StoreUrl:
    """A store URL split into what asyncpg sees and what agentrun does with it."""

    dsn: str  # the URL without agentrun's parameters
    pooler: str | None = None  # TRANSACTION, or None: a session of its own (direct, or a session pooler)
    listen: bool = True  # runs LISTEN for stop requests (never through a transaction pooler)
    ledger_window: float | None = None  # seconds; None: the store's default


def parse_store_url(url: str) -> StoreUrl:
    """``url``'s agentrun parameters; raises ``ValueError`` for an unknown one or an unknown value."""
    pooler: str | None = None
    listen = True
    ledger_window: float | None = None
    for _sep, name, value in _PARAM.findall(url):
        lowered = value.lower()
        if name == "agentrun_pooler":
            if lowered not in _POOLERS:
                raise ValueError(f"agentrun_pooler={value!r} in the store URL must be transaction, session or none")
            pooler = _POOLERS[lowered]
        elif name == "agentrun_listen":
            if lowered not in _OFF | _ON:
                raise ValueError(f"agentrun_listen={value!r} in the store URL must be on or off")
            listen = lowered in _ON
        elif name == "agentrun_ledger_window_ms":
            ledger_window = _milliseconds(name, value)
        else:
            raise ValueError(
                f"unknown store URL parameter {name!r} "
                "(agentrun_pooler, agentrun_listen and agentrun_ledger_window_ms exist)"
            )
    return StoreUrl(without_params(url, None), pooler, listen, ledger_window)


def listen_dsn(url: str) -> str | None:
    """The DSN on which a LISTEN for this store's notifications works, or ``None`` if it would not.

    ``None`` for a URL through a transaction pooler (``agentrun_pooler=transaction``); else the URL
    without agentrun's parameters (``agentrun_listen=off`` is about runs only). Raises ``ValueError``
    as ``parse_store_url`` does. (Here rather than in the package, so the operator's pure decisions
    can import it without the store backends.)
    """
    parsed = parse_store_url(url)
    return parsed.dsn if parsed.pooler is None else None


def _milliseconds(name: str, value: str) -> float:
    """``value`` ms as seconds; ``ValueError`` unless it is a number from 0 to 1000."""
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 1000:  # also refuses nan
        raise ValueError(f"{name}={value!r} in the store URL must be a number of milliseconds from 0 to 1000")
    return ms / 1000.0


def without_params(url: str, names: frozenset[str] | None) -> str:
    """``url`` without the agentrun parameters in ``names`` (``None``: all of them), the rest as it was."""
    while True:
        match = next((m for m in _PARAM.finditer(url) if names is None or m.group(2) in names), None)
        if match is None:
            return url
        before, after = url[: match.start()], url[match.end() :]
        if match.group(1) == "?":
            after = after.removeprefix("&")
            rest = f"?{after}" if after and not after.startswith("#") else after
        else:
            rest = after
        url = before + rest
