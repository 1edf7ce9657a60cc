"""Policy files, their directories and modes, and the Python side that writes and reads them."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.plugin.layout import (
    POLICY_SIZE,
    U64_MAX,
    Algo,
    Coll,
    CommEntry,
    Held,
    Policy,
    Pref,
    Proto,
    Rule,
    Verdict,
    apply,
    decode_policy,
    encode_policy,
    evaluate,
    validate_job,
)
from agent.plugin.shm import PolicyFile, policy_path, prepare_dirs, prepare_job_dir, read_policy
from tests.plugin.test_tuner_abi import (
    BROKEN,
    COMM,
    JOB,
    TREE_SIMPLE,
    broken_image,
    listed,
    nccl_table,
    opened,
    table_bytes,
)

pytestmark = pytest.mark.tuning


# ---- Files, modes and the Python side. ----


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Policy(0, (CommEntry(1), CommEntry(1))), "listed twice"),
    (lambda: Policy(0, (CommEntry(1, before=0),)), "names ruleset 0"),
    (lambda: Policy(0, rulesets=((),) * 17), "at most 16 rulesets"),
    (lambda: Rule(prefs=(Pref(),) * 5), "at most 4 preferences"),
    (lambda: Rule(min_bytes=2, max_bytes=1), "exceeds max_bytes"),
    (lambda: CommEntry(-1), "comm_id"),
    (lambda: CommEntry(1, revision=2**32), "revision"),
])
def test_policy_validation(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_validate_job():
    assert validate_job("a.b:c@d+e-f_") == "a.b:c@d+e-f_"
    for bad in ("", ".", "..", "a/b", "x" * 129, "sp ace"):
        with pytest.raises(ValueError):
            validate_job(bad)


def test_directories_and_modes(workdir):
    if os.geteuid() != 0:
        pytest.skip("needs root for ownership")
    directory = workdir / "tuner"
    prepare_dirs(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o711
    folder = prepare_job_dir(directory, JOB, 4321)
    info = folder.stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o1770, 0, 4321)
    with PolicyFile(policy_path(directory, JOB)) as handle:
        handle.write(listed(COMM, None, 0, 0, TREE_SIMPLE))
    info = policy_path(directory, JOB).stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o640, 0, 4321)
    root_only = prepare_job_dir(directory, "other", None)
    assert stat.S_IMODE(root_only.stat().st_mode) == 0o700


def test_read_policy_rejects_what_the_plugin_rejects(tuner_dir):
    path = policy_path(tuner_dir, JOB)
    for case in BROKEN:
        image = broken_image(case)
        if image is None or len(image) < POLICY_SIZE or case == "odd seq":
            continue
        path.write_bytes(image)
        with pytest.raises(ValueError):
            read_policy(path, attempts=2)


@st.composite
def rules_st(draw: st.DrawFn) -> Rule:
    low = draw(st.integers(0, 1 << 30))
    return Rule(frozenset(draw(st.sets(st.sampled_from(list(Coll)), max_size=3))), low,
                draw(st.integers(low, U64_MAX)),
                tuple(draw(st.lists(st.builds(Pref, st.one_of(st.none(), st.sampled_from(
                    list(Algo))), st.one_of(st.none(), st.sampled_from(list(Proto)))),
                    max_size=4))), draw(st.integers(0, 128)))


@st.composite
def policies_st(draw: st.DrawFn) -> Policy:
    sets = draw(st.lists(st.lists(rules_st(), max_size=3).map(tuple), max_size=3))
    comms = []
    for i in range(draw(st.integers(0, 3))):
        pick = st.one_of(st.none(), st.integers(0, len(sets) - 1)) if sets else st.none()
        comms.append(CommEntry(COMM + i, draw(st.integers(0, 1 << 40)), draw(pick), draw(pick),
                               draw(st.integers(0, 2**32 - 1)), draw(st.booleans())))
    return Policy(draw(st.integers(0, 2**32 - 1)), tuple(comms), tuple(sets))


@settings(max_examples=200, deadline=None)
@given(policy=policies_st())
def test_encode_decode_round_trip(policy):
    assert decode_policy(encode_policy(policy)) == policy


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=policies_st(), calls=st.lists(st.tuples(
    st.sampled_from(list(Coll)), st.integers(0, 1 << 34), st.sampled_from([0, 2, 8, 64])),
    min_size=1, max_size=6))
def test_table_matches_reference(lib, tmp_path_factory, policy, calls):
    """For a fresh context that takes the policy at once, every answer is layout.apply's."""
    directory = tmp_path_factory.mktemp("apply")
    prepare_job_dir(directory, JOB, None)
    # Only entries the fresh context takes at collective 0 without waiting.
    comms = tuple(c for c in policy.comms if not c.pending)
    policy = Policy(policy.policy_id, comms, policy.rulesets)
    with PolicyFile(policy_path(directory, JOB)) as handle:
        handle.write(policy)
    for entry in policy.comms or (CommEntry(COMM),):
        with opened(lib, 5, directory, comm_id=entry.comm_id) as ctx:
            view = policy.view(entry.comm_id)
            for i, (coll, nbytes, given_channels) in enumerate(calls):
                if evaluate(Held(), view, 0)[0] is not Verdict.ACCEPT:
                    break
                out, channels = ctx.call(coll, nbytes, nccl_table(), given_channels)
                want, _ = apply(policy, entry.comm_id, i, coll, nbytes, nccl_table(),
                                given_channels)
                assert table_bytes(out) == table_bytes(want)
                assert channels == given_channels  # no capping NCCL in this process
