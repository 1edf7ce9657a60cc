"""One link step: health and tuning judge each link once, by the same thresholds.

Before, health ran ``congestion_of`` with its 2 s hold and tuning rebuilt the
link views and ran it again with its own thresholds, so ``harmonctl links``
and ``harmonctl jobs`` could disagree about one moment, and after a reload
tuning kept the thresholds it started with.
"""

from __future__ import annotations

import dataclasses

import pytest

from agent.config import ObserversSection
from agent.links.health import LinkView, judge
from agent.links.settings import LinksSection
from agent.links.types import LinkRates, LinkSample
from agent.observations import Observations
from agent.step import HostHealthEngine
from agent.tuning.loop import LoopSettings, TuningLoop
from harmonaize.messages import Level

pytestmark = pytest.mark.redesign


def sample(utilization: float, at: float) -> LinkSample:
    bps = utilization * 100_000 * 1e6
    rates = LinkRates("eth0", "data", True, 100_000, bps, bps, 1e5, 1e5, utilization,
                      utilization, 0.0, 0.0, 0.0, 0.0, 0.0)
    return LinkSample("test", at, (rates,), 0.0)


def test_tuning_steps_on_the_judgement_health_holds_its_levels_from() -> None:
    engine = HostHealthEngine(ObserversSection(links=LinksSection(hold=2.0)))
    loop = TuningLoop(LoopSettings())
    seen = []
    for now, utilization in ((0.0, 0.95), (1.0, 0.1), (2.0, 0.1), (3.5, 0.1)):
        step = engine.step(Observations(links=sample(utilization, now)), now)
        loop.step(step.links.judged, {}, now)
        (levels,) = step.links.links
        assert loop.raw is levels.raw_congestion  # one judgement for both
        seen.append((levels.raw_congestion, levels.congestion))
    # The raw level falls at once; health's held level only after its hold.
    assert seen == [(Level.HIGH, Level.HIGH), (Level.NONE, Level.HIGH),
                    (Level.NONE, Level.HIGH), (Level.NONE, Level.NONE)]


def test_a_reload_changes_the_judgement_of_health_and_tuning_alike() -> None:
    cfg = ObserversSection()
    engine = HostHealthEngine(cfg)
    loop = TuningLoop(LoopSettings())
    step = engine.step(Observations(links=sample(0.87, 0.0)), 0.0)
    loop.step(step.links.judged, {}, 0.0)
    assert loop.raw is Level.HIGH and "utilization 87%" in loop.evidence
    engine.configure(dataclasses.replace(
        cfg, links=dataclasses.replace(cfg.links, utilization_high=0.9)))
    step = engine.step(Observations(links=sample(0.87, 1.0)), 1.0)
    loop.step(step.links.judged, {}, 1.0)
    assert loop.raw is Level.LOW
    assert step.links.links[0].raw_congestion is Level.LOW


def test_a_judgement_carries_its_evidence_and_whether_it_retransmits() -> None:
    cfg = LinksSection()
    busy = LinkView("ib0", "rdma", True, 0.2, 0.0, cfg.retransmit_low, 0.0,
                    cfg.min_packets_per_s)
    judged = judge(busy, cfg)
    assert judged.retransmitting and judged.congestion is Level.LOW
    assert judged.evidence == ("ib0: low: utilization 20%, CE/CNP 0.00%, retransmits "
                               f"{cfg.retransmit_low:.2%}")
    idle = judge(dataclasses.replace(busy, packets_per_s=cfg.min_packets_per_s / 2), cfg)
    assert not idle.retransmitting and idle.congestion is Level.NONE
    down = judge(dataclasses.replace(busy, up=False, utilization=0.99), cfg)
    assert down.congestion is Level.NONE and not down.up
