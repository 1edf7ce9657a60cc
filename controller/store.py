"""The controller's durable state: SQLite in WAL mode.

Writes are batched: the core applies a batch of agent messages in memory and
hands back what changed (:class:`~controller.outputs.Writes`: hosts, events,
publications, declarations, placements, tuning state); :meth:`Store.commit`
stores it in one transaction, and only then does the shell send the
acknowledgements and publications that depend on it.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack

from controller.cluster import HostRecord
from controller.notices import Notice
from controller.outputs import Restored, Writes
from controller.types import Member, Placement
from harmonaize.messages import HostSummary, JobDeclaration
from harmonaize.schema import SchemaError, from_plain, to_plain

log = logging.getLogger(__name__)

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
#: Host events kept for operators; older ones are pruned.
EVENT_RETENTION = 100_000

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


def _no_room(path: Path, exc: sqlite3.Error) -> bool:
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


class Store:
    def __init__(self, path: str | Path, *, initialise: bool = False,
                 durable: bool = True) -> None:
        """Open (or, where there is no file yet, create) the database at ``path``.

        An empty or unreadable file is refused: starting empty would restart every
        sequence number at 1 and tenants' clients would take new messages for old
        ones. With ``initialise`` such a file is moved aside and a new one begun
        (with a new feed epoch, so clients see the reset).
        """
        self.path = Path(path)
        #: False for a cache the bus can rebuild (a cluster replica's): commits need not
        #: survive an OS crash.
        self.durable = durable
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot make its directory: {exc.strerror}") from None
        problem = self._problem()
        if problem is not None:
            if not initialise:
                raise StoreError(f"{self.path}: {problem}; refusing to start (restore it, or "
                                 "start once with --initialise to move it aside and begin "
                                 "anew)")
            self._move_aside(problem)
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable database ({exc})") from None

    def _problem(self) -> str | None:
        """Why the existing file cannot be used, if it cannot (None: fine, or no file)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if self.path.is_dir():
            return "is a directory, not a database file"
        if size == 0:
            return "the database file is empty (0 bytes)"
        try:
            db = sqlite3.connect(self.path)
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

    def _move_aside(self, problem: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            old = Path(f"{self.path}{suffix}")
            if old.exists():
                old.rename(f"{self.path}.broken-{stamp}{suffix}")
        log.warning("%s: %s: moved aside as %s.broken-%s; beginning a new database (tenants' "
                    "clients will see a new feed epoch)", self.path, problem, self.path, stamp)

    def _open(self) -> None:
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        # An ack promises the agent its message is durable, so a commit must
        # survive an OS crash too (NORMAL would only survive a process crash).
        self.db.execute("PRAGMA synchronous=FULL" if self.durable else "PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        for table, columns in _COLUMNS.items():
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            for column, spec in columns.items():
                if column not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {spec}")
        self.db.execute("CREATE INDEX IF NOT EXISTS feed_by_stream ON feed_log (stream, offset)")
        version = self.get_meta("schema_version")
        if version is None or version in UPGRADABLE:
            self.set_meta("schema_version", SCHEMA_VERSION)
        elif version != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: database schema {version}, expected {SCHEMA_VERSION}")
        epoch = self.get_meta("feed_epoch")
        if not isinstance(epoch, int) or epoch <= 0:
            # Drawn once per database: a database begun anew (its sequence numbers
            # restart at 1) has another epoch, and tenants' clients see that. Below 2^53,
            # so that a client in any language (JavaScript's numbers, JSON) holds it exactly.
            epoch = secrets.randbits(53) or 1
            self.set_meta("feed_epoch", epoch)
        self.feed_epoch: int = epoch

    def close(self) -> None:
        self.db.close()

    def get_meta(self, key: str) -> object:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: object) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def load_hosts(self) -> list[HostRecord]:
        records = []
        for row in self.db.execute(
            "SELECT host_id, pool, gpu_class, gpus, version, epoch, last_seq, heartbeat, alive,"
            " down_reason, summary FROM hosts"
        ):
            summary = None
            if row[10] is not None:
                try:
                    summary = from_plain(HostSummary, msgpack.unpackb(row[10]))
                except (SchemaError, ValueError):
                    summary = None  # written by an older version: the agent will resend
            records.append(
                HostRecord(
                    host_id=row[0], pool=row[1], gpu_class=row[2], gpus=row[3], version=row[4],
                    epoch=row[5], last_seq=row[6], heartbeat=row[7], alive=bool(row[8]),
                    down_reason=row[9], summary=summary,
                )
            )
        return records

    def load_placements(self) -> list[Placement]:
        placements = []
        for job, tenant, members in self.db.execute(
                "SELECT job, tenant, members FROM placements"):
            raw = json.loads(members)
            # Schema 2 stored the member list alone; 3 an object with the group.
            group = raw.get("group", "") if isinstance(raw, dict) else ""
            listed = raw.get("members", []) if isinstance(raw, dict) else raw
            generation = raw.get("generation", 0) if isinstance(raw, dict) else 0
            placements.append(Placement(job, tenant, tuple(
                Member(name, host) for name, host in listed), group,
                generation if isinstance(generation, int) else 0))
        return placements

    def load_feed_seqs(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT topic, seq FROM feed_topics").fetchall())

    def load_declarations(self) -> list[tuple[str, JobDeclaration]]:
        out = []
        for tenant, body in self.db.execute("SELECT tenant, body FROM declarations"):
            try:
                out.append((tenant, from_plain(JobDeclaration, msgpack.unpackb(body))))
            except (SchemaError, ValueError):
                continue  # written by another version: the tenant declares again
        return out

    def load_tuning(self) -> dict[str, dict[str, object]]:
        """Each multi-host job's agreement state (decision numbers, the change in flight)."""
        out = {}
        for job, state in self.db.execute("SELECT job, state FROM tuning"):
            try:
                value = json.loads(state)
            except ValueError:
                continue
            if isinstance(value, dict):
                out[job] = value
        return out

    def load_notices(self) -> list[Notice]:
        """Validation notices tenants were told of, with their answers."""
        out = []
        for (state,) in self.db.execute("SELECT state FROM notices"):
            try:
                out.append(Notice.from_plain(json.loads(state)))
            except (KeyError, TypeError, ValueError):
                continue  # written by another version: the host's next notice rebuilds it
        return out

    def latest_conditions(self) -> dict[str, tuple[int, bytes, int]]:
        """Each topic's newest condition (seq, frame, offset), to serve late joiners
        after a restart."""
        rows = self.db.execute(
            "SELECT topic, MAX(seq), frame, offset FROM feed_log WHERE condition = 1 "
            "GROUP BY topic")
        return {topic: (seq, frame, offset) for topic, seq, frame, offset in rows}

    def load_feed_offsets(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT stream, offset FROM feed_streams").fetchall())

    def replay_stream(self, stream: str, after: int, limit: int
                      ) -> list[tuple[str, int, bytes, int]]:
        """Up to ``limit`` retained messages of ``stream`` after offset ``after``, in
        order: (topic, seq, frame, offset)."""
        return self.db.execute(
            "SELECT topic, seq, frame, offset FROM feed_log WHERE stream = ? AND offset > ? "
            "ORDER BY offset LIMIT ?", (stream, after, limit)).fetchall()

    def lost_after(self, stream: str, after: int) -> list[str]:
        """Topics of ``stream`` that messages after offset ``after`` were pruned from."""
        return [topic for (topic,) in self.db.execute(
            "SELECT topic FROM feed_topics WHERE pruned > ? AND topic IN "
            "(SELECT DISTINCT topic FROM feed_log WHERE stream = ?) ORDER BY topic",
            (after, stream))]

    def replay(self, topic: str, after: int, limit: int,
               retained_from: int = 0) -> list[tuple[int, bytes]]:
        """Up to ``limit`` messages of ``topic`` after ``after``, none below
        ``retained_from`` (what pruning has not reached yet is not retained either)."""
        return self.db.execute(
            "SELECT seq, frame FROM feed_log WHERE topic = ? AND seq > ? AND seq >= ? "
            "ORDER BY seq LIMIT ?", (topic, after, retained_from, limit)).fetchall()

    def prune_feed(self, keep: int) -> int:
        """Keep the newest ``keep`` messages per topic (sequence numbers have no holes)."""
        with self._room():
            # Where each topic was pruned to, in its stream: a resume from before it
            # lost something (lost_after).
            self.db.execute(
                "UPDATE feed_topics SET pruned = (SELECT MAX(l.offset) FROM feed_log l "
                "WHERE l.topic = feed_topics.topic AND l.seq <= feed_topics.seq - ?) "
                "WHERE EXISTS (SELECT 1 FROM feed_log l WHERE l.topic = feed_topics.topic "
                "AND l.seq <= feed_topics.seq - ?)", (keep, keep))
            cur = self.db.execute(
                "DELETE FROM feed_log WHERE seq <= "
                "(SELECT t.seq FROM feed_topics t WHERE t.topic = feed_log.topic) - ?", (keep,))
        return cur.rowcount

    def restored(self) -> Restored:
        """Everything a new core begins from."""
        return Restored(hosts=tuple(self.load_hosts()), tuning=self.load_tuning(),
                        placements=tuple(self.load_placements()),
                        feed_seqs=self.load_feed_seqs(), latest=self.latest_conditions(),
                        declarations=tuple(self.load_declarations()),
                        feed_epoch=self.feed_epoch, notices=tuple(self.load_notices()),
                        feed_offsets=self.load_feed_offsets())

    @contextmanager
    def _room(self) -> Iterator[None]:
        """One transaction; a full disk rolls it back and raises :class:`StoreFull`."""
        try:
            with self.db:
                yield
        except sqlite3.Error as exc:
            if not _no_room(self.path, exc):
                raise
            if self.db.in_transaction:
                self.db.rollback()
            raise StoreFull(f"{self.path}: no room to write ({exc})") from None

    def commit(self, *batches: Writes) -> None:
        """Store batches in one transaction, in order (before anything that depends on
        them is sent); :class:`StoreFull` when the disk has no room, with nothing stored."""
        batches = tuple(b for b in batches if b)
        if not batches:
            return
        with self._room():
            self.db.execute("BEGIN")
            for writes in batches:
                self._write(writes)

    def _write(self, writes: Writes) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO hosts (host_id, pool, gpu_class, gpus, version, epoch,"
            " last_seq, heartbeat, alive, down_reason, summary)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    h.host_id, h.pool, h.gpu_class, h.gpus, h.version, h.epoch, h.last_seq,
                    h.heartbeat, int(h.alive), h.down_reason,
                    None if h.summary is None else msgpack.packb(to_plain(h.summary)),
                )
                for h in writes.hosts
            ],
        )
        self.db.executemany(
            "INSERT INTO host_events (host_id, epoch, seq, time, reason, severity, message)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (e.host_id, e.epoch, e.seq, e.time, e.body.reason, e.body.severity.value,
                 e.body.message)
                for e in writes.events
            ],
        )
        self.db.executemany(
            "INSERT INTO feed_topics (topic, seq) VALUES (?, ?)"
            " ON CONFLICT (topic) DO UPDATE SET seq = excluded.seq",
            list(writes.feed_seqs.items()),
        )
        self.db.executemany(
            "INSERT OR REPLACE INTO feed_log (topic, seq, condition, frame, stream, offset)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [(e.topic, e.seq, int(e.condition), e.frame, e.stream, e.offset)
             for e in writes.feed_log],
        )
        self.db.executemany(
            "INSERT OR REPLACE INTO feed_streams (stream, offset) VALUES (?, ?)",
            list(writes.feed_offsets.items()),
        )
        for job, declared in writes.declarations.items():
            if declared is None:
                self.db.execute("DELETE FROM declarations WHERE job = ?", (job,))
            else:
                tenant, declaration = declared
                self.db.execute("INSERT OR REPLACE INTO declarations (job, tenant, body)"
                                " VALUES (?, ?, ?)",
                                (job, tenant, msgpack.packb(to_plain(declaration))))
        for job, placement in writes.placements.items():
            if placement is None:
                self.db.execute("DELETE FROM placements WHERE job = ?", (job,))
            else:
                members = json.dumps({"members": [[m.name, m.host_id]
                                                  for m in placement.members],
                                      "group": placement.group,
                                      "generation": placement.generation})
                self.db.execute("INSERT OR REPLACE INTO placements (job, tenant, members)"
                                " VALUES (?, ?, ?)", (job, placement.tenant, members))
        for notice_id, notice in writes.notices.items():
            if notice is None:
                self.db.execute("DELETE FROM notices WHERE id = ?", (notice_id,))
            else:
                self.db.execute("INSERT OR REPLACE INTO notices (id, state) VALUES (?, ?)",
                                (notice_id, json.dumps(notice.to_plain(), sort_keys=True)))
        for job, state in writes.tuning.items():
            if state is None:
                self.db.execute("DELETE FROM tuning WHERE job = ?", (job,))
            else:
                self.db.execute("INSERT OR REPLACE INTO tuning (job, state) VALUES (?, ?)",
                                (job, json.dumps(state, sort_keys=True)))

    def prune_events(self, keep: int = EVENT_RETENTION) -> int:
        with self._room():
            cur = self.db.execute(
                "DELETE FROM host_events WHERE id <= (SELECT MAX(id) FROM host_events) - ?", (keep,)
            )
        return cur.rowcount

    def recent_events(self, limit: int = 50) -> list[dict[str, object]]:
        rows = self.db.execute(
            "SELECT host_id, seq, time, reason, severity, message FROM host_events"
            " ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        keys = ("host_id", "seq", "time", "reason", "severity", "message")
        return [dict(zip(keys, row, strict=True)) for row in rows]
