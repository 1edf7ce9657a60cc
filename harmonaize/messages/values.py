"""Value types several families of messages share: levels, conditions, coarse buckets.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from harmonaize.schema import (
    Count,
    Ident,
    Len,
    Name,
    Text,
    Timestamp,
)


class Status(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Health(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


class Level(StrEnum):
    """A coarse level, used where an exact value would say too much."""

    NONE = "none"
    LOW = "low"
    HIGH = "high"

    @property
    def rank(self) -> int:
        return ("none", "low", "high").index(self.value)


class Trend(StrEnum):
    RISING = "rising"
    STEADY = "steady"
    FALLING = "falling"


@dataclass(frozen=True)
class Condition:
    """Level state in node-problem-detector's shape: a type and whether it holds."""

    type: Ident
    status: Status
    reason: Name = ""
    message: Text = ""
    severity: Severity = Severity.INFO
    since: Timestamp = 0.0


@dataclass(frozen=True)
class Bucket:
    """A coarse range ``lo..hi`` (``hi`` None: open above) that hides exact counts."""

    #: The lower edge (a cautious reading).
    lo: Count
    #: The upper edge (at least ``lo``); null: "or more".
    hi: Count | None

    def __post_init__(self) -> None:
        if self.hi is not None and self.hi < self.lo:
            raise ValueError(f"bucket upper bound {self.hi} is below lower bound {self.lo}")

    def __str__(self) -> str:
        if self.hi is None:
            return f"{self.lo}+"
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"

    def __contains__(self, value: int) -> bool:
        return value >= self.lo and (self.hi is None or value <= self.hi)


Conditions = Annotated[tuple[Condition, ...], Len(64)]


@dataclass(frozen=True)
class LinkHealth:
    """One class of a host's links (e.g. "data"), in coarse levels only."""

    link_class: Ident
    links: Count
    links_down: Count
    congestion: Level
    errors: Level
