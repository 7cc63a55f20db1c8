"""The history server's routes: JSON, the web view, live updates and the three actions, all as the caller.

Who the caller is: the bearer token of the ``Authorization`` header, else
the ``agentrun_token`` cookie of the token login (``--token-login``). No
token: 401. Before anything of a run is read from the store, the AgentRun is
read from the API server with that token; its answer decides (403, 404 and
401 are passed on as they are). A list is what the API server lists for
that token. Approve, reject, retry and stop patch the AgentRun with that token.

Cross-site requests: a POST must carry ``X-Agentrun-Action`` (a custom
header, which a page of another origin can only send after a CORS preflight
this server never answers) and, when the browser sends one, an ``Origin``
equal to this server's (so do the sign-in and the sign-out). The cookie is
HttpOnly and SameSite=Strict, and Secure when TLS protects the way in (the
server's own, or ``--tls-in-front``); without TLS a token is signed in only
from loopback unless ``--allow-plain-http-login``.

An approve or reject names the question it answers (the interrupt id and the
digest of ``status.interrupt`` the page showed) and may carry the answer
(``value``: any JSON; without it approve sends ``true``, reject ``false``):
anything else waiting is a 409 with the current question, and the patch is
guarded by a JSON patch ``test`` of the object that was checked. A tool call
review (LangChain's ``HumanInTheLoopMiddleware``, ``hitl``) takes only
``{"decisions": [...]}`` its calls allow (approve, edit, reject): anything else
is a 400 saying what to send, since the graph would fail on it. A retry
names the failure it re-opens (the ``spec.retry`` the page showed): a run
retried meanwhile, or not Failed, is a 409 with its current state, and the
patch (``spec.retry`` one higher) is guarded the same way. A body that is not
a JSON object is a 400 saying what to send. A namespace or name that is not a
DNS-1123 label or subdomain is a 400 before any request.

Live view: ``/runs/NS/NAME/events`` is a server-sent event stream (the list's: ``/runs/events``). It sends
``update`` when the store notifies progress for the run's thread
(``ProgressHub``) or when the AgentRun changed (read with the caller's token
every ``POLL_SECONDS``: phases are written by the operator, not the store),
and ``end`` once the run is in a final phase. A caller whose access is
revoked gets the stream closed at the next read.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrun import history, inspector
from agentrun_operator.decide import jobparity
from agentrun_operator.decide.spec import thread_key
from agentrun_operator.decide.status import AgentRunStatus

from . import hitl, listing, pages, text
from .kube import KubeError, UserKube
from .store import HistoryStore, ProgressHub

log = logging.getLogger("agentrun.history")

STATIC = Path(__file__).parent / "static"
COOKIE = "agentrun_token"
ACTION_HEADER = "X-Agentrun-Action"
POLL_SECONDS = 2.0
HEARTBEAT_SECONDS = 15.0
CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
STORE_DOWN = "the run's history could not be read from the store; try again later (the server's log has the cause)"

KUBE: web.AppKey[UserKube] = web.AppKey("kube", UserKube)
STORE: web.AppKey[HistoryStore] = web.AppKey("store", HistoryStore)
HUB: web.AppKey[ProgressHub] = web.AppKey("hub", ProgressHub)
TOKEN_LOGIN: web.AppKey[bool] = web.AppKey("token_login", bool)
SECURE_COOKIE: web.AppKey[bool] = web.AppKey("secure_cookie", bool)
PLAIN_HTTP_LOGIN: web.AppKey[bool] = web.AppKey("plain_http_login", bool)


class Refused(Exception):
    """An answer for the caller: HTTP status and a message (JSON or an error page), with ``details`` for JSON."""

    def __init__(self, status: int, title: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.title, self.message, self.details = status, title, message, details or {}


# DNS-1123: a namespace is a label, an AgentRun's name a subdomain (what the API server accepts for them).
# Checked before any request: the HTTP client collapses "." and ".." segments, so such a "name" would
# reach another API path (the namespace's list, the group's discovery document) with the caller's token.
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def valid_namespace(namespace: str) -> str:
    """``namespace`` when it is a DNS-1123 label, else ``Refused`` (400) saying what one is."""
    if len(namespace) <= 63 and LABEL.fullmatch(namespace):
        return namespace
    raise Refused(
        400,
        "Bad request",
        f'"{text.visible(namespace)[:300]}" is not a namespace name: a namespace is a DNS-1123 label (at most 63 '
        "lowercase letters, digits and '-', starting and ending with a letter or digit)",
    )


def valid_name(name: str) -> str:
    """``name`` when it is a DNS-1123 subdomain (an AgentRun's name), else ``Refused`` (400)."""
    if len(name) <= 253 and all(LABEL.fullmatch(label) for label in name.split(".")):
        return name
    raise Refused(
        400,
        "Bad request",
        f'"{text.visible(name)[:300]}" is not an AgentRun name: a name is a DNS-1123 subdomain (at most 253 '
        "lowercase letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit)",
    )


def run_names(request: web.Request) -> tuple[str, str]:
    """The namespace and name of the run in the request's path, validated (``Refused`` 400 otherwise)."""
    return valid_namespace(request.match_info["namespace"]), valid_name(request.match_info["name"])


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
    namespace, name = run_names(request)
    token = token_of(request)
    try:
        return token, await request.app[KUBE].get_run(token, namespace, name)
    except KubeError as e:
        raise _refused(e, f'agentrun "{name}" in namespace "{namespace}"') from None


async def readable_run(request: web.Request) -> tuple[dict[str, Any], bool]:
    """The AgentRun as the caller may see it, or, once deleted, what the store kept of it: (run, deleted).

    A deleted run's history is shown to whoever may list AgentRuns in its namespace (they could see the
    run while it existed), found by the request key the operator derived from it; anyone else gets 404.
    """
    namespace, name = run_names(request)
    token = token_of(request)
    what = f'agentrun "{name}" in namespace "{namespace}"'
    try:
        return await request.app[KUBE].get_run(token, namespace, name), False
    except KubeError as e:
        if e.status != 404:
            raise _refused(e, what) from None
    try:
        await request.app[KUBE].list_runs(token, namespace, limit=1)
    except KubeError:  # may not list there: the run does not exist for this caller, deleted or not
        raise Refused(404, "Not found", f"{what} does not exist") from None
    try:
        found = await request.app[STORE].find_run(namespace, name)
    except Exception as e:  # "does not exist" would be a guess: the store that knows cannot be asked
        log.warning("looking up deleted run %s/%s in the store failed: %r", namespace, name, e)
        raise Refused(503, "Store unavailable", STORE_DOWN) from e
    if found is None:
        raise Refused(404, "Not found", f"{what} does not exist")
    thread, uid = found
    run = {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"threadId": thread.split("/", 1)[1] if "/" in thread else thread},
        "status": {},
    }
    return run, True


