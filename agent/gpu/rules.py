"""The GPU health rules: one GPU's snapshot, counters and XIDs in, findings out.

Each rule reports a finding with its recommended action and its effect on the GPU's
state (:class:`agent.gpu.record.GpuRule`). Rules look at counter *changes* and rates
(never last-value gauges) and at NVML events. Sans-I/O: time is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.conditions import RECOVERY_ACTIONS, Action, Finding
from agent.gpu.record import GpuRecord, GpuRule
from agent.gpu.settings import GpuObserverSection
from agent.gpu.types import GpuCounters, GpuSnapshot, GpuTelemetry
from agent.gpu.xid import Effect, Reason, lookup
from harmonaize.messages import Severity

HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x20, 0x40, 0x80


def rules(cfg: GpuObserverSection, gpu: GpuRecord, snap: GpuSnapshot,
      call_timeout: float, now: float) -> Iterable[GpuRule]:
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
    yield from _xid_rules(cfg, gpu, now)
    counters = snap.counters
    if counters is not None:
        yield from _counter_rules(cfg, gpu, snap, counters, now)
        gpu.previous = counters
    if snap.telemetry is not None:
        yield from _link_rules(cfg, snap, snap.telemetry)


def _xid_rules(cfg: GpuObserverSection, gpu: GpuRecord, now: float) -> Iterable[GpuRule]:
    for xid, seen in list(gpu.xids.items()):
        if now - seen > cfg.xid_hold:
            del gpu.xids[xid]
            gpu.xid_effects.pop(xid, None)
    # The effect as attributed (an application-likely XID in doubt is at least suspect).
    infos = [(info, gpu.xid_effects.get(x, info.effect))
             for x in sorted(gpu.xids) if (info := lookup(x))]
    holds = bool(infos)
    worst = max(infos, key=lambda i: (list(Effect).index(i[1]), i[0].action.rank),
                default=None)
    yield GpuRule(
        Finding("Xid", holds,
                Severity.WARNING if worst and worst[1] is Effect.SUSPECT
                else Severity.CRITICAL,
                "XidReported" if holds else "",
                "; ".join(f"xid {i.xid} ({i.meaning})" for i, _ in infos)[:1000]),
        worst[0].action if worst else Action.NONE,
        worst[1] if worst else Effect.NONE,
        # An application-likely XID held here was judged the hardware's.
        worst[0].reason if worst and worst[0].reason is not Reason.APPLICATION
        else Reason.GPU_FAILURE,
    )


def _grew(gpu: GpuRecord, counters: GpuCounters, name: str) -> int:
    """How much a counter grew since the last sample (0 if unknown or reset)."""
    now_value = counters.get(name)
    before = gpu.previous.get(name) if gpu.previous is not None else None
    if now_value is None or before is None or now_value < before:
        return 0
    return now_value - before


def _in_window(gpu: GpuRecord, counters: GpuCounters, name: str, span: float,
           now: float) -> int:
    value = counters.get(name)
    return 0 if value is None else gpu.window(name, span).add(now, value)


def _counter_rules(cfg: GpuObserverSection, gpu: GpuRecord, snap: GpuSnapshot,
               counters: GpuCounters, now: float) -> Iterable[GpuRule]:
    before = gpu.previous
    if before is not None:
        volatile_restarted = any((counters.get(k) or 0) < (before.get(k) or 0)
                                 for k in ("ecc_sbe_volatile", "ecc_dbe_volatile"))
        remap_applied = bool(before.get("remap_pending")) and not counters.get("remap_pending")
        if volatile_restarted or remap_applied:
            gpu.reset_at = now  # what a GPU reset does: the repair it waited for is done
    dbe = _grew(gpu, counters, "ecc_dbe_volatile") or _grew(
        gpu, counters, "ecc_dbe_aggregate")
    yield GpuRule(
        Finding("EccUncorrectable", dbe > 0, Severity.CRITICAL,
                "NewDoubleBitErrors" if dbe else "", f"{dbe} new double-bit ECC error(s)"),
        Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_MEMORY)
    sbe = _in_window(gpu, counters, "ecc_sbe_volatile", 60.0, now)
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
    replays = _in_window(gpu, counters, "pcie_replay", 60.0, now)
    yield GpuRule(
        Finding("PcieReplayRate", replays >= allowed, Severity.WARNING,
                "PcieReplaysHigh" if replays >= allowed else "",
                f"{replays} PCIe replays in the last minute (allowed {allowed:g} at gen "
                f"{gen or '?'})"),
        Action.NONE, Effect.SUSPECT, Reason.INTERCONNECT)
    crc = (_in_window(gpu, counters, "nvlink_crc_flit", 10.0, now)
           + _in_window(gpu, counters, "nvlink_crc_data", 10.0, now)) / 10.0
    replay = _in_window(gpu, counters, "nvlink_replay", 60.0, now)
    recovery = _grew(gpu, counters, "nvlink_recovery")
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
                f"clock event reasons {reasons:#x}", sustain=cfg.slowdown_sustain),
        Action.NONE, Effect.SUSPECT, Reason.THERMAL)
    yield GpuRule(
        Finding("PowerSlowdown", power, Severity.WARNING,
                "PowerBrake" if power else "", f"clock event reasons {reasons:#x}",
                sustain=cfg.slowdown_sustain),
        Action.NONE, Effect.SUSPECT, Reason.THERMAL)


def _link_rules(cfg: GpuObserverSection, snap: GpuSnapshot,
           telemetry: GpuTelemetry) -> Iterable[GpuRule]:
    identity = snap.identity
    narrow = (telemetry.pcie_width is not None and identity.pcie_max_width is not None
              and telemetry.pcie_width < identity.pcie_max_width)
    busy = (telemetry.util_gpu or 0) > cfg.busy_utilization
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
