"""The controller's database file: its schema, whether an existing file can be used,
moving an unusable one aside, and telling a full disk from other write errors.
controller/store.py reads and writes what is in it.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from pathlib import Path

log = logging.getLogger("controller.store")

SCHEMA_VERSION = 4
#: Version 1 lacked the feed log and declarations, version 2 the tuning state, version 3
#: validation notices, the feed's streams and the HTTP gateway's tokens: their tables are
#: added, and the feed log's
#: new columns (:data:`_COLUMNS`); messages stored before them sit before every cursor.
UPGRADABLE = {1, 2, 3}
_COLUMNS = {
    "feed_topics": {"pruned": "INTEGER NOT NULL DEFAULT 0"},
    "feed_log": {"stream": "TEXT NOT NULL DEFAULT ''", "offset": "INTEGER NOT NULL DEFAULT 0"},
}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value ANY) STRICT;
CREATE TABLE IF NOT EXISTS hosts (
    host_id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    gpu_class TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    version TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    heartbeat REAL NOT NULL,
    alive INTEGER NOT NULL,
    down_reason TEXT NOT NULL,
    summary BLOB
) STRICT;
CREATE TABLE IF NOT EXISTS placements (
    job TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    members TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS feed_topics (
    topic TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    pruned INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE TABLE IF NOT EXISTS feed_log (
    topic TEXT NOT NULL,
    seq INTEGER NOT NULL,
    condition INTEGER NOT NULL,
    frame BLOB NOT NULL,
    stream TEXT NOT NULL DEFAULT '',
    offset INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, seq)
) STRICT, WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS feed_streams (stream TEXT PRIMARY KEY, offset INTEGER NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS declarations (
    job TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    body BLOB NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS tuning (job TEXT PRIMARY KEY, state TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS notices (id TEXT PRIMARY KEY, state TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS negotiation (key TEXT PRIMARY KEY, state TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    hash BLOB NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    revoked REAL NOT NULL DEFAULT 0,
    note TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE IF NOT EXISTS host_events (
    id INTEGER PRIMARY KEY,
    host_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    time REAL NOT NULL,
    reason TEXT NOT NULL,
    severity TEXT NOT NULL,
    message TEXT NOT NULL
) STRICT;
"""


class StoreError(RuntimeError):
    """The database cannot be used as it is; the message names the file and the way out."""


class StoreFull(StoreError):
    """A write found no room (SQLITE_FULL, or an I/O error on a full file system): nothing
    of it was stored, and the same write may be tried again once there is room."""


#: SQLite's primary result codes for "full" and "I/O error" (extended codes keep these
#: in their low byte).
SQLITE_FULL, SQLITE_IOERR = 13, 10
#: Below this many free bytes an I/O error on the database's file system is taken for a
#: full disk (SQLite reports ENOSPC on some writes as SQLITE_IOERR_WRITE).
NEARLY_FULL = 1 << 20


def no_room(path: Path, exc: sqlite3.Error) -> bool:
    """Whether ``exc`` means the database's file system has no room."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code == SQLITE_FULL:
        return True
    if code != SQLITE_IOERR:
        return False
    try:
        return shutil.disk_usage(path.parent).free < NEARLY_FULL
    except OSError:
        return False


def create_schema(db: sqlite3.Connection) -> None:
    """Make the tables (and the columns older versions lacked) where they are missing."""
    db.executescript(_SCHEMA)
    for table, columns in _COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column, spec in columns.items():
            if column not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {spec}")
    db.execute("CREATE INDEX IF NOT EXISTS feed_by_stream ON feed_log (stream, offset)")


def problem(path: Path) -> str | None:
    """Why the existing file cannot be used, if it cannot (None: fine, or no file)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if path.is_dir():
        return "is a directory, not a database file"
    if size == 0:
        return "the database file is empty (0 bytes)"
    try:
        db = sqlite3.connect(path)
        try:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
            version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                                 ).fetchone()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return f"not a usable database ({exc})"
    if verdict != "ok":
        return f"the database is damaged ({str(verdict)[:200]})"
    if version is None:
        return "holds no HarmonAIze state (no schema version)"
    return None


def move_aside(path: Path, problem: str) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for suffix in ("", "-wal", "-shm"):
        old = Path(f"{path}{suffix}")
        if old.exists():
            old.rename(f"{path}.broken-{stamp}{suffix}")
    log.warning("%s: %s: moved aside as %s.broken-%s; beginning a new database (tenants' "
                "clients will see a new feed epoch)", path, problem, path, stamp)
