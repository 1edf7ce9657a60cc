"""Validation inside the agent: planner, runner, history and the health engine, wired.

This is the I/O shell around the sans-I/O :class:`Planner`: each pass it
offers the planner the GPUs as the health engine sees them, tells jobs about
upcoming pauses, starts validations, and applies verdicts (a pass makes a
GPU healthy and lifts a quarantine, a fail quarantines it with the
recommended action, an undecided run puts it back where it was). Quarantines
are kept in the history by GPU UUID, so they outlive restarts and reboots; a
quarantined GPU is validated again once its repair has evidently been done
(it was reset, or the host rebooted).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.conditions import Action
from agent.gpu.interface import GpuEvent, GpuState, GpuStates, GpuView
from agent.validation.checks import CommandSpec, Outcome, StaticLimits, Target
from agent.validation.history import History, Quarantine
from agent.validation.planner import Device, Plan, Planner, PlannerSettings
from agent.validation.runner import Runner, Verdict, boot_id, budget
from agent.validation.settings import ValidationSection
from harmonaize.messages import (
    HostEvent,
    Message,
    NoticeStatus,
    Severity,
    ValidationDecision,
    ValidationNotice,
)
from harmonaize.opsocket import CommandError

log = logging.getLogger(__name__)

#: The planner looks this often at most (seconds), unless someone asked.
PLAN_PERIOD = 1.0


def command_specs(cfg: ValidationSection) -> list[CommandSpec]:
    specs = [
        CommandSpec(c.name, c.command, c.parser.value, frozenset(c.levels), c.budget,
                    c.scope.value, dict(c.baselines), c.on_fail)
        for c in cfg.commands
    ]
    network = cfg.network
    if network.peer:
        specs.append(CommandSpec(
            "network-bandwidth",
            ("iperf3", "-c", network.peer, "-p", str(network.port), "-t",
             f"{network.seconds:g}", "-J"),
            "iperf3", frozenset(network.levels), network.seconds + 15.0, "host",
            {"bandwidth": network.baseline_gbps} if network.baseline_gbps else {},
            Action.DRAIN))
    return specs


class ValidationService:
    def __init__(
        self,
        cfg: ValidationSection,
        state_dir: str | Path,
        engine: GpuStates,
        *,
        retired_pages_limit: int,
        publish: Callable[[Message], None],
        emit: Callable[[HostEvent], None],
        allowance: Callable[[str], float],
        defer_allowance: Callable[[str], float] = lambda job: 0.0,
        negotiates: Callable[[str], bool] = lambda job: False,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.publish = publish
        self.emit = emit
        self.allowance = allowance
        self.defer_allowance = defer_allowance
        self.negotiates = negotiates
        self.specs = command_specs(cfg)
        self.history = History(Path(state_dir) / "validation.db", keep=cfg.history_keep)
        self.planner = Planner(
            PlannerSettings(cfg.suspect_level, cfg.cooldown, cfg.schedule_interval,
                            cfg.max_parallel, cfg.notice_lead),
            self._budget,
            # Unique per run: the controller tells notices of another run apart.
            id_prefix=f"v{int(time.time() * 1000):x}",
        )
        self.runner = Runner(self.history, self.specs,
                             limits=StaticLimits(retired_pages_limit=retired_pages_limit),
                             tolerance=cfg.tolerance, max_parallel=cfg.max_parallel,
                             on_done=self._verdict_from_thread)
        self.last_done = self.history.last_finished()
        self.boot = boot_id()
        self._quarantines = {q.uuid: q for q in self.history.quarantined()}
        self._restored = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._planned_at = float("-inf")
        self._urgent = False
        self._server: subprocess.Popen[bytes] | None = None
        self.host_failure: str | None = None
        #: Called with each verdict once applied (remediation follows its GPUs' verdicts).
        self.listeners: list[Callable[[Verdict], None]] = []

    def configure(self, retired_pages_limit: int) -> None:
        """A reload's new GPU rule: the next checks judge retired pages by it."""
        self.runner.limits = StaticLimits(retired_pages_limit=retired_pages_limit)

    # --- lifecycle ------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        killed = self.runner.clean_up_after_a_crash(time.time())
        if killed:
            log.warning("killed checks an earlier agent left running: %s", ", ".join(killed))
        self._serve()

    def stop(self) -> None:
        self.runner.stop()
        if self._server is not None and self._server.poll() is None:
            self._server.kill()
            self._server.wait()
        self.history.close()

    def _serve(self) -> None:
        """Keep an iperf3 server up for peers' network checks, if configured."""
        network = self.cfg.network
        if not network.serve or (self._server is not None and self._server.poll() is None):
            return
        argv = ["iperf3", "-s", "-p", str(network.port)]
        if setpriv := shutil.which("setpriv"):
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        try:
            self._server = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        except OSError as exc:
            log.error("cannot run the iperf3 server for peers: %s", exc)

    # --- each pass ------------------------------------------------------------------

    def _budget(self, key: str, level: int) -> float:
        gpu = None if key == "host" else int(key.split(":")[1])
        return budget(self.specs, Target(gpu), level)

    def _devices(self, views: tuple[GpuView, ...]) -> list[Device]:
        devices = []
        for view in views:
            quarantine = self._quarantines.get(view.uuid)
            # "drain" asks a person to look: only `harmonctl release` ends it.
            repaired = quarantine is not None and quarantine.action != Action.DRAIN.value and (
                quarantine.boot_id != self.boot
                or self.engine.reset_seen(view.index) > quarantine.since)
            devices.append(Device(f"gpu:{view.index}", view.index, view.state.value,
                                  view.jobs, repaired, view.why))
        if any(s.scope == "host" for s in self.specs):
            devices.append(Device("host", None, "healthy"))
        return devices

    def step(self, views: tuple[GpuView, ...], now: float) -> None:
        if not views and not any(s.scope == "host" for s in self.specs):
            return
        if not self._restored and views:
            self._restore(views, now)
        if not self._urgent and now - self._planned_at < PLAN_PERIOD:
            return
        self._planned_at, self._urgent = now, False
        self._serve()
        starts, announced = self.planner.step(
            self._devices(views), now, running=set(self.runner.running),
            last_done=self.last_done, allowance=self.allowance, negotiates=self.negotiates)
        for plan in announced:
            self._tell(plan, NoticeStatus.SCHEDULED)
            log.info("told %s: a member pauses up to %.0f s for validation at %.0f",
                     ", ".join(plan.jobs), plan.pause, plan.start_at)
        for plan in self.planner.take_cancelled():
            self._tell(plan, NoticeStatus.CANCELLED)
            log.info("told %s: the validation of %s announced for %.0f is cancelled",
                     ", ".join(plan.jobs), plan.key, plan.start_at)
        for plan in starts:
            if plan.notices:
                self._tell(plan, NoticeStatus.STARTED)
        by_index = {v.index: v for v in views}
        for plan in starts:
            view = by_index.get(plan.gpu) if plan.gpu is not None else None
            if plan.gpu is not None and view is None:
                continue
            if plan.gpu is not None:
                event = self.engine.begin_validation(plan.gpu, now)
                if event is not None:
                    self.emit(event)
            log.info("validating %s at level %d (%s)", plan.key, plan.level, plan.trigger)
            self.runner.start(plan, Target(plan.gpu, view.snapshot if view else None),
                              view.uuid if view else "host")

    def _tell(self, plan: Plan, status: NoticeStatus) -> None:
        """Every job of the plan hears where it stands (the controller rebuilds it)."""
        for job, ranks in plan.notices:
            self.publish(ValidationNotice(job, ranks, round(plan.pause), plan.start_at,
                                          plan.id, plan.start_at, status, cause=plan.cause))

    @property
    def restored(self) -> bool:
        """Quarantines recorded before this start are applied again (on the first pass
        that saw GPUs; the health engine shows them from the pass after)."""
        return self._restored

    def request(self, gpu: int, trigger: str) -> None:
        """Validate a GPU at the suspect level soon (e.g. after remediation reset it);
        ``trigger`` goes into the history."""
        self.planner.request(f"gpu:{gpu}", self.cfg.suspect_level, trigger)
        self._urgent = True

    def answer(self, decision: ValidationDecision, now: float) -> None:
        """A tenant's answer to a notice, from the controller: start early or later."""
        plan, why = self.planner.answer(
            decision.notice, decision.job, now, approve=decision.approve,
            defer=decision.defer, max_defer=self.defer_allowance(decision.job),
            start=decision.start)
        log.info("job %s answered validation notice %s (%s): %s", decision.job,
                 decision.notice, "window" if decision.start else "approve"
                 if decision.approve else "defer", why)
        if plan is not None:
            self._tell(plan, NoticeStatus.SCHEDULED)
            self._urgent = True  # an approval may start it at the next pass

    def _restore(self, views: tuple[GpuView, ...], now: float) -> None:
        """Quarantines recorded before this start apply again (by GPU UUID)."""
        self._restored = True
        by_uuid = {v.uuid: v for v in views}
        for quarantine in self._quarantines.values():
            view = by_uuid.get(quarantine.uuid)
            if view is None:
                continue  # the GPU is gone (replaced?): nothing to hold
            self.engine.quarantine(view.index, f"{quarantine.reason} (recorded)", now,
                                   Action(quarantine.action), GpuEvent.QUARANTINE_RESTORED)

    # --- verdicts -------------------------------------------------------------------

    def _verdict_from_thread(self, verdict: Verdict) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._apply, verdict)

    def _apply(self, verdict: Verdict) -> None:
        now = time.time()
        plan = verdict.plan
        self.last_done[plan.key] = now
        self._urgent = True
        if plan.gpu is None:
            self.host_failure = None if verdict.outcome is not Outcome.FAIL else (
                f"validation failed ({verdict.action.value})")
            self._report(plan.key, verdict)
            return
        if verdict.outcome is Outcome.PASS:
            event = self.engine.end_validation(plan.gpu, True, "validation passed", now)
            self._quarantines.pop(verdict.uuid, None)
            self.history.release(verdict.uuid)
        elif verdict.outcome is Outcome.FAIL:
            event = self.engine.end_validation(plan.gpu, False,
                                               f"validation failed: {verdict.reason}", now,
                                               verdict.action)
            entry = Quarantine(verdict.uuid, plan.gpu, verdict.reason, verdict.action.value,
                               now, self.boot)
            self._quarantines[verdict.uuid] = entry
            self.history.quarantine(entry)
        else:
            event = self.engine.abort_validation(plan.gpu, f"validation undecided: "
                                                 f"{verdict.reason}", now)
        if event is not None:
            self.emit(event)
        self._report(plan.key, verdict)
        for listener in self.listeners:
            listener(verdict)

    def _report(self, key: str, verdict: Verdict) -> None:
        """One line for the operator's log; the controller hears no check names or values."""
        log.log(logging.WARNING if verdict.outcome is Outcome.FAIL else logging.INFO,
                "validation of %s: %s: %s", key, verdict.outcome.value, verdict.reason)
        severity = {Outcome.PASS: Severity.INFO, Outcome.FAIL: Severity.WARNING}.get(
            verdict.outcome, Severity.INFO)
        reason = {Outcome.PASS: "ValidationPassed", Outcome.FAIL: "ValidationFailed"}.get(
            verdict.outcome, "ValidationUndecided")
        self.emit(HostEvent(reason, severity,
                            f"{key}: {verdict.outcome.value}"
                            + (f" ({verdict.action.value})" if verdict.outcome is Outcome.FAIL
                               else "")))

    # --- operator commands ----------------------------------------------------------

    def _gpu_arg(self, args: dict[str, Any], views: tuple[GpuView, ...]) -> GpuView:
        gpu = args.get("gpu")
        if isinstance(gpu, bool) or not isinstance(gpu, int):
            raise CommandError("gpu must be a GPU index")
        view = next((v for v in views if v.index == gpu), None)
        if view is None:
            raise CommandError(f"no GPU {gpu} on this host")
        return view

    def command_validate(self, args: dict[str, Any],
                         views: tuple[GpuView, ...]) -> dict[str, Any]:
        level = args.get("level", self.cfg.suspect_level)
        if isinstance(level, bool) or level not in (1, 2, 3):
            raise CommandError("level must be 1, 2 or 3")
        if args.get("host"):
            if not any(s.scope == "host" for s in self.specs):
                raise CommandError("no host-level check is configured (validation.network)")
            key = "host"
        else:
            key = f"gpu:{self._gpu_arg(args, views).index}"
        self.planner.request(key, level, "operator")
        self._urgent = True
        return {"queued": key, "level": level,
                "pause_seconds": round(self._budget(key, level))}

    def command_release(self, args: dict[str, Any], views: tuple[GpuView, ...],
                        now: float) -> dict[str, Any]:
        view = self._gpu_arg(args, views)
        if view.state not in (GpuState.QUARANTINED, GpuState.LOST, GpuState.SUSPECT):
            raise CommandError(f"gpu {view.index} is {view.state.value}: nothing to release")
        if args.get("force"):
            event = self.engine.release(view.index, "released by an operator (forced)", now)
            if event is not None:
                self.emit(event)
            self._quarantines.pop(view.uuid, None)
            self.history.release(view.uuid)
            return {"released": view.index, "validated": False}
        self.planner.request(f"gpu:{view.index}", self.cfg.suspect_level, "release")
        self._urgent = True
        return {"validating": view.index, "then": "released if it passes"}

    def command_drain(self, args: dict[str, Any], views: tuple[GpuView, ...],
                      now: float) -> dict[str, Any]:
        view = self._gpu_arg(args, views)
        reason = args.get("reason") or "drained by an operator"
        if not isinstance(reason, str) or len(reason) > 200:
            raise CommandError("reason must be a string of at most 200 characters")
        self.planner.cancel(f"gpu:{view.index}")
        event = self.engine.quarantine(view.index, reason, now, Action.DRAIN)
        if event is not None:
            self.emit(event)
        entry = Quarantine(view.uuid, view.index, reason, Action.DRAIN.value, now, self.boot)
        self._quarantines[view.uuid] = entry
        self.history.quarantine(entry)
        return {"drained": view.index, "reason": reason}

    def command_history(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        limit = args.get("limit", 50)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise CommandError("limit must be an integer from 1 to 10000")
        return self.history.recent(limit)

    def status(self) -> dict[str, Any]:
        return {
            "running": sorted(self.runner.running),
            "scheduled": {k: {"level": p.level, "trigger": p.trigger, "starts_at": p.start_at,
                              "notice": p.id, "jobs": list(p.jobs),
                              "approved": sorted(p.approved), "deferred": sorted(p.deferred),
                              "cause": p.cause.value, "window": p.window}
                          for k, p in self.planner.scheduled.items()},
            "requested": sorted(self.planner.requests),
            "waiting": dict(self.planner.waiting),
            "quarantined": [q.__dict__ for q in self._quarantines.values()],
        }
