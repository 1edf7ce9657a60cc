"""Remediation inside the agent: the engine, the reset command, validation and history, wired.

Each pass it offers the engine the GPUs as the health engine sees them and does what the
engine asks: runs the reset command (its own session, a time limit, its output kept for
the history), asks validation to look at a GPU, records each step in the validation
history (``validation.db``) with what triggered it, or, in shadow mode, logs what it
would have done. Validation's verdicts come back through a listener. Records are kept by
GPU UUID in the same database, so escalations survive restarts and reboots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.gpu.interface import GpuView
from agent.remediation.engine import RemediationEngine
from agent.remediation.settings import RemediationMode, RemediationSection, render_reset
from agent.remediation.types import (
    Action,
    GpuSeen,
    Log,
    Phase,
    Record,
    Reset,
    Settings,
    Validate,
    Would,
)
from agent.validation.interface import Outcome, Validation, Verdict
from harmonaize.logs import one_line
from harmonaize.messages import Hold

log = logging.getLogger(__name__)

#: Output of a reset command kept for the history at most (characters).
MAX_OUTPUT = 400


def settings_of(cfg: RemediationSection) -> Settings:
    return Settings(shadow=cfg.mode is RemediationMode.SHADOW, max_resets=cfg.max_resets,
                    reset_interval=cfg.reset_interval,
                    max_resets_per_hour=cfg.max_resets_per_hour)


def read_boot_id(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()[:64]
    except OSError:
        return ""


def seen(views: Iterable[GpuView]) -> list[GpuSeen]:
    """What the engine needs of each GPU; processes unknown (None) count as busy."""
    out = []
    for view in views:
        snap = view.snapshot
        telemetry = snap.telemetry if snap is not None else None
        processes = (len(telemetry.processes) if telemetry is not None
                     and telemetry.processes_read else None)
        out.append(GpuSeen(view.index, view.uuid, snap.identity.pci_bus_id if snap else "",
                           view.state.value, view.action.value, view.why, processes))
    return out


class RemediationService:
    def __init__(self, cfg: RemediationSection, validation: Validation,
                 wake: Callable[[], None]) -> None:
        self.cfg = cfg
        self.validation = validation
        self.history = validation.history
        self.wake = wake
        self.boot = read_boot_id(cfg.boot_id_file)
        now = time.time()
        records = [Record(uuid, gpu, Phase(phase), failures, since, boot,
                          float("-inf") if last is None else last, detail)
                   for uuid, gpu, phase, failures, since, boot, last, detail
                   in self.history.remediation_load()]
        resets = [row["at"] for row in self.history.remediation_steps(
            limit=10_000, since=now - 3600.0, step="reset")]
        self.engine = RemediationEngine(settings_of(cfg), records, resets)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restored_before = False
        self._settled = False
        validation.listeners.append(self._verdict)
        for record in records:
            if record.phase is Phase.RESETTING:  # the agent stopped during a reset
                self._apply(self.engine.reset_interrupted(record.uuid, now), now)
        self._save()

    def configure(self, cfg: RemediationSection) -> None:
        """A reload: new mode, limits and command from the next pass on."""
        self.cfg = cfg
        self.engine.settings = settings_of(cfg)

    def stop(self) -> None:
        """A reset that runs is left to finish: cut off halfway it is worse than done.
        The next start finds the GPU's record mid-reset and lets validation decide."""
        for task in self._tasks.values():
            task.cancel()

    # --- each pass ------------------------------------------------------------------

    def step(self, views: tuple[GpuView, ...], now: float) -> None:
        # Not before the views show the quarantines validation restores at start: a GPU
        # quarantined before a restart would look healthy (released) for a pass.
        if not self._settled:
            self._settled = self._restored_before
            self._restored_before = self.validation.restored
            return
        self._apply(self.engine.step(seen(views), now, self.boot), now)

    def holds(self) -> tuple[Hold, ...]:
        return self.engine.holds()

    def _apply(self, actions: list[Action], now: float) -> None:
        for action in actions:
            if isinstance(action, Reset):
                self._start_reset(action)
            elif isinstance(action, Validate):
                self.validation.request(action.gpu, action.trigger)
            elif isinstance(action, Log):
                log.log(logging.WARNING if action.step in ("reboot", "rma", "reset-failed",
                                                           "revalidation-failed")
                        else logging.INFO, "remediation of gpu %d: %s (%s)%s", action.gpu,
                        action.step, action.trigger, f": {action.detail}" if action.detail
                        else "")
                self.history.remediation_step(now, action.uuid, action.gpu, step=action.step,
                                              trigger=action.trigger, detail=action.detail,
                                              boot=self.boot)
            elif isinstance(action, Would):
                log.warning("remediation (shadow, nothing done): would %s on gpu %d",
                            action.what, action.gpu)
        self._save()

    def _save(self) -> None:
        changed, self.engine.changed = self.engine.changed, set()
        if not changed:
            return
        rows = [(r.uuid, r.gpu, r.phase.value, r.failures, r.since, r.boot_id,
                 None if r.last_reset == float("-inf") else r.last_reset, r.detail)
                for uuid in changed if (r := self.engine.records.get(uuid)) is not None]
        gone = [uuid for uuid in changed if uuid not in self.engine.records]
        self.history.remediation_save(rows, gone)

    # --- the reset command ----------------------------------------------------------

    def _start_reset(self, reset: Reset) -> None:
        argv = render_reset(self.cfg.reset_command, reset.gpu, reset.pci_bus_id, reset.uuid)
        log.warning("remediation: resetting gpu %d: %s", reset.gpu, " ".join(argv))
        self._tasks[reset.uuid] = asyncio.get_running_loop().create_task(
            self._reset(reset, argv), name=f"reset-gpu-{reset.gpu}")

    async def _reset(self, reset: Reset, argv: list[str]) -> None:
        ok, detail = False, ""
        try:
            ok, detail = await self._run(argv)
        finally:
            self._tasks.pop(reset.uuid, None)
        now = time.time()
        self._apply(self.engine.reset_done(reset.uuid, ok, detail, now, self.boot), now)
        self.wake()

    async def _run(self, argv: list[str]) -> tuple[bool, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return False, f"cannot run {argv[0]}: {one_line(exc)}"
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), self.cfg.reset_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return False, f"killed after {self.cfg.reset_timeout:g} s"
        text = " ".join(output.decode("utf-8", "replace").split())[-MAX_OUTPUT:]
        if proc.returncode != 0:
            return False, f"exit {proc.returncode}: {text}"
        return True, text

    # --- validation's verdicts ------------------------------------------------------

    def _verdict(self, verdict: Verdict) -> None:
        if verdict.plan.gpu is None:
            return
        passed = {Outcome.PASS: True, Outcome.FAIL: False}.get(verdict.outcome)
        now = time.time()
        self._apply(self.engine.verdict(verdict.uuid, passed, verdict.reason, now, self.boot),
                    now)

    # --- operator commands ----------------------------------------------------------

    def status(self, limit: int = 20) -> dict[str, Any]:
        return {
            "enabled": True,
            "mode": self.cfg.mode.value,
            "boot_id": self.boot,
            "gpus": [{**asdict(r), "last_reset": None if r.last_reset == float("-inf")
                      else r.last_reset} for r in sorted(self.engine.records.values(),
                                                         key=lambda r: r.gpu)],
            "holds": [asdict(h) for h in self.holds()],
            "resetting": sorted(self._tasks),
            "steps": self.history.remediation_steps(limit),
        }

    def operator(self, verb: str, gpu: int) -> dict[str, Any]:
        now = time.time()
        if verb == "cancel":
            actions = self.engine.cancel(gpu, now)
        elif verb == "resume":
            actions = self.engine.resume(gpu, now)
        else:
            actions = self.engine.clear(gpu)
        self._apply(actions, now)
        self.wake()
        return {{"cancel": "cancelled", "resume": "resumed", "clear": "rma cleared"}[verb]: gpu}
