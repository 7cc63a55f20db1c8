"""The history server's routes: JSON, the web view, live updates and the three actions, all as the caller.

Who the caller is: the bearer token of the ``Authorization`` header, else
the ``agentrun_token`` cookie of the token login (``--token-login``). No
token: 401. Before anything of a run is read from the store, the AgentRun is
read from the API server with that token; its answer decides (403, 404 and
401 are passed on as they are). A list is what the API server lists for
that token. Approve, reject and stop patch the AgentRun with that token.

Cross-site requests: a POST must carry ``X-Agentrun-Action`` (a custom
header, which a page of another origin can only send after a CORS preflight
this server never answers) and, when the browser sends one, an ``Origin``
equal to this server's. The cookie is HttpOnly and SameSite=Strict.

Live view: ``/runs/NS/NAME/events`` is a server-sent event stream. It sends
``update`` when the store notifies progress for the run's thread
(``ProgressHub``) or when the AgentRun changed (read with the caller's token
every ``POLL_SECONDS``: phases are written by the operator, not the store),
and ``end`` once the run is in a final phase. A caller whose access is
revoked gets the stream closed at the next read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrun import history
from agentrun_operator.decide.spec import thread_key

from . import pages
from .kube import KubeError, UserKube
from .store import HistoryStore, ProgressHub

log = logging.getLogger("agentrun.history")

STATIC = Path(__file__).parent / "static"
COOKIE = "agentrun_token"
ACTION_HEADER = "X-Agentrun-Action"
POLL_SECONDS = 2.0
HEARTBEAT_SECONDS = 15.0
CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"

KUBE: web.AppKey[UserKube] = web.AppKey("kube", UserKube)
STORE: web.AppKey[HistoryStore] = web.AppKey("store", HistoryStore)
HUB: web.AppKey[ProgressHub] = web.AppKey("hub", ProgressHub)
TOKEN_LOGIN: web.AppKey[bool] = web.AppKey("token_login", bool)
SECURE_COOKIE: web.AppKey[bool] = web.AppKey("secure_cookie", bool)


class Refused(Exception):
    """An answer for the caller: HTTP status and a message (JSON or an error page)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def token_of(request: web.Request) -> str:
    """The caller's bearer token (the header, else the sign-in cookie); ``Refused`` (401) without one."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer ") and header[7:].strip():
        return header[7:].strip()
    cookie = request.cookies.get(COOKIE, "") if request.app[TOKEN_LOGIN] else ""
    if cookie:
        return cookie
    raise Refused(
        401,
        "Unauthorized",
        "no credentials: send your Kubernetes bearer token (kubectl agentrun ui does it for you)"
        + ("; or sign in at /login" if request.app[TOKEN_LOGIN] else ""),
    )


def _refused(error: KubeError, what: str) -> Refused:
    titles = {401: "Unauthorized", 403: "Forbidden", 404: "Not found"}
    if error.status == 404:
        return Refused(404, "Not found", f"{what} does not exist")
    return Refused(error.status, titles.get(error.status, error.reason or "Error"), error.message)


async def authorized_run(request: web.Request) -> tuple[str, dict[str, Any]]:
    """The caller's token and the AgentRun as the API server shows it to that token (else ``Refused``)."""
    token = token_of(request)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    try:
        return token, await request.app[KUBE].get_run(token, namespace, name)
    except KubeError as e:
        raise _refused(e, f'agentrun "{name}" in namespace "{namespace}"') from None


async def readable_run(request: web.Request) -> tuple[dict[str, Any], bool]:
    """The AgentRun as the caller may see it, or, once deleted, what the store kept of it: (run, deleted).

    A deleted run's history is shown to whoever may list AgentRuns in its namespace (they could see the
    run while it existed), found by the request key the operator derived from it; anyone else gets 404.
    """
    token = token_of(request)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    what = f'agentrun "{name}" in namespace "{namespace}"'
    try:
        return await request.app[KUBE].get_run(token, namespace, name), False
    except KubeError as e:
        if e.status != 404:
            raise _refused(e, what) from None
    try:
        await request.app[KUBE].list_runs(token, namespace, limit=1)
        found = await request.app[STORE].find_run(namespace, name)
    except KubeError:
        found = None
    except Exception as e:
        log.warning("looking up deleted run %s/%s in the store failed: %s", namespace, name, e)
        found = None
    if found is None:
        raise Refused(404, "Not found", f"{what} does not exist")
    thread, uid = found
    run = {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"threadId": thread.split("/", 1)[1] if "/" in thread else thread},
        "status": {},
    }
    return run, True


