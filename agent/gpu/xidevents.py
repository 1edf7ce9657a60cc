"""What an attributed XID does: to the GPU's record, for the operator, for the job.

A hardware XID is held on the GPU with its attributed effect (the rules make it a
condition and move the GPU's state); an application XID changes nothing of the GPU and
becomes an ``ApplicationXid`` for the job's owner (the controller rebuilds it) and an
``ApplicationXid`` host event for the operator.
"""

from __future__ import annotations

from agent.gpu.attribution import Attributed, Verdict
from agent.gpu.record import GpuRecord, XidSeen
from agent.gpu.xid import FAULTS, Attribution, Effect, lookup
from harmonaize.messages import HostEvent, Severity
from harmonaize.messages.jobhealth import ApplicationXid


def apply(gpu: GpuRecord, xid: Attributed, now: float,
          ) -> tuple[HostEvent, ApplicationXid | None]:
    info = lookup(xid.xid)
    gpu.xid_count += 1
    gpu.recent_xids.append(XidSeen(xid.at, xid.xid, xid.verdict.value, xid.why[:200],
                                   xid.job))
    fault = FAULTS.get(xid.xid)
    if xid.verdict is Verdict.APPLICATION and xid.job is not None and fault is not None:
        text = (f"gpu {gpu.index}: xid {xid.xid} ({info.meaning}) is job {xid.job}'s own"
                f"{' (teardown)' if xid.teardown else ''}: {xid.why}")
        return (HostEvent("ApplicationXid", Severity.INFO, text[:1000]),
                ApplicationXid(xid.job, xid.xid, fault, xid.ranks[:1024], xid.teardown, now))
    if xid.effect is not Effect.NONE:
        gpu.xids[xid.xid] = now
        gpu.xid_effects[xid.xid] = xid.effect
    severity = {Effect.NONE: Severity.INFO, Effect.SUSPECT: Severity.WARNING}.get(
        xid.effect, Severity.CRITICAL)
    # Only an XID that could have been the job's says why it was judged the hardware's.
    why = f"; hardware: {xid.why}" if info.attribution is not Attribution.HARDWARE else ""
    return HostEvent("Xid", severity, f"gpu {gpu.index}: xid {xid.xid} ({info.meaning}): "
                     f"{info.action.value}{why}"[:1000]), None
