"""Sans-I/O DCQCN control: a RoCE NIC's congestion control within the operator's ranges.

What it optimises: the port's throughput, under the constraint that RoCE loses
nothing. DCQCN (Zhu et al., SIGCOMM 2015) cuts a sender's rate when CNPs
arrive and raises it again on a timer and a byte counter; how fast it raises it
(the additive and hyper increase steps, the timer and byte counter, how often
the receiver sends CNPs) trades throughput against queue length. Too slow, and
throttled senders leave the link idle after every cut; too fast, and queues
overflow: packets are lost, and RoCE's go-back-N retransmission costs far more
than the bandwidth it wanted. docs/tuning.md gives the model and its sources.

The loop judges each configured port once per ``window`` from the NIC's
counters (CNPs handled, ignored and sent, ECN-marked packets, out-of-sequence
packets, retransmissions and timeouts) and moves a *level* along the declared
ranges: level 0 puts every steered parameter at its cautious end, ``steps`` at
its fast end.

* Loss at or above ``loss_high``: one level toward caution, at once.
* Senders throttled by CNPs (``cnp_low`` per packet sent) below
  ``utilization_target`` with loss at or below ``loss_low`` for ``hold``
  seconds: one level toward faster recovery, then ``hold`` again before the next.
* Between the two loss thresholds nothing moves (hysteresis).
* Enable flags: ``on``/``off`` are kept so; ``auto`` turns a priority's reaction
  point on when CNPs are ignored, its notification point when ECN-marked
  packets arrive, and never off.
* Any declared parameter found outside its range is brought back to its nearest end.

Every value it sets lies within the operator's declared range (or set of
enable values); at most ``max_changes_per_minute`` decisions per device. Time
is a parameter, nothing here reads a clock or a file: the shell
(:mod:`agent.rdma.service`) reads the values, writes them, keeps the originals
and restores them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.rdma.ccparams import PARAMS, enable_knob
from agent.rdma.settings import CcDeviceSection, RdmaCcSection, Switch
from agent.rdma.types import RdmaPortRates, RdmaSample, RdmaTotals

HISTORY = 100


@dataclass(frozen=True)
class DeviceSettings:
    """What the shell read of one configured device this window."""

    device: str
    #: The RDMA port its counters come from ("mlx5_0/1"); empty if none was found.
    port: str = ""
    layout: str = ""
    #: Knob -> its value now: parameters by name, enable flags as "rp_enable/3".
    values: Mapping[str, int] = field(default_factory=dict)
    #: Declared knobs this device has no readable file for.
    unsettable: tuple[str, ...] = ()
    #: Why nothing can be done with the device (no port, no layout); empty if fine.
    error: str = ""


@dataclass(frozen=True)
class CcObservations:
    rdma: RdmaSample | None
    devices: tuple[DeviceSettings, ...]


@dataclass(frozen=True)
class SetKnob:
    """Set ``knob`` of ``device`` to ``value`` (it was ``previous``), for ``reason``."""

    device: str
    knob: str
    value: int
    previous: int
    reason: str


@dataclass(frozen=True)
class Evidence:
    """One window's counters of a port, and the shares judged."""

    seconds: float
    tx_packets: int
    rx_packets: int
    cnp_handled: int
    cnp_ignored: int
    cnp_sent: int
    ecn_marked: int
    lost: int
    #: Out-of-sequence packets per packet received, or retransmissions and timeouts per
    #: packet sent: the worse.
    loss_fraction: float
    #: CNPs handled per packet sent.
    cnp_fraction: float
    #: Transmit utilization of the port over the window; None if its speed is unknown.
    utilization: float | None


def evidence(before: RdmaTotals, after: RdmaTotals, seconds: float,
             rate_gbps: float | None) -> Evidence:
    def d(name: str) -> int:
        return max(0, getattr(after, name) - getattr(before, name))

    tx, rx = d("tx_packets"), d("rx_packets")
    sender_loss = d("retransmits") + d("timeouts")
    loss = max(d("out_of_sequence") / rx if rx else 0.0, sender_loss / tx if tx else 0.0)
    utilization = None
    if rate_gbps and seconds > 0:
        utilization = min(1.0, 8 * d("tx_bytes") / seconds / (rate_gbps * 1e9))
    return Evidence(seconds, tx, rx, d("cnp_handled"), d("cnp_ignored"), d("cnp_sent"),
                    d("ecn_marked"), d("out_of_sequence") + sender_loss, loss,
                    d("cnp_handled") / tx if tx else 0.0, utilization)


def position(name: str, value: int, lo: int, hi: int) -> float:
    """Where ``value`` lies in [lo, hi]: 0 at the cautious end, 1 at the fast end."""
    param = PARAMS[name]
    value = min(hi, max(lo, value))
    if hi == lo:
        return 0.0
    if param.geometric:
        x = (math.log1p(value) - math.log1p(lo)) / (math.log1p(hi) - math.log1p(lo))
    else:
        x = (value - lo) / (hi - lo)
    return x if param.push > 0 else 1.0 - x


