"""Plain data of the scheduler loop: what it observes, what it decides, its settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from harmonaize.messages import Hold

#: Every drain reason we write begins with this; any other reason is someone else's.
OURS = "hz:"
#: Our maintenance reservations are named this, then the node.
RESERVATION_PREFIX = "hz-validate-"


class Mode(StrEnum):
    SHADOW = "shadow"  # log what would be done, do nothing
    ACT = "act"


@dataclass(frozen=True)
class Node:
    """A node as the scheduler reports it."""

    name: str
    #: State flags, upper case: IDLE, MIXED, ALLOCATED, DOWN, DRAIN, REBOOT_REQUESTED, ...
    flags: frozenset[str] = frozenset()
    #: The drain or down reason, without Slurm's " [user@time]" suffix.
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def out(self) -> bool:
        """Out of service, by anyone: counted by the breaker."""
        return bool(self.flags & {"DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT_REQUESTED",
                                  "REBOOT_ISSUED", "POWERED_DOWN"})

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"})


@dataclass(frozen=True)
class HostView:
    """One host as the controller knows it, under its scheduler node's name."""

    node: str
    host_id: str
    #: The agent was heard from recently (a silent host is left as it is).
    alive: bool
    holds: tuple[Hold, ...] = ()
    #: A validation waits for the host to be idle (a maintenance reservation helps).
    idle_wanted: bool = False


@dataclass(frozen=True)
class Observations:
    hosts: tuple[HostView, ...]
    #: None: the scheduler could not be read this time (nothing is decided on guesses).
    nodes: tuple[Node, ...] | None
    #: Names of the reservations that exist now (ours or not).
    reservations: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str


@dataclass(frozen=True)
class Resume:
    node: str


@dataclass(frozen=True)
class Reboot:
    node: str
    reason: str


@dataclass(frozen=True)
class Reserve:
    node: str
    name: str
    minutes: int


@dataclass(frozen=True)
class Unreserve:
    node: str
    name: str


Action = Drain | Resume | Reboot | Reserve | Unreserve


@dataclass(frozen=True)
class Settings:
    mode: Mode = Mode.SHADOW
    #: At most this share of a partition's nodes out of service at once (by anyone).
    max_share: float = 0.2
    #: Seconds between reads of the scheduler when nothing changed.
    reconcile: float = 30.0
    #: Minutes a maintenance reservation for a validation lasts at most.
    reservation_minutes: int = 120


@dataclass
class Marks:
    """What the engine keeps across steps and restarts (stored in SQLite)."""

    #: Node -> the reason we last wrote there (a node missing here is not ours).
    ours: dict[str, str] = field(default_factory=dict)
    #: Nodes an operator told us to leave alone.
    cancelled: set[str] = field(default_factory=set)
    #: All nodes left alone (``harmonctl -C scheduler pause``).
    paused: bool = False
    #: Nodes we asked to reboot, while their reboot hold lasts (one reboot per hold).
    rebooted: set[str] = field(default_factory=set)
    #: Nodes we drained whose reason someone edited: theirs until they are resumed.
    disowned: set[str] = field(default_factory=set)
