"""A small world for the negotiation engine: one pool of H100s, tenants a and b."""

from __future__ import annotations

from typing import Any

from controller.negotiation.engine import Engine, Output, Policy
from controller.negotiation.types import CapacityRelease, Flexibility, Proposal

T0 = 1_000_000.0
POOL, CLASS = "p1", "h100"


def world(free: int = 16, ceiling: int = 32, weights: dict[str, float] | None = None,
          **policy: Any) -> Engine:
    engine = Engine(Policy(weights=weights or {"a": 1.0, "b": 1.0}, **policy))
    out, _ = engine.step([CapacityRelease(POOL, CLASS, free, ceiling, T0)], T0)
    assert out == []
    return engine


def proposal(request_id: str = "r1", tenant: str = "a", lo: int = 2, hi: int = 4,
             earliest: float = T0 + 600, latest: float = T0 + 3600,
             duration: float = 3600.0, flex: Flexibility = Flexibility.NONE,
             pool: str = POOL, gpu_class: str = CLASS) -> Proposal:
    return Proposal(request_id, tenant, pool, gpu_class, lo, hi, earliest, latest, duration,
                    flex)


def one(engine: Engine, item: object, now: float = T0) -> Output:
    """The single answer to one input."""
    out, _ = engine.step([item], now)  # type: ignore[list-item]
    assert len(out) == 1, out
    return out[0]
