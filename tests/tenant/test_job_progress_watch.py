"""``harmonaize-tenant watch`` prints a job's progress findings and application XIDs as
readable lines (which ranks, what, why), and ``--json`` keeps every field."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import zmq

from harmonaize import messages as m
from harmonaize.messages.jobhealth import Cause, Fault, Finding, ProcessState, ProgressState
from harmonaize.tenant.cli import describe
from harmonaize.tenant.client import FeedMessage
from tests.conftest import needs_root, python
from tests.controller.jobhealth.reports import progress, rank
from tests.controller.test_feed import Sender, place
from tests.daemons import FakeAgent, keyring, start_controller, tenant_feed, wait_until

pytestmark = [pytest.mark.jobhealth, pytest.mark.tenant]


def watch(spawn, controller, tenant: str, count: int, *extra: str) -> subprocess.Popen:
    creds = keyring(controller.workdir).tenant(tenant)
    with tenant_feed(controller, [f"job/{tenant}/"], tenant):
        pass  # the controller has read the tenant's key
    return spawn(python("harmonaize.tenant.cli", "watch", "--feed", controller.feed, "--key",
                        str(creds.key), "--server-key", str(creds.server_key), "--topic",
                        f"job/{tenant}/", "--count", str(count), "--timeout", "60", *extra),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_root
def test_watch_prints_the_hung_rank_its_cause_and_an_application_xid_readably(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir, "[jobhealth]\nhang_after = 1.0\n")
    place(controller, "train", "alpha", "h1", "h1")  # ranks 0 and 1
    h1 = Sender(FakeAgent(ctx, controller, "h1"))
    readable = watch(spawn, controller, "alpha", 4)
    as_json = watch(spawn, controller, "alpha", 4, "--json")
    wait_until(lambda: sum(s["topics"] == ["job/alpha/"] for s in controller.request("feed"))
               >= 2, what="both watchers subscribed")
    h1.send(progress("train", rank("0", 5), rank("1", 4, ProcessState.ZOMBIE,
                                                   Cause.PROCESS_NOT_RUNNING), still_for=2.0,
                     n_ranks=2))
    h1.send(m.ApplicationXid("train", 31, Fault.MEMORY_MANAGEMENT, ("1",), False, 1.0))
    h1.send(progress("train", rank("0", 6), rank("1", 6), n_ranks=2))
    out, err = readable.communicate(timeout=60)
    assert readable.returncode == 0, err
    lines = out.splitlines()
    assert "job-health" in lines[0]
    assert lines[1].endswith(
        "job train comm 0x7: HANG: rank(s) 1 did not issue collective 4, which the job's other "
        "ranks wait in (process-not-running: the rank's process is stopped or stuck in the "
        "kernel)")
    assert lines[2].endswith(
        "job train: your process on rank 1 hit XID 31 (memory-management): the job's own "
        "fault, no hardware was taken out of service")
    assert lines[3].endswith("job train comm 0x7: hang of rank(s) 1 withdrawn: the ranks move "
                             "again, or the job ended")
    out, _ = as_json.communicate(timeout=60)
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["kind"] for r in records] == ["job-health", "job-progress", "application-xid",
                                            "job-progress"]
    assert records[1]["body"]["ranks"] == ["1"] and records[1]["body"]["at_collective"] == 4


def test_every_finding_and_cause_reads_as_a_sentence() -> None:
    for finding in (Finding.HANG, Finding.STALL, Finding.STRAGGLER):
        for cause in Cause:
            body = m.JobProgress("j", 255, finding, ProgressState.ACTIVE, ("3",), cause, 9, 1.0)
            line = describe(FeedMessage("job/a/j/", 1, 0.0, body))
            assert f"{finding.value.upper()}: rank(s) 3" in line and cause.value in line
            assert "{" not in line and "comm 0xff" in line
