"""The HTTP gateway streams a job's progress findings and application XIDs to the job's
owner, as CloudEvents with the same bodies the ZeroMQ feed carries, and no host."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from harmonaize import messages as m
from harmonaize.messages.jobhealth import Cause, Fault, ProcessState
from tests.conftest import needs_root
from tests.controller.jobhealth.reports import progress, rank
from tests.controller.test_feed import Sender, place
from tests.daemons import FakeAgent
from tests.sse import CurlStream
from tests.tenant.test_http import bearer, gateway, token

pytestmark = [pytest.mark.jobhealth, pytest.mark.tenant, needs_root]


def test_the_gateway_streams_job_progress_and_application_xids_to_the_owner(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller, url = gateway(spawn, workdir, "[jobhealth]\nhang_after = 1.0\n")
    place(controller, "job-a", "acme", "h1", "h1", "h2", "h2")  # ranks 0-3
    h1, h2 = Sender(FakeAgent(ctx, controller, "h1")), Sender(FakeAgent(ctx, controller, "h2"))
    owner = CurlStream(spawn, f"{url}/feed?topic=job/acme/", *bearer(token(controller, "acme")))
    other = CurlStream(spawn, f"{url}/feed?topic=job/beta/&topic=pool/",
                       *bearer(token(controller, "beta")))
    try:
        assert owner.next().kind == "subscribed"
        assert owner.next().kind == "job-health"  # the present
        assert other.next().kind == "subscribed"
        h1.send(progress("job-a", rank("0", 8), rank("1", 8), still_for=0.5))
        h2.send(progress("job-a", rank("2", 7, ProcessState.EXITED, Cause.PROCESS_EXITED),
                         rank("3", 8), still_for=0.5))
        hang = owner.next()
        assert hang.kind == "job-progress" and hang.data["category"] == "event"
        assert hang.data["data"] == {
            "job": "job-a", "comm": 7, "finding": "hang", "state": "active", "ranks": ["2"],
            "cause": "process-exited", "at_collective": 7, "since": hang.data["data"]["since"]}
        h2.send(m.ApplicationXid("job-a", 45, Fault.CLEANUP_AFTER_ERROR, ("2",), True, 3.0))
        xid = owner.next()
        assert xid.kind == "application-xid"
        assert (xid.data["data"]["fault"], xid.data["data"]["ranks"],
                xid.data["data"]["teardown"]) == ("cleanup-after-error", ["2"], True)
        assert "h2" not in str(hang.data) + str(xid.data)
        h2.send(progress("job-a", rank("2", 9), rank("3", 9)))
        assert owner.next().data["data"]["state"] == "withdrawn"
        # Another tenant heard none of it (it was published with the owner's events, so it
        # would have come by now): only the pools' capacity.
        heard = {other.events.get().kind for _ in range(other.events.qsize())}
        assert heard <= {"pool-capacity"}
    finally:
        owner.close()
        other.close()
