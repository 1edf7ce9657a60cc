"""Sans-I/O remediation: GPUs seen and results in; resets, validations and holds out.

A GPU the health engine quarantines with the recommended action ``reset-gpu`` is reset
once no process uses it and the rate limits allow, then validated; a pass releases it
(validation does that). A reset that fails, or a validation that fails after it, counts;
after ``max_resets`` of them the engine asks the scheduler for a reboot (a hold), and when
the host comes back in another boot, a validation decides: a pass releases the GPU, a
fail latches RMA, which only an operator clears. Time and the boot id are parameters;
nothing here reads a clock or does I/O.

Every move of a GPU's remediation is one row of ``TRANSITIONS``, the table of the
``remediation`` machine (:mod:`harmonaize.statemachine`); a move not in it raises a
``ValueError`` (an operator's command that does not fit the phase is answered with it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from enum import StrEnum

from agent.remediation.types import (
    Action,
    GpuSeen,
    Log,
    Phase,
    Record,
    Reset,
    Settings,
    Step,
    Validate,
    Would,
)
from harmonaize.messages import Hold, HoldKind
from harmonaize.statemachine import Machine

HOUR = 3600.0
#: Phases in which a GPU left quarantine for a validation that has not yet spoken.
_UNPROVEN = {Phase.REVALIDATING: "validating after reset",
             Phase.AFTER_REBOOT: "validating after reboot"}


class Event(StrEnum):
    QUARANTINED = "quarantined for a reset"
    START = "reset started"
    RESET_OK = "reset succeeded"
    RESET_FAILED = "reset failed"
    INTERRUPTED = "the agent stopped during the reset"
    PASSED = "validation passed"
    FAILED = "validation failed"
    ESCALATE = "too many failed resets"
    BOOTED = "the host rebooted"
    HEALTHY = "healthy again"
    CANCEL = "operator cancel"
    RESUME = "operator resume"
    CLEAR = "operator clear"


#: (phase, event) -> next phase; None: the GPU's remediation is over (forgotten).
TRANSITIONS: dict[tuple[Phase | None, Event], Phase | None] = {
    (None, Event.QUARANTINED): Phase.WAITING,
    (Phase.WAITING, Event.START): Phase.RESETTING,
    (Phase.WAITING, Event.HEALTHY): None,
    (Phase.RESETTING, Event.RESET_OK): Phase.REVALIDATING,
    (Phase.RESETTING, Event.RESET_FAILED): Phase.WAITING,
    (Phase.RESETTING, Event.INTERRUPTED): Phase.REVALIDATING,
    (Phase.RESETTING, Event.ESCALATE): Phase.REBOOT,
    (Phase.REVALIDATING, Event.PASSED): None,
    (Phase.REVALIDATING, Event.HEALTHY): None,
    (Phase.REVALIDATING, Event.FAILED): Phase.WAITING,
    (Phase.REVALIDATING, Event.ESCALATE): Phase.REBOOT,
    (Phase.REBOOT, Event.BOOTED): Phase.AFTER_REBOOT,
    (Phase.REBOOT, Event.HEALTHY): None,
    (Phase.AFTER_REBOOT, Event.PASSED): None,
    (Phase.AFTER_REBOOT, Event.HEALTHY): None,
    (Phase.AFTER_REBOOT, Event.FAILED): Phase.RMA,
    # The operator took over: no new resets of this GPU until it is healthy again (a
    # replacement has another UUID) or the operator resumes.
    (Phase.RMA, Event.CLEAR): Phase.CANCELLED,
    (Phase.CANCELLED, Event.RESUME): Phase.WAITING,
    (Phase.CANCELLED, Event.HEALTHY): None,
    **{(phase, Event.CANCEL): Phase.CANCELLED
       for phase in (None, Phase.WAITING, Phase.RESETTING, Phase.REVALIDATING, Phase.REBOOT,
                     Phase.AFTER_REBOOT)},
}

#: The table as a machine (None: no remediation under way for the GPU).
REMEDIATION: Machine[Phase | None, Event] = Machine(
    "remediation", TRANSITIONS, states=(None, *Phase), events=tuple(Event))


class RemediationEngine:
    def __init__(self, settings: Settings, records: Iterable[Record] = (),
                 resets: Iterable[float] = ()) -> None:
        self.settings = settings
        records = list(records)
        self.records: dict[str, Record] = {r.uuid: r for r in records}
        #: When this host's resets started (the hourly limit), oldest first.
        self.resets: list[float] = sorted(resets)
        #: Records changed or forgotten since the service last took them (to persist).
        self.changed: set[str] = set()
        self._seen: dict[int, GpuSeen] = {}
        #: GPUs whose validation was asked for in this run (asked again after a restart).
        self._asked: set[str] = set()
        self._due = float("inf")
        #: Each GPU's last reset, kept after its record is forgotten (a GPU released and
        #: quarantined again still waits out ``reset_interval`` since its last reset).
        self._last_reset: dict[str, float] = {r.uuid: r.last_reset for r in records
                                              if r.last_reset > float("-inf")}

    # --- moves ------------------------------------------------------------------------

    def _move(self, uuid: str, event: Event, *, gpu: int = -1,
              **fields: object) -> Record | None:
        record = self.records.get(uuid)
        phase = record.phase if record is not None else None
        if not REMEDIATION.legal(phase, event):
            raise ValueError(f"remediation: no move from {phase} on {event.value}")
        nxt = REMEDIATION.move(phase, event)
        self.changed.add(uuid)
        if nxt is None:
            self.records.pop(uuid, None)
            self._asked.discard(uuid)
            return None
        base = record or Record(uuid, gpu, nxt,
                                last_reset=self._last_reset.get(uuid, float("-inf")))
        moved = replace(base, phase=nxt, **fields)  # type: ignore[arg-type]
        self.records[uuid] = moved
        if moved.last_reset > float("-inf"):
            self._last_reset[uuid] = moved.last_reset
        return moved

    def _fail(self, record: Record, now: float, boot: str, *, step: Step,
              why: str) -> list[Action]:
        """A reset that did not help: count it, and escalate after ``max_resets``."""
        failures = record.failures + 1
        actions: list[Action] = [Log(record.uuid, record.gpu, step, why)]
        self._asked.discard(record.uuid)
        if failures >= self.settings.max_resets:
            self._move(record.uuid, Event.ESCALATE, failures=failures, since=now, boot_id=boot,
                       detail=f"{failures} failed reset(s): the scheduler should reboot")
            actions.append(Log(record.uuid, record.gpu, Step.REBOOT,
                               f"{failures} failed reset(s)", "asked the scheduler to reboot"))
        else:
            event = Event.RESET_FAILED if record.phase is Phase.RESETTING else Event.FAILED
            self._move(record.uuid, event, failures=failures, since=now, detail=why[:200])
        return actions

    # --- each pass --------------------------------------------------------------------

    def step(self, gpus: Sequence[GpuSeen], now: float, boot: str) -> list[Action]:
        actions: list[Action] = []
        self._seen = {g.index: g for g in gpus}
        self._due = float("inf")
        for gpu in gpus:
            record = self.records.get(gpu.uuid)
            if record is None:
                if gpu.state == "quarantined" and gpu.action == "reset-gpu":
                    self._move(gpu.uuid, Event.QUARANTINED, gpu=gpu.index, since=now,
                               detail="waiting")
                    record = self.records[gpu.uuid]
                else:
                    continue
            if record.phase is Phase.REBOOT and boot and record.boot_id \
                    and boot != record.boot_id:  # before all else: validation decides
                self._move(gpu.uuid, Event.BOOTED, since=now, detail="validating after reboot")
                actions.append(Log(gpu.uuid, gpu.index, Step.REBOOTED, "boot id changed"))
            elif gpu.state == "healthy" and (record.phase, Event.HEALTHY) in TRANSITIONS:
                self._move(gpu.uuid, Event.HEALTHY)
                if record.phase is not Phase.WAITING or record.last_reset > float("-inf"):
                    # (a GPU released before anything was done leaves no history)
                    actions.append(Log(gpu.uuid, gpu.index, Step.RELEASED, "healthy again "
                                       "(validated or released by an operator)"))
                continue
            elif record.phase is Phase.WAITING:
                actions += self._maybe_reset(record, gpu, now)
            record = self.records.get(gpu.uuid)
            if record is not None and record.phase in (Phase.REVALIDATING, Phase.AFTER_REBOOT) \
                    and gpu.uuid not in self._asked:
                self._asked.add(gpu.uuid)
                actions.append(Validate(gpu.index, "after-reset" if record.phase is
                                        Phase.REVALIDATING else "after-reboot"))
        return actions

    def _maybe_reset(self, record: Record, gpu: GpuSeen, now: float) -> list[Action]:
        cfg = self.settings
        why = self._blocked(record, gpu, now)
        if why is not None:
            if why != record.detail:
                self.records[gpu.uuid] = replace(record, detail=why)
                self.changed.add(gpu.uuid)
            return []
        if cfg.shadow:
            what = f"shadow: would reset gpu {gpu.index} ({gpu.pci_bus_id})"
            if record.detail == what:
                return []
            self.records[gpu.uuid] = replace(record, detail=what)
            self.changed.add(gpu.uuid)
            return [Would(gpu.index, f"reset ({gpu.pci_bus_id}): {gpu.why}")]
        self.resets.append(now)
        self._move(gpu.uuid, Event.START, since=now, last_reset=now, detail="resetting")
        return [Reset(gpu.uuid, gpu.index, gpu.pci_bus_id),
                Log(gpu.uuid, gpu.index, Step.RESET, gpu.why[:200] or "quarantined",
                    f"attempt {record.failures + 1}")]

    def _blocked(self, record: Record, gpu: GpuSeen, now: float) -> str | None:
        """Why this GPU may not be reset now (None: it may)."""
        cfg = self.settings
        if gpu.state != "quarantined":
            return f"waiting: the GPU is {gpu.state}"
        if gpu.action != "reset-gpu":
            return f"waiting: the recommended action is now {gpu.action}"
        if gpu.processes is None:
            return "waiting: its processes could not be read"
        if gpu.processes:
            return f"waiting: in use by {gpu.processes} process(es)"
        ready = record.last_reset + cfg.reset_interval
        if now < ready:
            self._due = min(self._due, ready)
            return f"rate limit: this GPU's next reset at {ready:.0f}"
        self.resets = [t for t in self.resets if now - t < HOUR]
        if len(self.resets) >= cfg.max_resets_per_hour:
            ready = self.resets[0] + HOUR
            self._due = min(self._due, ready)
            return f"rate limit: {len(self.resets)} resets on this host within the hour"
        return None

    def next_deadline(self) -> float:
        """When a rate limit that holds a reset back ends (the service may step earlier)."""
        return self._due

    # --- results ----------------------------------------------------------------------

    def reset_done(self, uuid: str, ok: bool, detail: str, now: float,
                   boot: str) -> list[Action]:
        record = self.records.get(uuid)
        if record is None or record.phase is not Phase.RESETTING:
            if record is not None:  # cancelled meanwhile: record what happened, stop there
                step = Step.RESET_DONE if ok else Step.RESET_FAILED
                return [Log(uuid, record.gpu, step, "the reset command", detail[:200])]
            return []
        if ok:
            self._move(uuid, Event.RESET_OK, since=now, detail="validating after reset")
            return [Log(uuid, record.gpu, Step.RESET_DONE, "the reset command", detail[:200])]
        return self._fail(record, now, boot, step=Step.RESET_FAILED,
                          why=f"the reset command: {detail}"[:200])

    def reset_interrupted(self, uuid: str, now: float) -> list[Action]:
        """A record found mid-reset at start: the outcome is unknown, validation decides."""
        record = self.records.get(uuid)
        if record is None or record.phase is not Phase.RESETTING:
            return []
        self._move(uuid, Event.INTERRUPTED, since=now, detail="validating after reset")
        return [Log(uuid, record.gpu, Step.RESET_DONE, "agent restart",
                    "the agent stopped during the reset: validation decides")]

    def verdict(self, uuid: str, passed: bool | None, reason: str, now: float,
                boot: str) -> list[Action]:
        """A validation of the GPU ended (None: undecided, asked again)."""
        record = self.records.get(uuid)
        if record is None or record.phase not in (Phase.REVALIDATING, Phase.AFTER_REBOOT):
            return []
        if passed is None:
            self._asked.discard(uuid)
            return []
        if passed:
            self._move(uuid, Event.PASSED)
            return [Log(uuid, record.gpu, Step.RELEASED, f"validation passed ({record.phase})")]
        if record.phase is Phase.AFTER_REBOOT:
            self._move(uuid, Event.FAILED, since=now,
                       detail=f"validation failed after the reboot: {reason}"[:200])
            return [Log(uuid, record.gpu, Step.RMA, "validation failed after the reboot",
                        reason[:200])]
        return self._fail(record, now, boot, step=Step.REVALIDATION_FAILED,
                          why=f"validation failed after reset: {reason}"[:200])

    # --- operators --------------------------------------------------------------------

    def _by_index(self, gpu: int) -> tuple[str, Record | None]:
        seen = self._seen.get(gpu)
        for record in self.records.values():
            if record.gpu == gpu and (seen is None or seen.uuid == record.uuid):
                return record.uuid, record
        if seen is None:
            raise KeyError(f"no GPU {gpu} on this host")
        return seen.uuid, None

    def cancel(self, gpu: int, now: float) -> list[Action]:
        uuid, record = self._by_index(gpu)
        phase = record.phase if record is not None else None
        if phase is Phase.RMA:
            raise ValueError(f"gpu {gpu} is held for RMA: only `remediation clear` ends that")
        if phase is Phase.CANCELLED:
            return []
        self._move(uuid, Event.CANCEL, gpu=gpu, since=now, detail="cancelled by an operator")
        return [Log(uuid, gpu, Step.CANCELLED, "operator", f"was {phase or 'idle'}")]

    def resume(self, gpu: int, now: float) -> list[Action]:
        uuid, record = self._by_index(gpu)
        if record is None or record.phase is not Phase.CANCELLED:
            raise ValueError(f"gpu {gpu}: remediation is not cancelled")
        self._move(uuid, Event.RESUME, since=now, detail="waiting")
        return [Log(uuid, gpu, Step.RESUMED, "operator")]

    def clear(self, gpu: int) -> list[Action]:
        uuid, record = self._by_index(gpu)
        if record is None or record.phase is not Phase.RMA:
            raise ValueError(f"gpu {gpu} is not held for RMA")
        self._move(uuid, Event.CLEAR, detail="RMA cleared by an operator")
        return [Log(uuid, gpu, Step.CLEARED, "operator", "RMA hold cleared")]

    # --- what the scheduler hears ----------------------------------------------------

    def holds(self) -> tuple[Hold, ...]:
        holds = []
        for record in sorted(self.records.values(), key=lambda r: r.gpu):
            if record.phase is Phase.REBOOT:
                holds.append(Hold(HoldKind.REBOOT, record.gpu,
                                  f"{record.failures} failed reset(s)"))
            elif record.phase is Phase.RMA:
                holds.append(Hold(HoldKind.RMA, record.gpu, "reset and reboot did not help"))
            elif record.phase in _UNPROVEN:
                # Out of quarantine but not yet proven: no new work lands on it meanwhile
                # (the scheduler would otherwise resume the node while it is validated).
                holds.append(Hold(HoldKind.GPU_QUARANTINED, record.gpu, _UNPROVEN[record.phase]))
        return tuple(holds)
