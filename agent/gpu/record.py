"""What the GPU health engine keeps of each GPU, and how the operator sees one.

Plain records, no logic beyond a counter window: the rules (:mod:`agent.gpu.rules`)
read and update them, the engine (:mod:`agent.gpu.health`) moves their state.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import partial

from agent.conditions import Action, ConditionTracker, Finding
from agent.gpu.states import GpuState
from agent.gpu.types import GpuCounters, GpuSnapshot, JobRef
from agent.gpu.xid import Effect, Reason
from harmonaize.messages import Condition


@dataclass(frozen=True)
class GpuRule:
    """A finding with what it means for the GPU."""

    finding: Finding
    action: Action = Action.NONE
    effect: Effect = Effect.NONE
    reason: Reason = Reason.GPU_FAILURE


@dataclass
class Window:
    """A counter's values over the last ``span`` seconds, for counts per window."""

    span: float
    points: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, now: float, value: int) -> int:
        """Record ``value``; return how much it grew within the window."""
        if self.points and value < self.points[-1][1]:
            self.points.clear()  # reset (driver reload, GPU reset): start over
        self.points.append((now, value))
        while len(self.points) > 1 and now - self.points[1][0] >= self.span:
            self.points.popleft()
        return value - self.points[0][1]


@dataclass(frozen=True)
class XidSeen:
    """An XID as the operator sees it: whose fault it was judged, and why."""

    at: float
    xid: int
    verdict: str
    why: str
    job: str | None = None


@dataclass
class GpuRecord:
    """What the engine keeps of one GPU between steps (its state moves only by
    :data:`agent.gpu.states.GPU`)."""

    index: int
    uuid: str = ""
    name: str = ""
    state: GpuState = GpuState.HEALTHY
    why: str = ""
    since: float = 0.0
    action: Action = Action.NONE
    reason: Reason = Reason.GPU_FAILURE
    tracker: ConditionTracker = field(default_factory=ConditionTracker)
    previous: GpuCounters | None = None
    windows: dict[str, Window] = field(default_factory=dict)
    xids: dict[int, float] = field(default_factory=dict)  # xid -> last seen
    #: The effect each held XID has on the GPU as attributed (over the catalog's).
    xid_effects: dict[int, Effect] = field(default_factory=dict)
    #: The latest XIDs with their attribution, for the operator.
    recent_xids: deque[XidSeen] = field(default_factory=partial(deque, maxlen=16))
    xid_count: int = 0
    last_suspect_signal: float = float("-inf")
    jobs: tuple[JobRef, ...] = ()
    rules: tuple[GpuRule, ...] = ()
    snapshot: GpuSnapshot | None = None
    view: GpuView | None = None
    evaluated_at: float = float("-inf")
    #: When time passing alone could change this GPU's verdict (see :meth:`_deadline`).
    due: float = float("-inf")
    #: The state to return to when a validation could not decide.
    before_validation: GpuState = GpuState.HEALTHY
    #: When the GPU was last seen reset (its volatile counters went back to zero).
    reset_at: float = float("-inf")
    #: When a passing validation or an operator last cleared the GPU: evidence that
    #: was already there then has been looked at, and only newer evidence counts.
    acknowledged_at: float = float("-inf")

    def window(self, name: str, span: float) -> Window:
        return self.windows.setdefault(name, Window(span))


@dataclass(frozen=True)
class GpuView:
    """One GPU as the operator sees it (never leaves the host)."""

    index: int
    uuid: str
    name: str
    state: GpuState
    why: str
    since: float
    action: Action
    conditions: tuple[Condition, ...]
    actions: dict[str, Action]
    jobs: tuple[JobRef, ...]
    xid_count: int
    snapshot: GpuSnapshot | None
    recent_xids: tuple[XidSeen, ...] = ()

