"""What operators see of the core, and their requests checked into the core's terms.

Pure functions of a :class:`ControllerCore` (and ``now``); the shell's operator
socket wires them to commands and adds what only it knows (its sockets, keys,
descriptors). These are the provider's views: hosts and pools by name, which a
tenant never sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from controller.core import ControllerCore
from controller.negotiation.types import Closed, Error
from controller.redactionconfig import Mode
from controller.types import Member, Placement
from harmonaize.schema import Ident, Len, Name, from_plain, to_plain


@dataclass(frozen=True)
class MemberRequest:
    name: Ident
    host: Ident


@dataclass(frozen=True)
class PlacementRequest:
    """A placement as the provider's scheduler sends it (validated like any input)."""

    STRICT_KEYS: ClassVar[bool] = True
    job: Ident
    tenant: Ident
    members: Annotated[tuple[MemberRequest, ...], Len(4096, min_len=1)]
    #: The Unix group (name or number) the job's processes run with on its hosts:
    #: only that group may read and follow the job's tuner policy there.
    group: Name = ""
    #: The tenant's hold (its negotiation's request id) this job uses: the hold is
    #: counted as used, never a no-show.
    hold: Name = ""


def placement(args: dict[str, Any]) -> Placement:
    """The ``place`` command's arguments as a placement (SchemaError if they are not one)."""
    request = from_plain(PlacementRequest, args, "place")
    return Placement(request.job, request.tenant,
                     tuple(Member(m.name, m.host) for m in request.members), request.group)


def use_hold(core: ControllerCore, placement: Placement, args: dict[str, Any],
             now: float) -> dict[str, Any]:
    """A ``place`` that names the tenant's hold it uses: the hold starts. What became of
    it, for the answer (the placement stands either way)."""
    hold = args.get("hold")
    if not isinstance(hold, str) or not hold:
        return {}
    if placement.tenant not in core.negotiation.policy.weights:
        return {"hold": f"not started: tenant {placement.tenant} does not negotiate"}
    answer = core.start_hold(placement.tenant, hold, now)
    return {"hold": "started" if isinstance(answer, Closed) else f"not started: {answer}"}


def placed(core: ControllerCore, placement: Placement) -> dict[str, Any]:
    """The ``place`` command's answer: hosts the controller has never heard from are
    named (a node without an agent yet, or a scheduler's name for a host that is not
    its agent's host id)."""
    unknown = sorted(placement.hosts - core.cluster.hosts.keys())
    return {"job": placement.job, "members": len(placement.members), "unknown_hosts": unknown}


def counters(core: ControllerCore) -> dict[str, Any]:
    """The core's part of ``status``."""
    hosts = core.cluster.hosts.values()
    feed = core.feed
    return {
        "hosts": {"known": len(hosts), "alive": sum(1 for h in hosts if h.alive)},
        "frames": core.frames,
        "rejected": dict(core.rejected),
        "protocol": dict(core.cluster.counters),
        "feed_stats": {**feed.stats, "topics": len(feed.seqs),
                       "subscribers": len(feed.hub.subscribers)},
    }


def hosts(core: ControllerCore, now: float) -> list[dict[str, Any]]:
    rows = []
    for host in sorted(core.cluster.hosts.values(), key=lambda h: h.host_id):
        summary = host.summary
        rows.append({
            "host_id": host.host_id,
            "pool": host.pool,
            "gpu_class": host.gpu_class,
            "gpus": host.gpus,
            "alive": host.alive,
            "down_reason": host.down_reason,
            "health": summary.health.value if summary else None,
            "schedulable": summary.schedulable if summary else None,
            "last_seen_seconds": round(now - host.last_seen, 3),
            "last_seq": host.last_seq,
            "version": host.version,
        })
    return rows


def capacity(core: ControllerCore) -> list[dict[str, Any]]:
    """What tenants currently see."""
    return [{"topic": p.topic, "tenant": p.tenant, "kind": p.body.KIND, **to_plain(p.body)}
            for p in core.redactor.current()]


def jobs(core: ControllerCore, now: float) -> list[dict[str, Any]]:
    return [{**to_plain(p), "declared": core.declarations.get(job) is not None,
             "tuning": core.agreement.status(job, now)}
            for job, p in sorted(core.redactor.placements.items())]


def feed(core: ControllerCore, now: float) -> list[dict[str, Any]]:
    core.feed.hub.settle()  # each subscriber's sent, counted per publication till now
    subscribers = core.feed.hub.subscribers.values()
    return [{
        "tenant": sub.tenant, "peer": sub.peer.hex(), "topics": list(sub.prefixes),
        "connected_seconds": round(now - sub.since, 1), "sent": sub.sent,
        "dropped": sub.dropped, "refused": sub.refused,
    } for sub in sorted(subscribers, key=lambda s: (s.tenant, s.peer))]


