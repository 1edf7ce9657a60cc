"""Sans-I/O link health: per-link congestion and error levels with hysteresis.

Links from the eBPF/proc link observer and RDMA ports from the RDMA observer
become :class:`LinkView` s. Each pass judges every link once (:func:`judge`: its
raw congestion and error levels by the configured thresholds, and the evidence),
and holds those levels with :class:`LevelHold` (a rise shows at once, a fall only
after the lower level persisted ``hold`` seconds, so congestion that flickers
does not flap). Health reports the held levels; the tuning loop takes the same
pass's raw judgements (and holds its own choice, ``tuning.hold``, before stepping
down), so ``harmonctl links`` and ``harmonctl jobs`` judge a moment alike, by the
same thresholds after a reload. Only per-class aggregates leave the host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.conditions import Finding
from agent.links.settings import LinksSection
from agent.links.types import LinkSample
from agent.rdma.interface import RdmaSample
from harmonaize.hysteresis import LevelHold
from harmonaize.messages import Level, LinkHealth, Severity


@dataclass(frozen=True)
class LinkView:
    """What the rules need of a link, whichever observer saw it."""

    name: str
    link_class: str
    up: bool
    utilization: float | None
    #: CE-marked share of received packets, or RDMA CNPs/ECN marks per packet.
    ce_fraction: float
    #: Retransmissions per transmitted packet.
    retransmit_fraction: float
    #: Drops and errors per packet (both directions).
    loss_fraction: float
    #: Packets per second, both directions (shares over few packets are noise).
    packets_per_s: float = 0.0
    #: Retransmitted segments per second attributed to this link (job health's evidence
    #: of a dead path: a blocked flow keeps retransmitting while little else moves).
    retransmits_per_s: float = 0.0


def views(links: LinkSample | None, rdma: RdmaSample | None) -> list[LinkView]:
    out = []
    for link in links.links if links else ():
        packets = link.rx_pps + link.tx_pps
        out.append(LinkView(
            link.name, link.link_class, link.up, link.utilization, link.ce_fraction,
            link.retransmit_fraction,
            (link.drops_per_s + link.errors_per_s) / packets if packets else
            (1.0 if link.drops_per_s + link.errors_per_s else 0.0),
            packets, link.retransmits_per_s,
        ))
    for port in rdma.ports if rdma else ():
        packets = port.rx_pps + port.tx_pps
        out.append(LinkView(
            port.name, port.link_class, port.up, port.utilization, port.congestion_fraction,
            port.retransmits_per_s / port.tx_pps if port.tx_pps else 0.0,
            port.errors_per_s / packets if packets else (1.0 if port.errors_per_s else 0.0),
            packets, port.retransmits_per_s,
        ))
    for name in rdma.missing if rdma else ():
        out.append(LinkView(name, "data", False, None, 0.0, 0.0, 0.0))
    return out


def congestion_of(view: LinkView, cfg: LinksSection) -> Level:
    util = view.utilization or 0.0
    busy = view.packets_per_s >= cfg.min_packets_per_s
    ce = view.ce_fraction if busy else 0.0
    retx = view.retransmit_fraction if busy else 0.0
    if util >= cfg.utilization_high or ce >= cfg.ce_high or retx >= cfg.retransmit_high:
        return Level.HIGH
    if util >= cfg.utilization_low or ce >= cfg.ce_low or retx >= cfg.retransmit_low:
        return Level.LOW
    return Level.NONE


def errors_of(view: LinkView, cfg: LinksSection) -> Level:
    if view.loss_fraction >= cfg.retransmit_high:
        return Level.HIGH
    if view.loss_fraction > 0:
        return Level.LOW
    return Level.NONE


@dataclass(frozen=True)
class LinkJudgement:
    """One link at one pass, judged by the thresholds in force: raw levels, no hold."""

    name: str
    link_class: str
    up: bool
    congestion: Level
    errors: Level
    #: Busy enough to count, and retransmitting at least ``retransmit_low``.
    retransmitting: bool
    #: What the congestion level rests on, in words (the tuning history quotes it).
    evidence: str


def judge(view: LinkView, cfg: LinksSection) -> LinkJudgement:
    congestion = congestion_of(view, cfg) if view.up else Level.NONE
    busy = view.packets_per_s >= cfg.min_packets_per_s
    return LinkJudgement(
        view.name, view.link_class, view.up, congestion, errors_of(view, cfg),
        busy and view.retransmit_fraction >= cfg.retransmit_low,
        f"{view.name}: {congestion.value}: utilization {(view.utilization or 0.0):.0%}, "
        f"CE/CNP {view.ce_fraction:.2%}, retransmits {view.retransmit_fraction:.2%}",
    )


@dataclass(frozen=True)
class LinkLevels:
    """A link's held levels, and this pass's raw ones they were held from."""

    name: str
    link_class: str
    up: bool
    congestion: Level
    errors: Level
    raw_congestion: Level = Level.NONE
    #: This pass's retransmitted segments per second on the link (not held: job health
    #: judges how long they go on itself).
    retransmits_per_s: float = 0.0


@dataclass(frozen=True)
class LinkStep:
    links: tuple[LinkLevels, ...]
    #: This pass's judgement of every link (what the tuning loop steps on).
    judged: tuple[LinkJudgement, ...]
    health: tuple[LinkHealth, ...]
    findings: list[Finding]


@dataclass
class LinkHealthEngine:
    cfg: LinksSection
    _congestion: dict[str, LevelHold] = field(default_factory=dict)
    _errors: dict[str, LevelHold] = field(default_factory=dict)

    def configure(self, cfg: LinksSection) -> None:
        """New thresholds and hold; each link keeps its level and how long it held."""
        self.cfg = cfg
        for hold in (*self._congestion.values(), *self._errors.values()):
            hold.hold = cfg.hold

    def next_deadline(self) -> float:
        """When a held level falls if its link stays as calm as it is now."""
        return min((hold.falls_at() for hold in (*self._congestion.values(),
                                                 *self._errors.values())),
                   default=float("inf"))

    def step(self, link_views: Iterable[LinkView], now: float) -> LinkStep:
        seen = tuple(link_views)
        levels, judged = [], tuple(judge(view, self.cfg) for view in seen)
        for view, raw in zip(seen, judged, strict=True):
            congestion = self._congestion.setdefault(raw.name, LevelHold(self.cfg.hold))
            errors = self._errors.setdefault(raw.name, LevelHold(self.cfg.hold))
            levels.append(LinkLevels(
                raw.name, raw.link_class, raw.up, congestion.update(raw.congestion, now),
                errors.update(raw.errors, now), raw.congestion, view.retransmits_per_s,
            ))
        return LinkStep(tuple(levels), judged, aggregate(levels), self._findings(levels))

    @staticmethod
    def _findings(levels: list[LinkLevels]) -> list[Finding]:
        down = sorted(link.name for link in levels if not link.up)
        congested = sorted(link.name for link in levels if link.congestion is Level.HIGH)
        return [
            Finding("LinkDown", bool(down), Severity.WARNING, "LinkNotUp" if down else "",
                    ", ".join(down)[:1000]),
            Finding("LinkCongested", bool(congested), Severity.WARNING,
                    "HighCongestion" if congested else "", ", ".join(congested)[:1000]),
        ]


def aggregate(levels: Iterable[LinkLevels]) -> tuple[LinkHealth, ...]:
    """Per link class: how many links, how many down, the worst levels."""
    classes: dict[str, list[LinkLevels]] = {}
    for link in levels:
        classes.setdefault(link.link_class, []).append(link)
    return tuple(
        LinkHealth(
            link_class=name,
            links=len(members),
            links_down=sum(1 for m in members if not m.up),
            congestion=max((m.congestion for m in members), key=lambda lv: lv.rank),
            errors=max((m.errors for m in members), key=lambda lv: lv.rank),
        )
        for name, members in sorted(classes.items())
    )
