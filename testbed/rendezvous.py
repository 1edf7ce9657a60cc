"""Coupling for stand-in ranks: a rendezvous server and its client, over TCP.

NCCL ranks block like this: a rank issues collective N and cannot issue N+1 until
every rank of its communicator has issued N (the collective completes only then, and
the program waits on its result sooner or later). Stand-in ranks
(``tests/bin/nccl_rank.py --sync``) get the same coupling from one server:

    python -m testbed.rendezvous --listen ADDR:PORT

It counts, per communicator and collective index, the ranks that issued it, and tells
every rank of the communicator once all have. One line per message, ASCII:

    rank -> server   hello COMM N_RANKS RANK     (COMM in hex, once, first)
    rank -> server   issued INDEX
    server -> rank   done INDEX                 (every rank issued INDEX)
    server -> rank   error REASON               (then it closes the connection)

Ranks on other hosts connect over the lab's network, so a cut link really blocks
them, and a rank waiting for its fellows sleeps in ``select`` (it never spins). The
server keeps what a rank that went away had issued: its fellows wait for it, as NCCL's
do for a dead rank. Standard library only: ranks run it under the system Python as
other users (testbed/ranks.py copies it for them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

#: A line longer than this is not the protocol: the connection is dropped.
MAX_LINE = 256
#: Ranks per communicator the server accepts.
MAX_RANKS = 4096


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host, int(port)


# --- the server ------------------------------------------------------------------------


@dataclass
class Conn:
    sock: socket.socket
    inbox: bytes = b""
    outbox: bytes = b""
    comm: tuple[int, int] | None = None
    rank: int = -1


@dataclass
class Comm:
    n_ranks: int
    members: dict[int, Conn] = field(default_factory=dict)
    #: Per collective index, the ranks that issued it (until all have).
    issued: dict[int, set[int]] = field(default_factory=dict)


class Server:
    """Per-communicator barriers counted per collective index; one thread, one selector."""

    def __init__(self, listen: tuple[str, int]) -> None:
        self.listener = socket.create_server(listen, reuse_port=False)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.comms: dict[tuple[int, int], Comm] = {}
        self.conns: dict[int, Conn] = {}

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()[:2]
        return host, port

    def serve(self) -> None:
        """Until :class:`Stopped` (raised by the caller's signal handler)."""
        while True:
            for key, events in self.selector.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self._accept()
                    continue
                conn = self.conns.get(key.fd)
                if conn is None:
                    continue
                if events & selectors.EVENT_READ:
                    self._read(conn)
                if events & selectors.EVENT_WRITE and conn.sock.fileno() in self.conns:
                    self._flush(conn)

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._drop(conn)
        self.selector.close()
        self.listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            sock, _ = self.listener.accept()
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns[sock.fileno()] = Conn(sock)
            self.selector.register(sock, selectors.EVENT_READ)

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.inbox += data
        while b"\n" in conn.inbox:
            line, conn.inbox = conn.inbox.split(b"\n", 1)
            if not self._line(conn, line.decode("ascii", "replace").split()):
                return
        if len(conn.inbox) > MAX_LINE:
            self._refuse(conn, "line too long")

    def _line(self, conn: Conn, words: list[str]) -> bool:
        """Handle one line; False when the connection was closed for it."""
        if conn.comm is None:
            return self._hello(conn, words)
        if len(words) == 2 and words[0] == "issued" and words[1].isdigit():
            self._issued(conn, int(words[1]))
            return True
        self._refuse(conn, "expected: issued INDEX")
        return False

    def _hello(self, conn: Conn, words: list[str]) -> bool:
        try:
            if len(words) != 4 or words[0] != "hello":
                raise ValueError
            comm_id, n_ranks, rank = int(words[1], 16), int(words[2]), int(words[3])
        except ValueError:
            self._refuse(conn, "expected: hello COMM N_RANKS RANK")
            return False
        if not 0 < n_ranks <= MAX_RANKS or not 0 <= rank < n_ranks:
            self._refuse(conn, f"rank {rank} of {n_ranks}: out of range")
            return False
        key = (comm_id, n_ranks)
        comm = self.comms.setdefault(key, Comm(n_ranks))
        if rank in comm.members:
            self._refuse(conn, f"rank {rank} of communicator {comm_id:x} is connected already")
            return False
        comm.members[rank] = conn
        conn.comm, conn.rank = key, rank
        return True

    def _issued(self, conn: Conn, index: int) -> None:
        assert conn.comm is not None
        comm = self.comms[conn.comm]
        ranks = comm.issued.setdefault(index, set())
        ranks.add(conn.rank)
        if len(ranks) < comm.n_ranks:
            return
        del comm.issued[index]
        line = f"done {index}\n".encode()
        for member in list(comm.members.values()):
            member.outbox += line
            self._flush(member)

    def _flush(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbox) if conn.outbox else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(conn)
            return
        conn.outbox = conn.outbox[sent:]
        # Wait for room only while something is left (a cut peer's buffer fills slowly).
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
        self.selector.modify(conn.sock, events)

    def _refuse(self, conn: Conn, reason: str) -> None:
        with contextlib.suppress(OSError):
            conn.sock.send(f"error {reason}\n".encode())
        self._drop(conn)

    def _drop(self, conn: Conn) -> None:
        fd = conn.sock.fileno()
        if fd in self.conns:
            del self.conns[fd]
            self.selector.unregister(conn.sock)
        conn.sock.close()
        if conn.comm is not None:
            comm = self.comms.get(conn.comm)
            if comm is not None and comm.members.get(conn.rank) is conn:
                del comm.members[conn.rank]
                if not comm.members:
                    del self.comms[conn.comm]  # every rank went: the communicator is over


# --- the client (in a rank) ------------------------------------------------------------


class Stopped(Exception):
    """The rank was told to stop (SIGTERM) while it waited."""


class Waiter:
    """Where a rank sleeps: on its wake pipe (signals write to it) and, at a barrier, its
    rendezvous socket. ``stop`` and ``held`` are set by the rank's signal handlers, each
    of which then calls :meth:`wake`."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.stop = False
        self.held = False

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"!")

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` unless stopped first (a signal cuts it short, then it goes on)."""
        deadline = _now() + seconds
        while not self.stop and (left := deadline - _now()) > 0:
            self._select([], left)

    def hold(self) -> None:
        """While held (SIGUSR1, until SIGUSR2): issue nothing, sleep."""
        while self.held and not self.stop:
            self._select([], None)

    def readable(self, sock: socket.socket) -> bool:
        """Block until ``sock`` has data (True) or the rank is stopped (False)."""
        while not self.stop:
            if self._select([sock], None):
                return True
        return False

    def _select(self, extra: list[socket.socket], timeout: float | None) -> bool:
        ready, _, _ = select.select([self._read, *extra], [], [], timeout)
        if self._read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 64)
        return any(s in ready for s in extra)


