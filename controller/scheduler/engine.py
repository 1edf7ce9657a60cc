"""Sans-I/O: from the hosts' holds and the scheduler's nodes, what to do there.

``step(observations, now)`` gives the actions to run now (none in shadow mode: those
are logged as what would be done), one-line notes to log (each said once), and the
next deadline (the next reconcile). It reads no clock and runs nothing; the shell
(service.py) reads the scheduler, runs the actions and reports each with :meth:`done`
or :meth:`failed`. What a node gets comes from table.py's one table; then the breaker
holds back whatever would take more than ``max_share`` of a partition out at once
(counting nodes out for any reason, by anyone), and an operator's cancel or pause
keeps the engine's hands off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller.scheduler.reasons import reason_of
from controller.scheduler.table import TABLE, Situation, Verdict, Want, situation
from controller.scheduler.types import (
    RESERVATION_PREFIX,
    Action,
    Drain,
    HostView,
    Marks,
    Mode,
    Node,
    Observations,
    Reboot,
    Reserve,
    Resume,
    Settings,
    Unreserve,
)
from harmonaize.messages import HoldKind

#: Seconds before a failed action is tried again (at the latest: the next reconcile).
RETRY = 5.0


@dataclass(frozen=True)
class Row:
    """One node in the operator's view."""

    node: str
    host: str
    situation: str
    slurm: str
    reason: str
    intent: str
    #: Why the intent is not carried out now ("" when it is, or there is none).
    held: str = ""


@dataclass(frozen=True)
class Step:
    actions: list[Action]
    notes: list[str]
    deadline: float
    rows: list[Row] = field(default_factory=list)


def want_of(host: HostView | None, marks: Marks) -> Want:
    if host is None or not host.alive:
        return Want.NONE
    if not host.holds:
        return Want.FREE
    if any(h.kind is HoldKind.REBOOT for h in host.holds) and host.node not in marks.rebooted:
        return Want.REBOOT
    return Want.HOLD


def reservation_name(node: str) -> str:
    return f"{RESERVATION_PREFIX}{node}"


class Breaker:
    """At most ``max_share`` of each partition out of service at once."""

    def __init__(self, nodes: Iterable[Node], max_share: float,
                 reservations: frozenset[str] = frozenset()) -> None:
        """``reservations``: a node with our maintenance reservation counts as out
        (Slurm 22.05 shows no flag on it while it is idle)."""
        self.max_share = max_share
        self.members: dict[str, set[str]] = {}
        self.out: dict[str, set[str]] = {}
        for node in nodes:
            for part in node.partitions:
                self.members.setdefault(part, set()).add(node.name)
                if node.out or reservation_name(node.name) in reservations:
                    self.out.setdefault(part, set()).add(node.name)

    def admit(self, node: Node) -> str:
        """Take the node out if every partition has room: "" or why not."""
        for part in node.partitions:
            out = self.out.get(part, set()) | {node.name}
            total = len(self.members[part])
            if len(out) > self.max_share * total:
                return (f"breaker: partition {part} would have {len(out)} of {total} out "
                        f"(max {self.max_share:.0%})")
        for part in node.partitions:
            self.out.setdefault(part, set()).add(node.name)
        return ""