def _thread(run: dict[str, Any]) -> str:
    meta, spec = run["metadata"], run.get("spec") or {}
    return thread_key(meta["namespace"], str(spec.get("threadId") or meta["name"]))


async def run_conversation(request: web.Request, run: dict[str, Any]) -> inspector.Conversation | None:
    """The run's input and conversation, or None (logged) when the store cannot give them: the rest is shown."""
    try:
        return await request.app[STORE].conversation(_thread(run), run["metadata"].get("uid"))
    except Exception as e:  # a history without its conversation beats no history
        log.warning("conversation of %s: the store could not be read: %r", run["metadata"]["name"], e)
        return None


def _version(request: web.Request) -> int:
    try:
        version = int(request.match_info["version"])
    except ValueError:
        version = 0
    if not 0 < version < 1 << 62:
        raise Refused(400, "Bad request", "a step is a state version: a positive integer (the Version column)")
    return version


async def run_step(request: web.Request) -> inspector.StepDetail:
    """The run's checkpoint ``{version}`` (``agentrun.inspector``): ``Refused`` 404 without it, 503 store down."""
    version = _version(request)  # before any request: a bad one asks the API server nothing
    run, _deleted = await readable_run(request)
    try:
        found = await request.app[STORE].step(_thread(run), version)
    except Exception as e:
        log.warning("step %d of %s: the store could not be read: %r", version, run["metadata"]["name"], e)
        raise Refused(503, "Store unavailable", STORE_DOWN) from e
    if found is None:
        raise Refused(404, "Not found", f"version {version} of this run's thread is not in the store")
    return found


