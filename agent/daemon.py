"""The agent's daemon shell: reads observers, steps the engines, applies, serves.

All decisions live in the domains' sans-I/O engines (:mod:`agent.step`, which
steps the GPU and link engines, the tuning loop, validation's planner) and
:mod:`agent.outbox`; each domain's operator commands live in its ``commands``
module. This module owns the clock, the sockets, signals and systemd notification.
"""

# Over 400 lines because the shell owns every clock, socket and signal of the agent; the
# decisions and the commands are in the domains, what is left is their wiring.

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import zmq.asyncio

from agent import config as agent_config
from agent import selfmetrics
from agent.config import AgentConfig
from agent.declarations import Declarations
from agent.energy import commands as energy_commands
from agent.energy.service import EnergyService
from agent.gpu import commands as gpu_commands
from agent.gpu.health import GpuState, GpuStep, GpuView
from agent.host import commands as host_commands
from agent.links import commands as link_commands
from agent.observations import Observations
from agent.observers import ObserverSet
from agent.rdma import commands as rdma_commands
from agent.rdma.service import RdmaCcService
from agent.remediation import commands as remediation_commands
from agent.remediation.service import RemediationService
from agent.spool import Spool
from agent.step import HealthStep, HostHealthEngine, Republisher
from agent.tuning import commands as tuning_commands
from agent.tuning.service import TuningService
from agent.uplink import Uplink
from agent.validation import commands as validation_commands
from agent.validation.service import ValidationService
from harmonaize import __version__, keys
from harmonaize.config import ConfigError
from harmonaize.exhaustion import AcceptExhaustion
from harmonaize.logs import one_line
from harmonaize.messages import (
    Hello,
    HostEvent,
    HostSummary,
    JobDeclaration,
    Message,
    Severity,
    TuningArm,
    TuningResolve,
    ValidationDecision,
)
from harmonaize.metrics import MetricsServer, Registry
from harmonaize.opsocket import Command, CommandError, OperatorSocket
from harmonaize.schema import to_plain
from harmonaize.sdnotify import Notifier
from harmonaize.threads import set_os_thread_name

log = logging.getLogger("harmonaize.agent")

#: After an observer wakes the loop, wait this long so a burst of events is one step.
MIN_STEP_GAP = 0.002
#: GPUs the energy loop leaves at their own power limit (a validation benchmarks them).
OUT_OF_SERVICE = frozenset({GpuState.VALIDATING, GpuState.QUARANTINED, GpuState.LOST})


