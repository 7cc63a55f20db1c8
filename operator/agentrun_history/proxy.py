"""``kubectl agentrun ui``'s local proxy: the history server on 127.0.0.1, carrying the kubeconfig's identity.

Every request the browser sends to ``http://127.0.0.1:PORT`` is forwarded to
the history server with ``Authorization: Bearer <the user's token>`` (from the
kubeconfig: a token, a token file or an exec credential plugin, refreshed as
the operator's client refreshes it), so the browser never holds the token.
Only requests for this proxy's own address are served (a ``Host`` header
naming another host is refused: DNS rebinding), and the upstream's own
checks (the action header, ``Origin``) still apply to what the page posts.
A browser that goes away mid-answer (a live view's tab closed) ends that
request and its upstream stream quietly, at once: no traceback for an everyday event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
from aiohttp import web

from agentrun_operator.io.kubeconfig import Credentials

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
UPSTREAM: web.AppKey[str] = web.AppKey("upstream", str)
CREDENTIALS: web.AppKey[Credentials] = web.AppKey("credentials", Credentials)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)


async def forward(request: web.Request) -> web.StreamResponse:
    """Forward a request from 127.0.0.1 upstream with the kubeconfig's credentials instead of the browser's."""
    host = (request.host or "").rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        return web.Response(status=403, text=f"this proxy serves 127.0.0.1 only, not {host!r}")
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"authorization", "cookie"}}
    authorization = await request.app[CREDENTIALS].header()
    if authorization:
        headers["Authorization"] = authorization
    if "Origin" in headers:  # the page's origin is this proxy; the upstream compares it with its own host
        headers["Origin"] = request.app[UPSTREAM]
    body = await request.read()
    async with request.app[SESSION].request(
        request.method,
        request.app[UPSTREAM] + request.rel_url.raw_path_qs,
        headers=headers,
        data=body or None,
        allow_redirects=False,
    ) as upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_BY_HOP:
                response.headers.add(key, value)
        try:
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():  # event streams pass through as they come
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            # The browser went away (a live tab closed, a navigation): nothing to tell anyone. Leaving the
            # upstream request closes it, so the history server's stream ends too.
            pass
        return response


def make_proxy(upstream: str, credentials: Credentials) -> web.Application:
    """The local proxy of ``kubectl agentrun ui``: every request to ``upstream`` carries ``credentials``."""
    app = web.Application(client_max_size=64 * 1024)
    app[UPSTREAM] = upstream.rstrip("/")
    app[CREDENTIALS] = credentials

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def serve_proxy(upstream: str, credentials: Credentials, *, port: int, ready: Callable[[int], None]) -> None:
    """Serve on 127.0.0.1:``port`` (0: any free port, given to ``ready``) until cancelled."""
    # handler_cancellation: a tab that closes cancels its handler, which closes its upstream stream at once
    # (otherwise it waits for the history server's next event, which may never come); shutdown_timeout: Ctrl-C
    # does not wait aiohttp's default 60 s for handlers of a local proxy (failed a CI run: ui outlived 30 s).
    runner = web.AppRunner(make_proxy(upstream, credentials), handler_cancellation=True, shutdown_timeout=2)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready(int(runner.addresses[0][1]))
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
