"""Local operator sockets: line-delimited JSON over a Unix socket.

A request is one line ``{"cmd": "status", "args": {...}}``; the reply is one
line ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``.
The peer's credentials come from the kernel (``SO_PEERCRED`` and
``SO_PEERGROUPS``): root may run every command, members of the socket's group
the read-only ones, anyone else nothing. Malformed requests get an error reply
and the server keeps serving; every request is bounded in size and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import inspect
import json
import logging
import os
import pwd
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from harmonaize.schema import SchemaError, check_depth

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
#: Requests nest no deeper than this (the commands take flat arguments).
MAX_DEPTH = 32
#: Seconds a connection may sit idle between requests: root's, everyone else's.
IDLE_TIMEOUT = 60.0
IDLE_TIMEOUT_OTHERS = 10.0
#: Connections open at once: all non-root users together, and each uid of them.
#: Root has its own ``ROOT_CLIENTS`` on top, which no one else can take, so a
#: read-only member holding idle connections never locks out a drain or a place.
OTHER_CLIENTS = 48
CLIENTS_PER_UID = 8
ROOT_CLIENTS = 16
#: What is read and thrown away after a refusal, so the client can finish sending
#: and read the reply instead of meeting a reset.
DISCARD_BYTES = 16 * 1024 * 1024
DISCARD_SECONDS = 2.0
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)


class Access(IntEnum):
    NONE = 0
    READ = 1
    #: The scheduler's own user: reads, and the commands marked ``scheduler``.
    SCHEDULER = 2
    ADMIN = 3


class CommandError(Exception):
    """A command's arguments are wrong; the message goes back to the caller."""


Handler = Callable[[dict[str, Any]], Any | Awaitable[Any]]


@dataclass(frozen=True)
class Command:
    handler: Handler
    help: str
    #: Commands that change state are for root only ...
    changes: bool = False
    #: ... except these, which the scheduler's users may run too (its hooks run as
    #: SlurmUser, not root): recording and forgetting placements, nothing else.
    scheduler: bool = False


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    groups: frozenset[int]


def peer_of(sock: socket.socket) -> Peer:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    groups: frozenset[int] = frozenset()
    with contextlib.suppress(OSError):
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 1024)
        groups = frozenset(struct.unpack(f"{len(raw) // 4}I", raw))
    return Peer(pid, uid, gid, groups)


@dataclass
class SocketStats:
    connections: int = 0
    requests: int = 0
    errors: int = 0
    denied: int = 0
    #: Connections refused because the caller's uid (or all non-root callers) had
    #: as many open as allowed, and connections closed for sitting idle.
    refused_busy: int = 0
    idle_closed: int = 0
    by_command: dict[str, int] = field(default_factory=dict)


