"""Sans-I/O GPU health: snapshots and events in; states, conditions, advice out.

Rules look at counter *changes* and rates (never last-value gauges) and at
NVML events, and report findings per GPU, each with a recommended action and
an effect on the GPU's state:

    healthy -> suspect -> validating -> healthy | quarantined        (and lost)

A suspect GPU returns to healthy only after ``suspect_clear`` seconds with no
suspect signal; quarantine and loss are latched until an operator or a
validation releases the GPU. When the failure risk of a GPU that a job uses
goes up, the job gets a checkpoint advisory in its own terms. Time is a
parameter; nothing here reads a clock or does I/O.
"""

# Over 400 lines because one GPU's states, its quarantine latch and its jobs' advisories are
# one state machine; the XID meanings are in agent/gpu/xid.py and the actions in
# agent/gpu/actions.py.

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from agent.conditions import ConditionTracker, Finding
from agent.gpu.actions import RECOVERY_ACTIONS, Action, worst
from agent.gpu.settings import GpuObserverSection
from agent.gpu.types import XID_EVENT, GpuCounters, GpuSample, GpuSnapshot, GpuTelemetry, JobRef
from agent.gpu.xid import Effect, Reason, lookup
from harmonaize.messages import (
    Advice,
    Condition,
    GpuCounts,
    HostEvent,
    JobAdvisory,
    Severity,
    Status,
    Urgency,
)

HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x20, 0x40, 0x80
#: A GPU with a finding that holds, or a condition waiting out its sustain, is
#: judged again this often (seconds) without news: its rules look at time passing
#: (windows, sustain, holds) and at growth since the last look. A GPU with neither
#: is judged again only on news or at its own deadline (the end of a suspicion).
FULL_EVALUATION = 1.0


