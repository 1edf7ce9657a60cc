"""The scheduler loop's marks in the controller's SQLite database, so a restart keeps
an operator's cancellations and pause, and knows which drains it wrote (no double
action, no drain forgotten)."""

from __future__ import annotations

import sqlite3

from controller.scheduler.types import Marks

_SCHEMA = ("CREATE TABLE IF NOT EXISTS scheduler_marks ("
           " node TEXT NOT NULL, kind TEXT NOT NULL, value TEXT NOT NULL DEFAULT '',"
           " PRIMARY KEY (node, kind))")
#: The row that says every node is left alone.
PAUSED = ("*", "paused")


class MarkStore:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.db.execute(_SCHEMA)
        #: The rows last stored (None: not known yet).
        self._saved: list[tuple[str, str, str]] | None = None

    def load(self) -> Marks:
        marks = Marks()
        for node, kind, value in self.db.execute(
                "SELECT node, kind, value FROM scheduler_marks"):
            if (node, kind) == PAUSED:
                marks.paused = True
            elif kind == "ours":
                marks.ours[node] = value
            elif kind in ("cancelled", "rebooted", "disowned"):
                getattr(marks, kind).add(node)
        return marks

    def save(self, marks: Marks) -> None:
        """All of it in one transaction (a few rows per node at most);
        raises sqlite3.Error (a full disk) with nothing changed."""
        rows = [(n, "ours", r) for n, r in marks.ours.items()]
        rows += [(n, kind, "") for kind in ("cancelled", "rebooted", "disowned")
                 for n in getattr(marks, kind)]
        if marks.paused:
            rows.append((*PAUSED, ""))
        rows.sort()
        if rows == self._saved:
            return  # most passes change nothing: no write
        self.db.execute("BEGIN")
        try:
            self.db.execute("DELETE FROM scheduler_marks")
            self.db.executemany("INSERT INTO scheduler_marks (node, kind, value) "
                                "VALUES (?, ?, ?)", rows)
            self.db.execute("COMMIT")
        except sqlite3.Error:
            self.db.execute("ROLLBACK")
            raise
        self._saved = rows
