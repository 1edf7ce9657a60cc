"""Choices derived from declarations: identical on every host, never outside the ranges."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.plugin.layout import Algo, Coll, Proto, apply, decode_policy, encode_policy
from agent.tuning import nextlaunch
from agent.tuning.loop import Entry, build_policy
from agent.tuning.policies import (
    BANDWIDTH_BOUND,
    CHOICE_NAMES,
    choice_name,
    derive,
    severity_of,
)
from harmonaize.messages import (
    Algorithm,
    BulkTraffic,
    Collective,
    JobDeclaration,
    Protocol,
    TuningRange,
)
from harmonaize.schema import SchemaError, from_plain, to_plain

pytestmark = pytest.mark.tuning

COLLS = {Collective.BROADCAST: Coll.BROADCAST, Collective.REDUCE: Coll.REDUCE,
         Collective.ALLGATHER: Coll.ALL_GATHER, Collective.REDUCESCATTER: Coll.REDUCE_SCATTER,
         Collective.ALLREDUCE: Coll.ALL_REDUCE}
ALGOS = {a: Algo[a.name] for a in Algorithm}
PROTOS = {p: Proto[p.name] for p in Protocol}


def subset(values):
    return st.lists(st.sampled_from(list(values)), min_size=1, max_size=len(values),
                    unique=True).map(tuple)


@st.composite
def ranges(draw):
    low = draw(st.sampled_from([0, 1, 4096, BANDWIDTH_BOUND - 1, BANDWIDTH_BOUND, 1 << 24,
                                1 << 30]))
    high = draw(st.integers(low + 1, 2**62))
    min_channels = draw(st.integers(1, 64))
    return TuningRange(draw(subset(Collective)), draw(subset(Algorithm)),
                       draw(subset(Protocol)), low, high, min_channels,
                       draw(st.integers(min_channels, 64)))


declarations = st.builds(
    JobDeclaration, job=st.sampled_from(["job-1", "train.7", "a:b@c"]),
    tuning=st.lists(ranges(), max_size=32).map(tuple), revision=st.integers(0, 10))


def example() -> JobDeclaration:
    return JobDeclaration("job-1", tuning=(
        TuningRange((Collective.ALLREDUCE, Collective.REDUCESCATTER),
                    (Algorithm.RING, Algorithm.TREE),
                    (Protocol.LL, Protocol.LL128, Protocol.SIMPLE), 0, 1 << 40, 2, 16),
        TuningRange((Collective.ALLGATHER,), (Algorithm.RING,), (Protocol.LL,), 0, 1 << 16),
    ), bulk=BulkTraffic(100.0, (5202,), (8,)), revision=3)


def test_the_example_declaration_gives_three_choices_with_these_rules() -> None:
    derivation = derive(example())
    assert [c.name for c in derivation.choices] == list(CHOICE_NAMES)
    assert derivation.choices[0].rules == ()
    congested, severe = derivation.choices[1].rules, derivation.choices[2].rules
    (rule,) = congested
    assert rule.colls == {Coll.ALL_REDUCE, Coll.REDUCE_SCATTER}
    assert (rule.min_bytes, rule.max_bytes) == (BANDWIDTH_BOUND, (1 << 40) - 1)
    # Least wire overhead first, the tenant's algorithm order within each protocol.
    assert [(p.algo, p.proto) for p in rule.prefs] == [
        (Algo.RING, Proto.SIMPLE), (Algo.TREE, Proto.SIMPLE),
        (Algo.RING, Proto.LL128), (Algo.TREE, Proto.LL128)]
    assert rule.max_channels == 8 and severe[0].max_channels == 4
    # The allgather band is latency-bound throughout: left to NCCL, and said so.
    assert any("range 1" in note for note in derivation.notes)


def test_derivation_is_byte_identical_across_hosts_and_the_wire() -> None:
    declaration = example()
    # What a second host gets: the declaration after a JSON (or msgpack) round trip.
    received = from_plain(JobDeclaration, json.loads(json.dumps(to_plain(declaration))))
    one, two = derive(declaration), derive(received)
    assert one == two and one.fingerprint == two.fingerprint
    for a, b in zip(one.choices, two.choices, strict=True):
        entry_a = Entry(7, 100, "default", a.name, (), a.rules)
        entry_b = Entry(7, 100, "default", b.name, (), b.rules)
        assert encode_policy(build_policy([entry_a], 1)) == \
            encode_policy(build_policy([entry_b], 1))


def test_a_different_declaration_has_a_different_fingerprint() -> None:
    declaration = example()
    narrower = JobDeclaration(declaration.job, tuning=(
        TuningRange((Collective.ALLREDUCE,), (Algorithm.RING,), (Protocol.SIMPLE,), 0, 1 << 40,
                    2, 16),), revision=4)
    assert derive(declaration).fingerprint != derive(narrower).fingerprint


def test_all_algorithms_declared_lets_nccl_pick_among_them() -> None:
    declaration = JobDeclaration("j", tuning=(TuningRange(
        (Collective.ALLREDUCE,), tuple(Algorithm), (Protocol.SIMPLE,)),))
    (rule,) = derive(declaration).get("congested").rules
    assert [(p.algo, p.proto) for p in rule.prefs] == [(None, Proto.SIMPLE)]


def test_choice_names_and_severities() -> None:
    assert [severity_of(choice_name(s)) for s in range(3)] == [0, 1, 2]
    assert choice_name(7) == "severe"
    with pytest.raises(ValueError, match="unknown choice"):
        severity_of("turbo")


def test_an_invalid_declaration_is_rejected_with_the_field_named() -> None:
    bad = to_plain(example())
    bad["tuning"][0]["max_channels"] = 65
    with pytest.raises(SchemaError, match=r"tuning\[0\]\.max_channels"):
        from_plain(JobDeclaration, bad, "declaration")
    bad = to_plain(example())
    bad["tuning"][0]["algorithms"] = ["ring", "warp"]
    with pytest.raises(SchemaError, match=r"tuning\[0\]\.algorithms\[1\]"):
        from_plain(JobDeclaration, bad, "declaration")


@settings(max_examples=300, deadline=None)
@given(declarations)
def test_rules_never_leave_the_declared_ranges(declaration: JobDeclaration) -> None:
    derivation = derive(declaration)
    assert derivation == derive(declaration)
    bandwidth_bound = [band for band in declaration.tuning
                       if max(band.min_bytes, BANDWIDTH_BOUND) <= band.max_bytes - 1][:16]
    for choice in derivation.choices[1:]:
        assert len(choice.rules) == len(bandwidth_bound)
        for rule, band in zip(choice.rules, bandwidth_bound, strict=True):
            assert rule.colls == {COLLS[c] for c in band.collectives}
            assert band.min_bytes <= rule.min_bytes and rule.max_bytes < band.max_bytes
            assert rule.min_bytes >= BANDWIDTH_BOUND
            assert band.min_channels <= rule.max_channels <= band.max_channels
            all_algorithms = set(band.algorithms) == set(Algorithm)
            for pref in rule.prefs:
                assert pref.proto in {PROTOS[p] for p in band.protocols}
                assert (pref.algo is None and all_algorithms) or \
                    pref.algo in {ALGOS[a] for a in band.algorithms}
    congested, severe = derivation.choices[1].rules, derivation.choices[2].rules
    assert all(s.max_channels <= c.max_channels for c, s in zip(congested, severe, strict=True))
    # What the plugin reads back is exactly what was derived.
    entries = [Entry(i + 1, 10, "default", c.name, (), c.rules)
               for i, c in enumerate(derivation.choices)]
    policy = build_policy(entries, 1)
    assert decode_policy(encode_policy(policy)) == policy


cost = st.one_of(st.just(-1.0), st.floats(0.0, 1e6, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(declarations, st.lists(st.lists(cost, min_size=3, max_size=3), min_size=7, max_size=7),
       st.sampled_from(list(Coll)), st.integers(0, 2**40), st.integers(0, 64))
def test_the_plugin_only_ever_picks_a_declared_entry(declaration, table, coll, nbytes,
                                                     channels) -> None:
    """Through the plugin's own semantics (layout.apply, checked against the C code by
    test_tuner_plugin): whatever the table, a choice either leaves NCCL's decision
    alone or points it at an algorithm/protocol the tenant allowed for that
    collective and size, with channels inside the declared range."""
    derivation = derive(declaration)
    for choice in derivation.choices:
        entry = Entry(1, 0, "default", choice.name, (), choice.rules)
        policy = build_policy([entry], 1)
        out, n = apply(policy, 1, 5, coll, nbytes, table, channels)
        zeroed = [(a, p) for a in range(7) for p in range(3)
                  if out[a][p] == 0.0 and table[a][p] != 0.0]
        bands = [b for b in declaration.tuning
                 if any(COLLS[c] == coll for c in b.collectives)
                 and b.min_bytes <= nbytes < b.max_bytes]
        for a, p in zeroed:
            assert table[a][p] >= 0  # never an entry NCCL disabled
            assert any(Algo(a) in {ALGOS[x] for x in b.algorithms}
                       and Proto(p) in {PROTOS[x] for x in b.protocols} for b in bands)
        if n != channels:
            assert any(b.min_channels <= n <= b.max_channels for b in bands)
            assert channels == 0 or n < channels


@settings(max_examples=200, deadline=None)
@given(declarations, st.floats(0.0, 1.0), st.booleans(), st.integers(-1, 255))
def test_next_launch_values_stay_inside_the_declaration(declaration, share, lossy,
                                                        traffic_class) -> None:
    seen = nextlaunch.Experience(share, lossy, 100.0)
    values = nextlaunch.recommend(declaration, seen, ib_traffic_class=traffic_class)
    text = nextlaunch.render(declaration.job, values, seen)
    parsed = nextlaunch.parse(text)
    assert parsed == {k: v for k, (v, _) in values.items()}
    assert all(name.startswith("NCCL_") for name in parsed)
    # NCCL has no comments: every line is NAME=value, or has no '=' at all.
    for line in text.splitlines():
        assert line.startswith("#") != ("=" in line)
    for name in ("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS"):
        if name in parsed:
            big = [b for b in declaration.tuning if b.max_bytes > BANDWIDTH_BOUND]
            assert all(b.min_channels <= int(parsed[name]) <= b.max_channels for b in big)
    assert ("NCCL_IB_TC" in parsed) == (traffic_class >= 0)
    assert ("NCCL_SOCKET_NTHREADS" in parsed) == lossy
    if "NCCL_SOCKET_NTHREADS" in parsed:
        assert int(parsed["NCCL_SOCKET_NTHREADS"]) * int(parsed["NCCL_NSOCKS_PERTHREAD"]) <= 64


def test_calm_jobs_get_no_congestion_recommendations() -> None:
    values = nextlaunch.recommend(example(), nextlaunch.Experience(0.05, False, 600.0))
    assert values == {}