class GpuState(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    VALIDATING = "validating"
    QUARANTINED = "quarantined"
    LOST = "lost"


@dataclass(frozen=True)
class GpuRule:
    """A finding with what it means for the GPU."""

    finding: Finding
    action: Action = Action.NONE
    effect: Effect = Effect.NONE
    reason: Reason = Reason.GPU_FAILURE


@dataclass
class _Window:
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


@dataclass
class _Gpu:
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
    windows: dict[str, _Window] = field(default_factory=dict)
    xids: dict[int, float] = field(default_factory=dict)  # xid -> last seen
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

    def window(self, name: str, span: float) -> _Window:
        return self.windows.setdefault(name, _Window(span))


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


@dataclass(frozen=True)
class GpuStep:
    gpus: tuple[GpuView, ...]
    counts: GpuCounts
    #: Host-level findings for the host's condition tracker.
    findings: list[Finding]
    events: list[HostEvent]
    advisories: list[JobAdvisory]
    #: The most disruptive action any GPU needs.
    action: Action


_RISK = {GpuState.SUSPECT: Urgency.ELEVATED, GpuState.VALIDATING: Urgency.ELEVATED,
         GpuState.QUARANTINED: Urgency.HIGH, GpuState.LOST: Urgency.HIGH}


class GpuHealthEngine:
    def __init__(self, cfg: GpuObserverSection) -> None:
        self.cfg = cfg
        self.gpus: dict[int, _Gpu] = {}
        self._advised: dict[str, tuple[Urgency, float]] = {}  # job -> (urgency, when)
        self._last: GpuStep | None = None
        self._last_at = float("-inf")
        #: When an advised job is due to be advised again.
        self._advise_due = float("inf")
        #: The number of the last observation stepped on (-1: none yet).
        self._seen = -1
        #: Set when a GPU's state moved (also from outside a step: validation,
        #: operators); the host engine then re-evaluates at once.
        self.changed = False

    def configure(self, cfg: GpuObserverSection) -> None:
        """New rule settings: states, quarantines and counter windows stay; every GPU
        is judged again by the new rules at the next step."""
        self.cfg = cfg
        for gpu in self.gpus.values():
            gpu.due = float("-inf")
        self.changed = True

    # --- hooks for validation and operators ---------------------------------------

    def _set(self, gpu: _Gpu, state: GpuState, why: str, now: float,
             action: Action | None = None) -> HostEvent | None:
        if gpu.state is state and gpu.why == why:
            return None
        gpu.due = float("-inf")  # show the change at the next step
        self.changed = True
        previous = gpu.state
        gpu.state, gpu.why, gpu.since = state, why, now
        if action is not None:
            gpu.action = action
        if state is GpuState.HEALTHY:
            gpu.action = Action.NONE
        severity = {GpuState.HEALTHY: Severity.INFO, GpuState.SUSPECT: Severity.WARNING,
                    GpuState.VALIDATING: Severity.INFO}.get(state, Severity.CRITICAL)
        if previous is state:
            return None
        return HostEvent(f"Gpu{state.value.capitalize()}", severity,
                         f"gpu {gpu.index}: {previous.value} -> {state.value}: {why}"[:1000])

    def begin_validation(self, index: int, now: float) -> HostEvent | None:
        gpu = self.gpus[index]
        if gpu.state is not GpuState.VALIDATING:
            gpu.before_validation = gpu.state
        return self._set(gpu, GpuState.VALIDATING, f"validating ({gpu.why})", now)

    def abort_validation(self, index: int, why: str, now: float) -> HostEvent | None:
        """The validation could not decide: back to where the GPU was."""
        gpu = self.gpus[index]
        if gpu.state is not GpuState.VALIDATING:
            return None
        return self._set(gpu, gpu.before_validation, why, now)

    def reset_seen(self, index: int) -> float:
        """When the GPU was last seen reset (-inf: never since the agent started)."""
        gpu = self.gpus.get(index)
        return gpu.reset_at if gpu is not None else float("-inf")

    def end_validation(self, index: int, passed: bool, why: str, now: float,
                       action: Action = Action.NONE) -> HostEvent | None:
        gpu = self.gpus[index]
        if passed:
            self._acknowledge(gpu, now)
            return self._set(gpu, GpuState.HEALTHY, why, now)
        return self._set(gpu, GpuState.QUARANTINED, why, now, action)

    def quarantine(self, index: int, why: str, now: float,
                   action: Action = Action.DRAIN) -> HostEvent | None:
        return self._set(self.gpus[index], GpuState.QUARANTINED, why, now, action)

    def release(self, index: int, why: str, now: float) -> HostEvent | None:
        gpu = self.gpus[index]
        self._acknowledge(gpu, now)
        return self._set(gpu, GpuState.HEALTHY, why, now)

    @staticmethod
    def _acknowledge(gpu: _Gpu, now: float) -> None:
        """Evidence up to now has been judged: rates count again from zero, so errors
        that keep coming make the GPU suspect again, and old ones do not."""
        gpu.last_suspect_signal = float("-inf")
        gpu.acknowledged_at = now
        gpu.windows.clear()
        gpu.xids.clear()

    # --- the step -------------------------------------------------------------------

    def step(self, sample: GpuSample | None, now: float) -> GpuStep:
        """Evaluate the GPUs whose inputs changed or whose deadline came."""
        events: list[HostEvent] = []
        evaluated = False
        changed, self.changed = self.changed, False
        seq = sample.seq if sample is not None else -1
        if seq == self._seen and self._last is not None and not changed \
                and now < self.next_deadline():
            # The observer handed on the same observation: nothing new at all.
            return GpuStep(self._last.gpus, self._last.counts, self._last.findings, [], [],
                           self._last.action)
        fresh, self._seen = seq != self._seen, seq
        if sample is not None:
            with_xids = set()
            for event in sample.events if fresh else ():  # an old sample's events are done
                if event.type == XID_EVENT and event.gpu in self._known(sample):
                    events.append(self._xid(self.gpus[event.gpu], event.data, now))
                    with_xids.add(event.gpu)
            for snap in sample.gpus:
                gpu = self.gpus.setdefault(snap.identity.index, _Gpu(snap.identity.index))
                jobs = sample.jobs.get(gpu.index, ())
                previous = gpu.snapshot
                gpu.uuid, gpu.name, gpu.snapshot = snap.identity.uuid, snap.identity.name, snap
                if (previous is not None and gpu.view is not None
                        and snap.version == previous.version
                        and snap.lost == previous.lost and snap.hung_call is None
                        and previous.hung_call is None and gpu.index not in with_xids
                        and jobs == gpu.jobs and now < gpu.due):
                    continue  # nothing new about this GPU
                gpu.jobs = jobs
                self._evaluate(gpu, snap, sample.call_timeout, now, events)
                evaluated = True
        if evaluated or changed or self._last is None or now >= self._advise_due:
            views = tuple(g.view for _, g in sorted(self.gpus.items()) if g.view is not None)
            self._last = GpuStep(views, self._counts(), self._host_findings(), [],
                                 self._advisories(now), worst([v.action for v in views]))
            self._last_at = now
            self._advise_due = min((at + self.cfg.advisory_interval
                                    for _, at in self._advised.values()), default=float("inf"))
            return GpuStep(self._last.gpus, self._last.counts, self._last.findings, events,
                           self._last.advisories, self._last.action)
        return GpuStep(self._last.gpus, self._last.counts, self._last.findings, events, [],
                       self._last.action)

    def _evaluate(self, gpu: _Gpu, snap: GpuSnapshot, call_timeout: float, now: float,
                  events: list[HostEvent]) -> None:
        gpu.rules = tuple(self._rules(gpu, snap, call_timeout, now))
        events += [
            HostEvent(e.reason, e.severity, f"gpu {gpu.index}: {e.message}".rstrip(": "))
            for e in gpu.tracker.update([r.finding for r in gpu.rules], now)
        ]
        if (moved := self._transition(gpu, now)) is not None:
            events.append(moved)
        gpu.view = self._view(gpu)
        gpu.evaluated_at = now
        gpu.due = self._deadline(gpu, now)

    def _deadline(self, gpu: _Gpu, now: float) -> float:
        """When time passing alone could change what the rules say of this GPU.

        While a finding holds or a condition waits out its sustain, rules look at
        time (windows, sustain, holds) and at growth since the last look: judge
        again every ``FULL_EVALUATION``. Otherwise no rule can change without news
        (a window's growth only shrinks as time passes, and none holds now), except
        a suspicion that ends ``suspect_clear`` after its last signal.
        """
        if gpu.tracker.pending() or any(r.finding.holds for r in gpu.rules):
            return now + FULL_EVALUATION
        if gpu.state is GpuState.SUSPECT:
            return gpu.last_suspect_signal + self.cfg.suspect_clear
        return float("inf")

    def next_deadline(self) -> float:
        """When a step without news could change anything: the earliest GPU deadline or
        re-advice (the daemon may step at any time before; it is then a no-op)."""
        return min([self._advise_due, *(g.due for g in self.gpus.values())])

    def _known(self, sample: GpuSample) -> set[int]:
        for snap in sample.gpus:
            self.gpus.setdefault(snap.identity.index, _Gpu(snap.identity.index))
        return set(self.gpus)

    def _xid(self, gpu: _Gpu, xid: int, now: float) -> HostEvent:
        info = lookup(xid)
        gpu.xid_count += 1
        if info.effect is not Effect.NONE:
            gpu.xids[xid] = now
        severity = {Effect.NONE: Severity.INFO, Effect.SUSPECT: Severity.WARNING}.get(
            info.effect, Severity.CRITICAL)
        return HostEvent("Xid", severity,
                         f"gpu {gpu.index}: xid {xid} ({info.meaning}): {info.action.value}")

    def _rules(self, gpu: _Gpu, snap: GpuSnapshot, call_timeout: float,
               now: float) -> Iterable[GpuRule]:
        yield GpuRule(
            Finding("GpuLost", snap.lost, Severity.CRITICAL, "FellOffTheBus" if snap.lost else "",
                    snap.error if snap.lost else ""),
            Action.REBOOT_NODE, Effect.LOST, Reason.GPU_FAILURE)
        hung = snap.hung_call is not None and snap.hung_for >= call_timeout
        yield GpuRule(
            Finding("GpuUnresponsive", hung, Severity.CRITICAL,
                    "NvmlCallHung" if hung else "",
                    f"{snap.hung_call} has not returned for {snap.hung_for:.1f} s" if hung else ""),
            Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE)
        yield from self._xid_rules(gpu, now)
        counters = snap.counters
        if counters is not None:
            yield from self._counter_rules(gpu, snap, counters, now)
            gpu.previous = counters
        if snap.telemetry is not None:
            yield from self._link_rules(snap, snap.telemetry)

    def _xid_rules(self, gpu: _Gpu, now: float) -> Iterable[GpuRule]:
        for xid, seen in list(gpu.xids.items()):
            if now - seen > self.cfg.xid_hold:
                del gpu.xids[xid]
        infos = [lookup(x) for x in sorted(gpu.xids)]
        holds = bool(infos)
        worst_info = max(infos, key=lambda i: (list(Effect).index(i.effect), i.action.rank),
                         default=None)
        yield GpuRule(
            Finding("Xid", holds,
                    Severity.WARNING if worst_info and worst_info.effect is Effect.SUSPECT
                    else Severity.CRITICAL,
                    "XidReported" if holds else "",
                    "; ".join(f"xid {i.xid} ({i.meaning})" for i in infos)[:1000]),
            worst_info.action if worst_info else Action.NONE,
            worst_info.effect if worst_info else Effect.NONE,
            worst_info.reason if worst_info else Reason.GPU_FAILURE,
        )

    def _grew(self, gpu: _Gpu, counters: GpuCounters, name: str) -> int:
        """How much a counter grew since the last sample (0 if unknown or reset)."""
        now_value = counters.get(name)
        before = gpu.previous.get(name) if gpu.previous is not None else None
        if now_value is None or before is None or now_value < before:
            return 0
        return now_value - before

    def _in_window(self, gpu: _Gpu, counters: GpuCounters, name: str, span: float,
                   now: float) -> int:
        value = counters.get(name)
        return 0 if value is None else gpu.window(name, span).add(now, value)

    def _counter_rules(self, gpu: _Gpu, snap: GpuSnapshot, counters: GpuCounters,
                       now: float) -> Iterable[GpuRule]:
        cfg = self.cfg
        before = gpu.previous
        if before is not None:
            volatile_restarted = any((counters.get(k) or 0) < (before.get(k) or 0)
                                     for k in ("ecc_sbe_volatile", "ecc_dbe_volatile"))
            remap_applied = bool(before.get("remap_pending")) and not counters.get("remap_pending")
            if volatile_restarted or remap_applied:
                gpu.reset_at = now  # what a GPU reset does: the repair it waited for is done
        dbe = self._grew(gpu, counters, "ecc_dbe_volatile") or self._grew(
            gpu, counters, "ecc_dbe_aggregate")
        yield GpuRule(
            Finding("EccUncorrectable", dbe > 0, Severity.CRITICAL,
                    "NewDoubleBitErrors" if dbe else "", f"{dbe} new double-bit ECC error(s)"),
            Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_MEMORY)
        sbe = self._in_window(gpu, counters, "ecc_sbe_volatile", 60.0, now)
        yield GpuRule(
            Finding("EccCorrectableRate", sbe >= cfg.sbe_per_minute, Severity.WARNING,
                    "SingleBitErrorsClimbing" if sbe >= cfg.sbe_per_minute else "",
                    f"{sbe} single-bit ECC errors in the last minute"),
            Action.NONE, Effect.SUSPECT, Reason.GPU_MEMORY)
        pending = bool(counters.get("remap_pending"))
        yield GpuRule(
            Finding("RowRemapPending", pending, Severity.WARNING,
                    "ResetToApplyRemap" if pending else "",
                    "row remapping waits for a GPU reset" if pending else ""),
            Action.RESET_GPU, Effect.SUSPECT, Reason.GPU_MEMORY)
        failed = bool(counters.get("remap_failure"))
        yield GpuRule(
            Finding("RowRemapFailure", failed, Severity.CRITICAL,
                    "RemapFailed" if failed else "",
                    "a row remapping failed" if failed else ""),
            Action.RMA, Effect.QUARANTINE, Reason.GPU_MEMORY)
        retired_pending = bool(counters.get("retired_pending"))
        yield GpuRule(
            Finding("PageRetirementPending", retired_pending, Severity.WARNING,
                    "ResetToRetirePages" if retired_pending else "",
                    "retired pages wait for a driver reload or reset" if retired_pending else ""),
            Action.RESET_GPU, Effect.SUSPECT, Reason.GPU_MEMORY)
        retired = (counters.get("retired_sbe") or 0) + (counters.get("retired_dbe") or 0)
        too_many = retired >= cfg.retired_pages_limit
        yield GpuRule(
            Finding("RetiredPagesLimit", too_many, Severity.CRITICAL,
                    "TooManyRetiredPages" if too_many else "", f"{retired} retired pages"),
            Action.RMA, Effect.QUARANTINE, Reason.GPU_MEMORY)
        gen = snap.telemetry.pcie_gen if snap.telemetry else None
        allowed = cfg.pcie_replays_per_minute * 2 ** max(0, (gen or 3) - 3)
        replays = self._in_window(gpu, counters, "pcie_replay", 60.0, now)
        yield GpuRule(
            Finding("PcieReplayRate", replays >= allowed, Severity.WARNING,
                    "PcieReplaysHigh" if replays >= allowed else "",
                    f"{replays} PCIe replays in the last minute (allowed {allowed:g} at gen "
                    f"{gen or '?'})"),
            Action.NONE, Effect.SUSPECT, Reason.INTERCONNECT)
        crc = (self._in_window(gpu, counters, "nvlink_crc_flit", 10.0, now)
               + self._in_window(gpu, counters, "nvlink_crc_data", 10.0, now)) / 10.0
        replay = self._in_window(gpu, counters, "nvlink_replay", 60.0, now)
        recovery = self._grew(gpu, counters, "nvlink_recovery")
        nvlink_bad = (crc >= cfg.nvlink_crc_per_second
                      or replay >= cfg.nvlink_replays_per_minute or recovery > 0)
        yield GpuRule(
            Finding("NvlinkErrors", nvlink_bad, Severity.WARNING,
                    "NvlinkErrorsGrowing" if nvlink_bad else "",
                    f"NVLink: {crc:.0f} CRC errors/s, {replay} replays/min, {recovery} new "
                    "recoveries"),
            Action.RESET_GPU, Effect.SUSPECT, Reason.INTERCONNECT)
        recovery_action = RECOVERY_ACTIONS.get(counters.get("recovery_action") or 0,
                                               Action.RESET_GPU)
        needs = recovery_action is not Action.NONE
        yield GpuRule(
            Finding("RecoveryAction", needs,
                    Severity.CRITICAL if recovery_action.rank >= Action.RESET_GPU.rank
                    else Severity.WARNING,
                    "DriverRequestsRecovery" if needs else "",
                    f"the driver asks for: {recovery_action.value}" if needs else ""),
            recovery_action,
            Effect.QUARANTINE if recovery_action.rank >= Action.RESET_GPU.rank
            else Effect.SUSPECT,
            Reason.GPU_FAILURE)
        reasons = counters.clocks_event_reasons or 0
        thermal = bool(reasons & (SW_THERMAL | HW_THERMAL | HW_SLOWDOWN))
        power = bool(reasons & HW_POWER_BRAKE)
        yield GpuRule(
            Finding("ThermalSlowdown", thermal, Severity.WARNING,
                    "ClocksThrottledForHeat" if thermal else "",
                    f"clock event reasons {reasons:#x}", sustain=self.cfg.slowdown_sustain),
            Action.NONE, Effect.SUSPECT, Reason.THERMAL)
        yield GpuRule(
            Finding("PowerSlowdown", power, Severity.WARNING,
                    "PowerBrake" if power else "", f"clock event reasons {reasons:#x}",
                    sustain=self.cfg.slowdown_sustain),
            Action.NONE, Effect.SUSPECT, Reason.THERMAL)

    def _link_rules(self, snap: GpuSnapshot, telemetry: GpuTelemetry) -> Iterable[GpuRule]:
        identity = snap.identity
        narrow = (telemetry.pcie_width is not None and identity.pcie_max_width is not None
                  and telemetry.pcie_width < identity.pcie_max_width)
        busy = (telemetry.util_gpu or 0) > self.cfg.busy_utilization
        slow = (busy and telemetry.pcie_gen is not None and identity.pcie_max_gen is not None
                and telemetry.pcie_gen < identity.pcie_max_gen)
        degraded = narrow or slow
        yield GpuRule(
            Finding("PcieLinkDegraded", degraded, Severity.WARNING,
                    "PcieBelowMaximum" if degraded else "",
                    f"PCIe gen {telemetry.pcie_gen}/{identity.pcie_max_gen}, width "
                    f"x{telemetry.pcie_width}/x{identity.pcie_max_width}"),
            Action.RESET_GPU, Effect.SUSPECT, Reason.INTERCONNECT)
        down = (identity.nvlinks and telemetry.nvlinks_up is not None
                and telemetry.nvlinks_up < identity.nvlinks)
        yield GpuRule(
            Finding("NvlinkDown", bool(down), Severity.WARNING, "NvlinkNotActive" if down else "",
                    f"{telemetry.nvlinks_up} of {identity.nvlinks} NVLinks up" if down else ""),
            Action.RESET_GPU, Effect.SUSPECT, Reason.INTERCONNECT)

    def _transition(self, gpu: _Gpu, now: float) -> HostEvent | None:
        # Conditions that started after the last pass or release; older ones were seen.
        holding = {c.type for c in gpu.tracker.holding() if c.since > gpu.acknowledged_at}
        active = [r for r in gpu.rules if r.finding.type in holding]
        by_effect = {e: [r for r in active if r.effect is e] for e in Effect}

        def explain(rules: list[GpuRule]) -> tuple[str, Action]:
            top = max(rules, key=lambda r: r.action.rank)
            gpu.reason = top.reason
            return (f"{top.finding.type}: {top.finding.message}".rstrip(": "),
                    worst([r.action for r in rules]))

        if by_effect[Effect.LOST]:
            why, action = explain(by_effect[Effect.LOST])
            return self._set(gpu, GpuState.LOST, why, now, action)
        if gpu.state in (GpuState.LOST, GpuState.QUARANTINED):
            return None  # latched until released
        if by_effect[Effect.QUARANTINE]:
            why, action = explain(by_effect[Effect.QUARANTINE])
            return self._set(gpu, GpuState.QUARANTINED, why, now, action)
        if by_effect[Effect.SUSPECT]:
            gpu.last_suspect_signal = now
            if gpu.state is GpuState.VALIDATING:
                return None
            why, action = explain(by_effect[Effect.SUSPECT])
            return self._set(gpu, GpuState.SUSPECT, why, now, action)
        if (gpu.state is GpuState.SUSPECT
                and now - gpu.last_suspect_signal >= self.cfg.suspect_clear):
            return self._set(gpu, GpuState.HEALTHY, "no suspect signal for "
                             f"{self.cfg.suspect_clear:g} s", now)
        return None

    def _view(self, gpu: _Gpu) -> GpuView:
        conditions = gpu.tracker.conditions()
        actions = {r.finding.type: r.action for r in gpu.rules}
        return GpuView(gpu.index, gpu.uuid, gpu.name, gpu.state, gpu.why, gpu.since,
                       gpu.action if gpu.state is not GpuState.HEALTHY else Action.NONE,
                       conditions, actions, gpu.jobs, gpu.xid_count, gpu.snapshot)

    def _counts(self) -> GpuCounts:
        states = [g.state for g in self.gpus.values()]
        in_use = sum(1 for g in self.gpus.values()
                     if g.snapshot and g.snapshot.telemetry and g.snapshot.telemetry.processes)
        return GpuCounts(
            healthy=states.count(GpuState.HEALTHY), suspect=states.count(GpuState.SUSPECT),
            validating=states.count(GpuState.VALIDATING),
            quarantined=states.count(GpuState.QUARANTINED), lost=states.count(GpuState.LOST),
            in_use=in_use,
        )

    def _host_findings(self) -> list[Finding]:
        failed = [g for g in self.gpus.values()
                  if g.state in (GpuState.LOST, GpuState.QUARANTINED)]
        suspect = [g for g in self.gpus.values() if g.state is GpuState.SUSPECT]
        node = worst([g.action for g in failed]).rank >= Action.REBOOT_NODE.rank

        def listing(gpus: list[_Gpu]) -> str:
            return "; ".join(f"gpu {g.index} {g.state.value}: {g.why} ({g.action.value})"
                             for g in sorted(gpus, key=lambda g: g.index))[:1000]

        return [
            Finding("GpuFailure", bool(failed), Severity.CRITICAL if node else Severity.WARNING,
                    ("NodeRebootRequired" if node else "GpuOutOfService") if failed else "",
                    listing(failed)),
            Finding("GpuSuspect", bool(suspect), Severity.WARNING,
                    "GpuUnderSuspicion" if suspect else "", listing(suspect)),
        ]

    def _advisories(self, now: float) -> list[JobAdvisory]:
        """Checkpoint advice for jobs on GPUs whose failure risk is up."""
        per_job: dict[str, tuple[Urgency, Reason, set[str]]] = {}
        for gpu in self.gpus.values():
            urgency = _RISK.get(gpu.state)
            if urgency is None:
                continue
            for ref in gpu.jobs:
                current = per_job.get(ref.job)
                ranks = (current[2] if current else set()) | ({ref.rank} if ref.rank else set())
                if current is None or (urgency is Urgency.HIGH
                                       and current[0] is not Urgency.HIGH):
                    per_job[ref.job] = (urgency, gpu.reason, ranks)
                else:
                    per_job[ref.job] = (current[0], current[1], ranks)
        advisories = []
        for job, (urgency, reason, ranks) in sorted(per_job.items()):
            last = self._advised.get(job)
            escalated = last is not None and last[0] is Urgency.ELEVATED and urgency is Urgency.HIGH
            if last is None or escalated or now - last[1] >= self.cfg.advisory_interval:
                self._advised[job] = (urgency, now)
                advisories.append(JobAdvisory(job, Advice.CHECKPOINT_NOW, reason.value, urgency,
                                              tuple(sorted(ranks))))
        for job in [j for j in self._advised if j not in per_job]:
            del self._advised[job]  # the risk passed: advise again next time it rises
        return advisories


def holding(view: GpuView) -> list[Condition]:
    return [c for c in view.conditions if c.status is Status.TRUE]