class Barrier:
    """A rank's side: after issuing collective N, :meth:`wait` until every rank has."""

    def __init__(self, address: tuple[str, int], comm: int, n_ranks: int, rank: int, *,
                 waiter: Waiter, connect_for: float = 5.0) -> None:
        self.waiter = waiter
        self.sock = _connect(address, waiter, connect_for)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(f"hello {comm:x} {n_ranks} {rank}\n".encode())
        self._buffer = b""
        self._done = -1

    def wait(self, index: int) -> None:
        """Say collective ``index`` was issued; return once every rank issued it.
        Raises :class:`Stopped` when stopped meanwhile, ``ConnectionError`` when the
        server went away or refused."""
        self.sock.sendall(f"issued {index}\n".encode())
        while self._done < index:
            if not self.waiter.readable(self.sock):
                raise Stopped
            data = self.sock.recv(4096)
            if not data:
                raise ConnectionError("the rendezvous server closed the connection")
            self._buffer += data
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                words = line.decode("ascii", "replace").split()
                if words[:1] == ["error"]:
                    raise ConnectionError("the rendezvous server refused: " + " ".join(words[1:]))
                if len(words) == 2 and words[0] == "done" and words[1].isdigit():
                    self._done = max(self._done, int(words[1]))

    def close(self) -> None:
        self.sock.close()


def _connect(address: tuple[str, int], waiter: Waiter, within: float) -> socket.socket:
    """Connect, retrying while the server is not up yet (ranks may start first)."""
    deadline = _now() + within
    while True:
        try:
            sock = socket.create_connection(address, timeout=5.0)
        except OSError:
            if _now() > deadline or waiter.stop:
                raise
            waiter.sleep(0.2)
            continue
        sock.settimeout(None)  # it waits in select, never in a timed call
        return sock


def _now() -> float:
    return time.monotonic()


# --- the server's command line ----------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rendezvous", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, metavar="ADDR:PORT")
    args = parser.parse_args(argv)
    try:
        server = Server(parse_address(args.listen))
    except (ValueError, OSError) as exc:
        print(f"rendezvous: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    def stopped(*_: object) -> None:
        raise Stopped

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopped)
    host, port = server.address
    print(f"listening {host}:{port}", flush=True)
    try:
        server.serve()
    except Stopped:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
