"""Validation history, learned baselines and quarantines, in SQLite on the host.

A validation row is written before its first check runs, with the process
group of any external check while it runs, so an agent that was killed
mid-validation finds, at its next start, what to kill and what to mark as
interrupted. Quarantines are kept by GPU UUID and survive restarts and reboots, and so
is each GPU's remediation (agent/remediation) with every step it took and what
triggered it.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agent.validation.checks import CheckResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS validations (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    uuid TEXT NOT NULL,
    level INTEGER NOT NULL,
    trigger TEXT NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    outcome TEXT,
    reason TEXT,
    action TEXT,
    pgid INTEGER,
    boot_id TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE IF NOT EXISTS results (
    validation INTEGER NOT NULL,
    check_name TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reason TEXT NOT NULL,
    duration REAL NOT NULL,
    measurements TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS results_by_check ON results (check_name, outcome);
CREATE TABLE IF NOT EXISTS quarantine (
    uuid TEXT PRIMARY KEY,
    gpu INTEGER NOT NULL,
    reason TEXT NOT NULL,
    action TEXT NOT NULL,
    since REAL NOT NULL,
    boot_id TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS remediation (
    uuid TEXT PRIMARY KEY,
    gpu INTEGER NOT NULL,
    phase TEXT NOT NULL,
    failures INTEGER NOT NULL,
    since REAL NOT NULL,
    boot_id TEXT NOT NULL,
    last_reset REAL,
    detail TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS remediation_steps (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    uuid TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    step TEXT NOT NULL,
    trigger TEXT NOT NULL,
    detail TEXT NOT NULL,
    boot_id TEXT NOT NULL
) STRICT;
"""


@dataclass(frozen=True)
class Interrupted:
    id: int
    target: str
    pgid: int | None
    boot_id: str


@dataclass(frozen=True)
class Quarantine:
    uuid: str
    gpu: int
    reason: str
    action: str
    since: float
    boot_id: str


F = TypeVar("F", bound=Callable[..., Any])


