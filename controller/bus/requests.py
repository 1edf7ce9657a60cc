"""What the leader answers for the other replicas: tenants' requests they forward (those
that change state; a subscription stays with the replica) and operators' commands
about what only the leader holds (controller/bus/leader.py sends the answers)."""

from __future__ import annotations

import time
from typing import Any

import msgpack

from controller import views
from controller.core import ControllerCore
from controller.outputs import Output
from controller.store import Store
from harmonaize.messages import TENANT_KINDS, Envelope, kinds
from harmonaize.opsocket import CommandError
from harmonaize.schema import SchemaError, from_plain, strict_keys

#: Requests a replica forwards (a subscription stays with the replica).
FORWARDED = TENANT_KINDS - {"subscribe"}


def forwarded(data: bytes) -> tuple[str, Envelope]:
    """A tenant's request as a replica forwarded it ({tenant, kind, seq, body}): the
    tenant and the message; ValueError, TypeError, KeyError or SchemaError if it is none."""
    request = msgpack.unpackb(data, raw=False)
    kind = request["kind"]
    if kind not in FORWARDED:
        raise ValueError(f"{kind!r} is not forwarded")
    with strict_keys():
        body = from_plain(kinds()[kind], request["body"], kind)
    return str(request["tenant"]), Envelope(kind, "tenant", int(request["seq"]), time.time(),
                                            body)


def command(core: ControllerCore, store: Store, name: str, args: dict[str, Any], *,
            now: float, wall: float) -> tuple[Any, list[Output]]:
    """The leader's answer to an operator command asked at any replica, and the outputs
    it causes (``leader``, about the leader itself, is the leader's own)."""
    if name == "hosts":
        return views.hosts(core, now), []
    if name == "capacity":
        return views.capacity(core), []
    if name == "jobs":
        return views.jobs(core, now), []
    if name == "tenants":
        return views.tenants(core, None), []
    if name == "pools":
        return views.pools(core), []
    if name == "privacy":
        return views.privacy(core, now), []
    if name == "job-findings":
        return core.jobhealth.view(now), []
    if name == "events":
        limit = args.get("limit", 50)
        if isinstance(limit, bool) or not isinstance(limit, int) or \
                not 1 <= limit <= 10_000:
            raise CommandError("limit must be an integer from 1 to 10000")
        return store.recent_events(limit), []
    if name == "place":
        try:
            placement = views.placement(args)
        except SchemaError as exc:
            raise CommandError(str(exc)) from None
        outputs = core.place(placement, now, wall)
        used = views.use_hold(core, placement, args, now)
        if used:
            outputs += core.tick(now, wall)  # the hold's end in a Commit before the answer
        return {**views.placed(core, placement), **used}, outputs
    if name == "unplace":
        job = args.get("job")
        if isinstance(job, str) and job not in core.redactor.placements and \
                args.get("missing_ok") is True:
            return {"job": job, "placed": False}, []
        if not isinstance(job, str) or job not in core.redactor.placements:
            raise CommandError("job must name a placed job")
        return {"job": job}, core.unplace(job, now)
    if name == "holds":
        return views.holds(core, now), []
    if name == "holds-cancel":
        # its Commit comes with the leader's tick after this batch, before the answer
        try:
            cancelled = views.cancel_hold(core, args, now)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        return cancelled, core.tick(now, wall)
    if name == "tenant-notices":
        return views.tenant_notices(core, str(args.get("tenant", ""))), []
    raise CommandError(f"unknown command {name!r}")