class Engine:
    def __init__(self, settings: Settings, marks: Marks | None = None) -> None:
        self.settings = settings
        self.marks = marks or Marks()
        #: Notes already said (key -> note), so each is logged once per episode.
        self._said: dict[str, str] = {}
        self._retry_at = float("inf")
        self.counters: dict[str, int] = {}
        self.rows: list[Row] = []

    def step(self, obs: Observations, now: float) -> Step:
        deadline = min(now + self.settings.reconcile, self._retry_at)
        if obs.nodes is None:
            return Step([], [], min(deadline, now + RETRY), self.rows)
        self._retry_at = float("inf")
        marks = self.marks
        hosts = {h.node: h for h in obs.hosts}
        nodes = {n.name: n for n in obs.nodes}
        breaker = Breaker(obs.nodes, self.settings.max_share, obs.reservations)
        actions: list[Action] = []
        notes: list[str] = []
        rows: list[Row] = []
        said: dict[str, str] = {}

        def say(key: str, note: str) -> None:
            said[key] = note
            if self._said.get(key) != note:
                notes.append(note)

        for name in sorted(hosts.keys() - nodes.keys()):
            say(f"unknown:{name}", f"host {hosts[name].host_id}: the scheduler has no node "
                f"{name} (map it in [scheduler] node_map); left alone")
        for name in sorted(nodes):
            node, host = nodes[name], hosts.get(name)
            sit = situation(node, marks.ours.get(name), disowned=name in marks.disowned)
            if not node.drained and not node.rebooting:  # nothing of ours there any more
                marks.ours.pop(name, None)
                marks.disowned.discard(name)
            want = want_of(host, marks)
            if host is not None and host.alive and not any(
                    h.kind is HoldKind.REBOOT for h in host.holds):
                marks.rebooted.discard(name)  # the reboot hold ended: a next one may reboot
            verdict = TABLE[(sit, want)]
            action, intent = self._action(verdict, node, host)
            held = ""
            if verdict is Verdict.LEAVE:
                if sit is Situation.EDITED:
                    marks.ours.pop(name, None)
                    marks.disowned.add(name)
                if name in marks.disowned:  # the same line while it stays theirs
                    say(f"leave:{name}", f"node {name}: its drain reason was edited by hand "
                        f"({node.reason!r}): it is not ours any more, left alone")
                elif want in (Want.HOLD, Want.REBOOT):
                    say(f"leave:{name}", f"node {name}: drained or down by someone else "
                        f"({node.reason!r}); our holds are not written there")
            if action is not None:
                if name in marks.cancelled or marks.paused:
                    held = "cancelled by an operator" if name in marks.cancelled else "paused"
                    action = None
                elif sit is Situation.FREE and isinstance(action, Drain | Reboot):
                    held = breaker.admit(node)
                    if held:
                        say(f"breaker:{name}", f"node {name}: {intent} held: {held}")
                        action = None
                if action is not None and self.settings.mode is Mode.SHADOW:
                    held = "shadow mode"
                    say(f"shadow:{name}", f"shadow mode: would {intent} on node {name}")
                    action = None
            if action is not None:
                actions.append(action)
            rows.append(Row(name, host.host_id if host else "", sit.value,
                            "+".join(sorted(node.flags)), node.reason, intent, held))
        actions += self._reservations(obs, hosts, nodes, breaker, say)
        self._said = said
        self.rows = rows
        return Step(actions, notes, deadline, rows)

    def _action(self, verdict: Verdict, node: Node,
                host: HostView | None) -> tuple[Action | None, str]:
        """The verdict as an action (None where nothing needs doing) and its words."""
        reason = reason_of(host.holds) if host is not None and host.holds else ""
        match verdict:
            case Verdict.DRAIN:
                return Drain(node.name, reason), f"drain ({reason})"
            case Verdict.REDRAIN if node.reason != reason:
                return Drain(node.name, reason), f"rewrite reason ({reason})"
            case Verdict.REDRAIN:
                return None, "drained"
            case Verdict.REBOOT:
                return Reboot(node.name, reason), f"reboot ({reason})"
            case Verdict.RESUME:
                return Resume(node.name), "resume"
            case Verdict.LEAVE:
                return None, "leave alone (not ours)"
        return None, ""

    def _reservations(self, obs: Observations, hosts: dict[str, HostView],
                      nodes: dict[str, Node], breaker: Breaker,
                      say: Callable[[str, str], None]) -> list[Action]:
        """A maintenance reservation on each node whose host waits to be idle for a
        validation; deleted when it no longer waits (a silent host's is left to expire)."""
        out: list[Action] = []
        for name in sorted(nodes):
            host, res = hosts.get(name), reservation_name(name)
            exists = res in obs.reservations
            if host is None or not host.alive or name in self.marks.cancelled \
                    or self.marks.paused:
                continue
            if host.idle_wanted and not exists:
                if breaker.admit(nodes[name]):
                    continue
                action: Action = Reserve(name, res, self.settings.reservation_minutes)
            elif exists and not host.idle_wanted:
                action = Unreserve(name, res)
            else:
                continue
            if self.settings.mode is Mode.SHADOW:
                say(f"shadow-res:{name}", f"shadow mode: would {type(action).__name__.lower()}"
                    f" {res}")
                continue
            out.append(action)
        return out

    def done(self, action: Action) -> None:
        """The scheduler took the action: remember what is ours now."""
        self._count(f"{type(action).__name__.lower()}_done")
        if isinstance(action, Drain | Reboot):
            self.marks.ours[action.node] = action.reason
            self.marks.disowned.discard(action.node)
        if isinstance(action, Reboot):
            self.marks.rebooted.add(action.node)
        if isinstance(action, Resume):
            self.marks.ours.pop(action.node, None)

    def failed(self, action: Action, now: float) -> None:
        """It failed or timed out: counted, tried again soon."""
        self._count(f"{type(action).__name__.lower()}_failed")
        self._retry_at = min(self._retry_at, now + RETRY)

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1