def level_value(name: str, level: int, steps: int, lo: int, hi: int) -> int:
    """The value of ``name`` at ``level`` of ``steps``, within [lo, hi]."""
    param = PARAMS[name]
    x = level / steps if param.push > 0 else 1.0 - level / steps
    if param.geometric:
        value = math.expm1(math.log1p(lo) + (math.log1p(hi) - math.log1p(lo)) * x)
    else:
        value = lo + (hi - lo) * x
    return min(hi, max(lo, round(value)))


@dataclass(frozen=True)
class Decision:
    at: float
    device: str
    knob: str
    previous: int
    value: int
    reason: str
    #: "set", or "failed: ..." when the shell could not write it.
    outcome: str = "set"


@dataclass
class _Device:
    cfg: CcDeviceSection
    level: int | None = None
    base: RdmaTotals | None = None
    base_at: float = 0.0
    decided: deque[float] = field(default_factory=deque)
    calm_since: float | None = None
    last_step: float = float("-inf")
    previous_level: int | None = None
    evidence: Evidence | None = None
    #: Why nothing changed at the last window, in words (empty if something did).
    waiting: str = "no window judged yet"
    port: str = ""
    layout: str = ""


class CcLoop:
    def __init__(self, cfg: RdmaCcSection) -> None:
        self.cfg = cfg
        self.devices = {d.device: _Device(d) for d in cfg.devices}
        self.history: deque[Decision] = deque(maxlen=HISTORY)
        self._due: float | None = None

    def next_deadline(self) -> float:
        """When the next window ends (inf with nothing to control)."""
        if not self.cfg.enabled or not self.devices:
            return float("inf")
        return self._due if self._due is not None else float("-inf")

    # --- one window ------------------------------------------------------------------

    def step(self, observations: CcObservations, now: float) -> list[SetKnob]:
        if not self.cfg.enabled or not self.devices:
            return []
        if self._due is not None and now < self._due:
            return []
        self._due = now + self.cfg.window
        ports = {p.name: p for p in observations.rdma.ports} if observations.rdma else {}
        actions: list[SetKnob] = []
        for settings in observations.devices:
            state = self.devices.get(settings.device)
            if state is not None:
                actions += self._device(state, settings, ports.get(settings.port), now)
        return actions

    def _device(self, state: _Device, settings: DeviceSettings, port: RdmaPortRates | None,
                now: float) -> list[SetKnob]:
        state.port, state.layout = settings.port, settings.layout
        if settings.error:
            state.waiting, state.base = settings.error, None
            return []
        if port is None:
            state.waiting, state.base = f"port {settings.port or '?'} is not observed", None
            return []
        before, state.base = state.base, port.totals
        seconds, state.base_at = now - state.base_at, now
        if before is None:
            state.waiting = "first window: counters from now on"
            return []
        ev = state.evidence = evidence(before, port.totals, seconds, port.rate_gbps)
        targets = self._in_range(state.cfg, settings.values)
        targets.update(self._enables(state.cfg, settings.values, ev))
        wanted_level = self._steer(state, settings.values, ev, now)
        if wanted_level is not None:
            for name, value in self._level_values(state.cfg, wanted_level).items():
                current = settings.values.get(name)
                if current is not None and current != value:
                    targets[name] = (value, self._steer_reason(state, wanted_level, ev))
        if not targets:
            if wanted_level is not None:  # already there (someone else set the values)
                state.level = wanted_level
            return []
        recent = [t for t in state.decided if now - t < 60.0]
        state.decided = deque(recent)
        if len(recent) >= self.cfg.max_changes_per_minute:
            state.waiting = (f"rate limit: {len(recent)} decisions in the last minute "
                             f"(max_changes_per_minute {self.cfg.max_changes_per_minute})")
            return []
        state.decided.append(now)
        state.previous_level = state.level
        if wanted_level is not None:
            state.level, state.last_step = wanted_level, now
        state.waiting = ""
        actions = [SetKnob(settings.device, knob, value, settings.values[knob], reason)
                   for knob, (value, reason) in sorted(targets.items())]
        self.history.extend(Decision(now, a.device, a.knob, a.previous, a.value, a.reason)
                            for a in actions)
        return actions

    @staticmethod
    def _in_range(cfg: CcDeviceSection, values: Mapping[str, int]) -> dict[str, tuple[int, str]]:
        out = {}
        for name, (lo, hi) in cfg.ranges.items():
            current = values.get(name)
            if current is not None and not lo <= current <= hi:
                out[str(name)] = (min(hi, max(lo, current)),
                                  f"{current} is outside the declared range [{lo}, {hi}]")
        return out

    @staticmethod
    def _enables(cfg: CcDeviceSection, values: Mapping[str, int],
                 ev: Evidence) -> dict[str, tuple[int, str]]:
        out = {}
        for point, switch in (("rp", cfg.rp_enable), ("np", cfg.np_enable)):
            for priority in cfg.priorities:
                knob = enable_knob(point, priority)
                current = values.get(knob)
                if current is None or switch is Switch.KEEP:
                    continue
                if switch is Switch.ON and current != 1:
                    out[knob] = (1, "declared on")
                elif switch is Switch.OFF and current != 0:
                    out[knob] = (0, "declared off")
                elif switch is Switch.AUTO and current == 0:
                    if point == "rp" and ev.cnp_ignored:
                        out[knob] = (1, f"{ev.cnp_ignored} CNPs ignored in {ev.seconds:.1f} s: "
                                        "the reaction point is off")
                    elif point == "np" and ev.ecn_marked and not ev.cnp_sent:
                        out[knob] = (1, f"{ev.ecn_marked} ECN-marked packets and no CNP sent "
                                        f"in {ev.seconds:.1f} s: the notification point is off")
        return out

    def _steered(self, cfg: CcDeviceSection) -> dict[str, tuple[int, int]]:
        return {str(name): bounds for name, bounds in cfg.ranges.items()
                if PARAMS[name].push and bounds[0] < bounds[1]}

    def _level_values(self, cfg: CcDeviceSection, level: int) -> dict[str, int]:
        return {name: level_value(name, level, self.cfg.steps, lo, hi)
                for name, (lo, hi) in self._steered(cfg).items()}

    def _steer(self, state: _Device, values: Mapping[str, int], ev: Evidence,
               now: float) -> int | None:
        """The level this window calls for, or None to stay."""
        steered = {n: b for n, b in self._steered(state.cfg).items() if n in values}
        if not steered:
            state.waiting = "no steered parameter declared (a range with two different ends)"
            return None
        if state.level is None:
            mean = sum(position(n, values[n], lo, hi) for n, (lo, hi) in steered.items()) \
                / len(steered)
            state.level = round(mean * self.cfg.steps)
        if ev.tx_packets + ev.rx_packets < self.cfg.min_packets:
            state.waiting = (f"{ev.tx_packets + ev.rx_packets} packets in the window: fewer "
                             f"than min_packets {self.cfg.min_packets}")
            return None
        if ev.loss_fraction >= self.cfg.loss_high:
            state.calm_since = None
            if state.level == 0:
                state.waiting = "losing packets at the most cautious level already"
                return None
            return state.level - 1
        if ev.loss_fraction > self.cfg.loss_low:
            state.calm_since = None
            state.waiting = (f"loss {ev.loss_fraction:.2e} between loss_low and loss_high: "
                             "holding")
            return None
        if state.calm_since is None:
            state.calm_since = now - ev.seconds
        throttled = ev.cnp_fraction >= self.cfg.cnp_low
        idle = ev.utilization is not None and ev.utilization < self.cfg.utilization_target
        if not (throttled and idle):
            state.waiting = "senders not held back by CNPs below utilization_target"
            return None
        if state.level >= self.cfg.steps:
            state.waiting = "throttled at the fastest level already"
            return None
        waited = min(now - state.calm_since, now - state.last_step)
        if waited < self.cfg.hold:
            state.waiting = f"throttled without loss for {waited:.1f} s of hold {self.cfg.hold:g} s"
            return None
        return state.level + 1

    def _steer_reason(self, state: _Device, level: int, ev: Evidence) -> str:
        where = f"level {state.level} -> {level} of {self.cfg.steps}"
        if level < (state.level or 0):
            return (f"{where}: loss {ev.loss_fraction:.2e} (>= loss_high "
                    f"{self.cfg.loss_high:g}): slower recovery after cuts")
        utilization = "unknown" if ev.utilization is None else f"{ev.utilization:.0%}"
        return (f"{where}: CNPs {ev.cnp_fraction:.2%} of packets sent at utilization "
                f"{utilization}, no loss for {self.cfg.hold:g} s: faster recovery after cuts")

    # --- what the shell reports back --------------------------------------------------

    def failed(self, action: SetKnob, error: str, now: float) -> None:
        """The shell could not write ``action``: the device stays at its level."""
        state = self.devices.get(action.device)
        if state is not None and state.previous_level is not None:
            state.level = state.previous_level
        self.history.append(Decision(now, action.device, action.knob, action.previous,
                                     action.value, action.reason, f"failed: {error}"))

    def describe(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for name, state in self.devices.items():
            out[name] = {
                "port": state.port, "layout": state.layout, "level": state.level,
                "steps": self.cfg.steps, "waiting": state.waiting,
                "evidence": state.evidence,
                "ranges": {str(k): list(v) for k, v in state.cfg.ranges.items()},
                "priorities": list(state.cfg.priorities),
                "rp_enable": state.cfg.rp_enable.value, "np_enable": state.cfg.np_enable.value,
            }
        return out
