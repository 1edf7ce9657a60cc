"""Engines judge again on news or at their deadline, not every second: and that
changes nothing. A GPU with no finding holding and no condition waiting is not
judged again until its readings move, an event comes or its own deadline (the end
of a suspicion, a job's next advice) passes. The property: an engine that judges
such quiet GPUs at every step instead says exactly the same, step by step.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.gpu.health import FULL_EVALUATION, GpuHealthEngine
from agent.gpu.record import GpuRecord as _Gpu
from agent.gpu.settings import GpuObserverSection
from agent.gpu.types import XID_EVENT, GpuSample, JobRef, NvmlEvent
from agent.links.health import LevelHold, LinkHealthEngine, LinkView
from agent.links.settings import LinksSection
from harmonaize.messages import Level
from tests.agent.gpu.test_health import SAMPLES, counters, sample, telemetry

pytestmark = pytest.mark.redesign

CFG = GpuObserverSection(sbe_per_minute=5.0, suspect_clear=4.0, advisory_interval=0.6,
                         slowdown_sustain=0.5, xid_hold=1.5)


class EveryStep(GpuHealthEngine):
    """The reference: a quiet GPU is judged again at every step (one with a finding
    holding or a condition waiting keeps the every-second cadence in both)."""

    def _deadline(self, gpu: _Gpu, now: float) -> float:
        due = super()._deadline(gpu, now)
        return due if due == now + FULL_EVALUATION else now


#: One step: seconds since the last, single-bit errors added, an XID or not, heat.
STEPS = st.lists(st.tuples(
    st.sampled_from([0.1, 0.1, 0.1, 0.5, 1.0, 2.5]),
    st.sampled_from([0, 0, 0, 1, 3, 6]),
    st.sampled_from([None, None, None, 13, 74]),
    st.booleans(),
    st.booleans(),  # a new observation (or the same one again)
), min_size=1, max_size=60)


def observable(step) -> tuple:
    views = tuple((v.index, v.state, v.why, v.since, v.action, v.conditions, v.xid_count)
                  for v in step.gpus)
    return views, step.counts, step.findings, step.events, step.advisories, step.action


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_judging_quiet_gpus_at_every_step_changes_nothing(steps) -> None:
    ours, reference = GpuHealthEngine(CFG), EveryStep(CFG)
    now, sbe, previous = 0.0, 0, None
    jobs = (JobRef("job-1", "0"),)
    for dt, errors, xid, hot, fresh in steps:
        now += dt
        if fresh or previous is None:
            sbe += errors
            reasons = 0x20 if hot else 0
            observation = sample(counters(ecc_sbe_volatile=sbe, clocks_event_reasons=reasons),
                                 telemetry(), xids=(xid,) if xid else (), jobs=jobs)
        else:
            observation = previous
        previous = observation
        assert observable(ours.step(observation, now)) == observable(
            reference.step(observation, now)), f"at {now:.1f} s"


def test_a_quiet_gpu_is_not_judged_again_and_a_suspicion_still_ends_on_time() -> None:
    engine = GpuHealthEngine(CFG)
    quiet = sample(counters(), telemetry())
    engine.step(quiet, 0.0)
    judged = engine.gpus[0].evaluated_at
    for tick in range(1, 50):  # five seconds at 10 Hz: the same readings, new numbers
        engine.step(GpuSample(quiet.gpus, (), call_timeout=2.0, seq=next(SAMPLES)), tick / 10)
    assert engine.gpus[0].evaluated_at == judged
    assert engine.next_deadline() == float("inf")
    # An XID 74 makes the GPU suspect; once its XID is no longer held and the
    # suspicion has had no signal for suspect_clear, the step at that deadline ends it.
    engine.step(GpuSample(quiet.gpus, (NvmlEvent(0, XID_EVENT, 74, 5.0),), call_timeout=2.0,
                          seq=next(SAMPLES)), 5.0)
    assert engine.gpus[0].state.value == "suspect"
    now = 5.0
    while engine.gpus[0].state.value == "suspect" and now < 20:
        now = round(now + 0.1, 1)
        engine.step(GpuSample(quiet.gpus, (), call_timeout=2.0, seq=next(SAMPLES)), now)
    last_signal = engine.gpus[0].since - CFG.suspect_clear
    assert engine.gpus[0].state.value == "healthy"
    assert now == pytest.approx(last_signal + CFG.suspect_clear)


def test_a_held_link_level_says_when_it_falls() -> None:
    hold = LevelHold(2.0)
    assert hold.falls_at() == float("inf")
    hold.update(Level.HIGH, 0.0)
    hold.update(Level.NONE, 1.0)
    assert hold.falls_at() == 3.0
    engine = LinkHealthEngine(LinksSection(hold=2.0))
    busy = LinkView("eth0", "data", True, 0.95, 0.0, 0.0, 0.0, 1e5)
    engine.step([busy], 0.0)
    assert engine.next_deadline() == float("inf")
    engine.step([dataclasses.replace(busy, utilization=0.1)], 1.0)
    assert engine.next_deadline() == 3.0
