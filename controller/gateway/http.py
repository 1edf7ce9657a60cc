"""The HTTP gateway's aiohttp application, on the controller's own event loop.

It is a second door to the same core: a stream is a subscriber of the core's feed hub
for as long as its connection lasts (the same access control and redaction: the frames
it sends are the ones the ZeroMQ feed sends, as CloudEvents), and a request is handed
to the core as a tenant's message, answered after the Commit like any other. What the
gateway adds is transport: authentication by token, certificate or browser session,
cursors over the two streams a tenant may see, and reading the stored feed log from a
cursor (budgeted like any replay).

Peers: the shell names ZeroMQ connections ``b"z" + routing id`` and the gateway's
``b"h" + a number``, so no client can pick a routing id that is another's peer.
"""

# Over 400 lines because the routes share one middleware, one way of identifying a tenant
# and one way of refusing; connections, bodies, sessions and cursors are modules of their
# own (connections.py, bodies.py, sessions.py, events.py).

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from controller.feed import stream_of, streams_of
from controller.gateway import events
from controller.gateway.bodies import MAX_BODY, BodyError, decode_json
from controller.gateway.connections import ConnectionGuard, GuardedSite
from controller.gateway.events import STATUS, Cursor, CursorError
from controller.gateway.sessions import Sessions
from controller.gateway.tokens import TokenBook, token_id
from controller.outputs import BadFrame, Delivery, Output, SendToTenant, TenantPeer
from harmonaize import spec
from harmonaize.config import split_address
from harmonaize.logs import one_line
from harmonaize.messages import (
    Envelope,
    ErrorCode,
    JobDeclaration,
    Message,
    Reply,
    Subscribed,
    ValidationAnswer,
)
from harmonaize.schema import SchemaError, from_plain, strict_keys, to_plain

if TYPE_CHECKING:
    from controller.config import GatewaySection
    from controller.core import ControllerCore
    from controller.store import Store

log = logging.getLogger("harmonaize.controller.gateway")

PEER = b"h"
COOKIE = "hz_session"
#: Stored messages read per query on a resume.
CHUNK = 500
#: The wire's Topic (harmonaize/messages/feed.py), as the query's topic= may carry it.
_TOPIC = re.compile(r"[A-Za-z0-9._:@+/-]{0,256}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+/=-]{1,128}")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


class Shell(Protocol):
    """What the gateway needs of the controller's shell."""

    core: ControllerCore
    store: Store
    anonymous: bool  # auth.mode = "none": no identity needed, pool topics only
    #: Where tokens are kept (the controller's database, or a cluster's bus).
    tokens: TokenBook

    def execute(self, outputs: list[Output]) -> None: ...

    async def ask(self, tenant: str, request: Envelope) -> Reply | None:
        """A request the core of another replica answers (a cluster's leader); None:
        this replica's own core answers it."""

    async def query(self, name: str, args: dict[str, Any]) -> Any:
        """A view of state this replica does not hold (a cluster's leader's); None: it
        holds it."""


