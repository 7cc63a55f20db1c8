"""``kubectl agentrun ui``'s local proxy (``agentrun_history.proxy``) with a live view closed mid-stream.

A real upstream (aiohttp on loopback) serves an event stream that sends one event and then nothing, as the
history server does between a run's updates. Failed once in CI: Ctrl-C on ``kubectl agentrun ui`` after
three closed tabs did not end it within 30 s, because the proxy's handler still waited on the idle upstream
and aiohttp's shutdown waits up to 60 s for handlers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from agentrun_history.proxy import serve_proxy
from agentrun_operator.io.kubeconfig import StaticToken

pytestmark = pytest.mark.timeout(90)


class IdleStream:
    """An upstream whose ``/events`` sends one event and then waits until its client goes away."""

    def __init__(self) -> None:
        self.open_streams = 0
        self.closed = asyncio.Event()

    async def events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"event: update\ndata: {}\n\n")
        self.open_streams += 1
        try:
            await asyncio.Event().wait()  # no further update: the client leaving is the only way out
        finally:
            self.open_streams -= 1
            self.closed.set()
        return response


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, IdleStream]]:
    stream = IdleStream()
    app = web.Application()
    app.router.add_get("/events", stream.events)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", stream
    finally:
        await runner.cleanup()


async def test_a_closed_live_view_ends_its_upstream_stream_and_ctrl_c_ends_the_proxy_at_once(
    upstream: tuple[str, IdleStream], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    url, stream = upstream
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    proxy = asyncio.create_task(serve_proxy(url, StaticToken("t"), port=0, ready=port.set_result))
    listening = await asyncio.wait_for(port, 30)

    async with (  # a tab: the first event, then closed
        aiohttp.ClientSession() as browser,
        browser.get(f"http://127.0.0.1:{listening}/events") as answer,
    ):
        assert answer.status == 200
        assert (await answer.content.readline()).startswith(b"event: update")
        assert stream.open_streams == 1

    # The upstream's stream ends once the tab is gone, not at its next event (there is none).
    await asyncio.wait_for(stream.closed.wait(), 20)
    assert stream.open_streams == 0

    proxy.cancel()  # Ctrl-C: asyncio.run cancels the proxy's task
    # 20 s: well under aiohttp's default 60 s wait for handlers, the failure this guards against.
    done, _ = await asyncio.wait({proxy}, timeout=20)
    assert proxy in done, "the proxy must stop at once on Ctrl-C, not wait for a stream nobody reads"
    assert [r.getMessage() for r in caplog.records] == [], "a closed tab is an everyday event: nothing to say"
