"""Who may connect: a ZAP handler over the key allow-lists.

ZeroMQ asks the handler (RFC 27, on ``inproc://zeromq.zap.01``) about every
CurveZMQ handshake. The agents' socket and the tenants' socket use their own
ZAP domains, so a tenant's key never opens the agents' socket or the
reverse. An accepted peer's identity (its key's file name) comes back as the
connection's User-Id, which the server reads off every frame: a host id for
agents, a tenant name for tenants. Refusals are counted by reason.

The allow-lists are directories of ``NAME.key`` files, re-read when they
change, so adding a host or a tenant needs no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils import z85

from harmonaize import keys

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
AGENTS = "agents"
TENANTS = "tenants"
#: Refusals logged per minute; all are counted.
LOG_BURST = 20
#: How long a key directory must have been still for its mtime to be trusted (ns).
SETTLED_NS = 1_000_000_000


@dataclass
class AllowList:
    """``NAME.key`` files in one directory, reloaded when the directory changes."""

    directory: Path
    keys: dict[bytes, str] = field(default_factory=dict)
    _stamp: tuple[int, int] | None = None

    def lookup(self, public: bytes) -> str | None:
        self._refresh()
        return self.keys.get(public)

    def names(self) -> list[str]:
        self._refresh()
        return sorted(self.keys.values())

    def _refresh(self) -> None:
        try:
            st = os.stat(self.directory)
            # Editors replace files in place: the directory's mtime moves either way.
            stamp = (st.st_mtime_ns, st.st_ino)
        except OSError:
            stamp = (0, 0)
        if stamp == self._stamp:
            return
        # A directory changed within the last second may change again within the same
        # tick of the file system's clock (a second key filed, a file renamed into place)
        # without its mtime moving: such a stamp is not trusted, and the next lookup reads
        # the directory again, until it has been still for a second.
        settled = time.time_ns() - stamp[0] >= SETTLED_NS
        self._stamp = stamp if settled else None
        allowed, problems = keys.allowed_keys(self.directory)
        if allowed == self.keys and not settled:
            return  # read again while unsettled, nothing new: nothing to say
        self.keys = allowed
        for problem in problems:
            log.warning("key allow-list: %s", problem)
        log.info("%s: %d keys allowed", self.directory, len(self.keys))


class ZapHandler:
    """Answers ZeroMQ's authentication requests from the allow-lists."""

    def __init__(self, ctx: zmq.asyncio.Context, lists: dict[str, AllowList]) -> None:
        self.lists = lists
        self.accepted: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self._logged = 0
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        # Must be bound before any CURVE socket binds: with no handler, libzmq lets everyone in.
        self._sock.bind(ZAP_ENDPOINT)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="zap")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sock.close()

    async def _serve(self) -> None:
        while True:
            request = await self._sock.recv_multipart()
            await self._sock.send_multipart(self.answer(request))

    def answer(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply to one request (RFC 27), or a refusal for anything odd."""
        if len(request) < 6:
            return [b"1.0", b"", b"400", b"malformed request", b"", b""]
        version, request_id, domain, address, _identity, mechanism = request[:6]
        credentials = request[6:]
        if version != b"1.0":
            return [b"1.0", request_id, b"400", b"unsupported ZAP version", b"", b""]
        peer = address.decode(errors="replace")
        allow = self.lists.get(domain.decode(errors="replace"))
        if allow is None:
            return self._refuse(request_id, "unknown domain", peer)
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            return self._refuse(request_id, "not curve", peer)
        public = z85.encode(credentials[0])
        name = allow.lookup(public)
        if name is None:
            return self._refuse(request_id, f"unknown {domain.decode()} key", peer)
        self.accepted[domain.decode()] += 1
        return [b"1.0", request_id, b"200", b"OK", name.encode(), b""]

    def _refuse(self, request_id: bytes, reason: str, peer: str) -> list[bytes]:
        self.refused[reason] += 1
        if self._logged < LOG_BURST:
            self._logged += 1
            log.warning("refused a connection from %s: %s", peer, reason)
        return [b"1.0", request_id, b"400", reason.encode(), b"", b""]

    def reset_log_budget(self) -> None:
        self._logged = 0


def curve_server(sock: zmq.Socket, pair: keys.KeyPair, domain: str) -> None:
    sock.curve_server = True
    sock.curve_secretkey = pair.secret
    sock.curve_publickey = pair.public
    sock.zap_domain = domain.encode()
    # With no ZAP handler libzmq would let every CURVE client in; ours is bound
    # first and lives as long as the sockets. Where libzmq has the (draft)
    # option, also make it refuse outright should the handler ever be missing.
    enforce = getattr(zmq, "ZAP_ENFORCE_DOMAIN", None)
    if enforce is not None:
        sock.setsockopt(enforce, 1)
