"""Tenant-side API for the controller's feed and requests.

    with FeedClient("tcp://controller:7401", topics=["pool/", "job/acme/"],
                    key="acme.key_secret", server_key="controller.key") as feed:
        for msg in feed:
            print(msg.topic, msg.body)

The client subscribes to topic prefixes and renews the subscription while you
keep reading (iterate, or call :meth:`FeedClient.recv`). Every message carries
a sequence number per topic; the client delivers each topic in order, once:

* a gap (a message lost on the way, a restarted controller) is filled from
  what the controller retains, before later messages on that topic are
  delivered -- or skipped after ``gap_timeout`` and counted in
  ``stats.gaps``;
* ``positions`` says where you are; pass it back as ``resume=`` (with
  ``epoch=`` set to ``epoch``) after a restart of your program and you get
  what you missed meanwhile, and nothing twice;
* if the controller's feed was begun anew (its epoch changed: a database
  restored or initialised), the client forgets its positions, counts it in
  ``stats.resets`` and receives what the controller retains from the start;
* conditions (level state such as pool capacity) are delivered when their
  content changes; repeats are skipped.

Malformed frames are counted in ``stats.rejected`` and skipped, never raised. The rules
of delivering each topic in order, once, are in :mod:`harmonaize.tenant.sequencer`; this
module keeps the connection: subscription and renewal, requests, failover between replicas.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import zmq
from zmq.utils.monitor import recv_monitor_message

from harmonaize import keys
from harmonaize.messages import (
    FEED_KINDS,
    MAX_FRAME,
    JobDeclaration,
    Message,
    NoticeAction,
    Position,
    Refusal,
    Reply,
    Subscribe,
    Subscribed,
    ValidationAnswer,
    WireError,
    decode,
    encode,
)
from harmonaize.tenant.negotiating import Negotiating, RequestError
from harmonaize.tenant.sequencer import FeedMessage, FeedStats, Sequencer

#: Renew this often until the controller says how long a subscription lasts.
DEFAULT_RENEW = 10.0
MAX_POSITIONS = 1024


class FeedError(RuntimeError):
    """The controller will not talk to this client as it is (its key was refused)."""


#: What the connection's monitor reports, and what each means for a tenant.
_WATCHED = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
REFUSED_KEY = ("the controller refused this key (is its public half, NAME.key, filed with "
               "your provider?)")


def _load_pair(key: keys.KeyPair | str | Path) -> keys.KeyPair:
    return key if isinstance(key, keys.KeyPair) else keys.load_pair(key)


def _load_public(key: bytes | str | Path) -> bytes:
    if isinstance(key, bytes):
        return key
    return keys.load_public(key)


class FeedClient(Negotiating):
    def __init__(
        self,
        endpoint: str | Sequence[str],
        topics: Iterable[str] = ("pool/",),
        *,
        key: keys.KeyPair | str | Path | None = None,
        server_key: bytes | str | Path | None = None,
        resume: Mapping[str, int] | None = None,
        epoch: int = 0,
        skip_repeated_conditions: bool = True,
        gap_timeout: float = 2.0,
        context: zmq.Context | None = None,
        failover: float = 3.0,
    ) -> None:
        """``endpoint`` may list a clustered controller's replicas: the client moves to
        the next when its replica has been unreachable, or has not answered a
        subscription, for ``failover`` seconds, and resumes there from its positions
        (every replica numbers the feed alike)."""
        self.endpoints = (endpoint,) if isinstance(endpoint, str) else tuple(endpoint)
        if not self.endpoints:
            raise ValueError("no endpoint to connect to")
        self._at = 0
        self.failover = failover
        self.failovers = 0
        self.topics = tuple(dict.fromkeys(topics))
        self.stats = FeedStats()
        #: Who the controller takes us to be, and what it refused (after the first answer).
        self.tenant: str | None = None
        self.refused: tuple[Refusal, ...] = ()
        self._order = Sequencer(self.stats, self._subscribe, resume=resume,
                                skip_repeated_conditions=skip_repeated_conditions,
                                gap_timeout=gap_timeout)
        #: The feed epoch the positions belong to (0 until the controller says).
        self.epoch = int(epoch) if resume else 0
        self._replies: dict[int, Reply] = {}
        self._request_seq = 0
        self._renew = DEFAULT_RENEW
        self._next_renew = 0.0
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._curve: tuple[keys.KeyPair, bytes] | None = None
        if key is not None or server_key is not None:
            if key is None or server_key is None:
                raise ValueError("CurveZMQ needs both key (yours) and server_key (the "
                                 "controller's)")
            self._curve = (_load_pair(key), _load_public(server_key))
        #: Why the connection does not work, in words (None: it works, or nothing known yet).
        self.problem: str | None = None
        self._handshakes = 0
        self._open()
        self._subscribe(time.monotonic())

    @property
    def endpoint(self) -> str:
        """The replica this client is connected to (or trying)."""
        return self.endpoints[self._at]

    def _open(self) -> None:
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME + 1024)
        if self._curve is not None:
            keys.curve_client(self._sock, *self._curve)
        self._monitor = self._sock.get_monitor_socket(_WATCHED)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._sock.connect(self.endpoint)
        now = time.monotonic()
        #: Since when the connection is down (None: up), and a subscription unanswered.
        self._down_since: float | None = now
        self._unanswered_since: float | None = None

    def _move_on(self, now: float) -> None:
        """With more than one replica: leave one that has been unreachable, or has not
        answered a subscription, for ``failover`` seconds; resume at the next."""
        if len(self.endpoints) < 2:
            return
        away = self._down_since is not None and now - self._down_since >= self.failover
        mute = (self._unanswered_since is not None
                and now - self._unanswered_since >= self.failover)
        if not (away or mute):
            return
        self._sock.disable_monitor()
        self._monitor.close()
        self._sock.close()
        self._at = (self._at + 1) % len(self.endpoints)
        self.failovers += 1
        self._open()
        self._subscribe(now)

    # --- what you call ------------------------------------------------------------------

    @property
    def positions(self) -> dict[str, int]:
        """Where this client is, per topic: pass it as ``resume=`` next time."""
        return self._order.positions

    @property
    def gap_timeout(self) -> float:
        """Seconds a gap may stay open without progress before it is skipped."""
        return self._order.gap_timeout

    @property
    def skip_repeated_conditions(self) -> bool:
        return self._order.skip_repeated_conditions

    def recv(self, timeout: float | None = None) -> FeedMessage | None:
        """The next message, or None if ``timeout`` seconds pass without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._order.ready:
            now = time.monotonic()
            self._move_on(now)
            self._housekeeping(now)
            if self._order.ready:
                break
            if deadline is not None and now >= deadline:
                return None
            wait = self._next_wake(now, deadline)
            self._wait(wait)
        return self._order.ready.popleft()

    def declare(self, declaration: JobDeclaration, timeout: float = 10.0) -> None:
        """Send a declaration for one of your jobs; raises :class:`RequestError` if refused."""
        self.request(declaration, timeout)

    def answer_notice(self, notice: str, action: NoticeAction | str, seconds: float = 0.0,
                      timeout: float = 10.0) -> None:
        """Approve a validation notice (start now) or defer it (by ``seconds``; 0: all your
        declaration allows); raises :class:`RequestError` if refused. The notice comes
        again on the job's topic showing the outcome."""
        self.request(ValidationAnswer(notice, NoticeAction(action), seconds), timeout)

    def request(self, body: Message, timeout: float = 10.0) -> Reply:
        """Send one request and wait for its answer; raises :class:`RequestError` if it is
        refused or not answered within ``timeout`` seconds."""
        self._request_seq += 1
        seq = self._request_seq
        frame = encode(body, sender="tenant", seq=seq)
        sent = self._send(frame)
        deadline = time.monotonic() + timeout
        while seq not in self._replies:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                why = f": {self.problem}" if self.problem else ""
                raise RequestError(f"no answer from {self.endpoint} within {timeout:g} s{why}")
            self._wait(min(remaining, 0.2))
            failovers = self.failovers
            self._move_on(time.monotonic())
            if not sent or self.failovers != failovers:
                # Not sent, or sent to a replica this client has left: send it (again)
                # to the one it is at now; the request's answer is the same for a retry.
                sent = self._send(frame)
        reply = self._replies.pop(seq)
        if not reply.ok:
            raise RequestError(reply.error, reply.code)
        return reply

    def __iter__(self) -> Iterator[FeedMessage]:
        while True:
            message = self.recv()
            if message is not None:
                yield message

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close()
        self._sock.close()
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> FeedClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- inside ---------------------------------------------------------------------------

    def _subscribe(self, now: float, since: Mapping[str, int] | None = None) -> None:
        positions = since if since is not None else self.positions
        items = sorted(positions.items(), key=lambda kv: -kv[1])[:MAX_POSITIONS]
        request = Subscribe(self.topics, tuple(Position(t, s) for t, s in items), self.epoch)
        # Numbered like any request (its answer names it); nothing waits on the number:
        # every answer is applied, a renewal comes again if one is dropped.
        self._request_seq += 1
        self._send(encode(request, sender="tenant", seq=self._request_seq))
        if self._unanswered_since is None:
            self._unanswered_since = now
        self._next_renew = now + self._renew / 3

    def _send(self, frame: bytes) -> bool:
        """Send without blocking: with no connection up (the controller away, or our
        handshake refused) ZeroMQ has nowhere to queue it, and a blocking send would
        hang the program past any timeout. Returns whether it went."""
        try:
            self._sock.send(frame, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def _wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a frame or a connection event; take what came."""
        ready = dict(self._poller.poll(int(seconds * 1000) + 1))
        if self._monitor in ready:
            self._connection_events()
        if self._sock in ready:
            self._pump()

    def _connection_events(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_CONNECTED):
                self._down_since = None
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED or (
                    kind == zmq.EVENT_CONNECTED and self._curve is None):
                self._handshakes += 1
                self.problem = None
                if self._handshakes > 1:
                    # A new connection is a new peer to the controller: subscribe again.
                    self._subscribe(time.monotonic())
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.problem = REFUSED_KEY
                raise FeedError(REFUSED_KEY)
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                self.problem = ("the handshake with the controller failed (a wrong server "
                                "key, or not a HarmonAIze feed?)")
            elif kind == zmq.EVENT_DISCONNECTED and self._down_since is None:
                self._down_since = time.monotonic()
            if kind == zmq.EVENT_DISCONNECTED and self.problem is None:
                self.problem = ("the controller closed the connection before any answer (a "
                                "wrong server key?)" if not self._handshakes else
                                "the connection to the controller dropped")

    def _next_wake(self, now: float, deadline: float | None) -> float:
        wakes = [self._next_renew - now]
        wakes += self._order.wakes(now)
        if deadline is not None:
            wakes.append(deadline - now)
        if len(self.endpoints) > 1:
            wakes += [since + self.failover - now for since in (
                self._down_since, self._unanswered_since) if since is not None]
        return max(0.0, min(wakes))

    def _housekeeping(self, now: float) -> None:
        if now >= self._next_renew:
            self._subscribe(now)
        self._order.housekeeping(now)

    def _pump(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self._accept(frames)

    def _accept(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self.stats.rejected += 1
            return
        try:
            topic = frames[0].decode()
            envelope = decode(frames[1], allowed=FEED_KINDS)
        except (UnicodeDecodeError, WireError):
            self.stats.rejected += 1
            return
        body = envelope.body
        if not topic:
            self._control(body)
            return
        self.stats.received += 1
        self._order.arrived(FeedMessage(topic, envelope.seq, envelope.time, body),
                            time.monotonic())

    def _control(self, body: Message) -> None:
        if isinstance(body, Subscribed):
            self.stats.subscriptions += 1
            self._unanswered_since = None
            self.tenant, self.refused = body.tenant, body.refused
            self._renew = body.renew
            self._next_renew = min(self._next_renew, time.monotonic() + body.renew / 3)
            if body.epoch and self.epoch and body.epoch != self.epoch:
                self._order.reset()
            if body.epoch:
                self.epoch = body.epoch
            self._order.learn(body.positions)
            self._order.lost_before(body.oldest, time.monotonic())
        elif isinstance(body, Reply):
            self._replies[body.request] = body
        else:
            self.stats.rejected += 1
