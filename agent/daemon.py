"""The agent's daemon shell: reads observers, steps the engines, applies, serves.

All decisions live in the domains' sans-I/O engines (:mod:`agent.step`, which
steps the GPU and link engines, the tuning loop, validation's planner) and
:mod:`agent.outbox`; each domain's operator commands live in its ``commands``
module. This module owns the clock, the sockets, signals and systemd notification;
its operator commands and reload are :mod:`agent.daemoncommands`, its side of the
controller :mod:`agent.daemonmessages`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import zmq.asyncio

from agent import selfmetrics
from agent.config import AgentConfig
from agent.daemoncommands import OperatorCommands
from agent.daemonmessages import ControllerMessages
from agent.declarations import Declarations
from agent.energy.service import EnergyService
from agent.gpu.health import GpuState
from agent.gpu.jobs import JobResolver
from agent.jobhealth.service import JobHealthService
from agent.observations import Observations
from agent.observers import ObserverSet
from agent.rdma.service import RdmaCcService
from agent.remediation.service import RemediationService
from agent.spool import Spool
from agent.step import HealthStep, HostHealthEngine, Republisher
from agent.tuning.service import TuningService
from agent.uplink import Uplink
from agent.validation.service import ValidationService
from harmonaize.exhaustion import AcceptExhaustion
from harmonaize.logs import one_line
from harmonaize.messages import (
    HostSummary,
)
from harmonaize.metrics import MetricsServer, Registry
from harmonaize.opsocket import OperatorSocket
from harmonaize.sdnotify import Notifier
from harmonaize.threads import set_os_thread_name

log = logging.getLogger("harmonaize.agent")

#: After an observer wakes the loop, wait this long so a burst of events is one step.
MIN_STEP_GAP = 0.002
#: GPUs the energy loop leaves at their own power limit (a validation benchmarks them).
OUT_OF_SERVICE = frozenset({GpuState.VALIDATING, GpuState.QUARANTINED, GpuState.LOST})


class AgentDaemon(OperatorCommands, ControllerMessages):
    def __init__(self, cfg: AgentConfig, cfg_path: Path | None = None) -> None:
        self.cfg = cfg
        self.cfg_path = cfg_path
        self.host_id = cfg.agent.host_id or socket.gethostname()
        self.epoch = int(time.time() * 1e6)
        self.started_at = time.monotonic()
        self.notifier = Notifier()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_pending = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.observers = ObserverSet.from_config(cfg, wake=self._wake)
        self._bind_job_groups()
        self.health = HostHealthEngine(cfg.observers)
        self.republisher = Republisher(cfg.controller.summary_refresh)
        self.summary: HostSummary | None = None
        self.last_step: HealthStep | None = None
        self.observations = Observations()
        self.advisories_sent = 0
        #: What tenants declared for their jobs (from the controller, or an operator).
        self.declarations = Declarations()
        self.validation: ValidationService | None = None
        self.tuning: TuningService | None = None
        self.energy: EnergyService | None = None
        #: RDMA congestion control; always there, so originals a killed agent left are put
        #: back at start even when [rdma.cc] is now off.
        self.rdma_cc: RdmaCcService | None = None
        #: Resets of quarantined GPUs and the reboot and RMA holds after them (needs
        #: validation, which decides after each step).
        self.remediation: RemediationService | None = None
        #: Which ranks hold each job's communicators up (needs tuning's stats reads).
        self.jobhealth: JobHealthService | None = None
        self._jobhealth_timer: asyncio.TimerHandle | None = None
        self.drained: str | None = None
        self.ready = False
        self.passes = 0
        self.overruns = 0
        self.woken_steps = 0
        self.last_pass_seconds = 0.0
        self.events_logged = 0
        self.events_by_reason: Counter[str] = Counter()
        self.metrics: MetricsServer | None = None
        self._stop = asyncio.Event()
        self._ctx: zmq.asyncio.Context | None = None
        self.uplink: Uplink | None = None
        #: Out of descriptors at accept (operator socket, metrics): one line, counted.
        self.exhaustion = AcceptExhaustion()
        self.opsocket = OperatorSocket(
            cfg.socket.path, self._commands(), group=cfg.socket.group, mode=cfg.socket.mode
        )
        self._last_watchdog = 0.0

    # --- identity -------------------------------------------------------------------------

    @property
    def gpu_class(self) -> str:
        if self.cfg.agent.gpu_class != "auto":
            return self.cfg.agent.gpu_class
        return getattr(self.observers.get("gpu"), "gpu_class", "none")

    # --- lifecycle -----------------------------------------------------------------------

    async def run(self) -> int:
        set_os_thread_name("hz-agent")
        loop = self._loop = asyncio.get_running_loop()
        self.exhaustion.install(loop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)  # result is logged
        self.notifier.status("starting observers")
        try:
            Path(self.cfg.agent.state_dir).mkdir(parents=True, exist_ok=True)
            if not Path(self.cfg.agent.state_dir).is_dir():
                raise NotADirectoryError(20, "not a directory", self.cfg.agent.state_dir)
        except OSError as exc:
            raise RuntimeError(f"agent.state_dir: {one_line(exc)}") from None
        curve = self._uplink_keys()  # before anything starts: a missing key is fatal
        # First: a taken port stops the start before anything else is running.
        if self.cfg.metrics.listen:
            registry = Registry("harmonaize_agent")
            registry.register("agent", lambda: selfmetrics.collect(self))
            self.metrics = MetricsServer(self.cfg.metrics.listen, registry)
            await self.metrics.start()
        self.observers.start_all()
        try:
            await self.opsocket.start()
        except RuntimeError as exc:
            self.observers.stop_all()
            raise RuntimeError(f"socket.path: {exc}") from None
        if self.cfg.validation.enabled:
            self.validation = ValidationService(
                self.cfg.validation, self.cfg.agent.state_dir, self.health.gpus,
                retired_pages_limit=self.cfg.observers.gpu.retired_pages_limit,
                publish=self._publish, emit=self._emit,
                allowance=self.declarations.pause_allowance,
                defer_allowance=self.declarations.defer_allowance,
                negotiates=self.declarations.negotiates)
            self.validation.start(loop)
        if self.cfg.remediation.enabled:
            if self.validation is None:
                log.error("remediation is off: it needs validation (validation.enabled)")
            else:
                self.remediation = RemediationService(self.cfg.remediation, self.validation,
                                                      wake=self._wake)
                log.info("remediation on (%s)", self.cfg.remediation.mode.value)
        if self.cfg.tuning.enabled:
            self.tuning = TuningService(self.cfg.tuning, self.cfg.observers.links,
                                        publish=self._publish)
            self.tuning.start(time.time())
        if self.cfg.jobhealth.enabled:
            gpu = self.cfg.observers.gpu
            self.jobhealth = JobHealthService(
                self.cfg.jobhealth, publish=self._publish, proc_root=gpu.procfs_root,
                resolver=JobResolver(gpu.procfs_root, gpu.job_env, gpu.job_cgroup_pattern,
                                     gpu.rank_env, group_of=self._job_group))
        energy = EnergyService(
            self.cfg.energy, self.cfg.agent.state_dir, self._gpu_handles,
            call_timeout=self.cfg.observers.gpu.call_timeout,
            policy_dir=self.cfg.tuning.policy_dir if self.cfg.tuning.enabled else None,
            wake=self._wake)
        # Power limits a killed agent left lowered go back first, even with the loop off.
        energy.restore_left()
        if self.cfg.energy.enabled:
            energy.start()
            self.energy = energy
        self.rdma_cc = RdmaCcService(self.cfg.rdma.cc, self.cfg.observers.rdma.sysfs_root,
                                     self.cfg.agent.state_dir)
        self.rdma_cc.start(time.time())
        self._step(time.time())  # the first summary (and GPU count) before the hello
        if self.cfg.controller.endpoint or self.cfg.controller.endpoints:
            self._ctx = zmq.asyncio.Context()
            spool = (Spool(Path(self.cfg.agent.state_dir) / "spool.db", self.host_id)
                     if self.cfg.controller.spool else None)
            self.uplink = Uplink(
                self._ctx, self.cfg.controller, self.host_id, self._hello,
                on_resync=self.republisher.force, on_declaration=self._declared,
                on_tuning=self._tuning_message, on_validation=self._validation_answer,
                spool=spool, curve=curve,
            )
            if self.uplink.outbox.restored:
                log.info("resending %d events a previous run left unacknowledged",
                         self.uplink.outbox.restored)
            self.uplink.connect()
            self.republisher.force()
            self._step(time.time())
        self.ready = True
        # Everything allocated so far lives as long as the daemon: keep the cyclic
        # collector from rescanning it on every collection.
        gc.freeze()
        self.notifier.ready(self._status_line())
        log.info("agent %s ready: %s", self.host_id, self._status_line())
        tasks = [asyncio.create_task(self._sampling_loop(), name="sampling")]
        if self.uplink is not None:
            tasks.append(asyncio.create_task(self.uplink.run(self._stop), name="uplink"))
        try:
            stopper = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            await self._shutdown(tasks)
        return 0

    def stop(self) -> None:
        self._stop.set()

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        self.notifier.stopping()
        log.info("agent %s stopping", self.host_id)
        for timer in (self._timer, self._jobhealth_timer):
            if timer is not None:
                timer.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.remediation is not None:
            self.remediation.stop()  # before validation closes the history it writes
        if self.validation is not None:
            self.validation.stop()  # kills running checks before anything else goes
        if self.energy is not None:
            self.energy.stop()  # every power limit back where it was, while NVML is up
        if self.tuning is not None:
            # Single-host communicators back to NCCL's own choices, traffic classes
            # removed; the policy files stay for the next agent to adopt.
            self.tuning.stop(time.time())
        if self.rdma_cc is not None:
            self.rdma_cc.stop()  # every NIC value it changed back to what it was
        if self.uplink is not None:
            self.uplink.close("agent stopping")
        if self._ctx is not None:
            self._ctx.term()
        await self.opsocket.close()
        if self.metrics is not None:
            await self.metrics.close()
        self.observers.stop_all()
        self.notifier.close()

    # --- the sampling loop ---------------------------------------------------------------

    def _bind_job_groups(self) -> None:
        """The GPU observer backs a process's HARMONAIZE_JOB with the job's Unix group
        from its placement, which comes with the job's declaration."""
        resolver = getattr(self.observers.get("gpu"), "resolver", None)
        if resolver is not None:
            resolver.group_of = self._job_group

    def _job_group(self, job: str) -> str | None:
        declaration = self.declarations.jobs.get(job)
        return declaration.group or None if declaration is not None else None

    def _wake(self) -> None:
        """An observer saw something (on any thread): step now, not at the next tick."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_wake)

    async def _sampling_loop(self) -> None:
        """Steps on a timer, plus extra steps when an observer wakes us.

        Callbacks on the event loop, not a coroutine per tick: at 10 Hz the
        bookkeeping of a task and a timeout per tick is a visible share of the
        agent's CPU budget.
        """
        loop = asyncio.get_running_loop()
        self._deadline = loop.time()
        self._tick()
        await asyncio.Event().wait()  # runs until cancelled at shutdown; callbacks do the work

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        self._deadline += self.cfg.agent.interval
        if self._deadline < now:  # fell behind: skip the missed ticks rather than burst
            self.overruns += 1
            self._deadline = now + self.cfg.agent.interval
        self._run_step()
        self._timer = loop.call_at(self._deadline, self._tick)
        self._wake_for_jobhealth()

    def _wake_for_jobhealth(self) -> None:
        """A job-health threshold that falls before the next tick gets a pass of its own
        (its deadline is on the wall clock, the loop's timers on the monotonic one)."""
        loop = self._loop
        due = self.jobhealth.next_deadline() if self.jobhealth is not None else None
        if loop is None or due is None or due <= time.time():
            return  # past: the next tick judges it
        at = loop.time() + (due - time.time())
        timer = self._jobhealth_timer
        if at < self._deadline and (timer is None or not loop.time() < timer.when() <= at):
            if timer is not None:
                timer.cancel()
            self._jobhealth_timer = loop.call_at(at, self._woken_step)

    def _on_wake(self) -> None:
        if self._wake_pending:
            return
        self._wake_pending = True
        assert self._loop is not None
        # A short delay lets a burst of events become one step.
        self._loop.call_later(MIN_STEP_GAP, self._woken_step)

    def _woken_step(self) -> None:
        self._wake_pending = False
        self.woken_steps += 1
        self._run_step()
        self._wake_for_jobhealth()

    def _run_step(self) -> None:
        began = time.perf_counter()
        try:
            self._step(time.time())
        except Exception:
            log.exception("sampling pass failed")
        self.last_pass_seconds = time.perf_counter() - began
        self._feed_watchdog()

    def _step(self, now: float) -> None:
        observations = Observations.of(self.observers.sample_all(now))
        self.observations = observations
        failing = {r.name: r.last_error or r.detail for r in self.observers.failing()}
        host_failure = self.validation.host_failure if self.validation is not None else None
        result = self.health.step(observations, now, failing=failing, drained=self.drained,
                                  validation_failure=host_failure,
                                  extra=self.tuning.findings() if self.tuning else ())
        self.passes += 1
        summary = result.summary
        if self.energy is not None:
            summary = replace(summary, energy=self.energy.reported(now))
        if self.validation is not None and self.validation.planner.idle_wanted:
            summary = replace(summary, idle_wanted=True)
        if self.remediation is not None and (extra := self.remediation.holds()):
            summary = replace(summary, holds=(summary.holds + extra)[:64])
        self.summary = summary
        self.last_step = result
        for event in result.events:
            self._emit(event)
        for advisory in result.advisories:
            log.warning("advisory to job %s: %s (%s, %s)", advisory.job, advisory.advice.value,
                        advisory.reason, advisory.urgency.value)
            self.advisories_sent += 1
            self._publish(advisory)
        for fault in result.gpus.application_xids:  # the job's own: for its owner
            log.warning("xid %d is job %s's own (%s)%s", fault.xid, fault.job,
                        fault.fault.value, ", at its teardown" if fault.teardown else "")
            self._publish(fault)
        if self.validation is not None:
            self.validation.step(result.gpus.gpus, now)
        if self.remediation is not None:
            self.remediation.step(result.gpus.gpus, now)
        if self.tuning is not None:
            self.tuning.step(observations.links, result.links.judged, now)
        if self.jobhealth is not None:
            self.jobhealth.step(self.tuning, observations.gpu, result.gpus.gpus,
                                result.links.links, now)
        if self.energy is not None:
            self.energy.step(observations.gpu, self.declarations.jobs, now,
                             [v.index for v in result.gpus.gpus if v.state in OUT_OF_SERVICE])
        if self.rdma_cc is not None:
            self.rdma_cc.step(observations.rdma, now)
        if self.republisher.due(summary, now) and self.uplink is not None:
            self.uplink.publish(summary)

    def _gpu_handles(self) -> dict[str, Any]:
        """NVML handles by GPU UUID, from the GPU observer running now (none without)."""
        nvml = getattr(self.observers.get("gpu"), "nvml", None)
        return {r.identity.uuid: r.handle for r in nvml.readers} if nvml is not None else {}

    def _feed_watchdog(self) -> None:
        interval = self.notifier.watchdog_interval
        now = time.monotonic()
        if interval is not None and now - self._last_watchdog >= interval:
            self.notifier.watchdog()
            self._last_watchdog = now
