"""A process out of descriptors, as its listeners meet it: one line, and a count.

When ``accept()`` fails for want of descriptors (EMFILE, ENFILE) or kernel memory,
asyncio stops accepting on that socket for a second, tries again, and hands each
failure to the loop's exception handler, whose default logs a full traceback: one per
listening socket per second for as long as it lasts, which fills the log while the
process can do nothing about it. Accepting resumes by itself once descriptors free
up. So the handler installed here counts those failures and writes one line per
episode (failures less than ``quiet`` seconds apart are the same episode); every
other exception goes to the handler that was there before.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from harmonaize.metrics import Family, counter

log = logging.getLogger("harmonaize.exhaustion")

#: The errors asyncio's accept loop treats as "out of a resource, try again later".
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Seconds without a failure that end an episode (asyncio retries every second).
QUIET = 30.0

Handler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


class AcceptExhaustion:
    """The loop's exception handler for accept failures from exhaustion."""

    def __init__(self, quiet: float = QUIET, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.quiet = quiet
        self.clock = clock
        #: Accepts that failed for want of descriptors or memory, and their episodes.
        self.failures = 0
        self.episodes = 0
        self._last: float | None = None
        self._previous: Handler | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self.handle)

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in EXHAUSTED \
                and "accept" in str(context.get("message", "")):
            self.noted(exc, context.get("socket"))
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def noted(self, exc: OSError, sock: Any = None) -> bool:
        """Count one failure; True where it began an episode (and was logged)."""
        now = self.clock()
        self.failures += 1
        began = self._last is None or now - self._last > self.quiet
        self._last = now
        if began:
            self.episodes += 1
            log.warning("out of descriptors accepting connections%s (%s): new connections "
                        "wait until some close; said once until %g s pass without it",
                        _where(sock), os.strerror(exc.errno or 0), self.quiet)
        return began


def families(prefix: str, exhaustion: AcceptExhaustion) -> list[Family]:
    """The two counters every daemon with listeners exports."""
    return [
        counter(f"{prefix}_accept_exhausted_total",
                "Connections not accepted for want of descriptors (they wait in the "
                "backlog until some close).").add(exhaustion.failures),
        counter(f"{prefix}_accept_exhausted_episodes_total",
                "Episodes of running out of descriptors at accept (one log line "
                "each).").add(exhaustion.episodes),
    ]


def _where(sock: Any) -> str:
    try:
        name = sock.getsockname() if sock is not None else None
    except OSError:
        return ""
    if isinstance(name, tuple) and len(name) >= 2:
        return f" on {name[0]}:{name[1]}"
    return f" on {name}" if name else ""
