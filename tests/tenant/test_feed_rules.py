"""What the feed promises a tenant's client across a controller restart, in the core with
the real store: revisions go on from where they were, and a condition the tenant already
has is not published again as if it were news."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.core import ControllerCore
from controller.outputs import AgentPeer, Commit, Output, TenantPeer
from controller.store import Store
from controller.types import Member, Placement
from harmonaize import messages as m
from tests.controller.test_core_with_outbox import (
    HOST,
    TENANT,
    WALL,
    agent_frame,
    config,
    hello,
    pool_sends,
    tenant_frame,
)

pytestmark = pytest.mark.tenant


def stored(store: Store, outputs: list[Output]) -> list[Output]:
    for out in outputs:
        if isinstance(out, Commit):
            store.commit(out.writes)
    return outputs


def summary(healthy: int) -> m.HostSummary:
    return m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=healthy))


def test_pool_revisions_go_on_after_a_restart(tmp_path: Path) -> None:
    cfg = config(redaction={"mode": "redacted"})
    store = Store(tmp_path / "c.db")
    core = ControllerCore(cfg, 0.0, store.restored())
    core.receive(TenantPeer(b"t1", TENANT), tenant_frame(m.Subscribe(("pool/",))), 0.0)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(summary(8), 1), 0.0)
    first = pool_sends(stored(store, core.tick(0.0, WALL)))
    core.receive(AgentPeer(b"c1", HOST), agent_frame(summary(2), 2, 1.0), 1.0)
    second = pool_sends(stored(store, core.tick(1.0, WALL + 1)))
    assert [p.revision for p in first + second] == [1, 2]  # type: ignore[attr-defined]
    store.close()
    store = Store(tmp_path / "c.db")
    core = ControllerCore(cfg, 0.0, store.restored())
    core.receive(TenantPeer(b"t2", TENANT), tenant_frame(m.Subscribe(("pool/",))), 0.0)
    core.receive(AgentPeer(b"c2", HOST), agent_frame(hello(acked=2), 0, 2.0), 2.0)
    # The same capacity again after the restart: nothing new, so nothing published.
    core.receive(AgentPeer(b"c2", HOST), agent_frame(summary(2), 3, 2.0), 2.0)
    assert pool_sends(stored(store, core.tick(2.0, WALL + 2))) == []
    core.receive(AgentPeer(b"c2", HOST), agent_frame(summary(8), 4, 3.0), 3.0)
    (third,) = pool_sends(stored(store, core.tick(3.0, WALL + 3)))
    assert third.revision == 3 and third.gpus_available.lo == 8  # type: ignore[attr-defined]
    store.close()


V3_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value ANY) STRICT;
CREATE TABLE feed_topics (topic TEXT PRIMARY KEY, seq INTEGER NOT NULL) STRICT;
CREATE TABLE feed_log (topic TEXT NOT NULL, seq INTEGER NOT NULL, condition INTEGER NOT NULL,
    frame BLOB NOT NULL, PRIMARY KEY (topic, seq)) STRICT, WITHOUT ROWID;
INSERT INTO meta VALUES ('schema_version', 3), ('feed_epoch', 77);
INSERT INTO feed_topics VALUES ('pool/p/H200', 2);
INSERT INTO feed_log VALUES ('pool/p/H200', 1, 1, x'00'), ('pool/p/H200', 2, 1, x'01');
"""


def test_a_database_of_the_version_before_gains_the_streams(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(V3_SCHEMA)
    store = Store(path)
    assert store.get_meta("schema_version") == 4 and store.feed_epoch == 77
    # What was stored before offsets lies before every cursor: numbered 0, in no stream.
    assert store.latest_conditions() == {"pool/p/H200": (2, b"\x01", 0)}
    assert store.replay_stream("pool", 0, 10) == []
    store.close()


def test_a_resume_reads_a_stream_in_order_and_says_what_was_pruned(tmp_path: Path) -> None:
    cfg = config()
    store = Store(tmp_path / "c.db")
    core = ControllerCore(cfg, 0.0, store.restored())
    stored(store, core.place(Placement("job-a", TENANT, (Member("0", HOST),)), 0.0, WALL))
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    stored(store, core.tick(0.0, WALL))
    for seq in range(1, 8):
        advice = m.JobAdvisory("job-a", m.Advice.CHECKPOINT_NOW, "thermal",
                               m.Urgency.ELEVATED, ("0",))
        core.receive(AgentPeer(b"c1", HOST), agent_frame(advice, seq, seq), float(seq))
        stored(store, core.tick(float(seq), WALL + seq))
    stream = f"job/{TENANT}"
    rows = store.replay_stream(stream, 0, 100)
    offsets = [offset for _, _, _, offset in rows]
    assert offsets == list(range(1, len(rows) + 1))  # a stream has no holes either
    assert {topic for topic, _, _, _ in rows} == {f"job/{TENANT}/job-a/"}
    assert store.replay_stream("pool", 0, 100) == []  # nothing of the job's in the pools'
    assert store.replay_stream(stream, offsets[2], 2) == rows[3:5]
    assert store.lost_after(stream, 0) == []
    store.prune_feed(keep=3)
    # Pruned: a cursor from before the cut lost something, one after it did not.
    assert store.lost_after(stream, 0) == [f"job/{TENANT}/job-a/"]
    assert store.lost_after(stream, offsets[-3]) == []
    assert [o for *_, o in store.replay_stream(stream, 0, 100)] == offsets[-3:]
    assert store.load_feed_offsets() == {stream: offsets[-1]}
    store.close()


def test_a_resume_from_before_what_is_retained_is_told_what_is_left() -> None:
    core = ControllerCore(config(feed={"retention": 3}), 0.0)
    core.place(Placement("job-a", TENANT, (Member("0", HOST),)), 0.0, WALL)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    core.tick(0.0, WALL)
    for seq in range(1, 11):
        advice = m.JobAdvisory("job-a", m.Advice.CHECKPOINT_NOW, "thermal",
                               m.Urgency.ELEVATED, ("0",))
        core.receive(AgentPeer(b"c1", HOST), agent_frame(advice, seq, seq), float(seq))
        core.tick(float(seq), WALL + seq)
    topic = f"job/{TENANT}/job-a/"
    newest = core.feed.seqs[topic]

    def answer(since: int) -> m.Subscribed:
        out = core.receive(TenantPeer(b"t1", TENANT), tenant_frame(m.Subscribe(
            ("job/alpha/",), (m.Position(topic, since),))), 20.0)
        return out[0].message  # type: ignore[attr-defined]

    assert answer(2).oldest == (m.Position(topic, newest - 2),)  # 2 < newest-3: lost
    assert answer(newest - 3).oldest == ()  # exactly what is retained: nothing lost
    assert answer(newest).oldest == ()
