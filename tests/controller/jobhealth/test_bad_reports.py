"""Hosts' reports of ranks' progress and XIDs the controller must not believe: ranks
placed elsewhere, other tenants' jobs, unplaced jobs, XIDs that are no application's,
too many communicators, thousands of ranks. Each is dropped and counted, with one log
line, and the core keeps serving."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from controller.config import load
from controller.outputs import AgentPeer
from controller.types import Member, Placement
from harmonaize.config import ConfigError
from harmonaize.messages import ApplicationXid, JobRankProgress
from harmonaize.messages.jobhealth import Cause, CommProgress, Fault, Finding
from tests.controller.jobhealth.reports import progress, rank
from tests.controller.jobhealth.test_core_job_progress import TwoHosts
from tests.controller.test_core_with_outbox import JOB, WALL, agent_frame, hello

pytestmark = pytest.mark.jobhealth


def test_ranks_named_by_a_host_they_are_not_placed_on_are_dropped_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    run = TwoHosts()
    # h1 speaks for h2's ranks and for names that are no member at all.
    forged = progress(JOB, rank("2", 10), rank("3", 11), rank("10.1.2.3", 10), still_for=9.0)
    with caplog.at_level(logging.WARNING, "harmonaize.controller"):
        assert run.report("h1", forged, 1.0) == []
    assert run.core.jobhealth.reports == {}  # nothing of the job's own: no state
    assert run.core.jobhealth.counters["rank_not_placed_here"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "ranks' progress" in r.getMessage()]
    assert "rank not placed here" in line
    # Mixed: its own rank is kept, the other host's is not.
    run.report("h1", progress(JOB, rank("0", 10), rank("3", 10)), 2.0)
    (report,) = run.core.jobhealth.reports[(JOB, 7)].values()
    assert [r.rank for r in report.comm.ranks] == ["0"]


def test_reports_for_unplaced_jobs_and_other_tenants_jobs_are_not_kept() -> None:
    run = TwoHosts()
    run.core.place(Placement("job-b", "beta", (Member("0", "h2"),)), 1.0, WALL)
    assert run.report("h1", progress("job-b", rank("0", 3), still_for=50.0), 1.0) == []
    assert run.report("h1", progress("nobody", rank("0", 3), still_for=50.0), 1.0) == []
    board = run.core.jobhealth
    assert (board.counters["not_placed_here"], board.counters["unplaced"]) == (1, 1)
    assert board.reports == {}


def test_communicators_per_job_are_capped() -> None:
    run = TwoHosts(jobhealth={"comms_per_job": 2})
    comms = tuple(CommProgress(c, 4, 1, 5, 5, 0.0, Finding.MOVING, Cause.UNKNOWN,
                               (rank("0", 5),)) for c in (1, 2, 3))
    run.report("h1", JobRankProgress(JOB, comms), 1.0)
    assert sorted(k[1] for k in run.core.jobhealth.reports) == [1, 2]
    assert run.core.jobhealth.counters["too_many_comms"] == 1


def test_a_job_of_thousands_of_ranks_names_the_one_that_hangs_it() -> None:
    hosts = [f"h{i}" for i in range(8)]
    run = TwoHosts()
    for host in hosts[3:] + hosts[:1]:  # every host up first: its members are not lost
        run.seqs[host] = 0
        run.core.receive(AgentPeer(host.encode(), host), agent_frame(hello(), sender=host),
                         0.0)
    members = tuple(Member(str(r), hosts[r // 256]) for r in range(2048))
    run.core.place(Placement("big", "alpha", members), 0.0, WALL)
    for i, host in enumerate(hosts):
        ranks = [rank(str(r), 100 if r != 1234 else 99) for r in range(i * 256, i * 256 + 256)]
        run.report(host, progress("big", *ranks, still_for=5.0, n_ranks=2048), 1.0)
    (finding,) = run.core.jobhealth.view(1.0)["findings"]
    assert [r["rank"] for r in finding["ranks"]] == ["1234"]
    assert finding["ranks"][0]["host"] == "h4" and finding["at_collective"] == 99


def test_an_application_xid_is_rebuilt_from_the_controllers_own_table() -> None:
    run = TwoHosts()
    # The agent's fault class and foreign ranks are not what the tenant gets.
    said = ApplicationXid(JOB, 13, Fault.CONTAINED_MEMORY_ERROR, ("1", "3", "gpu7"), True, 5.0)
    (xid,) = run.report("h1", said, 2.0)
    assert xid == ApplicationXid(JOB, 13, Fault.GRAPHICS_EXCEPTION, ("1",), True,
                                 round(WALL + 2.0, 3))
    assert run.core.jobhealth.xids == {"graphics-exception": 1}


def test_an_xid_outside_the_applications_table_is_refused_and_counted() -> None:
    run = TwoHosts()
    for xid in (79, 48, 0):  # fallen off the bus, a double-bit ECC error: the hardware's
        assert run.report("h1", ApplicationXid(JOB, xid, Fault.MEMORY_MANAGEMENT, ("0",)),
                          1.0) == []
    assert run.core.jobhealth.counters["not_an_application_xid"] == 3
    assert run.core.jobhealth.xids == {}


def test_a_flood_of_bad_reports_is_logged_in_a_bounded_burst_and_serving_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    run = TwoHosts()
    with caplog.at_level(logging.WARNING, "harmonaize.controller"):
        for i in range(500):
            run.report("h1", progress("nobody", rank("0", i)), 1.0 + i * 0.001)
    assert run.core.jobhealth.counters["unplaced"] == 500
    assert len([r for r in caplog.records if "nobody" in r.getMessage()]) <= 10
    (hang,) = [b for b in run.report("h1", progress(JOB, rank("0", 5), rank("1", 4),
                                                    still_for=9.0), 2.0)]
    assert hang.ranks == ("1",)


def test_hosts_per_communicator_are_capped() -> None:
    run = TwoHosts(jobhealth={"hosts_per_comm": 1})
    run.report("h1", progress(JOB, rank("0", 5)), 1.0)
    run.report("h2", progress(JOB, rank("2", 5)), 1.0)
    assert list(run.core.jobhealth.reports[(JOB, 7)]) == ["h1"]
    assert run.core.jobhealth.counters["too_many_hosts"] == 1


def test_a_jobhealth_section_that_contradicts_itself_is_refused_in_one_line(
        tmp_path: Path) -> None:
    path = tmp_path / "controller.toml"
    path.write_text("[jobhealth]\nhang_after = 30.0\nstall_after = 10.0\n")
    with pytest.raises(ConfigError) as refused:
        load(path)
    assert "stall_after must be at least hang_after" in str(refused.value)
    assert "\n" not in str(refused.value)
    path.write_text("[jobhealth]\nhang_after = 0.5\nstall_after = 10.0\n")
    assert load(path)[0].jobhealth.hang_after == 0.5