class Refused(Exception):
    def __init__(self, code: ErrorCode, message: str, *, status: int | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra
        #: The HTTP status, where it is not the code's own (events.STATUS).
        self.status = status


@dataclass
class Stream:
    peer: bytes
    tenant: str
    prefixes: tuple[str, ...]
    queue: asyncio.Queue[SendToTenant]
    #: The token it was opened with (its id), if any: revoking the token ends it.
    token: str | None = None
    #: The browser session it was opened with, if any: ending the session ends it.
    session: str | None = None
    #: Why it is ending: "behind" (its queue overflowed: what is queued goes first),
    #: "revoked", "logged out" or "closing" (at once).
    ending: str | None = None


@dataclass
class GatewayStats:
    streams: int = 0
    events: int = 0
    requests: int = 0
    refused: int = 0
    overflowed: int = 0
    body_timeouts: int = 0
    by_code: dict[str, int] = field(default_factory=dict)


class Gateway:
    def __init__(self, cfg: GatewaySection, shell: Shell, *, hwm: int) -> None:
        self.cfg = cfg
        self.shell = shell
        self.hwm = hwm
        self.tokens = shell.tokens
        self.streams: dict[bytes, Stream] = {}
        self.stats = GatewayStats()
        self._numbers = itertools.count(1)
        self._answers: dict[bytes, Reply | Subscribed | None] = {}
        self._runner: web.AppRunner | None = None
        #: The port it listens on, once started.
        self.port = 0
        self.connections = ConnectionGuard(cfg)
        self.sessions = Sessions(cfg.session_lifetime, cfg.sessions_per_tenant)
        self._spec: bytes | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY,
                              middlewares=[self._middleware])
        app.on_response_prepare.append(self._cors)
        v = "/v1"
        app.router.add_get(f"{v}/feed", self._feed)
        app.router.add_post(f"{v}/declarations", self._declare)
        app.router.add_get(f"{v}/notices", self._notices)
        app.router.add_post(f"{v}/notices/{{notice}}", self._answer)
        app.router.add_post(f"{v}/session", self._session)
        app.router.add_delete(f"{v}/session", self._end_session)
        app.router.add_get(f"{v}/spec", self._spec_json)
        return app

    async def start(self, port: int | None = None) -> None:
        """Listen on ``gateway.listen``; ``port`` instead of its port (0: any free one,
        for the fuzzer), which :attr:`port` then says."""
        host, configured = split_address(self.cfg.listen)
        port = configured if port is None else port
        # aiohttp's own bounds on each connection: an idle kept-alive one closes, and a
        # request line or header over 8 KiB (or over 64 headers) is answered 400.
        handler_args: dict[str, Any] = {
            "access_log": None, "keepalive_timeout": self.cfg.idle_timeout,
            "max_line_size": 8190, "max_field_size": 8190, "max_headers": 64}
        self._runner = web.AppRunner(self.app(), handle_signals=False, **handler_args)
        await self._runner.setup()
        site = GuardedSite(self._runner, host, port, guard=self.connections,
                           header_timeout=self.cfg.header_timeout, handler_args=handler_args,
                           ssl_context=self._tls(), shutdown_timeout=1.0)
        try:
            await site.start()
            self.port = site.port
        except OSError as exc:
            await self._runner.cleanup()
            raise RuntimeError(f"gateway.listen = {self.cfg.listen!r}: cannot listen there: "
                               f"{exc.strerror}") from None
        log.info("HTTP gateway on %s://%s", "https" if self.cfg.tls_cert else "http",
                 self.cfg.listen)

    def _tls(self) -> ssl.SSLContext | None:
        if not self.cfg.tls_cert:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
            if self.cfg.client_ca:
                context.load_verify_locations(self.cfg.client_ca)
                context.verify_mode = ssl.CERT_OPTIONAL  # tokens stay possible
        except (OSError, ssl.SSLError) as exc:
            raise RuntimeError(f"gateway TLS files: {exc}") from None
        return context

    async def close(self) -> None:
        for stream in self.streams.values():
            self._end(stream, "closing")
        if self._runner is not None:
            await self._runner.cleanup()

    # --- what the shell hands over -----------------------------------------------------

    @staticmethod
    def ours(peer: bytes) -> bool:
        return peer.startswith(PEER)

    def deliver(self, send: SendToTenant) -> Delivery:
        """A publication for one of our streams: queued for its writer."""
        stream = self.streams.get(send.peer)
        if stream is None:
            return Delivery.GONE
        if send.offset <= 0:
            return Delivery.SENT  # sent again (republication): a stream has it already
        try:
            stream.queue.put_nowait(send)
        except asyncio.QueueFull:
            # Too far behind: the stream ends, the client resumes from its cursor.
            stream.ending = "behind"
            return Delivery.FULL
        return Delivery.SENT

    def answer(self, peer: bytes, message: Message) -> Delivery:
        if peer not in self._answers:
            return Delivery.GONE
        self._answers[peer] = message  # type: ignore[assignment]
        return Delivery.SENT

    def revoked(self, token: str) -> int:
        """A token was revoked: the streams opened with it end now. How many."""
        ended = [s for s in self.streams.values() if s.token == token]
        for stream in ended:
            self._end(stream, "revoked")
        return len(ended)

    @staticmethod
    def _end(stream: Stream, why: str) -> None:
        stream.ending = why
        with contextlib.suppress(asyncio.QueueFull):  # wake its writer (a full queue will)
            stream.queue.put_nowait(SendToTenant(stream.peer, "", b"", -1))

    def view(self) -> dict[str, Any]:
        return {"listen": self.cfg.listen, "streams": len(self.streams),
                "opened": self.stats.streams, "events": self.stats.events,
                "requests": self.stats.requests, "refused": self.stats.refused,
                "closed_behind": self.stats.overflowed, "refused_by_code": self.stats.by_code,
                "connections": self.connections.open,
                "connections_refused": {"all_taken": self.connections.stats.refused_total,
                                        "per_address": self.connections.stats.refused_address},
                "header_timeouts": self.connections.stats.header_timeouts,
                "malformed_http": self.connections.stats.malformed,
                "tls_failed": self.connections.stats.tls_failed,
                "body_timeouts": self.stats.body_timeouts}

    # --- cross-cutting -----------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                          ) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id", "")
        if not _REQUEST_ID.fullmatch(rid):
            rid = uuid.uuid4().hex
        request["request_id"] = rid
        try:
            if request.method == "OPTIONS":  # a browser's CORS preflight, for any path
                response = await self._preflight(request)
            else:
                response = await handler(request)
        except Refused as refused:
            response = self._refusal(refused, rid, status=refused.status)
            if refused.status == 408:
                response.force_close()  # what is left of the body is not waited for
        except web.HTTPRequestEntityTooLarge:
            response = self._refusal(Refused(ErrorCode.MALFORMED, f"a body larger than "
                                             f"{MAX_BODY} bytes"), rid, status=413)
        except web.HTTPNotFound:
            response = self._refusal(Refused(ErrorCode.NOT_FOUND, f"no {request.path}"), rid)
        except web.HTTPMethodNotAllowed:
            response = self._refusal(Refused(ErrorCode.NOT_FOUND,
                                             f"no {request.method} on {request.path}"), rid,
                                     status=405)
        if not response.prepared:
            response.headers["X-Request-Id"] = rid
        return response

    def _refusal(self, refused: Refused, rid: str, status: int | None = None) -> web.Response:
        self.stats.refused += 1
        self.stats.by_code[refused.code.value] = self.stats.by_code.get(refused.code.value,
                                                                        0) + 1
        response = web.json_response(events.error(refused.code, refused.message, rid,
                                                  **refused.extra),
                                     status=status or STATUS[refused.code])
        if refused.code is ErrorCode.THROTTLED:
            response.headers["Retry-After"] = "1"
        if refused.code is ErrorCode.NOT_AUTHENTICATED:
            response.headers["WWW-Authenticate"] = 'Bearer realm="harmonaize"'
        return response

    async def _cors(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin and origin in self.cfg.cors_origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.headers["Access-Control-Expose-Headers"] = "X-Request-Id"
            response.headers["Vary"] = "Origin"

    async def _preflight(self, request: web.Request) -> web.Response:
        if request.headers.get("Origin") not in self.cfg.cors_origins:
            raise Refused(ErrorCode.NOT_FOUND, "no such origin allowed (gateway.cors_origins)")
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": "GET, POST, DELETE",
            "Access-Control-Allow-Headers": "Authorization, Content-Type, Last-Event-ID, "
                                            "X-Request-Id",
            "Access-Control-Max-Age": "600"})

    def _identify(self, request: web.Request, *, session: bool = False) -> str:
        """The tenant a request comes from: a bearer token, a client certificate, or (for
        reading the feed) a browser session; "" where anonymous readers are allowed."""
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            tenant = self.tokens.tenant_of(token.strip(), time.time()) \
                if scheme.lower() == "bearer" else None
            if tenant is None:
                raise Refused(ErrorCode.NOT_AUTHENTICATED, "the token is not valid (unknown, "
                              "expired or revoked)")
            request["token"] = token_id(token.strip())
            return tenant
        tenant = _certificate_tenant(request)
        if tenant is not None:
            return tenant
        if session and COOKIE in request.cookies:
            sid = request.cookies[COOKIE]
            now = time.time()
            held = self.sessions.get(sid, now)
            tenant = self.tokens.tenant_of(held.token, now) if held is not None else None
            if held is None or tenant != held.tenant:
                if held is not None:
                    self.sessions.end(sid)  # its token was revoked or expired
                raise Refused(ErrorCode.NOT_AUTHENTICATED, "the session is not valid (it "
                              "ended or expired, or its token did): start a new one")
            request["token"] = token_id(held.token)
            request["session"] = sid
            return tenant
        if self.shell.anonymous:
            return ""
        raise Refused(ErrorCode.NOT_AUTHENTICATED, "no credentials: send Authorization: "
                      "Bearer <token>, or a client certificate")

    def _admitted(self, request: web.Request, *, session: bool = False) -> str:
        """The request's tenant, once the request spent its request budget: before its
        body or query is read, so an invalid request costs what a valid one does."""
        tenant = self._identify(request, session=session)
        if not self.shell.core.feed.admit(tenant, time.monotonic()):
            raise Refused(ErrorCode.THROTTLED, "over your request budget: retry in a second")
        return tenant

    # --- requests ----------------------------------------------------------------------

    async def _json(self, request: web.Request) -> Any:
        if request.content_type != "application/json":
            raise Refused(ErrorCode.MALFORMED, "the body must be application/json")
        try:
            async with asyncio.timeout(self.cfg.body_timeout):
                raw = await request.read()
        except TimeoutError:
            self.stats.body_timeouts += 1
            raise Refused(ErrorCode.MALFORMED, f"the body did not arrive within "
                          f"{self.cfg.body_timeout:g} s", status=408) from None
        except (ConnectionError, HttpProcessingError) as exc:
            # Cut short, or not in the encoding it claims: the client's doing, no bug.
            raise Refused(ErrorCode.MALFORMED, "the body did not arrive whole ("
                          f"{_reason(exc)})") from None
        try:
            return decode_json(raw)
        except BodyError as exc:
            raise Refused(ErrorCode.MALFORMED, str(exc)) from None

    async def _ask(self, request: web.Request, tenant: str,
                   body: Message | BadFrame) -> Reply:
        """Hand a request to the core as a tenant's message; its answer (after the
        Commit of what it changed). In a cluster, the leader's core answers it."""
        self.stats.requests += 1
        number = next(self._numbers)
        peer = PEER + f"r{number}".encode()
        message = body if isinstance(body, BadFrame) else Envelope(
            body.KIND, "gateway", number, time.time(), body)
        reply: Reply | Subscribed | None = None
        if isinstance(message, Envelope):
            reply = await self.shell.ask(tenant, message)
        if reply is None:
            self._answers[peer] = None
            try:
                self.shell.execute(self.shell.core.receive(TenantPeer(peer, tenant, True), message,
                                                           time.monotonic()))
                reply = self._answers[peer]
            finally:
                del self._answers[peer]
        if not isinstance(reply, Reply):
            raise Refused(ErrorCode.THROTTLED, "over your request budget: retry in a second")
        log.info("request %s from %r: %s", request["request_id"], tenant or "(anonymous)",
                 "ok" if reply.ok else f"refused ({reply.code})")
        if not reply.ok:
            raise Refused(ErrorCode(reply.code) if reply.code in ErrorCode._value2member_map_
                          else ErrorCode.INVALID, reply.error)
        return reply

    def _typed(self, cls: type[Message], data: Any) -> Message | BadFrame:
        try:
            with strict_keys():
                return from_plain(cls, data, cls.KIND)
        except SchemaError as exc:
            return BadFrame("invalid", str(exc), next(self._numbers))

    async def _declare(self, request: web.Request) -> web.Response:
        tenant = self._admitted(request)
        body = self._typed(JobDeclaration, await self._json(request))
        await self._ask(request, tenant, body)
        return web.json_response({"ok": True, "request_id": request["request_id"]})

    async def _answer(self, request: web.Request) -> web.Response:
        tenant = self._admitted(request)
        data = await self._json(request)
        if not isinstance(data, dict):
            raise Refused(ErrorCode.INVALID, "validation-answer: expected a JSON object")
        notice = request.match_info["notice"]
        if "notice" in data and data["notice"] != notice:  # never one silently over the other
            raise Refused(ErrorCode.INVALID, f"validation-answer.notice: {data['notice']!r:.80} "
                          f"differs from the path's notice {notice!r:.80}: leave it out")
        body = self._typed(ValidationAnswer, {**data, "notice": notice})
        await self._ask(request, tenant, body)
        return web.json_response({"ok": True, "request_id": request["request_id"],
                                  "notice": request.match_info["notice"]})

    async def _notices(self, request: web.Request) -> web.Response:
        tenant = self._admitted(request)
        if not tenant:
            raise Refused(ErrorCode.NOT_AUTHENTICATED, "notices are a tenant's own")
        remote = await self.shell.query("tenant-notices", {"tenant": tenant})
        if remote is not None:
            return web.json_response({"notices": remote, "request_id": request["request_id"]})
        return web.json_response({"notices": tenant_notices(self.shell.core, tenant),
                                  "request_id": request["request_id"]})

    async def _session(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        tenant = self.tokens.tenant_of(token.strip(), time.time()) \
            if scheme.lower() == "bearer" else None
        if tenant is None:
            raise Refused(ErrorCode.NOT_AUTHENTICATED, "a session starts from a valid token "
                          "(Authorization: Bearer <token>)")
        sid = self.sessions.start(tenant, token.strip(), time.time())
        if sid is None:
            raise Refused(ErrorCode.UNAVAILABLE, "too many sessions open: retry later")
        response = web.json_response({"ok": True, "tenant": tenant,
                                      "expires_in": self.cfg.session_lifetime,
                                      "request_id": request["request_id"]})
        # The cookie reads the feed only: requests that change anything need the token
        # itself (no CSRF), and the cookie is a session's id, never a token.
        response.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", path="/v1",
                            secure=bool(self.cfg.tls_cert),
                            max_age=int(self.cfg.session_lifetime))
        return response

    async def _end_session(self, request: web.Request) -> web.Response:
        """Forget the session (its streams end too) and clear the cookie."""
        sid = request.cookies.get(COOKIE)
        ended = self.sessions.end(sid) is not None if sid else False
        if ended:
            for stream in [s for s in self.streams.values() if s.session == sid]:
                self._end(stream, "logged out")
        response = web.json_response({"ok": True, "ended": ended,
                                      "request_id": request["request_id"]})
        response.del_cookie(COOKIE, path="/v1", secure=bool(self.cfg.tls_cert),
                            httponly=True, samesite="Strict")
        return response

    async def _spec_json(self, request: web.Request) -> web.Response:
        if self._spec is None:
            self._spec = json.dumps(spec.document()).encode()
        return web.Response(body=self._spec, content_type="application/json")

    # --- the feed ----------------------------------------------------------------------

    async def _feed(self, request: web.Request) -> web.StreamResponse:
        tenant = self._admitted(request, session=True)
        topics = tuple(dict.fromkeys(request.query.getall("topic", ["pool/"])))
        if not 1 <= len(topics) <= 64 or not all(_TOPIC.fullmatch(t) for t in topics):
            raise Refused(ErrorCode.INVALID, "topic: 1 to 64 topic prefixes of letters, "
                          "digits and ._:@+/-")
        given = request.headers.get("Last-Event-ID") or request.query.get("since")
        try:
            cursor = Cursor.parse(given) if given else None
        except CursorError as exc:
            raise Refused(ErrorCode.INVALID, f"Last-Event-ID: {exc}") from None
        feed = self.shell.core.feed
        present = Cursor(feed.epoch, *feed.heads(tenant))
        if cursor is not None and cursor.epoch == present.epoch and not feed.follower and (
                cursor.pool > present.pool or cursor.job > present.job):
            # Never given by this feed (a replica behind another waits to catch up).
            raise Refused(ErrorCode.INVALID, f"Last-Event-ID: {cursor} is beyond the "
                          f"present ({present}): resume from a cursor the feed gave, or "
                          "without one")
        mine = sum(1 for s in self.streams.values() if s.tenant == tenant)
        if len(self.streams) >= self.cfg.max_streams or mine >= self.cfg.streams_per_tenant:
            raise Refused(ErrorCode.TOO_MANY_SUBSCRIPTIONS, "too many streams open "
                          f"({self.cfg.streams_per_tenant} per tenant)")
        peer = PEER + f"s{next(self._numbers)}".encode()
        core = self.shell.core
        reply = core.attach(TenantPeer(peer, tenant, True), topics, time.monotonic())
        if reply is None:
            raise Refused(ErrorCode.THROTTLED, "over your request budget: retry in a second")
        if not reply.accepted:
            core.detach(peer)
            first = reply.refused[0]
            raise Refused(ErrorCode(first.code), first.reason,
                          refused=[to_plain(r) for r in reply.refused])
        stream = Stream(peer, tenant, reply.accepted, asyncio.Queue(self.hwm),
                        request.get("token"), request.get("session"))
        self.streams[peer] = stream
        self.stats.streams += 1
        response = web.StreamResponse(headers={**SSE_HEADERS,
                                               "X-Request-Id": request["request_id"]})
        try:
            await response.prepare(request)
            await self._write(response, events.event(
                # A random id: a count of the gateway's would tell a tenant how many
                # requests others made.
                "subscribed", to_plain(reply), self.cfg.source, event_id=uuid.uuid4().hex,
                time=time.time()), None)
            epoch = core.feed.epoch
            if cursor is not None and cursor.epoch == epoch:
                cursor = await self._resume(response, stream, cursor)
            elif cursor is not None:  # a cursor of another epoch: everything retained
                cursor = await self._resume(response, stream, Cursor(epoch))
            else:
                cursor = await self._present(response, stream)
            await self._live(response, stream, cursor)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            core.detach(peer)
            self.streams.pop(peer, None)
        return response

    async def _write(self, response: web.StreamResponse, event: bytes,
                     cursor: Cursor | None) -> None:
        await response.write(events.sse(event, cursor))
        self.stats.events += 1

    async def _send(self, response: web.StreamResponse, topic: str, frame: bytes,
                    cursor: Cursor) -> None:
        epoch = self.shell.core.feed.epoch
        await self._write(response, events.cloudevent(frame, topic, self.cfg.source, epoch),
                          cursor)

    async def _present(self, response: web.StreamResponse, stream: Stream) -> Cursor:
        """A fresh stream: the newest condition of every topic, then the streams' heads.
        Each condition's cursor stands before the ones still to come."""
        feed = self.shell.core.feed
        names = streams_of(stream.tenant)
        heads = {name: feed.offsets.get(name, 0) for name in names}
        items = feed.present(stream.tenant, stream.prefixes)
        start = []
        for name in names:
            offsets = [offset for topic, _, _, offset in items if stream_of(topic) == name]
            start.append(min(offsets) - 1 if offsets else heads[name])
        cursor = Cursor(feed.epoch, *start)
        for topic, _, frame, offset in items:
            cursor = cursor.moved(stream_of(topic), offset)
            await self._send(response, topic, frame, cursor)
        return Cursor(feed.epoch, *(heads[name] for name in names))

    async def _resume(self, response: web.StreamResponse, stream: Stream,
                      cursor: Cursor) -> Cursor:
        """What is retained after the cursor, stream by stream, within the replay budget;
        first, which topics lost messages to pruning since it."""
        store, core = self.shell.store, self.shell.core
        lost = [t for s in streams_of(stream.tenant) for t in store.lost_after(s, cursor.at(s))
                if t.startswith(stream.prefixes)]
        if lost:
            await self._write(response, events.event(
                "gap", {"topics": lost[:1024]}, self.cfg.source,
                event_id=f"{cursor}:gap", time=time.time()), cursor)
        for name in streams_of(stream.tenant):
            while True:
                allowed = core.replay_allowance(stream.tenant, CHUNK, time.monotonic())
                if allowed <= 0:
                    await asyncio.sleep(0.05)  # the budget refills; the client waits
                    continue
                rows = store.replay_stream(name, cursor.at(name), allowed)
                for topic, _, frame, offset in rows:
                    cursor = cursor.moved(name, offset)
                    if topic.startswith(stream.prefixes):
                        await self._send(response, topic, frame, cursor)
                if len(rows) < allowed:
                    break
        return cursor

    async def _live(self, response: web.StreamResponse, stream: Stream,
                    cursor: Cursor) -> None:
        while True:
            try:
                send = await asyncio.wait_for(stream.queue.get(), self.cfg.keepalive)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            if stream.ending in ("revoked", "closing", "logged out"):
                log.info("ended a stream of tenant %r: %s", stream.tenant, stream.ending)
                return
            if send.offset > 0:
                name = stream_of(send.topic)
                if send.offset > cursor.at(name):
                    cursor = cursor.moved(name, send.offset)
                    await self._send(response, send.topic, send.frame, cursor)
            if stream.ending == "behind" and stream.queue.empty():
                self.stats.overflowed += 1
                log.warning("closed a stream of tenant %r that fell %d messages behind; it "
                            "resumes from its cursor", stream.tenant, self.hwm)
                return


def _reason(exc: Exception) -> str:
    """An exception's words in one short line (aiohttp's parse errors span several)."""
    text = exc.message if isinstance(exc, HttpProcessingError) else one_line(exc)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:120]


def _certificate_tenant(request: web.Request) -> str | None:
    """The tenant a verified client certificate names (its subject's common name)."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}",
                                                    value):
                return value
    return None


def tenant_notices(core: ControllerCore, tenant: str) -> list[dict[str, Any]]:
    """A tenant's validation notices as ``GET /v1/notices`` lists them."""
    out = []
    for notice in core.notices.of_tenant(tenant):
        declared = core.declarations.get(notice.job)
        max_defer = declared[1].max_validation_defer if declared else 0.0
        out.append({"id": notice.id, "job": notice.job, "status": notice.status.value,
                    "not_before": notice.not_before, "pause_seconds": notice.pause,
                    "approved": notice.approved, "deferred_seconds": notice.deferred,
                    "defer_seconds": core.notices.defer_left(notice.id, max_defer)})
    return out
