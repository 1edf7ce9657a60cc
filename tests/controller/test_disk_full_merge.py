"""Issue 28, item 6: what the controller keeps while its disk is full is stored, once
there is room, exactly as the batches one by one would have been.

While paused, the writer merges the batches that found no room into one (so memory
stays bounded by hosts, jobs and messages, not by time). A property over real SQLite
files: storing the merge gives the same tables as storing each batch in turn."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.cluster import HostRecord, StoredEvent
from controller.notices import Notice
from controller.outputs import FeedEntry, Writes
from controller.store import Store
from controller.types import Member, Placement
from controller.writeback import merged
from harmonaize import messages as m

pytestmark = pytest.mark.hardening

HOSTS = st.sampled_from(["h1", "h2", "h3"])
JOBS = st.sampled_from(["job-a", "job-b"])
TOPICS = st.sampled_from(["pool/p/H200", "job/acme/job-a/"])

hosts = st.builds(HostRecord, HOSTS, st.sampled_from(["p", "q"]), st.just("H200"),
                  st.integers(0, 8), alive=st.booleans(), last_seq=st.integers(0, 99))
events = st.builds(StoredEvent, HOSTS, st.integers(1, 3), st.integers(1, 99),
                   st.floats(0, 1e6), st.builds(m.HostEvent, st.just("r"),
                                                st.sampled_from(list(m.Severity))))
feed_log = st.builds(FeedEntry, TOPICS, st.integers(1, 20), st.booleans(),
                     st.binary(max_size=8), st.just("s"), st.integers(1, 99))
declarations = st.one_of(st.none(), st.builds(
    lambda job, rev: ("acme", m.JobDeclaration(job, revision=rev)), JOBS, st.integers(1, 9)))
placements = st.one_of(st.none(), st.builds(
    lambda job, host, gen: Placement(job, "acme", (Member("0", host),), "", gen),
    JOBS, HOSTS, st.integers(0, 3)))
notices = st.one_of(st.none(), st.builds(
    lambda i, approved: Notice(f"vn-{i}", "acme", "job-a", "h1", f"plan-{i}",
                               approved=approved), st.integers(0, 3), st.booleans()))


def _writes(job_key: st.SearchStrategy[str]) -> st.SearchStrategy[Writes]:
    return st.builds(
        Writes, hosts=st.lists(hosts, max_size=3).map(tuple),
        events=st.lists(events, max_size=3).map(tuple),
        feed_seqs=st.dictionaries(TOPICS, st.integers(1, 20), max_size=2),
        feed_log=st.lists(feed_log, max_size=3).map(tuple),
        feed_offsets=st.dictionaries(st.just("s"), st.integers(1, 99), max_size=1),
        declarations=st.dictionaries(job_key, declarations, max_size=2),
        placements=st.dictionaries(job_key, placements, max_size=2),
        tuning=st.dictionaries(job_key, st.one_of(st.none(), st.fixed_dictionaries(
            {"decision": st.integers(0, 9)})), max_size=2),
        notices=st.dictionaries(st.sampled_from(["vn-0", "vn-1", "vn-2", "vn-3"]), notices,
                                max_size=2))


def _consistent(batch: Writes) -> Writes:
    """A notice's key is its id, a declaration's and placement's their job's."""
    return Writes(
        batch.hosts, batch.events, batch.feed_seqs, batch.feed_log, batch.feed_offsets,
        {j: (d if d is None else (d[0], m.JobDeclaration(j, revision=d[1].revision)))
         for j, d in batch.declarations.items()},
        {j: (p if p is None else Placement(j, p.tenant, p.members, p.group, p.generation))
         for j, p in batch.placements.items()},
        batch.tuning,
        {i: (n if n is None else Notice(i, n.tenant, n.job, n.host, n.plan,
                                        approved=n.approved)) for i, n in batch.notices.items()})


TABLES = ("hosts", "placements", "feed_topics", "feed_log", "feed_streams", "declarations",
          "tuning", "notices", "host_events")


def _tables(path: Path) -> dict[str, list[tuple]]:
    db = sqlite3.connect(path)
    try:
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in TABLES}
    finally:
        db.close()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(_writes(JOBS).map(_consistent), min_size=1, max_size=5))
def test_full_disk_merged_batches_store_what_each_batch_in_turn_would(
        batches: list[Writes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        one_by_one, at_once = Store(Path(tmp) / "a.db"), Store(Path(tmp) / "b.db")
        try:
            for batch in batches:
                one_by_one.commit(batch)
            kept = batches[0]
            for batch in batches[1:]:
                kept = merged(kept, batch)
            at_once.commit(kept)
        finally:
            one_by_one.close()
            at_once.close()
        assert _tables(Path(tmp) / "a.db") == _tables(Path(tmp) / "b.db")