class OperatorSocket:
    def __init__(
        self,
        path: str | Path,
        commands: Mapping[str, Command],
        *,
        group: str = "",
        mode: int = 0o660,
        scheduler_users: Sequence[str] = (),
    ) -> None:
        self.path = Path(path)
        self.scheduler_users = tuple(scheduler_users)
        self.scheduler_uids: frozenset[int] = frozenset()
        self.commands = dict(commands)
        self.commands.setdefault("help", Command(self._help, "list the commands"))
        self.group = group
        self.mode = mode
        self.gid: int | None = None
        self.stats = SocketStats()
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._by_uid: dict[int, int] = {}

    def _help(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            name: {"help": c.help, "root_only": c.changes}
            for name, c in sorted(self.commands.items())
        }

    async def start(self) -> None:
        """Serve; raises RuntimeError (one line, naming the path) if it cannot."""
        try:
            await self._start()
        except OSError as exc:
            raise RuntimeError(f"{self.path}: {exc.strerror or exc}") from None

    async def _start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(mode):
                # Never delete what is not ours: a typo naming a real file must not cost it.
                raise RuntimeError(f"{self.path}: exists and is not a socket; refusing to "
                                   "replace it (remove it or choose another path)")
            if await _is_live(self.path):
                raise RuntimeError(f"{self.path}: another instance is serving this socket")
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        self.scheduler_uids = frozenset(self._uids(self.scheduler_users))
        mode = self.mode
        if self.group:
            try:
                self.gid = grp.getgrnam(self.group).gr_gid
                os.chown(self.path, 0 if os.geteuid() == 0 else -1, self.gid)
            except KeyError:
                log.warning(
                    "socket group %r does not exist: only root can use %s", self.group, self.path
                )
                mode &= 0o700
        os.chmod(self.path, mode)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._clients):
                task.cancel()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _uids(self, names: Sequence[str]) -> list[int]:
        uids = []
        for name in names:
            try:
                uids.append(pwd.getpwnam(name).pw_uid)
            except KeyError:
                log.warning("scheduler user %r does not exist: ignored", name)
        return uids

    def access_of(self, peer: Peer) -> Access:
        if peer.uid == 0:
            return Access.ADMIN
        if peer.uid in self.scheduler_uids:
            return Access.SCHEDULER
        if self.gid is not None and (peer.gid == self.gid or self.gid in peer.groups):
            return Access.READ
        return Access.NONE

    def _admit(self, peer: Peer) -> str | None:
        """Take a connection slot for the peer's uid; the refusal, if there is none."""
        held = self._by_uid.get(peer.uid, 0)
        if peer.uid == 0:
            if held >= ROOT_CLIENTS:
                return f"too many clients: root has {held} connections open"
        elif held >= CLIENTS_PER_UID:
            return f"too many clients: uid {peer.uid} has {held} connections open"
        elif sum(n for uid, n in self._by_uid.items() if uid != 0) >= OTHER_CLIENTS:
            return "too many clients: all non-root connections are taken"
        self._by_uid[peer.uid] = held + 1
        return None

    def _release(self, uid: int) -> None:
        left = self._by_uid.get(uid, 0) - 1
        if left > 0:
            self._by_uid[uid] = left
        else:
            self._by_uid.pop(uid, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        self.stats.connections += 1
        admitted: int | None = None
        try:
            peer = peer_of(writer.get_extra_info("socket"))
            access = self.access_of(peer)
            if access is Access.NONE:
                self.stats.denied += 1
                await _refuse(reader, writer, "permission denied")
                return
            refusal = self._admit(peer)
            if refusal is not None:
                self.stats.refused_busy += 1
                await _refuse(reader, writer, refusal)
                return
            admitted = peer.uid
            idle = IDLE_TIMEOUT if peer.uid == 0 else IDLE_TIMEOUT_OTHERS
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), idle)
                except (asyncio.LimitOverrunError, ValueError):
                    self.stats.errors += 1
                    await _refuse(reader, writer, f"request over {MAX_LINE} bytes")
                    return
                except TimeoutError:
                    self.stats.idle_closed += 1
                    return
                if not line:
                    return
                await _reply(writer, await self._dispatch(line, access))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if admitted is not None:
                self._release(admitted)
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _dispatch(self, line: bytes, access: Access) -> dict[str, Any]:
        self.stats.requests += 1
        try:
            request = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            self.stats.errors += 1
            return {"ok": False, "error": f"malformed request: not JSON ({exc})"}
        except RecursionError:
            request = None  # nested past the parser's own limit
        try:
            if request is None:
                raise SchemaError("request")
            check_depth(request, "request", MAX_DEPTH)
        except SchemaError:
            self.stats.errors += 1
            return {"ok": False, "error": f"malformed request: nested deeper than {MAX_DEPTH}"}
        if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
            self.stats.errors += 1
            return {"ok": False, "error": 'malformed request: expected {"cmd": "...", "args": {}}'}
        name, args = request["cmd"], request.get("args", {})
        if not isinstance(args, dict):
            self.stats.errors += 1
            return {"ok": False, "error": "malformed request: args must be an object"}
        command = self.commands.get(name)
        if command is None:
            self.stats.errors += 1
            return {"ok": False, "error": f"unknown command {name[:60]!r}; try 'help'"}
        if command.changes and access is not Access.ADMIN and not (
                command.scheduler and access is Access.SCHEDULER):
            self.stats.denied += 1
            return {"ok": False, "error": f"permission denied: {name!r} is for root only"}
        self.stats.by_command[name] = self.stats.by_command.get(name, 0) + 1
        try:
            result = command.handler(args)
            if inspect.isawaitable(result):
                result = await result
        except CommandError as exc:
            self.stats.errors += 1
            return {"ok": False, "error": str(exc)}
        except Exception as exc:
            self.stats.errors += 1
            log.exception("operator command %s failed", name)
            return {"ok": False, "error": f"internal error in {name!r}: {exc}"}
        return {"ok": True, "result": result}


async def _reply(writer: asyncio.StreamWriter, payload: dict[str, Any]) -> None:
    writer.write(json.dumps(payload, default=str).encode() + b"\n")
    await writer.drain()


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  error: str) -> None:
    """Answer with an error and end the connection without resetting it.

    Closing with the client's input unread makes the kernel reset the connection,
    and a client still sending would get EPIPE before it reads the answer. So the
    answer goes out, our side is shut for writing, and what the client still sends
    is read and dropped (up to DISCARD_BYTES or DISCARD_SECONDS) until it closes.
    """
    await _reply(writer, {"ok": False, "error": error})
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()
    loop = asyncio.get_running_loop()
    deadline, left = loop.time() + DISCARD_SECONDS, DISCARD_BYTES
    with contextlib.suppress(TimeoutError, ConnectionError):
        while left > 0:
            chunk = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
            if not chunk:
                break
            left -= len(chunk)


async def _is_live(path: Path) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def request(path: str | Path, cmd: str, args: dict[str, Any] | None = None,
            timeout: float = 10.0) -> Any:
    """Client side: send one request, return the result or raise CommandError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        # The server may have refused early (busy, denied): its answer may still be there.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(json.dumps({"cmd": cmd, "args": args or {}}).encode() + b"\n")
        buf = bytearray()
        while not buf.endswith(b"\n"):
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
    if not buf:
        raise CommandError("the server closed the connection without a reply")
    reply = json.loads(buf)
    if not reply.get("ok"):
        raise CommandError(reply.get("error", "unknown error"))
    return reply.get("result")