async def run_history(request: web.Request, run: dict[str, Any]) -> history.RunHistory:
    """The run's history from the store; raises ``Refused`` (503) when the store cannot be read."""
    meta, spec = run["metadata"], run.get("spec") or {}
    thread = _thread(run)
    try:
        rows = await request.app[STORE].rows(thread, meta.get("uid"))
    except Exception as e:  # the store is down or misconfigured: say so instead of a bare 500
        # The cause names the store's address and user: for the operators' log, not for every viewer.
        log.warning("history of %s/%s: the store could not be read: %r", meta["namespace"], meta["name"], e)
        raise Refused(503, "Store unavailable", STORE_DOWN) from e
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


SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on form posts (the login).
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _answer_refused(request: web.Request, r: Refused) -> web.Response:
    if request.path.startswith("/api/") or request.method == "POST":
        body = {"status": r.status, "reason": r.title, "message": r.message, **r.details}
        return web.json_response(body, status=r.status)
    if r.status == 401 and request.app[TOKEN_LOGIN]:
        refusal = login_refusal(request)
        if refusal is None:
            return web.Response(text=pages.login_page(r.message), status=401, content_type="text/html")
        return web.Response(
            text=pages.error_page(401, r.title, f"{r.message}; {refusal}"), status=401, content_type="text/html"
        )
    return web.Response(text=pages.error_page(r.status, r.title, r.message), status=r.status, content_type="text/html")


@web.middleware
async def answers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``Refused`` as JSON under /api, as a page elsewhere; security headers on every answer.

    The router's own 404 and 405 are raised as ``HTTPException``: answered the same way, with the headers
    (a redirect keeps its own answer, with the headers added)."""
    try:
        response = await handler(request)
    except Refused as r:
        response = _answer_refused(request, r)
    except web.HTTPException as exc:
        if exc.status < 400:
            for key, value in SECURITY_HEADERS.items():
                exc.headers.setdefault(key, value)
            raise
        message = f"{request.method} {text.visible(request.path)[:300]}: {exc.reason.lower()}"
        response = _answer_refused(request, Refused(exc.status, exc.reason, message))
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
    for key, value in SECURITY_HEADERS.items():
        response.headers.setdefault(key, value)
    return response


# --- JSON --------------------------------------------------------------------------------------------------------


async def _listed(request: web.Request, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
    """The list's entries (``listing``): the runs the caller may list there, and the deleted ones the store kept
    (asked only once the API server listed that scope for the caller); a note when the store could not say."""
    token = token_of(request)
    try:
        runs = await request.app[KUBE].list_runs(token, namespace)
    except KubeError as e:
        raise _refused(e, "the list") from None
    try:
        recorded = await request.app[STORE].recorded_runs(namespace)
    except Exception as e:  # the living runs are still worth showing; the log has the store's address
        log.warning("listing deleted runs from the store failed: %r", e)
        return listing.entries(runs), "Deleted runs are not listed: the store could not be read (try again later)."
    return listing.entries(runs, recorded), ""


def _choice(request: web.Request, items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, int, int]:
    """The query's filters (``phase``, ``q``, ``within``) and page (``page``) applied: entries, page, pages, total."""
    after = listing.since(request.query.get("within"), datetime.now(UTC))
    phase, search = request.query.get("phase") or None, request.query.get("q") or None
    kept = listing.chosen(items, phase=phase, search=search, after=after)
    shown, at, pages = listing.paged(kept, listing.page_number(request.query.get("page")))
    return shown, at, pages, len(kept)


async def api_list(request: web.Request) -> web.Response:
    """``GET /api/v1/.../agentruns``: the runs the caller may list and the deleted ones, newest first, as JSON.

    ``?q=`` searches names, graphs and thread ids, ``?phase=`` (``Deleted`` too) and ``?within=`` (1h, 24h, 7d,
    30d) filter, ``?page=`` pages."""
    namespace = request.match_info.get("namespace")
    if namespace is not None:
        valid_namespace(namespace)
    items, note = await _listed(request, namespace)
    shown, at, count, total = _choice(request, items)
    return web.json_response(
        {"items": shown, "page": at, "pages": count, "total": total, **({"note": note} if note else {})}
    )


