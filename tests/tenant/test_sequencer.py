"""The tenant client's delivery rules apart from its socket (harmonaize/tenant/sequencer.py):
each topic in order, once; a gap held, asked for again and skipped (and counted) when it
makes no progress; a condition delivered when its content changes. Time is passed in."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harmonaize.messages import (
    Advice,
    Bucket,
    JobAdvisory,
    PoolCapacity,
    Position,
    Trend,
    Urgency,
)
from harmonaize.tenant.sequencer import GAP_RETRY, FeedMessage, FeedStats, Sequencer

pytestmark = [pytest.mark.tenant, pytest.mark.architecture]

TOPIC = "job/acme/j1/"


class Asks:
    """What the sequencer asked the controller for: (now, {topic: after seq})."""

    def __init__(self) -> None:
        self.made: list[tuple[float, dict[str, int]]] = []

    def __call__(self, now: float, since: Mapping[str, int]) -> None:
        self.made.append((now, dict(since)))


def advisory(seq: int, topic: str = TOPIC) -> FeedMessage:
    body = JobAdvisory("j1", Advice.CHECKPOINT_NOW, "gpu-failure", Urgency.HIGH, (str(seq),))
    return FeedMessage(topic, seq, 0.0, body)


def capacity(seq: int, hosts: int) -> FeedMessage:
    body = PoolCapacity("p", "h100", Bucket(hosts, hosts), Bucket(0, 0), Bucket(0, 0),
                        Trend.STEADY, revision=hosts)
    return FeedMessage("pool/p/h100", seq, 0.0, body)


def sequencer(resume: Mapping[str, int] | None = None, gap_timeout: float = 2.0
              ) -> tuple[Sequencer, Asks]:
    asks = Asks()
    return Sequencer(FeedStats(), asks, resume=resume, skip_repeated_conditions=True,
                     gap_timeout=gap_timeout), asks


def delivered(seq: Sequencer) -> list[int]:
    out = [m.seq for m in seq.ready]
    seq.ready.clear()
    return out


def test_a_gap_is_held_asked_for_and_filled_in_order() -> None:
    seq, asks = sequencer(resume={TOPIC: 1})
    seq.arrived(advisory(2), 10.0)
    seq.arrived(advisory(4), 10.1)  # 3 is missing
    assert delivered(seq) == [2]
    assert asks.made == [(10.1, {TOPIC: 2})]
    seq.housekeeping(10.1 + GAP_RETRY)  # still missing: asked again
    assert asks.made[-1] == (10.1 + GAP_RETRY, {TOPIC: 2})
    seq.arrived(advisory(3), 10.8)
    assert delivered(seq) == [3, 4]
    assert (seq.stats.recovered, seq.stats.gaps) == (1, 0)
    assert seq.positions == {TOPIC: 4}


def test_a_gap_without_progress_is_skipped_and_counted_after_the_timeout() -> None:
    seq, _ = sequencer(resume={TOPIC: 1}, gap_timeout=2.0)
    seq.arrived(advisory(5), 0.0)
    seq.housekeeping(1.9)
    assert delivered(seq) == [] and seq.stats.gaps == 0
    seq.housekeeping(2.0)
    assert delivered(seq) == [5]
    assert seq.stats.gaps == 1 and seq.positions == {TOPIC: 5}
    assert seq.wakes(2.0) == []  # nothing open any more


def test_a_condition_is_delivered_when_its_content_changes_and_duplicates_are_counted() -> None:
    seq, _ = sequencer()
    seq.arrived(capacity(1, 3), 0.0)
    seq.arrived(capacity(2, 3), 0.0)  # the same content again
    seq.arrived(capacity(3, 4), 0.0)
    assert delivered(seq) == [1, 3]
    assert seq.stats.repeated_conditions == 1
    seq.arrived(advisory(1), 0.0)
    seq.arrived(advisory(1), 0.0)  # an event sent twice
    assert delivered(seq) == [1] and seq.stats.duplicates == 1


def test_what_was_lost_for_good_is_counted_and_the_topic_goes_on_from_what_is_retained() -> None:
    seq, _ = sequencer(resume={TOPIC: 2})
    seq.lost_before([Position(TOPIC, 10)], 0.0)
    assert seq.stats.gaps == 1 and seq.positions == {TOPIC: 9}
    seq.learn([Position("job/acme/j2/", 7)])  # new to us: the present, not the past
    assert seq.positions["job/acme/j2/"] == 7
    seq.reset()  # the feed begun anew: every topic from the start
    assert set(seq.positions.values()) == {0} and seq.stats.resets == 1


@given(st.permutations(list(range(1, 13))), st.lists(st.integers(1, 12), max_size=6))
def test_any_arrival_order_with_repeats_delivers_each_message_once_in_order(
        order: list[int], repeats: list[int]) -> None:
    seq, _ = sequencer(resume={TOPIC: 0})
    for n, number in enumerate([*order, *repeats]):
        seq.arrived(advisory(number), n * 0.01)  # all within the gap timeout
    assert delivered(seq) == list(range(1, 13))
    assert seq.stats.gaps == 0 and seq.positions == {TOPIC: 12}


def test_a_topic_new_to_the_client_starts_at_its_first_message() -> None:
    seq, asks = sequencer()
    seq.arrived(advisory(5), 0.0)
    assert delivered(seq) == [5] and asks.made == []
    assert seq.positions == {TOPIC: 5}


def test_progress_behind_a_gap_starts_its_clock_again() -> None:
    seq, asks = sequencer(resume={TOPIC: 1}, gap_timeout=2.0)
    seq.arrived(advisory(3), 0.0)
    seq.arrived(advisory(5), 0.0)  # two holes: 2 and 4
    assert seq.wakes(0.0) == [GAP_RETRY]  # asked again before the timeout
    seq.arrived(advisory(2), 1.5)  # progress: 2 and 3 go out, 4 still missing
    assert delivered(seq) == [2, 3]
    assert seq.wakes(1.5) == [GAP_RETRY - 1.5]  # last asked at 0.0: overdue
    seq.housekeeping(3.0)  # 1.5 s since the progress: asked again, not yet skipped
    assert delivered(seq) == [] and seq.stats.gaps == 0
    assert asks.made[-1] == (3.0, {TOPIC: 3})
    seq.housekeeping(3.5)  # 2 s without progress: 4 is skipped, 5 delivered
    assert delivered(seq) == [5] and seq.stats.gaps == 1 and seq.stats.recovered == 0
    assert asks.made[0] == (0.0, {TOPIC: 1})


def test_a_skipped_gap_delivers_up_to_the_next_hole_only() -> None:
    seq, _ = sequencer(resume={TOPIC: 1}, gap_timeout=1.0)
    seq.arrived(advisory(4), 0.0)
    seq.arrived(advisory(6), 0.0)
    seq.housekeeping(1.0)  # skip 2-3: 4 goes out; 5 is another hole, its clock from now
    assert delivered(seq) == [4] and seq.positions == {TOPIC: 4}
    assert seq.topics[TOPIC].gap_since is None  # skipped: a new hole is found on arrival
    seq.arrived(advisory(5), 1.2)
    assert delivered(seq) == [5, 6] and seq.stats.recovered == 0


def test_what_is_already_known_is_neither_relearnt_nor_counted_lost() -> None:
    seq, _ = sequencer(resume={TOPIC: 9})
    seq.learn([Position(TOPIC, 3)])
    assert seq.positions == {TOPIC: 9}
    seq.lost_before([Position(TOPIC, 10), Position("job/acme/other/", 50)], 0.0)
    assert seq.stats.gaps == 0 and seq.positions == {TOPIC: 9}
    seq.lost_before([Position(TOPIC, 11)], 0.0)  # 10 is gone
    assert seq.stats.gaps == 1 and seq.positions == {TOPIC: 10}


def test_a_loss_releases_what_was_held_behind_it() -> None:
    seq, _ = sequencer(resume={TOPIC: 1})
    seq.arrived(advisory(6), 0.0)
    seq.arrived(advisory(7), 0.0)
    seq.lost_before([Position(TOPIC, 6)], 0.5)  # 2-5 no longer retained
    assert delivered(seq) == [6, 7] and seq.wakes(0.5) == []


def test_after_a_reset_the_feed_is_taken_again_from_its_first_message() -> None:
    seq, _ = sequencer(resume={TOPIC: 40})
    seq.arrived(advisory(43), 0.0)  # held behind a gap
    seq.reset()
    assert seq.topics[TOPIC].held == {} and seq.wakes(0.0) == []
    seq.arrived(advisory(1), 0.1)
    assert delivered(seq) == [1]


def test_a_late_joiner_gets_the_present_condition_once_and_repeats_on_request() -> None:
    seq, _ = sequencer()
    seq.learn([Position("pool/p/h100", 5)])  # subscribed now: the present, not the past
    seq.arrived(capacity(3, 2), 0.0)  # the condition in force, never had: delivered
    seq.arrived(capacity(3, 2), 0.0)  # the same again: skipped
    assert delivered(seq) == [3] and seq.stats.repeated_conditions == 1
    keep, _ = sequencer(resume={"pool/p/h100": 5})
    keep.skip_repeated_conditions = False
    keep.arrived(capacity(6, 2), 0.0)
    keep.arrived(capacity(6, 2), 0.0)  # a republication, asked to be kept
    keep.arrived(capacity(7, 2), 0.0)
    assert delivered(keep) == [6, 6, 7] and keep.stats.repeated_conditions == 0


def test_every_topic_with_a_gap_is_looked_after_and_each_loss_counted() -> None:
    calm, held, late = "job/acme/a/", "job/acme/b/", "job/acme/c/"
    seq, asks = sequencer(resume={calm: 1, held: 1, late: 1}, gap_timeout=2.0)
    seq.arrived(advisory(2, calm), 0.0)  # in order: no gap on the first topic
    seq.arrived(advisory(4, held), 10.0)
    seq.arrived(advisory(4, late), 10.0)
    seq.housekeeping(10.1)  # asked at 10.0: not yet again
    assert len(asks.made) == 2
    seq.housekeeping(10.0 + GAP_RETRY)
    assert [since for _, since in asks.made[2:]] == [{held: 1}, {late: 1}]
    assert seq.wakes(10.0 + GAP_RETRY) == [GAP_RETRY, GAP_RETRY]
    seq.arrived(advisory(6, held), 11.5)  # no progress: the gap's clock runs on
    seq.housekeeping(12.0)
    assert seq.stats.gaps == 2 and seq.positions == {calm: 2, held: 4, late: 4}


def test_counters_count_every_occurrence() -> None:
    seq, _ = sequencer(resume={TOPIC: 1, "pool/p/h100": 5})
    for _ in range(2):
        seq.arrived(advisory(1), 0.0)  # duplicates
        seq.arrived(capacity(5, 2), 0.0)  # had before the restart: repeats
    assert (seq.stats.duplicates, seq.stats.repeated_conditions) == (2, 2)
    assert delivered(seq) == []
    seq.arrived(capacity(6, 2), 0.0)
    seq.arrived(capacity(7, 2), 0.0)  # the same content, newly numbered: skipped
    seq.arrived(capacity(8, 2), 0.0)
    assert delivered(seq) == [6] and seq.stats.repeated_conditions == 4
    for n in (3, 5):  # two gaps, each filled
        seq.arrived(advisory(n), 0.0)
        seq.arrived(advisory(n - 1), 0.1)
    assert seq.stats.recovered == 2 and seq.wakes(0.1) == []
    seq.lost_before([Position(TOPIC, 9)], 0.2)
    seq.lost_before([Position(TOPIC, 12)], 0.3)
    assert seq.stats.gaps == 2 and seq.stats.recovered == 2
    seq.reset()
    seq.reset()
    assert seq.stats.resets == 2
