"""The negotiation engine's state as rows, so a Commit carries only what changed.

The engine's plain form (controller/negotiation/plain.py) is one document. Written whole
after every request it would cost each commit time and bytes in proportion to every
negotiation of every tenant (some 700 KB and 60 ms at a thousand negotiations, near the
bus's largest message). So the shell keeps it as rows: ``view`` (the pools' releases), and
one row per tenant (``tenant:<name>``: its negotiations, closed ids, record and
maintenance windows). A request changes its tenant's row only; an expiry, the rows of
the tenants it touched. Restoring joins the rows into the one document again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller.negotiation import plain
from controller.negotiation.engine import Engine
from controller.negotiation.maintenance import MaintenanceBook

VIEW = "view"
TENANT = "tenant:"


def tenants_due(engine: Engine, wall: float) -> set[str]:
    """Tenants whose state an expiry at ``wall`` may change (it says nothing of some:
    a final negotiation forgotten, a closed id or a settled window let go)."""
    due = {t for (t, _), n in engine.negotiations.items() if n.until <= wall}
    due |= {t for (t, _), until in engine.closed.items() if until <= wall}
    due |= {i.proposal.tenant for i in engine.maintenance.items.values() if i.until <= wall}
    return due


def rows(engine: Engine, tenants: Iterable[str], view: bool) -> dict[str, Any]:
    """The rows of ``tenants`` (None where a tenant has nothing left) and, with ``view``,
    the view's."""
    out: dict[str, Any] = {}
    if view:
        out[VIEW] = plain.to_plain(Engine(engine.policy, view=engine.view))["view"]
    for tenant in tenants:
        part = Engine(
            engine.policy,
            negotiations={k: n for k, n in engine.negotiations.items() if k[0] == tenant},
            closed={k: u for k, u in engine.closed.items() if k[0] == tenant},
            records={t: r for t, r in engine.records.items() if t == tenant},
            maintenance=MaintenanceBook({k: i for k, i in engine.maintenance.items.items()
                                         if i.proposal.tenant == tenant}))
        data = plain.to_plain(part)
        kept = {k: data[k] for k in ("negotiations", "closed", "records", "maintenance")}
        out[TENANT + tenant] = kept if any(kept.values()) else None
    return out


def joined(stored: Mapping[str, Any]) -> dict[str, Any]:
    """The rows as the one document :func:`plain.from_plain` reads."""
    data: dict[str, Any] = {"version": plain.VERSION, "view": list(stored.get(VIEW) or []),
                            "negotiations": [], "closed": [], "records": {},
                            "maintenance": []}
    for key, row in sorted(stored.items()):
        if not key.startswith(TENANT) or not isinstance(row, dict):
            continue
        data["negotiations"] += row["negotiations"]
        data["closed"] += row["closed"]
        data["records"].update(row["records"])
        data["maintenance"] += row["maintenance"]
    return data
