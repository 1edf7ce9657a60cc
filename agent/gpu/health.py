"""Sans-I/O GPU health: snapshots and events in; states, conditions, advice out.

Rules look at counter *changes* and rates (never last-value gauges) and at
NVML events, and report findings per GPU, each with a recommended action and
an effect on the GPU's state:

    healthy -> suspect -> validating -> healthy | quarantined        (and lost)

The rules are in :mod:`agent.gpu.rules`; a state moves only by an event through the
table in :mod:`agent.gpu.states`, which validation and operators use too (the hooks
below). A suspect GPU returns to healthy only after ``suspect_clear`` seconds with no
suspect signal; quarantine and loss are latched until an operator or a
validation releases the GPU. When the failure risk of a GPU that a job uses
goes up, the job gets a checkpoint advisory in its own terms. Time is a
parameter; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agent.conditions import Action, Finding, worst
from agent.gpu.attribution import AttributionSettings, XidAttributor
from agent.gpu.record import GpuRecord, GpuRule, GpuView
from agent.gpu.rules import rules
from agent.gpu.settings import GpuObserverSection
from agent.gpu.states import GPU, UNDECIDED, GpuEvent, GpuState
from agent.gpu.types import XID_EVENT, GpuSample, GpuSnapshot
from agent.gpu.xid import Effect, Reason
from agent.gpu.xidevents import apply
from agent.kernel.kmsgformat import pci_key
from harmonaize.messages import (
    Advice,
    ApplicationXid,
    Condition,
    GpuCounts,
    HostEvent,
    JobAdvisory,
    Severity,
    Status,
    Urgency,
)

#: A GPU with a finding that holds, or a condition waiting out its sustain, is
#: judged again this often (seconds) without news: its rules look at time passing
#: (windows, sustain, holds) and at growth since the last look. A GPU with neither
#: is judged again only on news or at its own deadline (the end of a suspicion).
FULL_EVALUATION = 1.0


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
    #: XIDs judged a job's own process's, for the job's owner (through the controller).
    application_xids: list[ApplicationXid] = field(default_factory=list)


_RISK = {GpuState.SUSPECT: Urgency.ELEVATED, GpuState.VALIDATING: Urgency.ELEVATED,
         GpuState.QUARANTINED: Urgency.HIGH, GpuState.LOST: Urgency.HIGH}


class GpuHealthEngine:
    def __init__(self, cfg: GpuObserverSection) -> None:
        self.cfg = cfg
        self.gpus: dict[int, GpuRecord] = {}
        self.attributor = XidAttributor(attribution_settings(cfg))
        #: XIDs by whose fault they were judged (hardware, application).
        self.xids_by_class: Counter[str] = Counter()
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
        self.attributor.settings = attribution_settings(cfg)
        for gpu in self.gpus.values():
            gpu.due = float("-inf")
        self.changed = True

    # --- the one way a state changes: an event through the table -----------------

    def _send(self, gpu: GpuRecord, event: GpuEvent, why: str, now: float,
              action: Action | None = None) -> HostEvent | None:
        """Move ``gpu`` as :data:`agent.gpu.states.GPU` says for ``event``; the host
        event to report when the state changed. A move the table refuses (counted, in
        production) changes nothing."""
        state = GPU.move(gpu.state, event)
        if not GPU.legal(gpu.state, event) or (gpu.state is state and gpu.why == why):
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

    # --- hooks for validation and operators: each sends one event -------------------

    def begin_validation(self, index: int, now: float) -> HostEvent | None:
        gpu = self.gpus[index]
        if gpu.state is not GpuState.VALIDATING:
            gpu.before_validation = gpu.state
        return self._send(gpu, GpuEvent.VALIDATION_STARTED, f"validating ({gpu.why})", now)

    def abort_validation(self, index: int, why: str, now: float) -> HostEvent | None:
        """The validation could not decide: back to where the GPU was."""
        gpu = self.gpus[index]
        if gpu.state is not GpuState.VALIDATING:
            return None
        return self._send(gpu, UNDECIDED[gpu.before_validation], why, now)

    def reset_seen(self, index: int) -> float:
        """When the GPU was last seen reset (-inf: never since the agent started)."""
        gpu = self.gpus.get(index)
        return gpu.reset_at if gpu is not None else float("-inf")

    def end_validation(self, index: int, passed: bool, why: str, now: float,
                       action: Action = Action.NONE) -> HostEvent | None:
        gpu = self.gpus[index]
        if passed:
            self._acknowledge(gpu, now)
            return self._send(gpu, GpuEvent.VALIDATION_PASSED, why, now)
        return self._send(gpu, GpuEvent.VALIDATION_FAILED, why, now, action)

    def quarantine(self, index: int, why: str, now: float, action: Action = Action.DRAIN,
                   event: GpuEvent = GpuEvent.OPERATOR_DRAIN) -> HostEvent | None:
        """An operator's drain, or (``QUARANTINE_RESTORED``) one recorded before a start."""
        return self._send(self.gpus[index], event, why, now, action)

    def release(self, index: int, why: str, now: float) -> HostEvent | None:
        gpu = self.gpus[index]
        self._acknowledge(gpu, now)
        return self._send(gpu, GpuEvent.OPERATOR_RELEASE, why, now)

    @staticmethod
    def _acknowledge(gpu: GpuRecord, now: float) -> None:
        """Evidence up to now has been judged: rates count again from zero, so errors
        that keep coming make the GPU suspect again, and old ones do not."""
        gpu.last_suspect_signal = float("-inf")
        gpu.acknowledged_at = now
        gpu.windows.clear()
        gpu.xids.clear()
        gpu.xid_effects.clear()

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
        with_xids: set[int] = set()
        applications: list[ApplicationXid] = []
        if sample is not None and fresh:  # an old sample's events are done
            self._attribute(sample, now)
        for xid in self.attributor.decide(now):
            if xid.gpu in self.gpus:
                event, application = apply(self.gpus[xid.gpu], xid, now)
                events.append(event)
                self.xids_by_class[xid.verdict.value] += 1
                applications += [application] if application is not None else []
                with_xids.add(xid.gpu)
        if sample is not None:
            for snap in sample.gpus:
                gpu = self.gpus.setdefault(snap.identity.index, GpuRecord(snap.identity.index))
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
        if sample is None:  # XIDs decided after their wait, with no new observation
            for gpu in (self.gpus[i] for i in with_xids if self.gpus[i].snapshot):
                assert gpu.snapshot is not None
                self._evaluate(gpu, gpu.snapshot, self.cfg.call_timeout, now, events)
                evaluated = True
        if evaluated or changed or self._last is None or now >= self._advise_due:
            views = tuple(g.view for _, g in sorted(self.gpus.items()) if g.view is not None)
            self._last = GpuStep(views, self._counts(), self._host_findings(), [],
                                 self._advisories(now), worst([v.action for v in views]))
            self._last_at = now
            self._advise_due = min((at + self.cfg.advisory_interval
                                    for _, at in self._advised.values()), default=float("inf"))
            return GpuStep(self._last.gpus, self._last.counts, self._last.findings, events,
                           self._last.advisories, self._last.action, applications)
        return GpuStep(self._last.gpus, self._last.counts, self._last.findings, events, [],
                       self._last.action, applications)

    def _attribute(self, sample: GpuSample, now: float) -> None:
        """Hand the attribution what this observation saw: each GPU's processes and
        their jobs, the kernel's XID lines, and NVML's XID events to decide."""
        known = self._known(sample)
        for snap in sample.gpus:
            telemetry = snap.telemetry
            pids = {p.pid: sample.owners.get(p.pid) for p in telemetry.processes} \
                if telemetry else {}
            self.attributor.observe(snap.identity.index, pci_key(snap.identity.pci_bus_id),
                                    pids, sample.exiting, now,
                                    listed=telemetry is not None and telemetry.processes_read)
        self.attributor.kernel(sample.kernel_xids, now)
        for event in sample.events:
            if event.type == XID_EVENT and event.gpu in known:
                self.attributor.report(event.gpu, event.data, now)

    def _evaluate(self, gpu: GpuRecord, snap: GpuSnapshot, call_timeout: float, now: float,
                  events: list[HostEvent]) -> None:
        gpu.rules = tuple(rules(self.cfg, gpu, snap, call_timeout, now))
        events += [
            HostEvent(e.reason, e.severity, f"gpu {gpu.index}: {e.message}".rstrip(": "))
            for e in gpu.tracker.update([r.finding for r in gpu.rules], now)
        ]
        if (moved := self._transition(gpu, now)) is not None:
            events.append(moved)
        gpu.view = self._view(gpu)
        gpu.evaluated_at = now
        gpu.due = self._deadline(gpu, now)

    def _deadline(self, gpu: GpuRecord, now: float) -> float:
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
        return min([self._advise_due, self.attributor.next_deadline(),
                    *(g.due for g in self.gpus.values())])

    def _known(self, sample: GpuSample) -> set[int]:
        for snap in sample.gpus:
            self.gpus.setdefault(snap.identity.index, GpuRecord(snap.identity.index))
        return set(self.gpus)

    def _transition(self, gpu: GpuRecord, now: float) -> HostEvent | None:
        """The event the rules send this GPU, if any: findings that started after the
        last pass or release (older ones were seen), worst effect first."""
        holding = {c.type for c in gpu.tracker.holding() if c.since > gpu.acknowledged_at}
        active = [r for r in gpu.rules if r.finding.type in holding]
        by_effect = {e: [r for r in active if r.effect is e] for e in Effect}

        def send(event: GpuEvent, found: list[GpuRule]) -> HostEvent | None:
            top = max(found, key=lambda r: r.action.rank)
            gpu.reason = top.reason
            return self._send(gpu, event, f"{top.finding.type}: {top.finding.message}"
                              .rstrip(": "), now, worst([r.action for r in found]))

        if by_effect[Effect.LOST]:
            return send(GpuEvent.FELL_OFF, by_effect[Effect.LOST])
        if gpu.state in (GpuState.LOST, GpuState.QUARANTINED):
            return None  # latched until released
        if by_effect[Effect.QUARANTINE]:
            return send(GpuEvent.FAULT, by_effect[Effect.QUARANTINE])
        if by_effect[Effect.SUSPECT]:
            gpu.last_suspect_signal = now
            if gpu.state is GpuState.VALIDATING:
                return None  # its own checks may provoke the signal
            return send(GpuEvent.SUSPECT_SIGNAL, by_effect[Effect.SUSPECT])
        if (gpu.state is GpuState.SUSPECT
                and now - gpu.last_suspect_signal >= self.cfg.suspect_clear):
            return self._send(gpu, GpuEvent.SUSPICION_CLEARED, "no suspect signal for "
                              f"{self.cfg.suspect_clear:g} s", now)
        return None

    def _view(self, gpu: GpuRecord) -> GpuView:
        conditions = gpu.tracker.conditions()
        actions = {r.finding.type: r.action for r in gpu.rules}
        return GpuView(gpu.index, gpu.uuid, gpu.name, gpu.state, gpu.why, gpu.since,
                       gpu.action if gpu.state is not GpuState.HEALTHY else Action.NONE,
                       conditions, actions, gpu.jobs, gpu.xid_count, gpu.snapshot,
                       tuple(gpu.recent_xids))

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

        def listing(gpus: list[GpuRecord]) -> str:
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


def attribution_settings(cfg: GpuObserverSection) -> AttributionSettings:
    return AttributionSettings(cfg.kmsg_wait, cfg.xid_match_window, cfg.teardown_window,
                               cfg.xid_recur_window)


def holding(view: GpuView) -> list[Condition]:
    return [c for c in view.conditions if c.status is Status.TRUE]