async def api_history(request: web.Request) -> web.Response:
    """``GET /api/v1/.../agentruns/<name>/history``: one run's history as JSON (a deleted run's too)."""
    run, deleted = await readable_run(request)
    found = await run_history(request, run)
    found.deleted = deleted
    talk = await run_conversation(request, run)
    body = found.model_dump(mode="json") | {"conversation": talk.model_dump(mode="json") if talk else None}
    return web.json_response(body)


async def api_step(request: web.Request) -> web.Response:
    """``GET /api/v1/.../agentruns/<name>/steps/<version>``: one checkpoint's state, changes and messages."""
    return web.json_response(text=(await run_step(request)).model_dump_json())


async def step_page(request: web.Request) -> web.Response:
    """``GET /runs/<namespace>/<name>/steps/<version>``: one checkpoint's detail; ``?fragment=1`` alone (the
    run page opens a step with it), else as a page of its own."""
    detail = await run_step(request)
    fragment = pages.step_detail(detail)
    if request.query.get("fragment"):
        return web.Response(text=pages.flagged(fragment), content_type="text/html")
    namespace, name = run_names(request)
    back = f'<p><a href="{pages.a(pages.run_url(namespace, name))}">← {pages.e(name)}</a></p>'
    return web.Response(
        text=pages.page(f"{namespace}/{name} v{detail.version}", back + pages.flagged(fragment)),
        content_type="text/html",
    )


# --- actions (as the caller) --------------------------------------------------------------------------------------


def _same_origin(request: web.Request, what: str) -> None:
    """``Refused`` (403) when the browser says the request comes from a page of another origin."""
    origin = request.headers.get("Origin")
    if origin and origin not in (f"http://{request.host}", f"https://{request.host}"):
        raise Refused(403, "Forbidden", f"cross-origin {what} refused (Origin {text.visible(origin)[:300]})")


def _check_origin(request: web.Request) -> None:
    if request.headers.get(ACTION_HEADER) != "1":
        raise Refused(403, "Forbidden", f"actions need the {ACTION_HEADER} header (sent by the page's buttons)")
    _same_origin(request, "action")


async def act(request: web.Request) -> web.Response:
    """``POST .../stop|approve|reject|retry``: the caller's own patch of the AgentRun (409 when it cannot apply)."""
    _check_origin(request)
    namespace, name = run_names(request)
    verb = request.match_info["verb"]
    token_of(request)  # 401 before anything about the body
    body = {} if verb == "stop" else await _body(request)
    seen = _seen(body) if verb in ("approve", "reject") else None
    seen_retry = _seen_retry(body) if verb == "retry" else None
    token, run = await authorized_run(request)
    try:
        if verb == "stop":
            return await _stop(request, token, run)
        if seen_retry is not None:
            return await _retry(request, token, run, seen_retry)
        assert seen is not None
        value = body.get("value", verb == "approve")  # "value": null is an answer too (JSON's null)
        return await _answer(request, token, run, verb, seen, value)
    except KubeError as e:
        raise _refused(e, f'agentrun "{name}" in namespace "{namespace}"') from None


async def _stop(request: web.Request, token: str, run: dict[str, Any]) -> web.Response:
    meta, phase = run["metadata"], (run.get("status") or {}).get("phase") or "Pending"
    if phase in pages.TERMINAL:
        raise Refused(409, "Conflict", f"agentrun {meta['name']} already ended ({phase}); there is nothing to stop")
    # Sent even when spec.stop is already true (a no-op patch): the API server decides whether this caller may
    # stop the run; a "stop requested" without its answer would tell a viewer they had stopped it.
    await request.app[KUBE].merge_patch(token, meta["namespace"], meta["name"], {"spec": {"stop": True}})
    return web.json_response({"message": f"stop requested for {meta['name']}"})


ANSWER_ATTEMPTS = 3
ANSWER_SHAPE = (
    'send JSON {"interrupt": ID, "digest": SHA256, "value": ANY JSON VALUE} ("value" optional: approve sends true, '
    "reject false) with the id and digest the run's page shows (a 409 answer carries the current ones)"
)


