"""Requests for the controller, written down before they are sent and sent in order.

A prolog or epilog must never fail or wait on the controller, and nothing it recorded
may be lost, so each request is first a file in ``queue/`` (numbered under a lock,
written, flushed to disk and renamed into place), then delivered oldest first by
whichever invocation holds the delivery lock, and removed once the controller has it.
What the controller refuses for good is moved to ``rejected/`` (kept for the operator,
named in the log); what could not be delivered now stays for the next invocation or
the timer's ``harmonaize-slurm replay``.

One deliverer at a time keeps the order: an invocation that finds the lock taken
leaves its request to the holder, which looks at the queue again after letting go
(the request was written before the holder let go, so it is seen).
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

#: A spooled request is read whole; nothing the hook writes comes near this.
MAX_REQUEST = 1024 * 1024


# Plain classes and strings, not dataclasses and enums: their imports cost a job start.
DELIVERED = "delivered"  # the controller has it (or had it already)
REJECTED = "rejected"    # the controller refuses it for good: kept aside
LATER = "later"          # the controller is down, hung or busy: try again later


class Sent:
    """What became of one request: an outcome above, and the reply or the reason."""

    def __init__(self, outcome: str, detail: str = "") -> None:
        self.outcome = outcome
        self.detail = detail


class Round:
    """One invocation's delivery."""

    def __init__(self) -> None:
        self.delivered = 0
        self.rejected = 0
        self.left = 0
        #: Why delivery stopped early (the controller's state), "" when the queue emptied.
        self.stopped = ""
        #: Another invocation held the delivery lock (it delivers what is queued).
        self.busy = False


class Spool:
    def __init__(self, root: str) -> None:
        self.root = root
        self.queue = os.path.join(root, "queue")
        self.rejected = os.path.join(root, "rejected")

    def put(self, request: dict[str, Any]) -> str:
        """Write ``request`` at the end of the queue, durably; its file."""
        os.makedirs(self.queue, mode=0o750, exist_ok=True)
        data = json.dumps({**request, "spooled": time.time()}, separators=(",", ":"))
        with _locked(os.path.join(self.root, ".seq")) as counter:
            raw = os.pread(counter, 32, 0).strip()
            seq = int(raw) + 1 if raw.isdigit() else 1
            temp = os.path.join(self.queue, f".{os.getpid()}.tmp")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
            try:
                os.write(fd, data.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                while True:  # link, unlike rename, never replaces a request already there
                    name = os.path.join(self.queue, f"{seq:016d}.json")
                    try:
                        os.link(temp, name)
                        break
                    except FileExistsError:
                        seq += 1
            finally:
                os.unlink(temp)
            os.ftruncate(counter, 0)
            os.pwrite(counter, str(seq).encode(), 0)
        return name

    def pending(self, limit: int | None = None) -> list[str]:
        """Queued requests, oldest first (``limit`` of them at most)."""
        try:
            entries = [e.name for e in os.scandir(self.queue)
                       if e.name.endswith(".json") and not e.name.startswith(".")]
        except FileNotFoundError:
            return []
        names = sorted(entries) if limit is None else heapq.nsmallest(limit, entries)
        return [os.path.join(self.queue, n) for n in names]

    def deliver(self, send: Callable[[dict[str, Any]], Sent], *, limit: int,
                deadline: float, note: Callable[[str], None]) -> Round:
        """Send queued requests in order until the queue is empty, ``limit`` were sent,
        ``deadline`` (monotonic) passed, or the controller could not take one."""
        result = Round()
        while True:
            with _try_locked(os.path.join(self.root, ".deliver")) as held:
                if not held:
                    result.busy = True
                    break
                self._drain(send, result, limit, deadline, note)
            # Let go, then look again: a request queued while we held the lock and whose
            # writer found it taken is ours to send.
            if result.stopped or not self.pending(1):
                break
        result.left = len(self.pending())
        return result

    def _drain(self, send: Callable[[dict[str, Any]], Sent], result: Round, limit: int,
               deadline: float, note: Callable[[str], None]) -> None:
        while not result.stopped:
            batch = self.pending(min(64, limit - result.delivered - result.rejected))
            if not batch:
                return
            for path in batch:
                if result.delivered + result.rejected >= limit:
                    result.stopped = f"{limit} requests delivered this time"
                    return
                if time.monotonic() >= deadline:
                    result.stopped = "out of time"
                    return
                request = _read(path)
                if request is None:
                    self._reject(path, "not a request (unreadable or not JSON)", note)
                    result.rejected += 1
                    continue
                sent = send(request)
                if sent.outcome is DELIVERED:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    result.delivered += 1
                elif sent.outcome is REJECTED:
                    self._reject(path, sent.detail, note)
                    result.rejected += 1
                else:
                    result.stopped = sent.detail
                    return

    def _reject(self, path: str, why: str, note: Callable[[str], None]) -> None:
        os.makedirs(self.rejected, mode=0o750, exist_ok=True)
        name = os.path.basename(path)
        target = os.path.join(self.rejected, f"{time.time_ns()}-{name}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, target)
        note(f"request {name} refused by the controller, kept as {target}: {why}")


def _read(path: str) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_REQUEST)
    finally:
        os.close(fd)
    try:
        request = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(request, dict) or request.get("cmd") not in ("place", "unplace") \
            or not isinstance(request.get("args"), dict):
        return None
    return request


@contextlib.contextmanager
def _locked(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing lets go of the lock


@contextlib.contextmanager
def _try_locked(path: str) -> Iterator[bool]:
    # Read-only is enough for flock, and opens a lock file another user made.
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)
