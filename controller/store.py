"""The controller's durable state: SQLite in WAL mode.

Writes are batched: the core applies a batch of agent messages in memory and
hands back what changed (:class:`~controller.outputs.Writes`: hosts, events,
publications, declarations, placements, tuning state); :meth:`Store.commit`
stores it in one transaction, and only then does the shell send the
acknowledgements and publications that depend on it. The file itself (its schema,
whether it can be used, a full disk) is controller/storefile.py's.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import msgpack

from controller.cluster import HostRecord
from controller.notices import Notice
from controller.outputs import Restored, Writes
from controller.plainmemo import summary_packed, summary_unpacked
from controller.storefile import (
    SCHEMA_VERSION,
    UPGRADABLE,
    StoreError,
    StoreFull,
    create_schema,
    move_aside,
    no_room,
    problem,
)
from controller.types import Member, Placement
from harmonaize.messages import JobDeclaration, JobProgress, WireError, decode
from harmonaize.messages.jobhealth import ProgressState
from harmonaize.schema import SchemaError, from_plain, to_plain

log = logging.getLogger(__name__)

#: Host events kept for operators; older ones are pruned.
EVENT_RETENTION = 100_000


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
        trouble = problem(self.path)
        if trouble is not None:
            if not initialise:
                raise StoreError(f"{self.path}: {trouble}; refusing to start (restore it, or "
                                 "start once with --initialise to move it aside and begin "
                                 "anew)")
            move_aside(self.path, trouble)
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable database ({exc})") from None

    def _open(self) -> None:
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        # An ack promises the agent its message is durable, so a commit must
        # survive an OS crash too (NORMAL would only survive a process crash).
        self.db.execute("PRAGMA synchronous=FULL" if self.durable else "PRAGMA synchronous=NORMAL")
        create_schema(self.db)
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
                    summary = summary_unpacked(row[10])
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

    def load_negotiation(self) -> dict[str, object] | None:
        """The negotiation engine's rows as last committed (None: none; an unreadable
        row is left out, and the engine says what it cannot read)."""
        out: dict[str, object] = {}
        for key, state in self.db.execute("SELECT key, state FROM negotiation"):
            try:
                out[key] = json.loads(state)
            except ValueError:
                continue
        return out or None

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

    def restored(self, hosts: Iterable[HostRecord] | None = None) -> Restored:
        """Everything a new core begins from; ``hosts``: the stored hosts as the caller
        holds them already (a warm standby's), not read again."""
        return Restored(hosts=tuple(self.load_hosts() if hosts is None else hosts),
                        tuning=self.load_tuning(),
                        placements=tuple(self.load_placements()),
                        feed_seqs=self.load_feed_seqs(), latest=self.latest_conditions(),
                        declarations=tuple(self.load_declarations()),
                        feed_epoch=self.feed_epoch, notices=tuple(self.load_notices()),
                        feed_offsets=self.load_feed_offsets(),
                        progress=self.told_progress(),
                        negotiation=self.load_negotiation())

    def told_progress(self) -> tuple[tuple[str, JobProgress], ...]:
        """Per job topic and communicator, the last job-progress retained, where it
        said active: (the owner, the message)."""
        last: dict[tuple[str, int], JobProgress] = {}
        for topic, frame in self.db.execute(
                "SELECT topic, frame FROM feed_log WHERE topic LIKE 'job/%' AND condition = 0 "
                "AND instr(frame, ?) > 0 ORDER BY topic, seq", (JobProgress.KIND.encode(),)):
            try:
                body = decode(frame).body
            except WireError:
                continue  # written by another version: nothing to withdraw from it
            if isinstance(body, JobProgress):
                last[(topic, body.comm)] = body
        return tuple((topic.split("/")[1], body) for (topic, _), body in sorted(
            last.items()) if body.state is ProgressState.ACTIVE)

    @contextmanager
    def _room(self) -> Iterator[None]:
        """One transaction; a full disk rolls it back and raises :class:`StoreFull`."""
        try:
            with self.db:
                yield
        except sqlite3.Error as exc:
            if not no_room(self.path, exc):
                raise
            if self.db.in_transaction:
                self.db.rollback()
            raise StoreFull(f"{self.path}: no room to write ({exc})") from None

    def commit(self, *batches: Writes, meta: Mapping[str, object] | None = None) -> None:
        """Store batches in one transaction, in order (before anything that depends on
        them is sent), with ``meta`` keys set in the same transaction; :class:`StoreFull`
        when the disk has no room, with nothing stored."""
        batches = tuple(b for b in batches if b)
        if not batches and not meta:
            return
        with self._room():
            self.db.execute("BEGIN")
            for writes in batches:
                self._write(writes)
            for key, value in (meta or {}).items():
                self.set_meta(key, value)

    def _write(self, writes: Writes) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO hosts (host_id, pool, gpu_class, gpus, version, epoch,"
            " last_seq, heartbeat, alive, down_reason, summary)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    h.host_id, h.pool, h.gpu_class, h.gpus, h.version, h.epoch, h.last_seq,
                    h.heartbeat, int(h.alive), h.down_reason,
                    None if h.summary is None else summary_packed(h.summary),
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
        for key, row in (writes.negotiation or {}).items():
            if row is None:
                self.db.execute("DELETE FROM negotiation WHERE key = ?", (key,))
            else:
                self.db.execute("INSERT OR REPLACE INTO negotiation (key, state) VALUES (?, ?)",
                                (key, json.dumps(row, sort_keys=True)))
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
