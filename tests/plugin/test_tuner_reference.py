"""Which copy a rank follows: the plugin against the reference in layout.evaluate."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.plugin.layout import (
    U64_MAX,
    Algo,
    Coll,
    CommEntry,
    Held,
    Policy,
    Pref,
    Proto,
    ReferenceContext,
    Rule,
    Verdict,
    evaluate,
    ruleset_hash,
)
from agent.plugin.shm import PolicyFile, policy_path, prepare_job_dir, read_stats
from tests.plugin.test_tuner_abi import COMM, JOB, RING_LL128, TREE_SIMPLE, choice, opened

pytestmark = pytest.mark.tuning


# ---- Which copy a rank follows: the plugin against layout.evaluate. ----


@pytest.mark.parametrize(("held", "new", "n", "verdict"), [
    # A switch ahead of the rank, agreeing before it: taken.
    (Held(), Held(True, 100, 0, 7, 1), 10, Verdict.ACCEPT),
    # The same switch once the rank passed it: refused (it would change the past).
    (Held(), Held(True, 100, 0, 7, 1), 101, Verdict.REFUSE),
    # An empty policy (a restarted agent that lost its state) never undoes an entry.
    (Held(True, 100, 0, 7, 3), Held(), 50, Verdict.REFUSE),
    # An older revision never replaces a newer one.
    (Held(True, 100, 0, 7, 3), Held(True, 100, 0, 7, 2), 50, Verdict.REFUSE),
    # The same revision must be the same entry.
    (Held(True, 100, 0, 7, 3), Held(True, 200, 0, 7, 3), 50, Verdict.REFUSE),
    # Confirming or cancelling an armed change, even at its switching index.
    (Held(True, 100, 0, 7, 3, True), Held(True, 100, 0, 7, 4), 100, Verdict.ACCEPT),
    (Held(True, 100, 0, 7, 3, True), Held(True, 100, 0, 0, 4), 100, Verdict.ACCEPT),
    # A third outcome of an armed change is no outcome of it.
    (Held(True, 100, 0, 7, 3, True), Held(True, 100, 0, 9, 4), 100, Verdict.REFUSE),
    # The next change written before this rank passed its own switch: judged there.
    (Held(True, 100, 0, 7, 3), Held(True, 300, 7, 9, 4), 50, Verdict.DEFER),
    (Held(True, 100, 0, 7, 3), Held(True, 300, 7, 9, 4), 150, Verdict.ACCEPT),
])
def test_evaluate_cases(held, new, n, verdict):
    assert evaluate(held, new, n)[0] is verdict


POOL = (None, TREE_SIMPLE, RING_LL128,
        (Rule(frozenset({Coll.ALL_REDUCE}), 1 << 10, U64_MAX, (Pref(None, Proto.SIMPLE),)),))
ANSWERS = {0: None, ruleset_hash(TREE_SIMPLE): (Algo.TREE, Proto.SIMPLE),
           ruleset_hash(RING_LL128): (Algo.RING, Proto.LL128),
           ruleset_hash(POOL[3]): (Algo.NVLS, Proto.SIMPLE)}


@st.composite
def entry_writes(draw: st.DrawFn) -> list[tuple[str, object]]:
    """A schedule: writes of the communicator's entry (revisions mostly rising) and
    runs of collectives."""
    steps: list[tuple[str, object]] = []
    revision = 0
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            revision = max(0, revision + draw(st.sampled_from([1, 1, 1, 2, 0, -1])))
            listed_entry = draw(st.integers(0, 9)) > 0
            entry = None
            if listed_entry:
                entry = (draw(st.integers(0, 400)), draw(st.integers(0, 3)),
                         draw(st.integers(0, 3)), max(1, revision), draw(st.booleans()))
            steps.append(("write", entry))
        else:
            steps.append(("calls", draw(st.integers(1, 120))))
    return steps


def held_of(entry: tuple[int, int, int, int, bool] | None) -> Held:
    if entry is None:
        return Held()
    at, before, after, revision, pending = entry
    return Held(True, at, ruleset_hash(POOL[before] or ()), ruleset_hash(POOL[after] or ()),
                revision, pending)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=entry_writes())
def test_plugin_follows_the_reference(lib, tmp_path_factory, steps):
    directory = tmp_path_factory.mktemp("ref")
    prepare_job_dir(directory, JOB, None)
    sets = tuple(rules for rules in POOL[1:])  # ruleset i+1 of POOL is index i
    model = ReferenceContext()
    with PolicyFile(policy_path(directory, JOB)) as handle, \
            opened(lib, 5, directory) as ctx:
        for kind, arg in steps:
            if kind == "write":
                if arg is None:
                    handle.write(Policy(1, (), sets))
                else:
                    at, before, after, revision, pending = arg  # type: ignore[misc]
                    handle.write(Policy(1, (CommEntry(
                        COMM, at, None if before == 0 else before - 1,
                        None if after == 0 else after - 1, revision, pending),), sets))
                model.see(held_of(arg))  # type: ignore[arg-type]
                continue
            for _ in range(arg):  # type: ignore[arg-type]
                if model.would_wait():
                    break  # the plugin would wait here for an outcome: next write
                n = model.n
                expected = ANSWERS[model.call()]
                assert choice(ctx) == expected, f"collective {n}"
            [slot] = read_stats(directory, JOB)
            assert slot.revision == model.held.revision
            assert (slot.switches, slot.history) == (model.switches, model.history)
            assert slot.refused == (model.refused is not None)
