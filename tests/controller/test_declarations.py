"""Tenants' declarations: a misspelt field, a malformed one or an outdated revision
gets a refusal that names it and the request it answers, never a silent ok."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import zmq

from harmonaize import messages as m
from harmonaize.tenant.client import RequestError
from tests.conftest import needs_root
from tests.controller.test_feed import place
from tests.daemons import FakeAgent, curve_dealer, keyring, start_controller, tenant_feed

pytestmark = [pytest.mark.hardening, pytest.mark.controller, needs_root]


def test_declarations_are_checked_field_by_field_and_by_revision(
    spawn, workdir: Path
) -> None:
    controller = start_controller(spawn, workdir)
    ctx = zmq.Context()
    try:
        h1 = FakeAgent(ctx, controller, "h1")
        h1.hello()
        place(controller, "job-a", "alpha", "h1")
        raw = curve_dealer(ctx, controller, keyring(workdir).tenant("alpha"), controller.feed)

        def ask(seq: int, body: dict) -> m.Reply:
            raw.send(msgpack.packb(["hz", 1, "job-declaration", "t", seq, 1.0, body]))
            assert raw.poll(5000), "no answer"
            topic, frame = raw.recv_multipart()
            reply = m.decode(frame).body
            assert topic == b"" and isinstance(reply, m.Reply)
            return reply

        typo = ask(11, {"job": "job-a", "max_validation_paus": 600})
        assert (typo.request, typo.ok) == (11, False)
        assert "job-declaration.max_validation_paus: unknown key" in typo.error
        nested = ask(12, {"job": "job-a", "tuning": [{
            "collectives": ["allreduce"], "algorithms": ["ring"], "protocols": ["simple"],
            "chanels": [1, 4]}]})
        assert (nested.request, nested.ok) == (12, False) and "chanels" in nested.error
        bad = ask(13, {"job": "job-a", "max_validation_pause": -5})
        assert (bad.request, bad.ok) == (13, False) and "max_validation_pause" in bad.error
        assert not h1.sock.poll(300)  # none of them reached the host
        assert controller.request("status")["feed_stats"]["bad_request"] == 3
        with tenant_feed(controller, ["pool/"], "alpha") as alpha:
            alpha.declare(m.JobDeclaration("job-a", 120.0, revision=5))
            assert h1.recv().revision == 5
            with pytest.raises(RequestError, match="revision 3 is older than revision 5 in "
                                                   "force: ignored"):
                alpha.declare(m.JobDeclaration("job-a", 3600.0, revision=3))
            alpha.declare(m.JobDeclaration("job-a", 60.0, revision=5))  # the same: newest wins
            assert h1.recv().max_validation_pause == 60.0
    finally:
        ctx.destroy(linger=0)
