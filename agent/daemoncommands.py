"""The agent daemon's operator commands and its reload: what the operator socket (and
SIGHUP) reach. Each domain's commands live in its ``commands`` module; this part of the
daemon lists them and answers ``status`` and ``reload`` itself.

A mixin of :class:`agent.daemon.AgentDaemon`, whose state it reads (the configuration,
the observers, the engines and services, the last pass).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from typing import Any

from agent import config as agent_config
from agent.energy import commands as energy_commands
from agent.gpu import commands as gpu_commands
from agent.gpu.health import GpuStep, GpuView
from agent.host import commands as host_commands
from agent.jobhealth import commands as jobhealth_commands
from agent.links import commands as link_commands
from agent.observers import ObserverSet
from agent.rdma import commands as rdma_commands
from agent.remediation import commands as remediation_commands
from agent.tuning import commands as tuning_commands
from agent.validation import commands as validation_commands
from harmonaize import __version__
from harmonaize.config import ConfigError
from harmonaize.messages import HostSummary
from harmonaize.opsocket import Command, CommandError
from harmonaize.schema import to_plain

log = logging.getLogger("harmonaize.agent")


class OperatorCommands:
    """``status``, ``reload`` and every domain's commands, on the daemon's state."""

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
                ("jobhealth.enabled", self.cfg.jobhealth.enabled, new.jobhealth.enabled),
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
        if self.jobhealth is not None and new.jobhealth != self.cfg.jobhealth:
            self.jobhealth.configure(new.jobhealth)
            log.info("applied the new [jobhealth] settings")
        if live:
            log.info("applied %s to the running rules", ", ".join(live))
        self.republisher.refresh = new.controller.summary_refresh
        logging.getLogger().setLevel(new.agent.log_level.value.upper())
        self.cfg = new
        self.notifier.notify("READY=1", f"STATUS={self._status_line()}")
        log.info("configuration reloaded from %s", self.cfg_path or "built-in defaults")
        return None

    def _status_line(self) -> str:
        running = sum(1 for r in self.observers.records.values() if r.state.value == "running")
        target = (self.uplink.endpoint if self.uplink is not None
                  else self.cfg.controller.endpoint or "no controller")
        return (
            f"sampling {running} observer(s) every {self.cfg.agent.interval * 1000:.0f} ms; "
            f"{target}"
        )

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
            **jobhealth_commands.commands(self),
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
