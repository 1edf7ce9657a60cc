"""RDMA congestion control's loop, sans I/O: decisions from counters, inside the ranges.

The property tests drive the loop with random ranges, random settings found on
the NIC (inside and outside the ranges) and random counter streams, and check
what every decision may never do: set a value outside the operator's range or
enable set, or decide more often than the rate limit allows.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.rdma.cc import CcLoop, CcObservations, DeviceSettings, level_value, position
from agent.rdma.ccparams import PARAMS, STEERED, enable_knob
from agent.rdma.settings import CcDeviceSection, RdmaCcSection, Switch
from agent.rdma.types import RdmaPortRates, RdmaSample, RdmaTotals

pytestmark = pytest.mark.rdma

RANGES = {"rpg_ai_rate": (5, 80), "rpg_hai_rate": (50, 400), "rpg_time_reset": (100, 1200),
          "min_time_between_cnps": (0, 20), "cnp_dscp": (48, 48)}


def port(totals: RdmaTotals, rate_gbps: float | None = 100.0) -> RdmaSample:
    rates = RdmaPortRates("mlx5_0", 1, "eth2", "data", "Ethernet", "ACTIVE", True, rate_gbps,
                          0.0, 0.0, 0.0, 0.0, None, None, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                          totals=totals)
    return RdmaSample((rates,))


def device(**kwargs: object) -> CcDeviceSection:
    return CcDeviceSection(**{"device": "eth2", "ranges": RANGES, **kwargs})  # type: ignore[arg-type]


def loop_for(dev: CcDeviceSection | None = None, **kwargs: object) -> CcLoop:
    cfg = RdmaCcSection(**{"enabled": True, "window": 1.0, "hold": 10.0, "min_packets": 1000,
                           "max_changes_per_minute": 30, "devices": (dev or device(),),
                           **kwargs})  # type: ignore[arg-type]
    return CcLoop(cfg)


class Nic:
    """A NIC as the loop sees it: values, and counters that move as a test says."""

    def __init__(self, values: dict[str, int] | None = None) -> None:
        self.values = dict(values or {"rpg_ai_rate": 5, "rpg_hai_rate": 50,
                                      "rpg_time_reset": 300, "min_time_between_cnps": 4,
                                      "cnp_dscp": 48})
        self.totals = RdmaTotals()

    def traffic(self, packets: int = 100_000, loss: int = 0, cnps: int = 0,
                ignored: int = 0, marked: int = 0, utilization: float = 0.5) -> None:
        t = self.totals
        self.totals = dataclasses.replace(
            t, tx_packets=t.tx_packets + packets, rx_packets=t.rx_packets + packets,
            tx_bytes=t.tx_bytes + int(utilization * 100e9 / 8),
            retransmits=t.retransmits + loss, cnp_handled=t.cnp_handled + cnps,
            cnp_ignored=t.cnp_ignored + ignored, ecn_marked=t.ecn_marked + marked)

    def observe(self, name: str = "eth2") -> CcObservations:
        return CcObservations(port(self.totals), (DeviceSettings(
            name, "mlx5_0/1", "sysfs", dict(self.values)),))

    def step(self, loop: CcLoop, now: float) -> list:
        actions = loop.step(self.observe(), now)
        for action in actions:
            self.values[action.knob] = action.value
        return actions


def run(loop: CcLoop, nic: Nic, windows: int, start: float = 0.0, **traffic: object) -> list:
    actions = []
    for i in range(windows):
        nic.traffic(**traffic)  # type: ignore[arg-type]
        actions += nic.step(loop, start + i)
    return actions


def test_loss_steps_toward_caution_at_once() -> None:
    loop, nic = loop_for(), Nic({"rpg_ai_rate": 80, "rpg_hai_rate": 400, "rpg_time_reset": 100,
                                 "min_time_between_cnps": 20, "cnp_dscp": 48})
    assert nic.step(loop, 0.0) == []                 # the first window sets the baseline
    nic.traffic(loss=100)                             # 1e-3 of packets: above loss_high
    actions = nic.step(loop, 1.0)
    assert loop.devices["eth2"].level == 7
    assert {a.knob for a in actions} == {"rpg_ai_rate", "rpg_hai_rate", "rpg_time_reset",
                                          "min_time_between_cnps"}
    changed = {a.knob: a for a in actions}
    assert changed["rpg_ai_rate"].value < 80 and changed["rpg_time_reset"].value > 100
    assert "loss 1.00e-03" in changed["rpg_ai_rate"].reason
    # More loss: more caution, one level per window, down to the cautious ends.
    run(loop, nic, 10, start=2.0, loss=100)
    assert loop.devices["eth2"].level == 0
    assert nic.values["rpg_ai_rate"] == 5 and nic.values["rpg_time_reset"] == 1200
    assert "most cautious level" in loop.devices["eth2"].waiting


def test_throttled_without_loss_steps_toward_faster_recovery_after_the_hold() -> None:
    loop, nic = loop_for(), Nic()
    nic.step(loop, 0.0)
    # CNPs on 1% of packets at 50% utilization, no loss: senders held back.
    assert run(loop, nic, 9, start=1.0, cnps=1000) == []
    assert "of hold 10 s" in loop.devices["eth2"].waiting
    start = loop.devices["eth2"].level     # where the values it found lie in the ranges
    assert start == 2
    actions = run(loop, nic, 2, start=10.0, cnps=1000)
    assert actions and loop.devices["eth2"].level == start + 1
    assert "faster recovery" in actions[0].reason and "utilization 50%" in actions[0].reason
    assert nic.values["rpg_ai_rate"] > 5 and nic.values["rpg_time_reset"] < 1200
    # The next step up waits a whole hold again.
    assert run(loop, nic, 8, start=12.0, cnps=1000) == []
    assert run(loop, nic, 1, start=20.0, cnps=1000) and loop.devices["eth2"].level == start + 2


def test_busy_or_unthrottled_or_lossy_links_hold_their_level() -> None:
    for traffic in ({"cnps": 1000, "utilization": 0.95},   # throttled but the link is full
                    {"cnps": 10},                           # barely any CNPs
                    {"cnps": 1000, "loss": 3}):             # loss between the thresholds
        loop, nic = loop_for(), Nic()
        nic.step(loop, 0.0)
        assert run(loop, nic, 30, start=1.0, **traffic) == [], traffic
    loop, nic = loop_for(), Nic()
    nic.step(loop, 0.0)
    assert run(loop, nic, 30, start=1.0, packets=100, loss=100) == []  # too few packets
    assert "fewer than min_packets" in loop.devices["eth2"].waiting


def test_decisions_are_rate_limited_per_device() -> None:
    loop, nic = loop_for(max_changes_per_minute=2), Nic({
        "rpg_ai_rate": 80, "rpg_hai_rate": 400, "rpg_time_reset": 100,
        "min_time_between_cnps": 20, "cnp_dscp": 48})
    nic.step(loop, 0.0)
    decided = {a.value for a in run(loop, nic, 59, start=1.0, loss=100)
               if a.knob == "rpg_ai_rate"}
    assert len(decided) == 2 and loop.devices["eth2"].level == 6
    assert "rate limit" in loop.devices["eth2"].waiting
    run(loop, nic, 1, start=61.0, loss=100)   # a minute after the first decision
    assert loop.devices["eth2"].level == 5


def test_values_outside_the_range_are_brought_back_and_enables_follow_the_switches() -> None:
    dev = device(priorities=(3, 4), rp_enable=Switch.AUTO, np_enable=Switch.ON)
    loop = loop_for(dev)
    nic = Nic({"rpg_ai_rate": 1, "rpg_hai_rate": 50, "rpg_time_reset": 300,
               "min_time_between_cnps": 4, "cnp_dscp": 26, enable_knob("rp", 3): 0,
               enable_knob("rp", 4): 1, enable_knob("np", 3): 0, enable_knob("np", 4): 1})
    nic.step(loop, 0.0)
    actions = {a.knob: a for a in run(loop, nic, 1, start=1.0, packets=10)}
    assert actions["rpg_ai_rate"].value == 5 and "outside the declared range" in \
        actions["rpg_ai_rate"].reason
    assert actions["cnp_dscp"].value == 48
    assert actions[enable_knob("np", 3)].value == 1
    assert enable_knob("rp", 3) not in actions        # auto: nothing says it is needed yet
    actions = {a.knob: a for a in run(loop, nic, 1, start=2.0, packets=10, ignored=5)}
    assert actions[enable_knob("rp", 3)].value == 1
    assert "5 CNPs ignored" in actions[enable_knob("rp", 3)].reason
    # Auto never turns a flag off; "off" does.
    loop = loop_for(device(priorities=(3,), rp_enable=Switch.OFF, np_enable=Switch.AUTO))
    nic.step(loop, 10.0)
    actions = {a.knob: a for a in run(loop, nic, 1, start=11.0, marked=50)}
    assert actions[enable_knob("rp", 3)].value == 0
    assert enable_knob("np", 3) not in actions        # it is on already


def test_a_failed_write_keeps_the_level() -> None:
    loop, nic = loop_for(), Nic({"rpg_ai_rate": 80, "rpg_hai_rate": 400,
                                 "rpg_time_reset": 100, "min_time_between_cnps": 20,
                                 "cnp_dscp": 48})
    nic.step(loop, 0.0)
    nic.traffic(loss=100)
    actions = loop.step(nic.observe(), 1.0)
    loop.failed(actions[0], "Permission denied", 1.0)
    assert loop.devices["eth2"].level == 8
    assert loop.history[-1].outcome == "failed: Permission denied"


def test_levels_span_each_range_from_its_cautious_to_its_fast_end() -> None:
    for name in STEERED:
        param = PARAMS[name]
        lo, hi = (param.lo, min(param.hi, param.lo + 5000))
        cautious, fast = level_value(name, 0, 8, lo, hi), level_value(name, 8, 8, lo, hi)
        assert (cautious, fast) == ((lo, hi) if param.push > 0 else (hi, lo)), name
        assert position(name, fast, lo, hi) == pytest.approx(1.0)
        assert position(name, cautious, lo, hi) == pytest.approx(0.0)


def test_nothing_happens_when_off_and_deadlines_are_windows() -> None:
    assert CcLoop(RdmaCcSection(devices=(device(),))).next_deadline() == float("inf")
    loop, nic = loop_for(), Nic()
    nic.step(loop, 5.0)
    assert loop.next_deadline() == 6.0
    nic.traffic(loss=100)
    assert loop.step(nic.observe(), 5.5) == []       # before its deadline: nothing judged


# --- properties ------------------------------------------------------------------------

def _bound(name: str) -> st.SearchStrategy[tuple[int, int]]:
    param = PARAMS[name]
    hi = min(param.hi, 200_000)
    return st.tuples(st.integers(param.lo, hi), st.integers(param.lo, hi)).map(
        lambda b: (min(b), max(b)))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[CcDeviceSection, RdmaCcSection, dict[str, int], list]:
    names = draw(st.lists(st.sampled_from(sorted(PARAMS)), min_size=1, max_size=8, unique=True))
    ranges = {name: draw(_bound(name)) for name in names}
    priorities = tuple(draw(st.lists(st.integers(0, 7), max_size=3, unique=True)))
    switches = st.sampled_from(list(Switch)) if priorities else st.just(Switch.KEEP)
    dev = CcDeviceSection("eth2", priorities, draw(switches), draw(switches),
                          ranges)  # type: ignore[arg-type]
    cfg = RdmaCcSection(enabled=True, window=1.0, hold=draw(st.sampled_from([0.0, 2.0, 10.0])),
                        steps=draw(st.integers(1, 12)), min_packets=100,
                        max_changes_per_minute=draw(st.integers(1, 6)), devices=(dev,))
    values = {name: draw(st.integers(PARAMS[name].lo, min(PARAMS[name].hi, 300_000)))
              for name in names}
    for priority in priorities:
        for point in ("rp", "np"):
            values[enable_knob(point, priority)] = draw(st.integers(0, 1))
    windows = draw(st.lists(st.fixed_dictionaries({
        "packets": st.integers(0, 10**6), "loss": st.integers(0, 5000),
        "cnps": st.integers(0, 50_000), "ignored": st.integers(0, 10),
        "marked": st.integers(0, 10), "utilization": st.floats(0.0, 1.0),
        "gap": st.sampled_from([0.5, 1.0, 1.0, 3.0, 30.0]),
        "meddle": st.booleans()}), min_size=1, max_size=60))
    return dev, cfg, values, windows


ALLOWED = {Switch.ON: {1}, Switch.OFF: {0}, Switch.AUTO: {0, 1}, Switch.KEEP: set()}


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_decision_ever_leaves_the_declared_ranges(scenario: tuple) -> None:
    dev, cfg, values, windows = scenario
    loop, nic, now = CcLoop(cfg), Nic(values), 0.0
    decided: list[float] = []
    for window in windows:
        now += window["gap"]
        if window["meddle"] and dev.ranges:  # someone else writes a value, any value
            name = sorted(dev.ranges)[0]
            nic.values[name] = PARAMS[name].hi if nic.values[name] != PARAMS[name].hi \
                else PARAMS[name].lo
        nic.traffic(**{k: v for k, v in window.items() if k not in ("gap", "meddle")})
        actions = nic.step(loop, now)
        for action in actions:
            if action.knob in dev.ranges:
                lo, hi = dev.ranges[action.knob]
                assert lo <= action.value <= hi, (action, dev.ranges[action.knob])
            else:
                point = action.knob.split("_", 1)[0]
                switch = dev.rp_enable if point == "rp" else dev.np_enable
                assert action.value in ALLOWED[switch], (action, switch)
            assert action.value != action.previous
        if actions:
            decided.append(now)
        assert sum(1 for t in decided if now - t < 60.0) <= cfg.max_changes_per_minute