async def _body(request: web.Request) -> dict[str, Any]:
    """The action's JSON object (``{}`` without a body); ``Refused`` (400) naming the fault when it is not one."""
    raw = await request.text() if request.can_read_body else ""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        where = f" ({e.msg} at character {e.pos})" if isinstance(e, json.JSONDecodeError) else ""
        raise Refused(400, "Bad request", f"the request body is not JSON{where}: {ANSWER_SHAPE}") from None
    except RecursionError:  # nested deeper than the parser goes: no answer a graph could use
        raise Refused(400, "Bad request", f"the request body is nested too deeply to read: {ANSWER_SHAPE}") from None
    if not isinstance(body, dict):
        raise Refused(400, "Bad request", f"the request body is JSON but not an object: {ANSWER_SHAPE}")
    return body


def _seen(body: dict[str, Any]) -> tuple[str, str]:
    """The interrupt id and digest the person answers (the page's buttons send them: ``interrupt``, ``digest``)."""
    seen = (body.get("interrupt"), body.get("digest"))
    if not all(isinstance(x, str) and x for x in seen):
        raise Refused(400, "Bad request", f"an answer says which question it answers: {ANSWER_SHAPE}")
    return str(seen[0]), str(seen[1])


def _seen_retry(body: dict[str, Any]) -> int:
    """The ``spec.retry`` the person saw on the run's page (JSON ``retry``): a retry re-opens only that failure."""
    seen = body.get("retry")
    if not isinstance(seen, int) or isinstance(seen, bool) or seen < 0:
        raise Refused(
            400,
            "Bad request",
            'a retry says which failure it retries: send JSON {"retry": N}, the spec.retry the run\'s page shows '
            "(0 when unset; a 409 answer carries the current one)",
        )
    return seen


def _retry_state(run: dict[str, Any]) -> dict[str, Any]:
    """The run as a retry sees it, for a 409 answer: phase, reason, ``spec.retry`` and ``status.observedRetry``."""
    status = run.get("status") or {}
    return {
        "phase": status.get("phase") or "Pending",
        "reason": status.get("reason"),
        "retry": jobparity.retry_of(run.get("spec")),
        "observedRetry": AgentRunStatus.parse(status).observed_retry,
    }


def _retry_conflict(run: dict[str, Any], seen: int) -> Refused | None:
    """Why a retry of the failure seen (``spec.retry`` ``seen``) cannot apply to ``run`` as it is now."""
    name, spec, current = run["metadata"]["name"], run.get("spec") or {}, _retry_state(run)
    refusal = jobparity.retry_refusal(name, spec, AgentRunStatus.parse(run.get("status")))
    if refusal is not None:
        return Refused(409, "Conflict", refusal, current)
    if current["retry"] != seen:
        return Refused(
            409,
            "Conflict",
            f"agentrun {name} was retried since you saw it (spec.retry {current['retry']}, you saw {seen}; "
            f"phase {current['phase']}): nothing was changed. Load its page again.",
            current,
        )
    if current["retry"] > current["observedRetry"]:
        return Refused(409, "Conflict", f"a retry of agentrun {name} is already requested", current)
    return None


async def _retry(request: web.Request, token: str, run: dict[str, Any], seen: int) -> web.Response:
    """Re-open the Failed run the person saw (``spec.retry`` one higher), only while it is still that failure."""

    def next_retry(run: dict[str, Any]) -> int:
        return jobparity.next_retry(run.get("spec"), AgentRunStatus.parse(run.get("status")))

    run = await _patch_as_seen(
        request.app[KUBE],
        token,
        run,
        conflict=lambda run: _retry_conflict(run, seen),
        change=lambda run: [{"op": "add", "path": "/spec/retry", "value": next_retry(run)}],
        state=_retry_state,
    )
    retry = next_retry(run)
    return web.json_response(
        {
            "message": f"retry {retry} requested for {run['metadata']['name']}: it resumes its turn from the last "
            "checkpoint, completed tool calls replay from the ledger",
            "retry": retry,
        }
    )