async def run_history(request: web.Request, run: dict[str, Any]) -> history.RunHistory:
    """The run's history from the store; raises ``Refused`` (503) when the store cannot be read."""
    meta, spec = run["metadata"], run.get("spec") or {}
    thread = thread_key(meta["namespace"], str(spec.get("threadId") or meta["name"]))
    try:
        rows = await request.app[STORE].rows(thread, meta.get("uid"))
    except Exception as e:  # the store is down or misconfigured: say so instead of a bare 500
        log.warning("history of %s/%s: the store could not be read: %s", meta["namespace"], meta["name"], e)
        raise Refused(503, "Store unavailable", f"the run's history could not be read from the store: {e}") from e
    return history.build(
        rows,
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid"),
        thread_id=thread,
        graph=spec.get("graph"),
        status=run.get("status") or {},
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def answers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``Refused`` as JSON under /api, as a page elsewhere; security headers on every answer."""
    try:
        response = await handler(request)
    except Refused as r:
        if request.path.startswith("/api/") or request.method == "POST":
            response = web.json_response({"status": r.status, "reason": r.title, "message": r.message}, status=r.status)
        elif r.status == 401 and request.app[TOKEN_LOGIN]:
            response = web.Response(text=pages.login_page(r.message), status=401, content_type="text/html")
        else:
            response = web.Response(
                text=pages.error_page(r.status, r.title, r.message), status=r.status, content_type="text/html"
            )
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on form posts (the login).
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


# --- JSON --------------------------------------------------------------------------------------------------------


async def api_list(request: web.Request) -> web.Response:
    """``GET /api/v1/.../agentruns``: the runs the caller may list, as JSON."""
    token = token_of(request)
    namespace = request.match_info.get("namespace")
    try:
        runs = await request.app[KUBE].list_runs(token, namespace)
    except KubeError as e:
        raise _refused(e, "the list") from None
    phase = request.query.get("phase") or None
    items = [_brief(r) for r in pages.list_filter(runs, phase)]
    return web.json_response({"items": items})


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    meta, status = run["metadata"], run.get("status") or {}
    return {
        "namespace": meta.get("namespace"),
        "name": meta["name"],
        "phase": status.get("phase") or "Pending",
        "currentNode": status.get("currentNode"),
        "stateVersion": status.get("stateVersion"),
        "attempt": status.get("attempt"),
        "toolCalls": status.get("toolCalls") or {},
        "graph": (run.get("spec") or {}).get("graph"),
        "created": meta.get("creationTimestamp"),
    }


async def api_history(request: web.Request) -> web.Response:
    """``GET /api/v1/.../agentruns/<name>/history``: one run's history as JSON (a deleted run's too)."""
    run, deleted = await readable_run(request)
    found = await run_history(request, run)
    found.deleted = deleted
    return web.json_response(text=found.model_dump_json())


# --- actions (as the caller) --------------------------------------------------------------------------------------


def _check_origin(request: web.Request) -> None:
    if request.headers.get(ACTION_HEADER) != "1":
        raise Refused(403, "Forbidden", f"actions need the {ACTION_HEADER} header (sent by the page's buttons)")
    origin = request.headers.get("Origin")
    if origin and origin not in (f"http://{request.host}", f"https://{request.host}"):
        raise Refused(403, "Forbidden", f"cross-origin action refused (Origin {origin})")


async def act(request: web.Request) -> web.Response:
    """``POST .../stop|approve|reject``: the caller's own patch of the AgentRun (409 when it cannot apply)."""
    _check_origin(request)
    token, run = await authorized_run(request)
    verb = request.match_info["verb"]
    meta, spec, status = run["metadata"], run.get("spec") or {}, run.get("status") or {}
    name, namespace, phase = meta["name"], meta["namespace"], status.get("phase") or "Pending"
    kube = request.app[KUBE]
    try:
        if verb == "stop":
            if phase in pages.TERMINAL:
                raise Refused(409, "Conflict", f"agentrun {name} already ended ({phase}); there is nothing to stop")
            if not spec.get("stop"):
                await kube.merge_patch(token, namespace, name, {"spec": {"stop": True}})
            return web.json_response({"message": f"stop requested for {name}"})
        if phase != "Interrupted":
            raise Refused(409, "Conflict", f"agentrun {name} is not waiting for an answer (phase {phase})")
        interrupt = status.get("interrupt") or {}
        ids = [str(i) for i in interrupt.get("ids") or [interrupt.get("id")] if i]
        value = verb == "approve"
        resume: dict[str, Any] = {"values": {i: value for i in ids}} if ids else {"value": value}
        # "add" replaces an earlier spec.resume whole (as kubectl agentrun approve does), so no answer of an
        # earlier interrupt stays beside this one; a merge patch would keep its keys.
        await kube.json_patch(token, namespace, name, [{"op": "add", "path": "/spec/resume", "value": resume}])
        return web.json_response({"message": f"{verb}d: {name} resumes in a new pod"})
    except KubeError as e:
        raise _refused(e, f'agentrun "{name}" in namespace "{namespace}"') from None