class AgentDaemon:
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

    def _hello(self, acked: int) -> Hello:
        return Hello(
            pool=self.cfg.agent.pool,
            gpu_class=self.gpu_class,
            gpus=self.summary.gpus.total if self.summary else 0,
            version=__version__,
            epoch=self.epoch,
            acked=acked,
            heartbeat=self.cfg.controller.heartbeat,
        )

    def _uplink_keys(self) -> tuple[keys.KeyPair, bytes] | None:
        section = self.cfg.controller
        if not section.endpoint or not section.server_key:
            if section.endpoint:
                log.warning("connecting to the controller without CurveZMQ "
                            "(controller.server_key is empty)")
            return None
        try:
            return keys.load_pair(section.secret_key), keys.load_public(section.server_key)
        except keys.KeyFileError as exc:
            directory = Path(section.secret_key).parent
            raise RuntimeError(
                f"{exc} (make this host's pair with: harmonctl keygen --dir {directory} agent; "
                f"then copy {directory}/agent.key to the controller as "
                f"agents/{self.host_id}.key. Or set controller.server_key = \"\" for a "
                "controller without authentication)") from None

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
                defer_allowance=self.declarations.defer_allowance)
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
        if self._timer is not None:
            self._timer.cancel()
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

    def reload(self) -> str | None:
        """SIGHUP: re-read the configuration; a bad file keeps the running one.

        Returns the error that refused the new file, if any.
        """
        self.notifier.reloading()
        try:
            new, _ = agent_config.load(self.cfg_path)
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            self.notifier.notify("READY=1", f"STATUS=reload failed: {exc}")
            return str(exc)
        restart_needed = [
            key
            for key, old, fresh in (
                ("agent.host_id", self.cfg.agent.host_id, new.agent.host_id),
                ("socket", self.cfg.socket, new.socket),
                ("controller.endpoint", self.cfg.controller.endpoint, new.controller.endpoint),
                ("controller.endpoints", self.cfg.controller.endpoints,
                 new.controller.endpoints),
                ("agent.state_dir", self.cfg.agent.state_dir, new.agent.state_dir),
                ("tuning", self.cfg.tuning, new.tuning),
                ("energy.enabled", self.cfg.energy.enabled, new.energy.enabled),
                ("remediation.enabled", self.cfg.remediation.enabled,
                 new.remediation.enabled),
                ("rdma", self.cfg.rdma, new.rdma),
                ("metrics.listen", self.cfg.metrics.listen, new.metrics.listen),
            )
            if old != fresh
        ]
        if restart_needed:
            log.warning("changes to %s take effect at the next restart", ", ".join(restart_needed))
        live, io = agent_config.changes(self.cfg.observers, new.observers)
        if io:
            # What the observers were started with (a library, interfaces, a mode):
            # they restart. The engines live on either way, so GPU states and
            # quarantines, conditions and link levels are never lost to a reload.
            log.info("restarting the observers: %s changed", ", ".join(io))
            self.observers.stop_all()
            self.observers = ObserverSet.from_config(new, wake=self._wake)
            self._bind_job_groups()
            self.observers.start_all()
        if live or io:
            self.health.configure(new.observers)
            if self.validation is not None:
                self.validation.configure(new.observers.gpu.retired_pages_limit)
            if self.tuning is not None:
                self.tuning.configure(new.observers.links)
        if self.remediation is not None and new.remediation != self.cfg.remediation:
            self.remediation.configure(new.remediation)
            log.info("applied the new [remediation] settings")
        if self.energy is not None and new.energy != self.cfg.energy:
            self.energy.configure(new.energy)
            log.info("applied the new [energy] settings to the running loop")
        if live:
            log.info("applied %s to the running rules", ", ".join(live))
        self.republisher.refresh = new.controller.summary_refresh
        logging.getLogger().setLevel(new.agent.log_level.value.upper())
        self.cfg = new
        self.notifier.notify("READY=1", f"STATUS={self._status_line()}")
        log.info("configuration reloaded from %s", self.cfg_path or "built-in defaults")
        return None

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
        if self.validation is not None:
            self.validation.step(result.gpus.gpus, now)
        if self.remediation is not None:
            self.remediation.step(result.gpus.gpus, now)
        if self.tuning is not None:
            self.tuning.step(observations.links, result.links.judged, now)
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

    def _publish(self, message: Message) -> None:
        if self.uplink is not None:
            self.uplink.publish(message)

    def _declared(self, declaration: JobDeclaration) -> None:
        self._tune_declared(declaration)
        self.declarations.receive(declaration)

    def _tune_declared(self, declaration: JobDeclaration) -> None:
        if self.tuning is None:
            return
        try:
            if declaration.withdrawn:
                if declaration.job in self.tuning.loop.jobs:
                    self.tuning.withdraw(declaration.job, time.time())
            else:
                self.tuning.declare(declaration, time.time())
        except ValueError as exc:
            log.warning("job %s: declaration not applied to tuning: %s", declaration.job, exc)

    def _tuning_message(self, message: TuningArm | TuningResolve) -> None:
        """The controller's phases of a multi-host change, handled as they arrive
        (not at the next pass): every millisecond of delay is headroom lost."""
        if self.tuning is None:
            return
        try:
            if isinstance(message, TuningArm):
                self.tuning.arm(message, time.time())
            else:
                self.tuning.resolve(message, time.time())
        except Exception:
            log.exception("tuning message %s for job %s failed", message.KIND, message.job)

    def _validation_answer(self, decision: ValidationDecision) -> None:
        """A tenant's answer to a validation notice, applied as it arrives."""
        if self.validation is not None:
            self.validation.answer(decision, time.time())
            self._wake()

    def _emit(self, event: HostEvent) -> None:
        level = logging.WARNING if event.severity is not Severity.INFO else logging.INFO
        log.log(level, "event %s %s", event.reason, event.message)
        self.events_logged += 1
        self.events_by_reason[event.reason] += 1
        if self.uplink is not None:
            self.uplink.publish(event)

    def _feed_watchdog(self) -> None:
        interval = self.notifier.watchdog_interval
        now = time.monotonic()
        if interval is not None and now - self._last_watchdog >= interval:
            self.notifier.watchdog()
            self._last_watchdog = now

    def _status_line(self) -> str:
        running = sum(1 for r in self.observers.records.values() if r.state.value == "running")
        target = (self.uplink.endpoint if self.uplink is not None
                  else self.cfg.controller.endpoint or "no controller")
        return (
            f"sampling {running} observer(s) every {self.cfg.agent.interval * 1000:.0f} ms; "
            f"{target}"
        )

    # --- operator commands ---------------------------------------------------------------

    def _commands(self) -> dict[str, Command]:
        """The daemon's own commands, then each domain's (in the order ``help`` lists)."""
        return {
            "status": Command(self._cmd_status, "agent, observers, health and uplink"),
            **link_commands.commands(self.observers, self._links_pass),
            **rdma_commands.commands(self, lambda: self.observations.rdma),
            **gpu_commands.commands(self, self._last_gpu_pass),
            **energy_commands.commands(self),
            **host_commands.commands(self, lambda: self._step(time.time()), self._drain_gpu),
            "reload": Command(self._cmd_reload, "re-read the configuration file", changes=True),
            **validation_commands.commands(self, self._gpu_views),
            **remediation_commands.commands(self),
            **tuning_commands.commands(self, self._declared),
        }

    def _links_pass(self) -> link_commands.LinksPass:
        """The latest pass as the ``links`` command shows it."""
        step = self.last_step
        return link_commands.LinksPass(
            self.observations.links, self.observations.rdma,
            step.links.links if step else (), step.summary.links if step else None)

    def _last_gpu_pass(self) -> tuple[HostSummary | None, GpuStep | None]:
        step = self.last_step
        return (step.summary, step.gpus) if step is not None else (None, None)

    def _gpu_views(self) -> tuple[GpuView, ...]:
        return self.last_step.gpus.gpus if self.last_step is not None else ()

    def _drain_gpu(self, args: dict[str, Any]) -> dict[str, Any]:
        """``drain`` with ``gpu``: the host's command, validation's work."""
        return validation_commands.drain_gpu(self, self._gpu_views, args)

    def _cmd_status(self, args: dict[str, Any]) -> dict[str, Any]:
        self.observers.refresh_details()
        summary = self.summary
        return {
            "host_id": self.host_id,
            "pool": self.cfg.agent.pool,
            "gpu_class": self.gpu_class,
            "version": __version__,
            "pid": os.getpid(),
            "uptime_seconds": round(time.monotonic() - self.started_at, 3),
            "ready": self.ready,
            "config": str(self.cfg_path) if self.cfg_path else None,
            "interval_seconds": self.cfg.agent.interval,
            "loop": {
                "passes": self.passes,
                "woken": self.woken_steps,
                "overruns": self.overruns,
                "last_pass_seconds": round(self.last_pass_seconds, 6),
            },
            "health": summary.health.value if summary else None,
            "schedulable": summary.schedulable if summary else None,
            "conditions": [to_plain(c) for c in summary.conditions] if summary else [],
            "holds": [to_plain(h) for h in summary.holds] if summary else [],
            "observers": [r.as_dict() for r in self.observers.records.values()],
            "uplink": self.uplink.status() if self.uplink else None,
            "socket": asdict(self.opsocket.stats),
            "validation": self.validation.status() if self.validation else None,
        }

    def _cmd_reload(self, args: dict[str, Any]) -> dict[str, Any]:
        error = self.reload()
        if error is not None:
            raise CommandError(f"reload refused, running configuration kept: {error}")
        return {"config": str(self.cfg_path) if self.cfg_path else None}