async def _patch_as_seen(
    kube: UserKube,
    token: str,
    run: dict[str, Any],
    *,
    conflict: Callable[[dict[str, Any]], Refused | None],
    change: Callable[[dict[str, Any]], list[dict[str, Any]]],
    state: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Patch ``run`` with ``change(run)`` as the person's own request, only while ``conflict(run)`` finds nothing
    against it; the run as it was when patched. The test op makes the API server apply the change only to the
    object just checked: a run that moved on meanwhile fails it (422) and is read and checked again."""
    meta = run["metadata"]
    for _ in range(ANSWER_ATTEMPTS):
        refused = conflict(run)
        if refused is not None:
            raise refused
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": run["metadata"]["resourceVersion"]},
            *change(run),
        ]
        try:
            await kube.json_patch(token, meta["namespace"], meta["name"], ops)
        except KubeError as e:
            if e.status != 422:
                raise
            before = run["metadata"]["resourceVersion"]
            run = await kube.get_run(token, meta["namespace"], meta["name"])
            if run["metadata"].get("resourceVersion") == before:  # not the test op: the API server's own refusal
                raise
            continue
        return run
    raise Refused(409, "Conflict", f"agentrun {meta['name']} kept changing; load its page again", state(run))


def _question(run: dict[str, Any]) -> dict[str, Any]:
    """What the run waits for now, for a 409 answer: its phase, and its interrupt with the digest to answer it."""
    status = run.get("status") or {}
    interrupt = status.get("interrupt") or {}
    current: dict[str, Any] = {"phase": status.get("phase") or "Pending"}
    if current["phase"] == "Interrupted" and pages.pending_ids(interrupt):
        current["interrupt"] = {
            "ids": pages.pending_ids(interrupt),
            "message": interrupt.get("message"),
            "payload": interrupt.get("payload"),
            "digest": pages.interrupt_digest(interrupt),
        }
    return current


def _conflict(run: dict[str, Any], seen: tuple[str, str]) -> Refused | None:
    """Why an answer to ``seen`` cannot apply to ``run`` as it is now (``None``: it can)."""
    name, current = run["metadata"]["name"], _question(run)
    if current["phase"] != "Interrupted":
        return Refused(
            409, "Conflict", f"agentrun {name} is not waiting for an answer (phase {current['phase']})", current
        )
    waiting = current.get("interrupt")
    if waiting is not None and seen[0] in waiting["ids"] and seen[1] == waiting["digest"]:
        return None
    if waiting is None:
        now = "no interrupt it names"
    else:
        now = f"interrupt {', '.join(waiting['ids'])}: {text.visible(str(waiting['message'] or ''))[:500]!r}"
    return Refused(
        409,
        "Conflict",
        f"agentrun {name} no longer waits on the question you answered (interrupt {text.visible(seen[0])[:100]}); "
        f"it now waits on {now}. Read it, then answer that one.",
        current,
    )


def _unfit(run: dict[str, Any], value: Any) -> Refused | None:
    """A 400 when the question is a tool call review (``hitl``) and ``value`` is no answer it allows: the
    middleware would raise inside the graph and fail the run."""
    pending = hitl.actions(((run.get("status") or {}).get("interrupt") or {}).get("payload"))
    if pending is None:
        return None
    why = hitl.problem(pending, value)
    if why is None:
        return None
    return Refused(400, "Bad request", f"{why} (allowed: {hitl.allowed_words(pending)}); nothing was answered")


async def _answer(
    request: web.Request, token: str, run: dict[str, Any], verb: str, seen: tuple[str, str], value: Any
) -> web.Response:
    """Answer the interrupt ``seen`` names with ``value``, only while the run still waits on that exact question."""

    def values(run: dict[str, Any]) -> dict[str, Any]:
        return {i: value for i in pages.pending_ids((run.get("status") or {}).get("interrupt") or {})}

    # "add" replaces an earlier spec.resume whole, so no answer of an earlier interrupt stays beside this one.
    run = await _patch_as_seen(
        request.app[KUBE],
        token,
        run,
        conflict=lambda run: _conflict(run, seen) or _unfit(run, value),
        change=lambda run: [{"op": "add", "path": "/spec/resume", "value": {"values": values(run)}}],
        state=_question,
    )
    answered = values(run)
    sent = json.dumps(value, ensure_ascii=False)
    return web.json_response(
        {
            "message": f"{verb}d interrupt {', '.join(answered)} with {text.visible(sent)[:300]}: "
            f"{run['metadata']['name']} resumes in a new pod",
            "values": answered,
        }
    )


# --- the web view --------------------------------------------------------------------------------------------------


async def runs_page(request: web.Request) -> web.Response:
    """``GET /runs``: the list page (``?namespace=``, ``?q=``, ``?phase=``, ``?within=``, ``?page=``)."""
    namespace = request.query.get("namespace") or None
    if namespace is not None:
        valid_namespace(namespace)
    phase, search = request.query.get("phase") or None, request.query.get("q") or None
    try:
        items, note = await _listed(request, namespace)
    except Refused as r:
        if r.status != 403:
            raise
        items = []
        where = f'namespace "{namespace}"' if namespace else "all namespaces"
        note = f"You may not list AgentRuns in {where} ({r.message}). Choose a namespace you may read."
    shown, at, count, total = _choice(request, items)
    html = pages.run_list(
        shown,
        namespace=namespace,
        phase=phase,
        search=search,
        within=request.query.get("within") or None,
        page_at=(at, count, total),
        note=note,
        now=datetime.now(UTC),
    )
    return web.Response(text=html, content_type="text/html")


async def run_page(request: web.Request) -> web.Response:
    """``GET /runs/<namespace>/<name>``: one run's page."""
    run, deleted = await readable_run(request)
    found = await run_history(request, run)
    found.deleted = deleted
    live = not deleted and not pages.ended(run)
    talk = await run_conversation(request, run)
    return web.Response(text=pages.run_page(found, run, live=live, talk=talk), content_type="text/html")


async def timeline(request: web.Request) -> web.Response:
    """``GET /runs/<namespace>/<name>/timeline``: the run's page body alone (what a live view swaps in)."""
    run, deleted = await readable_run(request)
    found = await run_history(request, run)
    found.deleted = deleted
    talk = await run_conversation(request, run)
    return web.Response(text=pages.timeline(found, run, talk=talk), content_type="text/html")


async def events(request: web.Request) -> web.StreamResponse:
    """``GET .../events``: server-sent events, one each time the run's store or object changed."""
    token, run = await authorized_run(request)
    meta, spec = run["metadata"], run.get("spec") or {}
    thread = thread_key(meta["namespace"], str(spec.get("threadId") or meta["name"]))
    hub, kube = request.app[HUB], request.app[KUBE]
    # The headers go out with prepare(): the middleware's come too late for a stream.
    response = web.StreamResponse(headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream"})
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
            if pages.ended(run):  # a Failed run with a retry requested is about to run again
                await response.write(f"event: end\ndata: {json.dumps({'phase': status.get('phase')})}\n\n".encode())
                break
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        hub.unsubscribe(thread, woken)
    return response


async def list_events(request: web.Request) -> web.StreamResponse:
    """``GET /runs/events?namespace=``: server-sent ``update`` each time the list the caller may see changed.

    The list is read with the caller's token every ``POLL_SECONDS`` and compared by each run's name and
    resourceVersion (a list's own resourceVersion moves with any write in the cluster); a run deleted leaves
    it, so the page shows it again as deleted. A caller who may no longer list gets ``end``."""
    namespace = request.query.get("namespace") or None
    if namespace is not None:
        valid_namespace(namespace)
    token, kube = token_of(request), request.app[KUBE]
    try:
        seen = _list_mark(await kube.list_runs(token, namespace))
    except KubeError as e:
        raise _refused(e, "the list") from None
    response = web.StreamResponse(headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream"})
    try:
        await response.prepare(request)
    except ConnectionResetError:
        return response
    quiet = 0.0
    try:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            try:
                now = _list_mark(await kube.list_runs(token, namespace))
            except KubeError as e:
                await response.write(f"event: end\ndata: {json.dumps({'status': e.status})}\n\n".encode())
                break
            if now != seen:
                seen, quiet = now, 0.0
                await response.write(b"event: update\ndata: {}\n\n")
            else:
                quiet += POLL_SECONDS
                if quiet >= HEARTBEAT_SECONDS:
                    quiet = 0.0
                    await response.write(b": still here\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


def _list_mark(runs: list[dict[str, Any]]) -> frozenset[tuple[str, str, str]]:
    """What makes a list differ: each run's namespace, name and resourceVersion."""
    metas = (r["metadata"] for r in runs)
    return frozenset((str(m.get("namespace")), str(m.get("name")), str(m.get("resourceVersion"))) for m in metas)


def _loopback(remote: str | None) -> bool:
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def login_refusal(request: web.Request) -> str | None:
    """Why a token may not be signed in from here (``None``: it may).

    A pasted token is a bearer credential: over plain HTTP anyone on the path can read it (and the cookie
    after it). Allowed when TLS protects the way in (the server's own, or ``--tls-in-front``: the chart's
    ingress with TLS), from loopback (``kubectl port-forward`` arrives there), or when the operator of the
    install said so (``--allow-plain-http-login``)."""
    if request.app[SECURE_COOKIE] or request.app[PLAIN_HTTP_LOGIN] or _loopback(request.remote):
        return None
    return (
        f"token sign-in over plain HTTP from {request.remote} is refused: the token would cross the network "
        "in clear. Put TLS in front (chart values history.tls, or history.ingress with tlsSecretName, or "
        "history.tlsInFront when your own proxy terminates TLS), or use kubectl agentrun ui; "
        "history.tokenLogin.allowPlainHttp allows it anyway"
    )


async def login_form(request: web.Request) -> web.Response:
    """``GET /login``: the token sign-in form (404 unless token login is on; 403 where a token would go in clear)."""
    if not request.app[TOKEN_LOGIN]:
        raise Refused(404, "Not found", "token login is off (--token-login / history.tokenLogin.enabled)")
    refusal = login_refusal(request)
    if refusal is not None:
        raise Refused(403, "Forbidden", refusal)
    return web.Response(text=pages.login_page(), content_type="text/html")


async def login(request: web.Request) -> web.Response:
    """``POST /login``: check the token with the API server, set the sign-in cookie (404 without token login)."""
    if not request.app[TOKEN_LOGIN]:
        raise Refused(404, "Not found", "token login is off")
    _same_origin(request, "sign-in")
    refusal = login_refusal(request)
    if refusal is not None:
        raise Refused(403, "Forbidden", refusal)
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
    """``POST /logout``: drop the sign-in cookie (not for a page of another origin: that would sign you out)."""
    _same_origin(request, "sign-out")
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
    *,
    kube: UserKube,
    store: HistoryStore,
    hub: ProgressHub,
    token_login: bool = False,
    secure_cookie: bool = False,
    plain_http_login: bool = False,
) -> web.Application:
    """The history server's application: its routes over ``kube`` (as the caller), ``store`` and ``hub``.

    ``secure_cookie``: TLS protects the way in (served here, or terminated in front): the sign-in cookie is
    ``Secure``. ``plain_http_login``: a token may be signed in over plain HTTP from anywhere, not only loopback."""
    app = web.Application(middlewares=[answers], client_max_size=64 * 1024)
    app[KUBE], app[STORE], app[HUB] = kube, store, hub
    app[TOKEN_LOGIN], app[SECURE_COOKIE], app[PLAIN_HTTP_LOGIN] = token_login, secure_cookie, plain_http_login
    run = "/{namespace}/{name}"
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/", root),
            web.get("/login", login_form),
            web.post("/login", login),
            web.post("/logout", logout),
            web.get("/runs", runs_page),
            web.get("/runs/events", list_events),
            web.get("/runs" + run, run_page),
            web.get("/runs" + run + "/timeline", timeline),
            web.get("/runs" + run + "/events", events),
            web.get("/runs" + run + "/steps/{version}", step_page),
            web.post("/runs" + run + "/{verb:approve|reject|retry|stop}", act),
            web.get("/api/v1/agentruns", api_list),
            web.get("/api/v1/namespaces/{namespace}/agentruns", api_list),
            web.get("/api/v1/namespaces/{namespace}/agentruns/{name}/history", api_history),
            web.get("/api/v1/namespaces/{namespace}/agentruns/{name}/steps/{version}", api_step),
            web.post("/api/v1/namespaces/{namespace}/agentruns/{name}/{verb:approve|reject|retry|stop}", act),
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
