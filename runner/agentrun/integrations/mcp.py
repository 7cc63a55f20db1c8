"""An MCP server's tools as agentrun tools (``pip install 'agentrun[mcp]'``, the official ``mcp`` SDK, 1.x).

    server = MCPServer.stdio("python", "-m", "billing_mcp")      # or MCPServer.http("http://127.0.0.1:8000/mcp")
    tools = mcp_tools(server, side_effects={"charge": "retry", "refund": "interrupt"}, timeouts={"charge": 20})
    graph.add_node("tools", ToolNode([*tools, lookup_order]))

Each tool is a ``SchemaTool`` with the server's name, description and input
schema; the tool node runs it like a native tool (ledger, intent, deadline,
stop). What the adapter adds:

- **Side effects are declared by you**, per tool, with the in-doubt policy
  (``side_effects={"charge": "retry"}``): an MCP server cannot declare them
  (its ``destructiveHint`` is a hint, not a contract). A name in
  ``side_effects`` that the server does not have is an error, so a typo
  cannot silently drop an intent.
- **The idempotency key** reaches the server in two ways: always in the
  request's ``_meta`` as ``"agentrun/idempotency-key"`` (a FastMCP tool reads
  ``ctx.request_context.meta``), and as the argument ``idempotency_key`` when
  the tool's input schema has that property. That property is filled by
  agentrun and hidden from the model.
- **Deadlines per tool**: ``timeouts={"charge": 20, "search": 5}`` (by the
  server's tool name; ``<= 0``: none); the others get ``tool_timeout``, or
  the run's ``tool_timeout`` when that is not given either.
- **One session per server and event loop**, opened on first use and reused
  by every call (parallel calls, and the runs of every thread that share the
  server object; the blocking API runs them all on one loop). ``await
  server.aclose()`` (or ``async with server:``) closes it; a stdio server is
  then stopped.
- **One call ends alone.** A call that reaches its deadline
  (``NODE_TIMEOUT_002``) or whose run is stopped is cancelled by itself: the
  server gets MCP's ``notifications/cancelled`` for that request id, and the
  session stays open for every other call in flight on it, which finish and
  are recorded as usual.
- **A lost connection leaves its calls in doubt.** A server that dies or a
  connection that breaks under a call raises ``MCPConnectionLost`` (an
  ``MCPConnectionError`` and a ``ToolOutcomeUnknown``): the request went
  out, the answer did not come back. For a side-effect tool the tool node
  applies its in-doubt policy at once (retry with the SAME idempotency key,
  report, interrupt); it is never counted as a plain failure. The next call
  restarts the stdio server or reconnects to the HTTP one. A session that
  cannot be opened at all raises ``MCPConnectionError`` (a
  ``ConnectionError``): nothing was sent, so nothing is in doubt.

Hazards and limits, where the guarantee ends:

- A cancelled call may still be running on the server, or may have finished
  before the cancellation arrived: cancellation is a request the server may
  ignore (a FastMCP server cancels the tool's task). The adapter cannot take
  a call back. A side-effect tool cut off by its deadline is in doubt on
  replay exactly like a native one; in the run itself, as for a native
  tool, the model gets ``NODE_TIMEOUT_002``.
- A call that times out does not drop the session (that would fail its
  siblings), so a server that is stuck for good (a blocking call inside its
  event loop) stays stuck for later calls, which time out too; ``await
  server.aclose()`` drops the session, and the next call opens a new one (a
  stdio server restarts). A response stream that breaks while the session
  lives on (a proxy cut it) fails that call alone, in doubt; the session is
  replaced once the calls still in flight on it have ended.
- A stdio server's death is seen at once (its pipe closes). An HTTP
  server's is seen when the call's response stream breaks (the SDK 1.x
  swallows that, so the adapter watches each response itself), or by probing
  its port once a second while a call is in flight; a connection that stays
  open to nothing (a host gone without closing it, a proxy that holds it)
  is seen only by the deadline.
- The request id a cancellation names is read from the SDK session just
  before the request is sent (``ClientSession._request_id``, mcp 1.x; the
  SDK does not return it); if a later SDK changes that, the call is still
  abandoned alone, only without telling the server.
- The session is bound to the loop that opened it. The blocking API runs
  every call on one loop, so ``invoke()`` reuses it too; ``mcp_tools()``
  (blocking) lists the tools on a short-lived loop of its own and closes
  that session before it returns; called while a loop runs (a graph module
  imported by the runner) it does so on a thread and blocks that loop
  meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import threading
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, TextIO, TypeVar

from ..tools import InDoubtPolicy, SchemaTool, Tool, ToolOutcomeUnknown
from . import missing_extra

try:
    import httpx
    from mcp import ClientSession, McpError, StdioServerParameters
    from mcp import types as mcp_types
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise missing_extra("mcp", "mcp", e) from e

T = TypeVar("T")

log = logging.getLogger("agentrun.integrations.mcp")

# The request-metadata key that carries agentrun's idempotency key to every MCP call.
IDEMPOTENCY_META_KEY = "agentrun/idempotency-key"
# The tool argument agentrun fills with the key when the tool's input schema declares it.
IDEMPOTENCY_ARGUMENT = "idempotency_key"
DEFAULT_CONNECT_TIMEOUT = 30.0
# How long aclose() waits for a session (and a stdio server) to shut down.
CLOSE_TIMEOUT = 10.0
# While a call to an HTTP server is in flight, how often its port is probed (see _probe_until_refused).
PROBE_INTERVAL = 1.0
# How long sending one request's cancellation may take before it is given up (the session may be busy or gone).
CANCEL_SEND_TIMEOUT = 5.0


class MCPToolError(Exception):
    """The MCP server answered the call with ``isError``; the text is what it said."""


class MCPConnectionError(ConnectionError):
    """The session to the MCP server could not be opened: nothing was sent."""


class MCPConnectionLost(MCPConnectionError, ToolOutcomeUnknown):
    """The session broke under a call: the request went out, its outcome is unknown (in doubt)."""


class MCPServer:
    """Where an MCP server is: a command started over stdio, or a streamable-HTTP URL.

    Holds the sessions (one per event loop); see the module docstring.
    """

    def __init__(
        self,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        errlog: TextIO | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("give an MCP server either a command (stdio) or a url (streamable HTTP)")
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = str(cwd) if cwd is not None else None
        self.url = url
        self.headers = dict(headers or {})
        self.name = name or (url if url is not None else " ".join([command or "", *self.args]))
        self.connect_timeout = connect_timeout
        self.errlog = errlog
        self._connections: dict[asyncio.AbstractEventLoop, _Connection] = {}
        self._retired: set[asyncio.Task[None]] = set()
        # The two above are shared by the threads (and their loops) that use this server object.
        self._lock = threading.Lock()

    @classmethod
    def stdio(
        cls,
        command: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        errlog: TextIO | None = None,
    ) -> MCPServer:
        """A server started as ``command *args`` and spoken to over its stdin/stdout."""
        return cls(
            command=command, args=args, env=env, cwd=cwd, name=name, connect_timeout=connect_timeout, errlog=errlog
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> MCPServer:
        """A server reached over streamable HTTP at ``url`` (e.g. ``http://127.0.0.1:8000/mcp``)."""
        return cls(url=url, headers=headers, name=name, connect_timeout=connect_timeout)

    def __repr__(self) -> str:
        return f"MCPServer({self.name!r})"

    async def __aenter__(self) -> MCPServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- calls ----------------------------------------------------------------

    async def list_tools(self) -> list[mcp_types.Tool]:
        """Every tool the server offers (all pages)."""
        connection = self._connection()
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            page = await connection.request(functools.partial(_list_page, cursor=cursor), what="list its tools")
            tools.extend(page.tools)
            cursor = page.nextCursor
            if not cursor:
                return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, idempotency_key: str | None = None
    ) -> mcp_types.CallToolResult:
        """One ``tools/call``; raises ``MCPConnectionError`` if the session cannot be opened or breaks."""
        meta = {IDEMPOTENCY_META_KEY: idempotency_key} if idempotency_key else None
        connection = self._connection()
        return await connection.request(
            lambda s: s.call_tool(name, arguments, meta=meta), what=f"call {name}", cancellable=True
        )

    async def _aclose_this_loop(self) -> None:
        """Close the session of the running loop only (``mcp_tools``' short-lived one)."""
        connection = self._connections.get(asyncio.get_running_loop())
        if connection is not None:
            self._retire(connection)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(connection.task), CLOSE_TIMEOUT)
            with self._lock:
                self._retired.discard(connection.task)

    async def aclose(self) -> None:
        """Close every session of this server (stopping a stdio server); safe to call more than once.

        Calls in flight on them lose their answer (``MCPConnectionLost``). Sessions of other event loops
        (other threads) are told to close and are not waited for.
        """
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            self._retire(connection)
        loop = asyncio.get_running_loop()
        with self._lock:
            tasks = [t for t in self._retired if not t.done() and t.get_loop() is loop]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT)
            for task in pending:
                log.warning(
                    "MCP server %s did not shut down within %gs; abandoning its session", self.name, CLOSE_TIMEOUT
                )
                task.cancel()
        with self._lock:
            self._retired = {t for t in self._retired if not t.done()}

    # -- sessions -------------------------------------------------------------

    def _transport(self, on_broken: Callable[[int], None]) -> AbstractAsyncContextManager[Any]:
        if self.command is not None:
            params = StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
            if self.errlog is not None:
                return stdio_client(params, errlog=self.errlog)
            return stdio_client(params)
        assert self.url is not None
        return _http_transport(self.url, self.headers, self.connect_timeout, on_broken)

    def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        with self._lock:
            for dead in [lp for lp in self._connections if lp.is_closed()]:
                self._connections.pop(dead, None)
            connection = self._connections.get(loop)
            if connection is None or connection.broken:
                connection = _Connection(self)
                self._connections[loop] = connection
                self._retired.add(connection.task)
        return connection

    def _retire(self, connection: _Connection, *, drain: bool = False) -> None:
        """Stop using a session: it closes in the background; the next call opens a new one.

        ``drain``: close it only once the calls still in flight on it have ended (they may be fine).
        """
        connection.broken = True
        if connection.loop.is_closed():
            pass
        elif drain and connection.inflight:
            connection.draining = True
        elif _running_loop() is connection.loop:
            connection.closing.set()
        else:  # asyncio.Event is not thread-safe: set it on its own loop
            with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                connection.loop.call_soon_threadsafe(connection.closing.set)
        with self._lock:
            for loop, current in list(self._connections.items()):
                if current is connection:
                    del self._connections[loop]


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _probe_until_refused(url: str) -> None:
    """Return once the HTTP server's port refuses connections: the server process is gone.

    Why: when a streamable-HTTP server dies mid-call, the SDK (1.x) ends the
    call's event stream without telling the waiting request, which would then
    wait for the tool deadline. A refused TCP connection is unambiguous (a
    busy server still accepts); a timeout proves nothing and is ignored.
    Behind a proxy or load balancer the probe sees the proxy, and a dead
    backend is only noticed by the deadline.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    while True:
        await asyncio.sleep(PROBE_INTERVAL)
        try:
            async with asyncio.timeout(PROBE_INTERVAL * 5):
                _, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            continue
        except OSError:
            return
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _list_page(session: ClientSession, *, cursor: str | None) -> mcp_types.ListToolsResult:
    return await session.list_tools(params=mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None)


@contextlib.asynccontextmanager
async def _http_transport(
    url: str, headers: Mapping[str, str], connect_timeout: float, on_broken: Callable[[int], None]
) -> AsyncIterator[Any]:
    # No read timeout on the HTTP client: a tool may legitimately run for long; the tool deadline bounds a call.
    timeout = httpx.Timeout(None, connect=connect_timeout)

    async def watch(response: httpx.Response) -> None:
        request_id = _rpc_request_id(response.request)
        if request_id is not None:
            response.stream = _WatchedStream(response.stream, functools.partial(on_broken, request_id))

    async with (
        httpx.AsyncClient(
            headers=dict(headers), timeout=timeout, follow_redirects=True, event_hooks={"response": [watch]}
        ) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


def _rpc_request_id(request: httpx.Request) -> int | None:
    """The JSON-RPC request id a POST carries (the SDK posts one message per request), else None."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return None
    request_id = body.get("id") if isinstance(body, dict) and "method" in body else None
    return request_id if isinstance(request_id, int) else None