# --- the web view --------------------------------------------------------------------------------------------------


async def runs_page(request: web.Request) -> web.Response:
    """``GET /runs``: the list page."""
    token = token_of(request)
    namespace = request.query.get("namespace") or None
    phase = request.query.get("phase") or None
    note = ""
    try:
        runs = await request.app[KUBE].list_runs(token, namespace)
    except KubeError as e:
        if e.status != 403:
            raise _refused(e, "the list") from None
        runs = []
        where = f'namespace "{namespace}"' if namespace else "all namespaces"
        note = f"You may not list AgentRuns in {where} ({e.message}). Choose a namespace you may read."
    html = pages.run_list(
        pages.list_filter(runs, phase), namespace=namespace, phase=phase, note=note, now=datetime.now(UTC)
    )
    return web.Response(text=html, content_type="text/html")


async def run_page(request: web.Request) -> web.Response:
    """``GET /runs/<namespace>/<name>``: one run's page."""
    run, deleted = await readable_run(request)
    found = await run_history(request, run)
    found.deleted = deleted
    live = not deleted and (found.phase or "Pending") not in pages.TERMINAL
    return web.Response(text=pages.run_page(found, run, live=live), content_type="text/html")


async def timeline(request: web.Request) -> web.Response:
    """``GET /runs/<namespace>/<name>/timeline``: the run's page body alone (what a live view swaps in)."""
    run, deleted = await readable_run(request)
    found = await run_history(request, run)
    found.deleted = deleted
    return web.Response(text=pages.timeline(found, run), content_type="text/html")


async def events(request: web.Request) -> web.StreamResponse:
    """``GET .../events``: server-sent events, one each time the run's store or object changed."""
    token, run = await authorized_run(request)
    meta, spec = run["metadata"], run.get("spec") or {}
    thread = thread_key(meta["namespace"], str(spec.get("threadId") or meta["name"]))
    hub, kube = request.app[HUB], request.app[KUBE]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    response.headers["Content-Security-Policy"] = CSP
    try:
        await response.prepare(request)
    except ConnectionResetError:  # the page went away before the stream started (a navigation)
        return response
    woken = hub.subscribe(thread)
    last = (meta.get("resourceVersion"), None)
    quiet = 0.0
    try:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=POLL_SECONDS)
            stored = woken.is_set()
            woken.clear()
            try:
                run = await kube.get_run(token, meta["namespace"], meta["name"])
            except KubeError as e:  # revoked, deleted: the stream ends
                await response.write(f"event: end\ndata: {json.dumps({'status': e.status})}\n\n".encode())
                break
            status = run.get("status") or {}
            now = (run["metadata"].get("resourceVersion"), status.get("stateVersion"))
            if now != last or stored:
                last, quiet = now, 0.0
                data = json.dumps({"phase": status.get("phase"), "version": status.get("stateVersion")})
                await response.write(f"event: update\ndata: {data}\n\n".encode())
            else:
                quiet += POLL_SECONDS
                if quiet >= HEARTBEAT_SECONDS:
                    quiet = 0.0
                    await response.write(b": still here\n\n")
            if (status.get("phase") or "Pending") in pages.TERMINAL:
                await response.write(f"event: end\ndata: {json.dumps({'phase': status.get('phase')})}\n\n".encode())
                break
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        hub.unsubscribe(thread, woken)
    return response


