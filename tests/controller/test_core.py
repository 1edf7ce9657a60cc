"""The controller's protocol core and aggregation (sans-I/O)."""

from __future__ import annotations

import pytest

from controller.cluster import Cluster, Down, HostRecord
from harmonaize import messages as m
from harmonaize.messages import Envelope

pytestmark = pytest.mark.foundation


def env(body: m.Message, sender: str = "h1", seq: int = 0) -> Envelope:
    return Envelope(body.KIND, sender, seq, 0.0, body)


def hello(epoch: int = 1, acked: int = 0, pool: str = "p") -> m.Hello:
    return m.Hello(pool=pool, gpu_class="H200", gpus=8, version="1", epoch=epoch, acked=acked,
                   heartbeat=1.0)


SUMMARY = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8))


def test_unbound_connections_are_asked_to_resync() -> None:
    cluster = Cluster()
    (reply,) = cluster.receive(b"c1", env(SUMMARY, seq=1), 0.0)
    assert isinstance(reply.body, m.Resync)
    assert cluster.counters["unbound"] == 1 and not cluster.hosts


def test_in_order_delivery_with_duplicates_and_gaps() -> None:
    cluster = Cluster()
    assert cluster.receive(b"c1", env(hello()), 0.0)[0].body == m.Ack(0)
    assert cluster.hosts["h1"].alive
    assert cluster.receive(b"c1", env(SUMMARY, seq=1), 0.1)[0].body == m.Ack(1)
    assert cluster.receive(b"c1", env(SUMMARY, seq=1), 0.2)[0].body == m.Ack(1)  # duplicate
    assert cluster.receive(b"c1", env(SUMMARY, seq=3), 0.3)[0].body == m.Ack(1)  # gap
    event = m.HostEvent("X", m.Severity.INFO)
    assert cluster.receive(b"c1", env(event, seq=2), 0.4)[0].body == m.Ack(2)
    assert cluster.counters["duplicate"] == 1 and cluster.counters["out_of_order"] == 1
    records, events = cluster.take_dirty()
    assert [r.host_id for r in records] == ["h1"]
    assert [(e.seq, e.body) for e in events] == [(2, event)]


def test_a_connection_cannot_speak_for_another_host() -> None:
    cluster = Cluster()
    cluster.receive(b"c1", env(hello()), 0.0)
    assert cluster.receive(b"c1", env(SUMMARY, sender="h2", seq=1), 0.0) == []
    assert cluster.receive(b"c1", env(hello(), sender="h2"), 0.0) == []
    assert cluster.counters["sender_mismatch"] == 2 and set(cluster.hosts) == {"h1"}


def test_a_restarted_agent_starts_a_new_epoch() -> None:
    cluster = Cluster()
    cluster.receive(b"c1", env(hello(epoch=1)), 0.0)
    cluster.receive(b"c1", env(SUMMARY, seq=1), 0.0)
    cluster.receive(b"c1", env(SUMMARY, seq=2), 0.0)
    # Same epoch on a new connection (the controller or network restarted): keep counting.
    assert cluster.receive(b"c2", env(hello(epoch=1)), 1.0)[0].body == m.Ack(2)
    assert cluster.receive(b"c1", env(SUMMARY, seq=3), 1.0)[0].body == m.Resync("say hello first")
    # New epoch: numbering restarts from what the agent says was acknowledged.
    assert cluster.receive(b"c3", env(hello(epoch=2, acked=0)), 2.0)[0].body == m.Ack(0)
    assert cluster.receive(b"c3", env(SUMMARY, seq=1), 2.0)[0].body == m.Ack(1)


def test_liveness_goodbye_and_silence() -> None:
    cluster = Cluster(missed_heartbeats=3)
    cluster.receive(b"a", env(hello(), sender="h1"), 0.0)
    cluster.receive(b"b", env(hello(), sender="h2"), 0.0)
    cluster.receive(b"a", env(m.Goodbye("bye"), sender="h1"), 1.0)
    assert not cluster.hosts["h1"].alive and cluster.hosts["h1"].down_reason == Down.STOPPED
    assert cluster.tick(2.9) == []
    cluster.receive(b"b", env(m.Heartbeat(1.0, 0), sender="h2"), 2.9)
    assert cluster.tick(5.8) == []
    assert cluster.tick(6.0) == ["h2"]
    assert cluster.hosts["h2"].down_reason == Down.SILENT
    cluster.receive(b"b", env(m.Heartbeat(1.0, 0), sender="h2"), 7.0)
    assert cluster.hosts["h2"].alive


def test_the_first_time_a_host_can_fall_silent_is_known() -> None:
    cluster = Cluster(missed_heartbeats=3)
    assert cluster.silent_from == float("inf")  # nobody up: nobody to count down
    cluster.receive(b"a", env(hello(), sender="h1"), 1.0)
    assert cluster.silent_from == 4.0
    slow = m.Hello(pool="p", gpu_class="H200", gpus=8, version="1", epoch=1, acked=0,
                   heartbeat=5.0)
    cluster.receive(b"b", env(slow, sender="h2"), 2.0)
    assert cluster.silent_from == 4.0  # h1 still comes first
    cluster.receive(b"a", env(m.Heartbeat(1.0, 0), sender="h1"), 3.0)
    # A lower bound: h1 spoke at 3.0, so its deadline moved, but the heap holds the one
    # it had (4.0) until a look after it, which puts it back at its deadline then.
    assert cluster.tick(3.0) == [] and cluster.silent_from == 4.0
    assert cluster.tick(4.5) == [] and cluster.silent_from == 6.0
    assert cluster.tick(6.0) == [] and cluster.silent_from == 6.0  # not yet past it
    assert cluster.tick(6.5) == ["h1"] and cluster.silent_from == 17.0
    cluster.receive(b"a", env(m.Heartbeat(1.0, 0), sender="h1"), 7.0)  # back up
    assert cluster.silent_from == 10.0
    cluster.receive(b"b", env(m.Goodbye("bye"), sender="h2"), 8.0)
    assert cluster.tick(8.0) == [] and cluster.silent_from == 10.0
    restored = Cluster(missed_heartbeats=2)
    restored.restore([HostRecord("h1", alive=True, heartbeat=1.5),
                      HostRecord("h2", alive=False, heartbeat=0.1)], now=50.0)
    assert restored.silent_from == 53.0


def test_restored_hosts_get_a_grace_period() -> None:
    cluster = Cluster(missed_heartbeats=3)
    cluster.restore([HostRecord("h1", alive=True, heartbeat=1.0)], now=100.0)
    assert cluster.tick(102.0) == []
    assert cluster.tick(103.5) == ["h1"]


def test_restored_hosts_views_carry_their_summary() -> None:
    cluster = Cluster()
    cluster.receive(b"c1", env(hello()), 0.0)
    cluster.receive(b"c1", env(SUMMARY, seq=1), 0.0)
    (view,) = cluster.views()
    assert (view.host_id, view.gpu_class, view.gpus.healthy, view.available) == (
        "h1", "H200", 8, True)
