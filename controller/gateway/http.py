"""The HTTP gateway's aiohttp application, on the controller's own event loop.

It is a second door to the same core: a stream is a subscriber of the core's feed hub
for as long as its connection lasts (the same access control and redaction: the frames
it sends are the ones the ZeroMQ feed sends, as CloudEvents), and a request is handed
to the core as a tenant's message, answered after the Commit like any other. What the
gateway adds is transport: authentication by token, certificate or browser session,
cursors over the two streams a tenant may see, and reading the stored feed log from a
cursor (budgeted like any replay).

Streams are in controller/gateway/streaming.py, identifying a request's tenant in
controller/gateway/identity.py; what the parts share (the shell's
interface, refusals) in controller/gateway/shell.py.

Peers: the shell names ZeroMQ connections ``b"z" + routing id`` and the gateway's
``b"h" + a number``, so no client can pick a routing id that is another's peer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from controller import views
from controller.gateway import direct, events
from controller.gateway.bodies import MAX_BODY, BodyError, decode_json
from controller.gateway.connections import ConnectionGuard, GuardedSite
from controller.gateway.events import STATUS
from controller.gateway.identity import TenantIdentity
from controller.gateway.negotiations import NegotiationRoutes
from controller.gateway.sessions import Sessions
from controller.gateway.shell import PEER, GatewayStats, Refused, Shell
from controller.gateway.streaming import FeedStreams, Stream
from controller.outputs import BadFrame, Delivery, FanOut, SendToTenant, TenantPeer
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
from harmonaize.schema import SchemaError, from_plain, strict_keys

if TYPE_CHECKING:
    from controller.config import GatewaySection

log = logging.getLogger("harmonaize.controller.gateway")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+/=-]{1,128}")



class Gateway(TenantIdentity, FeedStreams, NegotiationRoutes):
    def __init__(self, cfg: GatewaySection, shell: Shell, *, hwm: int) -> None:
        self.cfg = cfg
        self.shell = shell
        self.hwm = hwm
        self.tokens = shell.tokens
        self.streams: dict[bytes, Stream] = {}
        self.open_per_tenant: dict[str, int] = {}
        self.written = events.EventCache()
        self.stats = GatewayStats()
        self._numbers = itertools.count(1)
        self._answers: dict[bytes, Reply | Subscribed | None] = {}
        self._runner: web.AppRunner | None = None
        #: The port it listens on, once started.
        self.port = 0
        self.connections = ConnectionGuard(cfg)
        self.sessions = Sessions(cfg.session_lifetime, cfg.sessions_per_tenant)
        self._spec: bytes | None = None
        self._ticker: asyncio.Task[None] | None = None

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
        app.router.add_post(f"{v}/notices/{{notice}}/windows", self._windows)
        app.router.add_get(f"{v}/negotiations", self._negotiations)
        app.router.add_post(f"{v}/negotiations/{{step}}", self._negotiate)
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
        if self._ticker is not None:
            self._ticker.cancel()
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
        if len(stream.pending) >= self.hwm:
            # Too far behind: the stream ends, the client resumes from its cursor.
            stream.ending = "behind"
            return Delivery.FULL
        stream.pending.append(send)
        self._wake_one(stream)
        return Delivery.SENT

    def deliver_all(self, out: FanOut, peers: list[bytes], *, full: list[bytes],
                    gone: list[bytes]) -> None:
        """A publication for ``peers``, our streams among its subscribers, in one loop:
        written at once to the streams whose writers wait with nothing queued, queued
        for the others (controller/gateway/direct.py); the streams it did not reach go
        to ``full``, ``gone``."""
        if out.offset <= 0:
            return  # sent again (republication): a stream has it already
        send = SendToTenant(b"", out.topic, out.frame, out.offset)  # all a writer reads
        queued: list[Stream] = []
        self.stats.events += direct.deliver_all(
            self.streams, peers, send, lambda: self.written.get(
                out.frame, out.topic, self.cfg.source, self.shell.core.feed.epoch), self.hwm,
            full=full, gone=gone, queued=queued)
        for stream in queued:
            self._wake_one(stream)

    def _wake(self) -> None:
        """Wake every waiting writer (for keep-alives); each looks at its own queue."""
        for stream in self.streams.values():
            self._wake_one(stream)

    @staticmethod
    def _wake_one(stream: Stream) -> None:
        waiter = stream.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

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

    def _end(self, stream: Stream, why: str) -> None:
        stream.ending = why
        self._wake_one(stream)

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
        return web.json_response({"notices": views.tenant_notices(self.shell.core, tenant),
                                  "request_id": request["request_id"]})

    async def _spec_json(self, request: web.Request) -> web.Response:
        if self._spec is None:
            self._spec = json.dumps(spec.document()).encode()
        return web.Response(body=self._spec, content_type="application/json")


def _reason(exc: Exception) -> str:
    """An exception's words in one short line (aiohttp's parse errors span several)."""
    text = exc.message if isinstance(exc, HttpProcessingError) else one_line(exc)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:120]
