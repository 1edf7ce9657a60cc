"""Unacknowledged events on disk, so an agent restart does not lose them.

Conditions need no spool: a restarted agent sends its current state anyway.
Events (an XID, a validation verdict, an advisory) happened once; until the
controller acknowledges one, it is kept in a small SQLite file in the state
directory and sent again, under the new run's sequence numbers, after a
restart. Unreadable rows (another version, a damaged file) are dropped and
counted, never fatal.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import msgpack

from harmonaize.messages import Message, WireError, decode, encode

log = logging.getLogger(__name__)


class Spool:
    def __init__(self, path: str | Path, sender: str) -> None:
        self.path = Path(path)
        self.sender = sender
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        # A power loss may cost the last events; a process crash never does.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, "
                        "frame BLOB NOT NULL) STRICT")
        self.unreadable = 0

    def add(self, body: Message) -> int:
        cur = self.db.execute("INSERT INTO events (frame) VALUES (?)",
                              (encode(body, sender=self.sender),))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def remove(self, ids: Iterable[int]) -> None:
        rows = [(i,) for i in ids]
        if rows:
            self.db.executemany("DELETE FROM events WHERE id = ?", rows)

    def load(self) -> list[tuple[int, Message]]:
        out, bad = [], []
        for row_id, frame in self.db.execute("SELECT id, frame FROM events ORDER BY id"):
            try:
                out.append((row_id, decode(frame).body))
            except (WireError, msgpack.ExtraData, TypeError):
                bad.append(row_id)
        if bad:
            self.unreadable += len(bad)
            log.warning("%s: dropped %d unreadable spooled events", self.path, len(bad))
            self.remove(bad)
        return out

    def close(self) -> None:
        self.db.close()
