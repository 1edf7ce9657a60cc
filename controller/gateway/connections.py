"""The gateway's connections: how many, from where, and how long before a request.

aiohttp bounds what it can see: the length of a request line and of headers, and an
idle keep-alive connection (``keepalive_timeout``, which in aiohttp also closes one
that waits with half a request). What it leaves open is a brand-new connection that
never completes its first request's headers, and how many connections one address,
or everyone, may hold: each holds a descriptor, and a process out of descriptors can
no longer accept agents, tenants or root's admin socket. So each connection's
protocol here is aiohttp's own request handler with three additions: admitted or
closed as it is accepted (caps over all and per address, counted), and closed when
its first request's headers are not in within ``header_timeout``. And a request
aiohttp cannot parse (it answers 400) is counted and said in one line a minute, where
aiohttp would log a traceback for each one a client cares to send.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

if TYPE_CHECKING:
    from controller.config import GatewaySection

log = logging.getLogger("harmonaize.controller.gateway")

#: Seconds between two log lines about malformed requests.
MALFORMED_LOG_INTERVAL = 60.0


@dataclass
class ConnectionStats:
    accepted: int = 0
    #: Closed as accepted: every cap's connections were taken, or the address's.
    refused_total: int = 0
    refused_address: int = 0
    #: Closed for not sending a first request's headers in time.
    header_timeouts: int = 0
    #: Requests that were not HTTP aiohttp could parse (each answered 400).
    malformed: int = 0
    #: TLS handshakes that failed or did not finish in time.
    tls_failed: int = 0


class ConnectionGuard:
    """Counts connections by address; admits or refuses each as it is accepted."""

    def __init__(self, cfg: GatewaySection) -> None:
        self.cfg = cfg
        self.open = 0
        self.by_address: dict[str, int] = {}
        self.stats = ConnectionStats()
        self._said_malformed = -MALFORMED_LOG_INTERVAL

    def malformed(self, address: str, exc: HttpProcessingError) -> None:
        """A request aiohttp could not parse (it answers 400): counted, and one line at
        most every MALFORMED_LOG_INTERVAL seconds, where aiohttp would log a traceback
        for each (a flood of them would fill the log)."""
        self.stats.malformed += 1
        now = time.monotonic()
        if now - self._said_malformed >= MALFORMED_LOG_INTERVAL:
            self._said_malformed = now
            reason = (exc.message or type(exc).__name__).strip().splitlines()[0][:200]
            log.warning("malformed HTTP from %s, answered %d: %s (%d malformed requests "
                        "since start; said at most once every %g s)", address, exc.code,
                        reason, self.stats.malformed, MALFORMED_LOG_INTERVAL)

    def admit(self, address: str) -> str | None:
        """Take a slot for ``address``; the refusal (one line) if there is none."""
        held = self.by_address.get(address, 0)
        if self.open >= self.cfg.max_connections:
            self.stats.refused_total += 1
            return f"too many connections ({self.cfg.max_connections} in all)"
        if held >= self.cfg.connections_per_address:
            self.stats.refused_address += 1
            return (f"too many connections from your address "
                    f"({self.cfg.connections_per_address})")
        self.open += 1
        self.by_address[address] = held + 1
        self.stats.accepted += 1
        return None

    def release(self, address: str) -> None:
        self.open -= 1
        left = self.by_address.get(address, 0) - 1
        if left > 0:
            self.by_address[address] = left
        else:
            self.by_address.pop(address, None)


def _refusal(message: str) -> bytes:
    """A 503 written straight to the socket (no handler runs for a refused connection)."""
    body = json.dumps({"error": {"code": "unavailable", "message": message}}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nRetry-After: 1\r\nContent-Length: " +
            str(len(body)).encode() + b"\r\n\r\n" + body)


class GuardedHandler(RequestHandler):
    """aiohttp's request handler, admitted by the guard as the connection is accepted
    (before any TLS handshake, so half-open handshakes count against the caps too) and
    given one deadline, from the accept, for the handshake and the first request's
    headers."""

    def __init__(self, guard: ConnectionGuard, header_timeout: float,
                 tls: ssl.SSLContext | None, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._header_timeout = header_timeout
        self._tls = tls
        self._address: str | None = None  # None: refused, or gone
        self._raw: asyncio.Transport | None = None
        self._served = False  # aiohttp's handler runs (after the TLS handshake, if any)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._handshake: asyncio.Task[None] | None = None
        #: What arrived between the handshake's end and aiohttp's handler starting.
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        refusal = self._guard.admit(address)
        if refusal is not None:
            if self._tls is None:  # over TLS, plain text would only confuse the client
                transport.write(_refusal(refusal))
            transport.close()
            return
        self._address, self._raw = address, transport
        loop = asyncio.get_running_loop()
        self._header_deadline = loop.call_later(self._header_timeout, self._headers_late)
        if self._tls is None:
            self._serve(transport)
        else:
            self._handshake = loop.create_task(self._start_tls(transport, self._tls))

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(raw, self, context, server_side=True,
                                       ssl_handshake_timeout=self._header_timeout)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
            self._guard.stats.tls_failed += 1
            raw.abort()
            self._gone()
            return
        if tls is None or tls.is_closing() or self._address is None:
            self._gone()  # closed during the handshake (asyncio returns no transport)
            return
        self._serve(tls)

    def _serve(self, transport: asyncio.Transport) -> None:
        self._served = True
        super().connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if not self._served:
            if self._address is not None:  # TLS delivers before start_tls returns
                self._early.append(data)
            return
        super().data_received(data)
        # aiohttp counts a request once its line and headers are parsed in full.
        if self._header_deadline is not None and self._request_count > 0:
            self._header_deadline.cancel()
            self._header_deadline = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._gone()
        if self._served:
            self._served = False
            super().connection_lost(exc)

    def _gone(self) -> None:
        """Release the connection's slot (once, however it ended)."""
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None
        if self._address is not None:
            self._guard.release(self._address)
            self._address = None

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):  # the client's fault: no traceback
            self._guard.malformed(self._address or "?", exc)
            return
        super().log_exception(*args, **kw)

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self._request_count > 0:
            return
        self._guard.stats.header_timeouts += 1
        if self._served:
            self.force_close()
        elif self._raw is not None:  # still in its TLS handshake
            self._raw.abort()
            self._gone()


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site, serving :class:`GuardedHandler` connections."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *,
                 guard: ConnectionGuard, header_timeout: float,
                 handler_args: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._guard = guard
        self._header_timeout = header_timeout
        self._handler_args = handler_args

    def _protocol(self) -> GuardedHandler:
        server = self._runner.server
        assert server is not None
        return GuardedHandler(self._guard, self._header_timeout, self._ssl_context, server,
                              loop=asyncio.get_running_loop(), **self._handler_args)

    async def start(self) -> None:
        # BaseSite.start registers the site with its runner; TCPSite.start would then
        # listen with the runner's plain handlers, so it is not called. TLS is started
        # by each connection once admitted (GuardedHandler), not by the listener.
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol, self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