def tenants(core: ControllerCore, keys: set[str] | None) -> list[dict[str, Any]]:
    """Every tenant with a key on file (``keys``; None: no authentication) or a job."""
    names = set(keys or ())
    placed: dict[str, list[str]] = {}
    for p in core.redactor.placements.values():
        placed.setdefault(p.tenant, []).append(p.job)
        names.add(p.tenant)
    rows = []
    for name in sorted(names):
        subs = [s for s in core.feed.hub.subscribers.values() if s.tenant == name]
        rows.append({
            "tenant": name,
            "key": keys is None or name in keys,
            "jobs": sorted(placed.get(name, [])),
            "declared": core.declarations.of_tenant(name),
            "subscribers": len(subs),
            "dropped": sum(s.dropped for s in subs),
        })
    return rows


def pools(core: ControllerCore) -> list[dict[str, Any]]:
    """Pools: hosts and GPUs (the provider's view, exact)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for host in core.cluster.hosts.values():
        row = rows.setdefault((host.pool, host.gpu_class), {
            "pool": host.pool, "gpu_class": host.gpu_class, "hosts": 0, "alive": 0,
            "schedulable": 0, "gpus": 0, "gpus_healthy": 0, "gpus_in_use": 0})
        row["hosts"] += 1
        summary = host.summary
        if host.alive:
            row["alive"] += 1
            if summary is not None and summary.schedulable:
                row["schedulable"] += 1
        row["gpus"] += host.gpus
        if host.alive and summary is not None:
            row["gpus_healthy"] += summary.gpus.healthy
            row["gpus_in_use"] += summary.gpus.in_use
    return [rows[k] for k in sorted(rows)]


def privacy(core: ControllerCore, now: float) -> dict[str, Any]:
    """The private feed's budget per pool: spent over the last 24 hours, and the plan."""
    red = core.redactor
    cfg = red.cfg
    rows = [{
        "pool": p.pool, "gpu_class": p.gpu_class, "budget": p.budget,
        "spent_24h": round(p.spent, 6), "releases_24h": p.releases,
        "epsilon_per_release": round(p.epsilon_per_release, 6),
        "release_interval": round(p.release_interval, 1), "hosts": p.hosts,
        "gpu_noise_scale": round(p.gpu_noise_scale, 3),
        "host_noise_scale": None if p.host_noise_scale is None else round(p.host_noise_scale, 3),
        "next_release_in": None if p.next_release_in is None else round(p.next_release_in, 1),
    } for p in red.privacy(now)] if cfg.mode is Mode.PRIVATE else []
    return {"mode": str(cfg.mode), "epsilon_per_day": cfg.epsilon_per_day,
            "release_interval": cfg.release_interval,
            "max_release_interval": cfg.max_release_interval, "noise_share": cfg.noise_share,
            "unit": str(cfg.unit), "job_hosts": cfg.job_hosts, "host_gpus": cfg.host_gpus,
            "refused": red.ledger.refused, "pools": rows}


def tenant_notices(core: ControllerCore, tenant: str) -> list[dict[str, Any]]:
    """A tenant's validation notices as ``GET /v1/notices`` lists them."""
    out = []
    for notice in core.notices.of_tenant(tenant):
        declared = core.declarations.get(notice.job)
        max_defer = declared[1].max_validation_defer if declared else 0.0
        out.append({"id": notice.id, "job": notice.job, "status": notice.status.value,
                    "not_before": notice.not_before, "pause_seconds": notice.pause,
                    "approved": notice.approved, "deferred_seconds": notice.deferred,
                    "defer_seconds": core.notices.defer_left(notice.id, max_defer)})
    return out


def holds(core: ControllerCore, now: float) -> list[dict[str, Any]]:
    """Tenants' capacity holds not yet started, released, cancelled or expired
    (``harmonctl -C holds``); ``id`` is what ``holds cancel`` takes."""
    return [{"id": f"{h.tenant}/{h.request_id}", "tenant": h.tenant,
             "request_id": h.request_id, "pool": h.pool, "gpu_class": h.gpu_class,
             "count": h.count, "start": h.start, "end": h.end, "expires_at": h.expires_at}
            for h in sorted(core.negotiation.holds(), key=lambda h: (h.start, h.tenant,
                                                                       h.request_id))]


def cancel_hold(core: ControllerCore, args: dict[str, Any], now: float) -> dict[str, Any]:
    """An operator's ``holds cancel TENANT/REQUEST``: the hold ends, charged to nobody;
    a ValueError names what does not fit (its callers say it as the command's error)."""
    tenant, request_id = args.get("tenant"), args.get("request_id")
    if not isinstance(tenant, str) or not isinstance(request_id, str):
        raise ValueError("tenant and request_id must be strings (ID: TENANT/REQUEST)")
    if tenant not in core.negotiation.policy.weights:
        raise ValueError(f"no tenant {tenant!r:.80} negotiates ([negotiation] weights)")
    answer = core.cancel_hold(tenant, request_id, now)
    if isinstance(answer, Error):
        raise ValueError(f"{tenant}/{request_id}: {answer}")
    assert isinstance(answer, Closed)
    return {"id": f"{tenant}/{request_id}", "state": answer.state.value}