async def login_form(request: web.Request) -> web.Response:
    """``GET /login``: the token sign-in form (404 unless token login is on)."""
    if not request.app[TOKEN_LOGIN]:
        raise Refused(404, "Not found", "token login is off (--token-login / history.tokenLogin.enabled)")
    return web.Response(text=pages.login_page(), content_type="text/html")


async def login(request: web.Request) -> web.Response:
    """``POST /login``: check the token with the API server, set the sign-in cookie (404 without token login)."""
    if not request.app[TOKEN_LOGIN]:
        raise Refused(404, "Not found", "token login is off")
    origin = request.headers.get("Origin")
    if origin and origin not in (f"http://{request.host}", f"https://{request.host}"):
        raise Refused(403, "Forbidden", f"cross-origin sign-in refused (Origin {origin})")
    form = await request.post()
    token = str(form.get("token") or "").strip()
    if not token:
        return web.Response(text=pages.login_page("a token is needed"), status=400, content_type="text/html")
    # Proved by use: the API server decides at every request; an invalid token gets 401 on the first page.
    response = web.HTTPSeeOther("/runs")
    response.set_cookie(
        COOKIE, token, httponly=True, samesite="Strict", secure=request.app[SECURE_COOKIE], path="/", max_age=8 * 3600
    )
    raise response


async def logout(request: web.Request) -> web.Response:
    """``POST /logout``: drop the sign-in cookie."""
    response = web.HTTPSeeOther("/login" if request.app[TOKEN_LOGIN] else "/runs")
    response.del_cookie(COOKIE, path="/")
    raise response


async def healthz(_request: web.Request) -> web.Response:
    """Liveness: ``ok``."""
    return web.Response(text="ok")


async def root(_request: web.Request) -> web.Response:
    """``/``: to the run list."""
    raise web.HTTPFound("/runs")


def make_app(
    *, kube: UserKube, store: HistoryStore, hub: ProgressHub, token_login: bool = False, secure_cookie: bool = False
) -> web.Application:
    """The history server's application: its routes over ``kube`` (as the caller), ``store`` and ``hub``."""
    app = web.Application(middlewares=[answers], client_max_size=64 * 1024)
    app[KUBE], app[STORE], app[HUB] = kube, store, hub
    app[TOKEN_LOGIN], app[SECURE_COOKIE] = token_login, secure_cookie
    run = "/{namespace}/{name}"
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/", root),
            web.get("/login", login_form),
            web.post("/login", login),
            web.post("/logout", logout),
            web.get("/runs", runs_page),
            web.get("/runs" + run, run_page),
            web.get("/runs" + run + "/timeline", timeline),
            web.get("/runs" + run + "/events", events),
            web.post("/runs" + run + "/{verb:approve|reject|stop}", act),
            web.get("/api/v1/agentruns", api_list),
            web.get("/api/v1/namespaces/{namespace}/agentruns", api_list),
            web.get("/api/v1/namespaces/{namespace}/agentruns/{name}/history", api_history),
            web.post("/api/v1/namespaces/{namespace}/agentruns/{name}/{verb:approve|reject|stop}", act),
            web.static("/static", STATIC),
        ]
    )

    async def lifecycle(app: web.Application) -> Any:
        hub.start()
        yield
        await hub.aclose()
        await store.aclose()
        await kube.close()

    app.cleanup_ctx.append(lifecycle)
    return app
