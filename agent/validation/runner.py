"""Running validations: checks in order, external commands under a budget.

Each external check runs in a process group of its own, with
``PR_SET_PDEATHSIG`` (through ``setpriv``) so it dies with the agent, and its
group id recorded in the history while it runs, so the next agent start kills
whatever a killed agent left. A check that overruns its budget is killed,
group and all, and fails. Validations run on worker threads; the verdict goes
back through ``on_done``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from agent.conditions import Action, worst
from agent.validation import baseline
from agent.validation.checks import (
    PARSERS,
    CheckResult,
    CommandSpec,
    Outcome,
    StaticLimits,
    Target,
    static_checks,
)
from agent.validation.history import History
from agent.validation.planner import Plan

log = logging.getLogger(__name__)

MAX_OUTPUT = 1 << 20


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Verdict:
    plan: Plan
    uuid: str
    outcome: Outcome
    reason: str
    action: Action
    results: tuple[CheckResult, ...]


def checks_for(specs: Sequence[CommandSpec], target: Target, level: int) -> list[CommandSpec]:
    scope = "host" if target.gpu is None else "gpu"
    return [s for s in specs if s.scope == scope and level in s.levels]


def budget(specs: Sequence[CommandSpec], target: Target, level: int) -> float:
    """How long a validation may take (and pause a job): its commands' budgets."""
    static = 1.0 if target.gpu is not None else 0.0
    return static + sum(s.budget for s in checks_for(specs, target, level))


class Runner:
    def __init__(self, history: History, specs: Sequence[CommandSpec], *,
                 limits: StaticLimits, tolerance: float, max_parallel: int,
                 on_done: Callable[[Verdict], None]) -> None:
        self.history = history
        self.specs = list(specs)
        self.limits = limits
        self.tolerance = tolerance
        self.on_done = on_done
        self.running: dict[str, int] = {}  # target key -> validation id
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_parallel),
                                        thread_name_prefix="validate")
        self._setpriv = shutil.which("setpriv")

    # --- lifecycle ------------------------------------------------------------------

    def clean_up_after_a_crash(self, now: float) -> list[str]:
        """Kill check processes a killed agent left behind; mark their validations.

        Only groups recorded in this boot: after a reboot the number may be anyone's.
        """
        killed = []
        current = boot_id()
        for entry in self.history.interrupted(now):
            if entry.pgid and entry.boot_id == current and _kill_group(entry.pgid):
                killed.append(f"{entry.target} (process group {entry.pgid})")
        return killed

    def stop(self) -> None:
        """Kill running checks (their validations end as interrupted) and wait."""
        self._stopping = True
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            _kill_group(proc.pid)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def start(self, plan: Plan, target: Target, uuid: str) -> None:
        with self._lock:
            if plan.key in self.running or self._stopping:
                return
            self.running[plan.key] = self.history.begin(plan.key, uuid, plan.level,
                                                        plan.trigger, now=time.time(),
                                                        boot=boot_id())
        self._pool.submit(self._run, plan, target, uuid)

    # --- one validation -------------------------------------------------------------

    def _run(self, plan: Plan, target: Target, uuid: str) -> None:
        validation = self.running[plan.key]
        results: list[CheckResult] = []
        try:
            if target.gpu is not None:
                results += static_checks(target, self.limits)
            for spec in checks_for(self.specs, target, plan.level):
                if self._stopping:
                    break
                results.append(self._command(validation, plan, spec, target, uuid))
            verdict = _verdict(plan, uuid, results, self._stopping)
        except Exception as exc:  # a bug here must not leave the device "validating"
            log.exception("validation of %s failed", plan.key)
            verdict = Verdict(plan, uuid, Outcome.ERROR, f"validation crashed: {exc}",
                              Action.NONE, tuple(results))
        try:
            self.history.finish(validation, verdict.outcome.value, verdict.reason,
                                verdict.action.value, results=verdict.results, now=time.time())
        except Exception:  # the verdict still stands; only its record is lost
            log.exception("recording the validation of %s failed", plan.key)
        finally:
            with self._lock:
                self.running.pop(plan.key, None)
            self.on_done(verdict)

    def _command(self, validation: int, plan: Plan, spec: CommandSpec, target: Target,
                 uuid: str) -> CheckResult:
        command = spec.render(target, plan.level)
        argv = command
        if self._setpriv:  # the check dies with us, whatever happens to us
            argv = [self._setpriv, "--pdeathsig", "KILL", "--", *command]
        began = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return CheckResult(spec.name, Outcome.ERROR, f"cannot run {command[0]}: "
                               f"{exc.strerror}")
        with self._lock:
            self._procs[plan.key] = proc
        self.history.set_process(validation, proc.pid)
        overran = False
        try:
            output, _ = proc.communicate(timeout=spec.budget)
        except subprocess.TimeoutExpired:
            overran = True
            _kill_group(proc.pid)
            output, _ = proc.communicate()
        finally:
            with self._lock:
                self._procs.pop(plan.key, None)
            self.history.set_process(validation, None)
        duration = time.monotonic() - began
        if self._stopping:
            return CheckResult(spec.name, Outcome.ERROR, "interrupted: the agent is stopping",
                               duration=duration)
        if overran:
            return CheckResult(spec.name, Outcome.FAIL,
                               f"overran its budget of {spec.budget:g} s and was killed",
                               duration=duration, action=spec.on_fail)
        text = output[:MAX_OUTPUT].decode("utf-8", "replace")
        outcome, reason, measurements = PARSERS[spec.parser](text, proc.returncode)
        judged = []
        for m in measurements:
            base = spec.baselines.get(m.name)
            if base is None:
                base = baseline.learned(self.history.passing_values(uuid, spec.name, m.name))
            ok, why = baseline.judge(m.value, base, higher_is_better=m.higher_is_better,
                                     tolerance=self.tolerance)
            judged.append(replace(m, baseline=base))
            if not ok and outcome is Outcome.PASS:
                value = f"{m.value:g} {m.unit}".strip()
                outcome, reason = Outcome.FAIL, f"{m.name} {value}: {why}"
        return CheckResult(spec.name, outcome, reason, tuple(judged), duration,
                           spec.on_fail if outcome is Outcome.FAIL else Action.NONE)


def _verdict(plan: Plan, uuid: str, results: list[CheckResult], stopping: bool) -> Verdict:
    failed = [r for r in results if r.outcome is Outcome.FAIL]
    errors = [r for r in results if r.outcome is Outcome.ERROR]
    if failed:
        reason = "; ".join(f"{r.check}: {r.reason}" for r in failed)
        return Verdict(plan, uuid, Outcome.FAIL, reason[:1000], worst([r.action for r in failed]),
                       tuple(results))
    if errors or stopping:
        reason = "; ".join(f"{r.check}: {r.reason}" for r in errors) or "interrupted"
        return Verdict(plan, uuid, Outcome.ERROR, reason[:1000], Action.NONE, tuple(results))
    return Verdict(plan, uuid, Outcome.PASS, f"{len(results)} check(s) passed", Action.NONE,
                   tuple(results))


def _kill_group(pgid: int) -> bool:
    """SIGKILL a check's process group; False if it is already gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True

