"""A stand-in NCCL rank whose collectives move data over TCP, and the peer it talks to.

    socket_rank.py rank LIBRARY COMM_ID N_RANKS HOST PORT
    socket_rank.py peer HOST PORT

``rank`` issues allreduces through the real tuner plugin (the stats files count them),
and completes each one only when its peer has taken a chunk of data and answered, as a
collective completes only when the other ranks' data arrived: when the path to the peer
dies, the rank blocks in the socket (asleep, not stopped) and its count stands still.
``peer`` answers every chunk of every connection. The environment names the job
(HARMONAIZE_JOB), the policy directory (HARMONAIZE_TUNER_DIR) and the rank (RANK), as a
launcher would. SIGTERM ends either at once, wherever it waits.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from testbed.plugin import Rank, load_fake_nccl

CHUNK = 16 << 10
#: Collectives per second at most: the counts move, the path is not the bottleneck.
RATE = 100


def receive(conn: socket.socket, size: int) -> bool:
    got = 0
    while got < size:
        data = conn.recv(min(65536, size - got))
        if not data:
            return False
        got += len(data)
    return True


def rank(args: argparse.Namespace) -> int:
    load_fake_nccl(23203)
    plugin = Rank(int(args.comm, 0), int(args.ranks), 1, job=os.environ.get("HARMONAIZE_JOB"),
                  directory=os.environ.get("HARMONAIZE_TUNER_DIR"), library=args.library)
    conn = socket.create_connection((args.host, int(args.port)), timeout=10)
    conn.settimeout(None)
    payload = b"\0" * CHUNK
    stop = threading.Event()
    while not stop.wait(1.0 / RATE):
        plugin.call()
        conn.sendall(payload)
        if not receive(conn, 1):
            return 1
    return 0


def peer(args: argparse.Namespace) -> int:
    server = socket.create_server((args.host, int(args.port)), backlog=16)

    def answer(conn: socket.socket) -> None:
        with conn:
            while receive(conn, CHUNK):
                conn.sendall(b"k")

    while True:
        conn, _ = server.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    one = sub.add_parser("rank")
    for name in ("library", "comm", "ranks", "host", "port"):
        one.add_argument(name)
    other = sub.add_parser("peer")
    other.add_argument("host")
    other.add_argument("port")
    args = parser.parse_args()
    return rank(args) if args.role == "rank" else peer(args)


if __name__ == "__main__":
    sys.exit(main())
