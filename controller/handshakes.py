"""Connections on the controller's two ports as ZeroMQ's monitor reports them.

A handshake that fails (no CurveZMQ, a wrong server key, a refused key, or a
peer that never completes it within the handshake timeout) never reaches our
code as a frame, so without this it would be neither counted nor logged. The
monitor also says how many connections are open per port, which is what an
attacker holding idle connections spends our descriptors on.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
          | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
#: A connection that has not completed its handshake after this long is dropped
#: (ZeroMQ's default is 30 s): what bounds connections that never say anything.
HANDSHAKE_TIMEOUT_MS = 5000
#: Failures logged: the first, then at most one summary per this many seconds.
LOG_EVERY = 10.0

_REASONS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "no_detail",
}
_WORDS = {
    "auth": "a key not on file",
    "protocol": "not CurveZMQ, or not our protocol",
    "no_detail": "a wrong server key, a timeout or a dropped connection",
}


@dataclass
class PortWatch:
    """Counts for one port, fed with the monitor's events (no I/O here)."""

    name: str
    accepted: int = 0
    succeeded: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    open_fds: set[int] = field(default_factory=set)
    _logged_at: float = float("-inf")
    _unlogged: int = 0

    def event(self, kind: int, value: int, now: float) -> str | None:
        """Account one event; returns a line to log, if one is due."""
        if kind == zmq.EVENT_ACCEPTED:
            self.accepted += 1
            self.open_fds.add(value)
        elif kind == zmq.EVENT_DISCONNECTED:
            self.open_fds.discard(value)
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.succeeded += 1
        elif kind in _REASONS:
            reason = _REASONS[kind]
            self.failed[reason] += 1
            self._unlogged += 1
            if now - self._logged_at >= LOG_EVERY:
                line = (f"handshake failed on the {self.name} port ({_WORDS[reason]}); "
                        f"{self._unlogged} since the last such line, "
                        f"{sum(self.failed.values())} in all")
                self._logged_at, self._unlogged = now, 0
                return line
        return None

    def view(self) -> dict[str, object]:
        return {"accepted": self.accepted, "succeeded": self.succeeded,
                "failed": dict(self.failed), "open": len(self.open_fds)}


async def watch(sock: zmq.asyncio.Socket, port: PortWatch) -> None:
    """Read ``sock``'s monitor until cancelled."""
    monitor = sock.get_monitor_socket(EVENTS)
    try:
        while True:
            frames = await monitor.recv_multipart()
            event = parse_monitor_message(frames)
            line = port.event(event["event"], event["value"], time.monotonic())
            if line is not None:
                log.warning("%s", line)
    finally:
        sock.disable_monitor()
        monitor.close()