class _WatchedStream(httpx.AsyncByteStream):
    """A response body that reports when it breaks (the server died mid-answer) before the SDK swallows it."""

    def __init__(self, inner: Any, on_broken: Callable[[], None]) -> None:
        self.inner = inner
        self.on_broken = on_broken

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.inner:
                yield chunk
        except (httpx.TransportError, OSError):
            self.on_broken()
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Connection:
    """One session, owned by one background task.

    The SDK's transports and sessions are anyio task groups that must be
    entered and left by the same task, while calls come from the tool node's
    tasks (and are cancelled by deadlines and stops). So a task of our own
    opens the session, keeps it open until told to close, and closes it.
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.broken = False
        self.loop = asyncio.get_running_loop()
        self.closing = asyncio.Event()
        self.ready: asyncio.Future[ClientSession] = self.loop.create_future()
        self.task = asyncio.create_task(self._own(), name=f"agentrun-mcp-session:{server.name}")
        # Cancellation notifications being sent (a reference each, so none is garbage-collected mid-send).
        self.cancels: set[asyncio.Task[None]] = set()
        # Requests in flight by id: set when the response stream of that request broke (HTTP).
        self.streams: dict[int, asyncio.Future[None]] = {}
        self.inflight = 0
        self.draining = False  # retired: closes when the last call in flight ends

    def _stream_broke(self, request_id: int) -> None:
        lost = self.streams.get(request_id)
        if lost is not None and not lost.done():
            lost.set_result(None)

    async def _own(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write, *_ = await stack.enter_async_context(self.server._transport(self._stream_broke))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self.ready.set_result(session)
                await self.closing.wait()
        except BaseException as e:
            self.broken = True
            if not self.ready.done():
                self.ready.set_exception(e if isinstance(e, Exception) else MCPConnectionError(repr(e)))
                self.ready.exception()  # retrieved here: a caller that gave up must not leave it unretrieved
            if not isinstance(e, Exception):
                raise
            if not self.closing.is_set():
                log.warning("the session to MCP server %s ended: %s: %s", self.server.name, type(e).__name__, e)
        finally:
            self.broken = True

    async def session(self) -> ClientSession:
        try:
            async with asyncio.timeout(self.server.connect_timeout):
                return await asyncio.shield(self.ready)
        except TimeoutError:
            self.server._retire(self)
            raise MCPConnectionError(
                f"MCP server {self.server.name} did not complete the MCP handshake within "
                f"{self.server.connect_timeout:g}s"
            ) from None
        except Exception as e:
            # A caller cancelled while the session opens (its deadline, a stop) leaves it opening for the others.
            self.server._retire(self)
            raise MCPConnectionError(
                f"could not open a session to MCP server {self.server.name}: {type(e).__name__}: {e}"
            ) from e

    async def request(
        self, send: Callable[[ClientSession], Awaitable[T]], *, what: str, cancellable: bool = False
    ) -> T:
        """Run ``send(session)`` on the shared session.

        The caller being cancelled (a deadline, a stop) cancels this request alone: with ``cancellable``
        the server is told (``notifications/cancelled``), and the session stays open for the other calls.
        The session breaking under the request (the server gone) raises ``MCPConnectionLost``.
        """
        session = await self.session()
        self.inflight += 1
        try:
            return await self._request(session, send, what=what, cancellable=cancellable)
        finally:
            self.inflight -= 1
            if self.draining and not self.inflight:
                self.closing.set()

    async def _request(
        self, session: ClientSession, send: Callable[[ClientSession], Awaitable[T]], *, what: str, cancellable: bool
    ) -> T:
        sent: list[int] = []
        broke = self.loop.create_future()

        async def numbered() -> T:
            # The id send_request is about to take: it reads it before its first await, and nothing runs
            # between this line and that read (see the module docstring's last hazard).
            request_id = getattr(session, "_request_id", None)
            if isinstance(request_id, int):
                sent.append(request_id)
                self.streams[request_id] = broke
            return await send(session)

        call = asyncio.ensure_future(numbered())
        watch = {call, self.task, broke}
        probe = asyncio.ensure_future(_probe_until_refused(self.server.url)) if self.server.url else None
        if probe is not None:
            watch.add(probe)
        try:
            await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # A deadline or a stop, of this call only: abandon it, tell the server, keep the session.
            call.cancel()
            if cancellable and sent and not call.done():
                self._send_cancel(sent[0], what)
            raise
        finally:
            if probe is not None:
                probe.cancel()
            if sent:
                self.streams.pop(sent[0], None)
            broke.cancel()
        if not call.done():
            call.cancel()
            # A broken response stream may be this request's alone (a proxy cut it): the others finish first.
            self.server._retire(self, drain=broke.done() and not self.task.done())
            raise MCPConnectionLost(
                f"the session to MCP server {self.server.name} ended while trying to {what}; "
                "the outcome is unknown (the next call reconnects)"
            )
        try:
            return call.result()
        except McpError as e:
            if e.error.code == mcp_types.CONNECTION_CLOSED:
                self.server._retire(self)
                raise MCPConnectionLost(
                    f"MCP server {self.server.name} closed the connection while trying to {what}; "
                    "the outcome is unknown (the next call restarts or reconnects it)"
                ) from e
            raise
        except (OSError, httpx.TransportError) as e:
            self.server._retire(self)
            raise MCPConnectionLost(
                f"lost MCP server {self.server.name} while trying to {what}: {type(e).__name__}: {e}; "
                "the outcome is unknown"
            ) from e

    def _send_cancel(self, request_id: int, what: str) -> None:
        """Send ``notifications/cancelled`` for one request, in the background (the caller is being cancelled)."""
        if self.task.done() or not self.ready.done() or self.ready.cancelled() or self.ready.exception():
            return
        session = self.ready.result()
        notification = mcp_types.ClientNotification(
            mcp_types.CancelledNotification(
                params=mcp_types.CancelledNotificationParams(
                    requestId=request_id, reason="agentrun: the call's deadline passed or its run was stopped"
                )
            )
        )

        async def notify() -> None:
            try:
                async with asyncio.timeout(CANCEL_SEND_TIMEOUT):
                    await session.send_notification(notification)
            except Exception as e:  # the session is going away: the server loses the request with it
                log.info("could not tell MCP server %s to cancel (%s): %s", self.server.name, what, e)
            else:
                log.info("told MCP server %s to cancel request %d (%s)", self.server.name, request_id, what)

        task = asyncio.create_task(notify(), name=f"agentrun-mcp-cancel:{self.server.name}:{request_id}")
        self.cancels.add(task)
        task.add_done_callback(self.cancels.discard)


def result_value(result: mcp_types.CallToolResult, tool_name: str) -> Any:
    """What the model sees of a call's result: its text, else its structured content, else its content blocks.

    Raises ``MCPToolError`` when the server flagged the result as an error.
    """
    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    if result.isError:
        raise MCPToolError("\n".join(texts) or f"{tool_name} failed (the MCP server gave no message)")
    if texts and len(texts) == len(result.content):
        return "\n".join(texts)
    if result.structuredContent is not None:
        return result.structuredContent
    return [block.model_dump(mode="json", exclude_none=True) for block in result.content]


def _as_tool(
    server: MCPServer, spec: mcp_types.Tool, *, name: str, policy: InDoubtPolicy | None, timeout: float | None
) -> Tool:
    schema = dict(spec.inputSchema or {})
    properties = dict(schema.get("properties") or {})
    wants_key = IDEMPOTENCY_ARGUMENT in properties
    if wants_key:
        # agentrun fills it; the model must neither see nor invent it.
        properties.pop(IDEMPOTENCY_ARGUMENT)
        schema["properties"] = properties
        if "required" in schema:
            schema["required"] = [r for r in schema["required"] if r != IDEMPOTENCY_ARGUMENT]
    remote = spec.name

    async def call(arguments: dict[str, Any], idempotency_key: str | None) -> Any:
        if wants_key and idempotency_key is not None:
            arguments = {**arguments, IDEMPOTENCY_ARGUMENT: idempotency_key}
        result = await server.call_tool(remote, arguments, idempotency_key=idempotency_key)
        return result_value(result, remote)

    return SchemaTool(
        call,
        name=name,
        parameters=schema,
        description=spec.description or (spec.annotations.title if spec.annotations else None) or "",
        side_effects=policy is not None,
        in_doubt=policy or "interrupt",
        timeout=timeout,
    )


async def amcp_tools(
    server: MCPServer,
    *,
    side_effects: Mapping[str, InDoubtPolicy] | Iterable[str] = (),
    in_doubt: InDoubtPolicy = "interrupt",
    include: Iterable[str] | None = None,
    prefix: str = "",
    tool_timeout: float | None = None,
    timeouts: Mapping[str, float] | None = None,
) -> list[Tool]:
    """The server's tools as agentrun tools (opens the session on this loop and keeps it for the calls).

    ``side_effects``: the tools with side effects, as ``{name: in_doubt policy}``
    or as names (which then get ``in_doubt``). ``include``: only these tools.
    ``prefix``: prepended to every name the model sees (to tell servers apart).
    ``tool_timeout``: a deadline for these tools overriding the run's ``tool_timeout``.
    ``timeouts``: deadlines per tool, ``{server tool name: seconds}`` (``<= 0``:
    none), overriding ``tool_timeout`` for those tools.
    Raises ``ValueError`` for a name in ``side_effects``, ``include`` or
    ``timeouts`` that the server does not have (or a deadline that is not a
    number), ``MCPConnectionError`` if it cannot be reached.
    """
    policies: dict[str, InDoubtPolicy] = (
        dict(side_effects) if isinstance(side_effects, Mapping) else dict.fromkeys(side_effects, in_doubt)
    )
    deadlines = dict(timeouts or {})
    for tool_name, seconds in deadlines.items():
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError(f"timeouts[{tool_name!r}] must be a number of seconds, not {seconds!r}")
    listed = await server.list_tools()
    names = {t.name for t in listed}
    wanted = set(include) if include is not None else names
    unknown = sorted((set(policies) | wanted | set(deadlines)) - names)
    if unknown:
        raise ValueError(f"MCP server {server.name} has no tool(s) {unknown} (it has {sorted(names)})")
    tools = [
        _as_tool(
            server,
            spec,
            name=prefix + spec.name,
            policy=policies.get(spec.name),
            timeout=deadlines.get(spec.name, tool_timeout),
        )
        for spec in listed
        if spec.name in wanted
    ]
    for spec in listed:
        hints = spec.annotations
        if spec.name in wanted and spec.name not in policies and hints is not None and hints.destructiveHint:
            log.warning(
                "MCP tool %s says it is destructive but is not in side_effects: no intent is recorded, so a crash "
                "mid-call cannot be told apart from a call that never started",
                spec.name,
            )
    return tools


def mcp_tools(
    server: MCPServer,
    *,
    side_effects: Mapping[str, InDoubtPolicy] | Iterable[str] = (),
    in_doubt: InDoubtPolicy = "interrupt",
    include: Iterable[str] | None = None,
    prefix: str = "",
    tool_timeout: float | None = None,
    timeouts: Mapping[str, float] | None = None,
) -> list[Tool]:
    """``amcp_tools`` for module level (building a graph): lists the tools on a short-lived session.

    Blocks until the tools are listed. Inside a running event loop (a graph
    module imported by the runner, whose loop is already running) the listing
    runs on a thread of its own, and that loop waits for it: meant for import
    time; in a coroutine, ``await amcp_tools(...)`` instead.
    """

    async def once() -> list[Tool]:
        try:
            return await amcp_tools(
                server,
                side_effects=side_effects,
                in_doubt=in_doubt,
                include=include,
                prefix=prefix,
                tool_timeout=tool_timeout,
                timeouts=timeouts,
            )
        finally:
            await server._aclose_this_loop()

    if _running_loop() is None:
        return asyncio.run(once())
    listed: list[list[Tool]] = []
    failed: list[BaseException] = []

    def listing() -> None:
        try:
            listed.append(asyncio.run(once()))
        except BaseException as e:  # raised again in the caller's thread
            failed.append(e)

    thread = threading.Thread(target=listing, name=f"agentrun-mcp-list:{server.name}", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return listed[0]
