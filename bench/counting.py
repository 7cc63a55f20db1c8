"""Round trips and transactions of asyncpg connections, counted on the wire.

``Counter.init`` is a pool ``init`` hook: it puts a proxy between the
connection's transport and its protocol and reads the PostgreSQL message
stream the server sends. Every ``ReadyForQuery`` (``Z``) ends one round trip
(the client sent a ``Sync`` or a simple query and waited for it); a ``Z``
whose transaction status is idle (``I``) also ends a transaction (an
autocommit statement, a ``COMMIT``, the pool's reset query), which is what
``pg_stat_database.xact_commit`` counts on the server.
"""

from __future__ import annotations

from typing import Any


class Counter:
    def __init__(self) -> None:
        self.round_trips = 0
        self.transactions = 0

    def snapshot(self) -> tuple[int, int]:
        return self.round_trips, self.transactions

    async def init(self, conn: Any) -> None:
        transport = conn._transport
        transport._protocol = _Proxy(transport._protocol, self)


class _Proxy:
    """Forwards everything to asyncpg's protocol; frames the bytes it receives to find ``Z`` messages."""

    def __init__(self, protocol: Any, counter: Counter) -> None:
        self._protocol = protocol
        self._counter = counter
        self._header = b""  # an incomplete 5-byte message header carried over from the last chunk
        self._skip = 0  # bytes of the current message body still to come

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol, name)

    def data_received(self, data: bytes) -> None:
        self._scan(data)
        self._protocol.data_received(data)

    def _scan(self, data: bytes) -> None:
        view = memoryview(data)
        pos = 0
        size = len(view)
        while pos < size:
            if self._skip:
                step = min(self._skip, size - pos)
                self._skip -= step
                pos += step
                continue
            need = 5 - len(self._header)
            self._header += bytes(view[pos : pos + need])
            pos += min(need, size - pos)
            if len(self._header) < 5:
                return
            kind = self._header[:1]
            length = int.from_bytes(self._header[1:5], "big") - 4
            self._header = b""
            if kind == b"Z" and length == 1 and pos < size:
                self._counter.round_trips += 1
                if view[pos : pos + 1] == b"I":
                    self._counter.transactions += 1
                pos += 1
            elif kind == b"Z" and length == 1:
                # The status byte is in the next chunk: count it there.
                self._counter.round_trips += 1
                self._pending_status = True
                self._skip = 0
                self._expect_status()
                return
            else:
                self._skip = length

    def _expect_status(self) -> None:
        # Rare (a chunk boundary between a Z header and its status byte): count it as a transaction end
        # only when the byte arrives; wrap data_received once for that.
        original = self._scan

        def scan_status(data: bytes) -> None:
            self._scan = original  # type: ignore[method-assign]
            if data[:1] == b"I":
                self._counter.transactions += 1
            original(data[1:])

        self._scan = scan_status  # type: ignore[method-assign]
