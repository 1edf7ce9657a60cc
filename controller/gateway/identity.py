"""Who a gateway request comes from: a bearer token, a verified client certificate, or
(for reading the feed) a browser session started from a token; and the request budget
every identified request spends before its body or query is read.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from aiohttp import web

from controller.gateway.sessions import Sessions
from controller.gateway.shell import Refused, Shell
from controller.gateway.tokens import TokenBook, token_id
from harmonaize.messages import ErrorCode

if TYPE_CHECKING:
    from controller.config import GatewaySection
    from controller.gateway.streaming import Stream

#: The browser session's cookie: a session's id, never a token.
COOKIE = "hz_session"


class TenantIdentity:
    """Identification and browser sessions of :class:`controller.gateway.http.Gateway`,
    which holds the state."""

    cfg: GatewaySection
    shell: Shell
    tokens: TokenBook
    sessions: Sessions
    streams: dict[bytes, Stream]

    if TYPE_CHECKING:  # in controller/gateway/http.py
        def _end(self, stream: Stream, why: str) -> None: ...

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