def _serialized(method: F) -> F:
    """One thread at a time on the connection: two validations finishing together
    would otherwise open a transaction inside the other's and lose a result."""
    @functools.wraps(method)
    def locked(self: History, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return locked  # type: ignore[return-value]


class History:
    def __init__(self, path: str | Path, keep: int = 10_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        # check_same_thread: the runner's worker threads write results too (serialized).
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)

    @_serialized
    def close(self) -> None:
        self.db.close()

    # --- validations ----------------------------------------------------------------

    @_serialized
    def begin(self, target: str, uuid: str, level: int, trigger: str, *, now: float,
              boot: str = "") -> int:
        cur = self.db.execute(
            "INSERT INTO validations (target, uuid, level, trigger, started, boot_id)"
            " VALUES (?,?,?,?,?,?)", (target, uuid, level, trigger, now, boot))
        return int(cur.lastrowid or 0)

    @_serialized
    def set_process(self, validation: int, pgid: int | None) -> None:
        self.db.execute("UPDATE validations SET pgid = ? WHERE id = ?", (pgid, validation))

    @_serialized
    def finish(self, validation: int, outcome: str, reason: str, action: str, *,
               results: Iterable[CheckResult], now: float) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "UPDATE validations SET finished = ?, outcome = ?, reason = ?, action = ?,"
                " pgid = NULL WHERE id = ?", (now, outcome, reason, action, validation))
            self.db.executemany(
                "INSERT INTO results (validation, check_name, outcome, reason, duration,"
                " measurements) VALUES (?,?,?,?,?,?)",
                [(validation, r.check, r.outcome.value, r.reason, r.duration,
                  json.dumps([m.__dict__ for m in r.measurements])) for r in results])
        self._prune()

    @_serialized
    def _prune(self) -> None:
        row = self.db.execute("SELECT MAX(id) FROM validations").fetchone()
        if row and row[0] and row[0] > self.keep:
            cutoff = row[0] - self.keep
            with self.db:
                self.db.execute("DELETE FROM results WHERE validation <= ?", (cutoff,))
                self.db.execute("DELETE FROM validations WHERE id <= ?", (cutoff,))

    @_serialized
    def interrupted(self, now: float) -> list[Interrupted]:
        """Validations an earlier agent never finished; marks them as such."""
        rows = self.db.execute(
            "SELECT id, target, pgid, boot_id FROM validations WHERE finished IS NULL").fetchall()
        with self.db:
            self.db.execute(
                "UPDATE validations SET finished = ?, outcome = 'error', reason = ?, pgid = NULL"
                " WHERE finished IS NULL", (now, "interrupted: the agent stopped during it"))
        return [Interrupted(r[0], r[1], r[2], r[3]) for r in rows]

    @_serialized
    def last_finished(self) -> dict[str, float]:
        """When each target was last validated (cooldowns hold across restarts)."""
        return dict(self.db.execute(
            "SELECT target, MAX(finished) FROM validations WHERE finished IS NOT NULL"
            " GROUP BY target").fetchall())

    @_serialized
    def passing_values(self, uuid: str, check: str, measurement: str,
                       limit: int = 20) -> list[float]:
        """This device's earlier passing values of one measurement, oldest first."""
        rows = self.db.execute(
            "SELECT r.measurements FROM results r JOIN validations v ON v.id = r.validation"
            " WHERE v.uuid = ? AND r.check_name = ? AND r.outcome = 'pass'"
            " ORDER BY v.id DESC LIMIT ?", (uuid, check, limit)).fetchall()
        values = []
        for (text,) in reversed(rows):
            for m in json.loads(text):
                if m.get("name") == measurement:
                    values.append(float(m["value"]))
        return values

    @_serialized
    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT id, target, uuid, level, trigger, started, finished, outcome, reason, action"
            " FROM validations ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        keys = ("id", "target", "uuid", "level", "trigger", "started", "finished", "outcome",
                "reason", "action")
        out = []
        for row in rows:
            record = dict(zip(keys, row, strict=True))
            record["checks"] = [
                {"check": c, "outcome": o, "reason": why, "duration": d,
                 "measurements": json.loads(ms)}
                for c, o, why, d, ms in self.db.execute(
                    "SELECT check_name, outcome, reason, duration, measurements FROM results"
                    " WHERE validation = ?", (row[0],))
            ]
            out.append(record)
        return out

    # --- quarantines ----------------------------------------------------------------

    @_serialized
    def quarantine(self, entry: Quarantine) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO quarantine VALUES (?,?,?,?,?,?)",
                            (entry.uuid, entry.gpu, entry.reason, entry.action, entry.since,
                             entry.boot_id))

    @_serialized
    def release(self, uuid: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM quarantine WHERE uuid = ?", (uuid,))

    @_serialized
    def quarantined(self) -> list[Quarantine]:
        return [Quarantine(*row) for row in self.db.execute(
            "SELECT uuid, gpu, reason, action, since, boot_id FROM quarantine")]

    # --- remediation (agent/remediation) --------------------------------------------

    @_serialized
    def remediation_save(self, rows: Iterable[tuple[Any, ...]], gone: Iterable[str]) -> None:
        """Rows: (uuid, gpu, phase, failures, since, boot_id, last_reset, detail)."""
        with self.db:
            self.db.executemany("DELETE FROM remediation WHERE uuid = ?",
                                [(uuid,) for uuid in gone])
            self.db.executemany("INSERT OR REPLACE INTO remediation VALUES (?,?,?,?,?,?,?,?)",
                                list(rows))

    @_serialized
    def remediation_load(self) -> list[tuple[Any, ...]]:
        return self.db.execute(
            "SELECT uuid, gpu, phase, failures, since, boot_id, last_reset, detail"
            " FROM remediation").fetchall()

    @_serialized
    def remediation_step(self, at: float, uuid: str, gpu: int, *, step: str, trigger: str,
                         detail: str, boot: str) -> None:
        with self.db:
            self.db.execute(
                "INSERT INTO remediation_steps (at, uuid, gpu, step, trigger, detail, boot_id)"
                " VALUES (?,?,?,?,?,?,?)", (at, uuid, gpu, step, trigger, detail, boot))
            self.db.execute("DELETE FROM remediation_steps WHERE id <= "
                            "(SELECT MAX(id) FROM remediation_steps) - ?", (self.keep,))

    @_serialized
    def remediation_steps(self, limit: int = 50, since: float = float("-inf"),
                          step: str | None = None) -> list[dict[str, Any]]:
        """The latest steps, newest first (``since``/``step``: only those)."""
        rows = self.db.execute(
            "SELECT id, at, uuid, gpu, step, trigger, detail, boot_id FROM remediation_steps"
            " WHERE at >= ? AND (? IS NULL OR step = ?) ORDER BY id DESC LIMIT ?",
            (since, step, step, limit)).fetchall()
        keys = ("id", "at", "uuid", "gpu", "step", "trigger", "detail", "boot_id")
        return [dict(zip(keys, row, strict=True)) for row in rows]
