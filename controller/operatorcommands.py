"""What an operator can ask of the controller's shell: the admin socket's commands
(their views are controller/views.py's) and reloading the configuration."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller import config as controller_config
from controller import views
from controller.auth import AGENTS, TENANTS, ZapHandler
from controller.core import ControllerCore
from controller.gateway.http import Gateway
from controller.gateway.tokens import TokenBook, TokenError
from controller.handshakes import PortWatch
from controller.limits import descriptors
from controller.outputs import Output
from controller.scheduler.wiring import SchedulerWiring
from controller.store import Store
from controller.writeback import Writer
from harmonaize import __version__
from harmonaize.config import ConfigError
from harmonaize.opsocket import Command, CommandError, OperatorSocket
from harmonaize.schema import SchemaError
from harmonaize.sdnotify import Notifier

if TYPE_CHECKING:
    from controller.config import ControllerConfig

log = logging.getLogger("harmonaize.controller")


class OperatorCommands:
    """The operator's commands of :class:`controller.server.ControllerServer`, which
    holds the state."""

    cfg: ControllerConfig
    cfg_path: Path | None
    started_at: float
    notifier: Notifier
    store: Store
    core: ControllerCore
    writer: Writer
    scheduler: SchedulerWiring
    zap: ZapHandler | None
    ports: dict[str, PortWatch]
    gateway: Gateway | None
    tokens: TokenBook
    admin: OperatorSocket
    _wake: asyncio.Event

    if TYPE_CHECKING:  # in controller/server.py
        def _execute(self, outputs: list[Output]) -> None: ...

    # --- configuration -------------------------------------------------------------------

    def reload(self) -> str | None:
        """SIGHUP or ``reload``: re-read the configuration; a bad file keeps the running one.

        What the loops read each time (liveness, feed timing and retention,
        redaction, tuning agreement, log level) applies at once; sockets, the
        database, keys and metrics keep their values until the next restart, and
        the log says which. Returns the error that refused the new file, if any.
        """
        self.notifier.reloading()
        try:
            new, _ = controller_config.load(self.cfg_path)
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            self.notifier.notify("READY=1", f"STATUS=reload failed: {exc}")
            return str(exc)
        self.cfg, later = controller_config.reloaded(self.cfg, new)
        if later:
            log.warning("changes to %s take effect at the next restart", ", ".join(later))
        self.core.reconfigure(self.cfg)
        self.scheduler.reconfigure(self.cfg.scheduler)
        self.writer.retry = self.cfg.controller.full_disk_retry
        self._wake.set()  # the deadlines may have moved
        logging.getLogger().setLevel(new.controller.log_level.value.upper())
        self.notifier.notify("READY=1", f"STATUS={len(self.core.cluster.hosts)} known hosts")
        log.info("configuration reloaded from %s", self.cfg_path or "built-in defaults")
        return None

    def _cmd_reload(self, args: dict[str, Any]) -> dict[str, Any]:
        error = self.reload()
        if error is not None:
            raise CommandError(f"reload refused, running configuration kept: {error}")
        return {"config": str(self.cfg_path) if self.cfg_path else None}

    # --- admin commands: the views are controller/views.py's -------------------------------

    def _commands(self) -> dict[str, Command]:
        core = self.core
        return {
            "status": Command(self._cmd_status, "controller counters and endpoints"),
            "hosts": Command(lambda _: views.hosts(core, time.monotonic()),
                             "every known host and its last state"),
            "capacity": Command(lambda _: views.capacity(core), "what tenants currently see"),
            "jobs": Command(lambda _: views.jobs(core, time.monotonic()),
                            "jobs' placements (from the scheduler)"),
            "place": Command(self._cmd_place, "record a job's placement: job, tenant, members",
                             changes=True, scheduler=True),
            "unplace": Command(self._cmd_unplace, "forget a job's placement", changes=True,
                               scheduler=True),
            "events": Command(self._cmd_events, "recent host events"),
            "feed": Command(lambda _: views.feed(core, time.monotonic()),
                            "tenant subscribers: topics, sent, dropped"),
            "tenants": Command(lambda _: views.tenants(core, self._tenant_keys()),
                               "tenants: key, jobs, declarations, subscribers"),
            "pools": Command(lambda _: views.pools(core),
                             "pools: hosts and GPUs (the provider's view)"),
            "privacy": Command(lambda _: views.privacy(core, time.monotonic()),
                               "the private feed's budget per pool: ε spent in 24 h, plan"),
            "job-findings": Command(lambda _: core.jobhealth.view(time.monotonic()),
                                    "jobs' hangs, stalls, stragglers and application XIDs, "
                                    "with hosts"),
            "holds": Command(lambda _: views.holds(core, time.monotonic()),
                             "tenants' capacity holds not yet started or ended"),
            "holds-cancel": Command(self._cmd_cancel_hold,
                                    "cancel a tenant's hold: tenant, request_id (charged to "
                                    "nobody)", changes=True),
            "reload": Command(self._cmd_reload, "re-read the configuration file", changes=True),
            "tokens": Command(self._cmd_tokens, "tenants' HTTP gateway tokens (no secrets)"),
            "token-issue": Command(self._cmd_token_issue,
                                   "issue a tenant a bearer token: tenant, days, note",
                                   changes=True),
            "token-revoke": Command(self._cmd_token_revoke, "revoke a token by its id",
                                    changes=True),
            **self.scheduler.commands(),
        }

    def _cmd_status(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_seconds": round(time.monotonic() - self.started_at, 3),
            "listen": self.cfg.controller.listen,
            "feed": self.cfg.controller.feed,
            "database": self.cfg.controller.database,
            **views.counters(self.core),
            "auth": self._auth_status(),
            "handshakes_failed": {name: sum(port.failed.values())
                                  for name, port in self.ports.items()},
            "ports": {name: port.view() for name, port in self.ports.items()},
            "descriptors": descriptors(),
            "storage": self.writer.view(time.monotonic()),
            # Hosts left out of tenants' capacity: their pool or class is not in [pools].
            "held_back_hosts": sum(self.core.redactor.held_back.values()),
            "admin_socket": asdict(self.admin.stats),
            "gateway": self.gateway.view() if self.gateway is not None else None,
        }

    def _auth_status(self) -> dict[str, Any]:
        if self.zap is None:
            return {"mode": "none"}
        return {
            "mode": "curve",
            "keys_dir": self.cfg.auth.keys_dir,
            "agents_allowed": len(self.zap.lists[AGENTS].names()),
            "tenants_allowed": len(self.zap.lists[TENANTS].names()),
            "accepted": dict(self.zap.accepted),
            "refused": dict(self.zap.refused),
        }

    def _tenant_keys(self) -> set[str] | None:
        return set(self.zap.lists[TENANTS].names()) if self.zap is not None else None

    def _writable(self) -> None:
        """Refuse an operator's change while the disk is full (nothing could store it)."""
        if self.writer.paused:
            raise CommandError("the controller's disk is full, nothing can be stored now: "
                               "try again later (harmonctl -C status: storage)")

    def _stored(self) -> None:
        """After a change: say so if its commit found no room (it is kept, in memory)."""
        if self.writer.paused:
            raise CommandError("taken, but the controller's disk is full: it is stored once "
                               "there is room, and lost if the controller stops before")

    def _cmd_place(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            placement = views.placement(args)
        except SchemaError as exc:
            raise CommandError(str(exc)) from None
        self._writable()
        self._execute(self.core.place(placement, time.monotonic(), time.time()))
        used = views.use_hold(self.core, placement, args, time.monotonic())
        if used:
            self._execute(self.core.tick(time.monotonic(), time.time()))  # stored first
        self._stored()
        return {**views.placed(self.core, placement), **used}

    def _cmd_cancel_hold(self, args: dict[str, Any]) -> dict[str, Any]:
        self._writable()
        try:
            result = views.cancel_hold(self.core, args, time.monotonic())
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self._execute(self.core.tick(time.monotonic(), time.time()))  # stored, then said
        self._stored()
        log.info("hold %s cancelled by an operator", result["id"])
        return result

    def _cmd_unplace(self, args: dict[str, Any]) -> dict[str, Any]:
        job = args.get("job")
        if isinstance(job, str) and job not in self.core.redactor.placements and \
                args.get("missing_ok") is True:
            return {"job": job, "placed": False}  # a scheduler's epilog said it again
        if not isinstance(job, str) or job not in self.core.redactor.placements:
            raise CommandError("job must name a placed job")
        self._writable()
        self._execute(self.core.unplace(job, time.monotonic()))
        self._stored()
        return {"job": job}

    async def _cmd_tokens(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        return await self.tokens.listed(time.time())

    async def _cmd_token_issue(self, args: dict[str, Any]) -> dict[str, Any]:
        self._writable()
        try:
            issued = await self.tokens.issue(args.get("tenant"), args.get("days", 90),
                                             args.get("note", ""), time.time())
        except TokenError as exc:
            raise CommandError(str(exc)) from None
        except sqlite3.OperationalError as exc:  # a full disk, found by this very write
            raise CommandError(f"not stored: {exc}; try again later") from None
        log.info("issued token %s for tenant %r", issued["id"], issued["tenant"])
        return issued

    async def _cmd_token_revoke(self, args: dict[str, Any]) -> dict[str, Any]:
        self._writable()
        try:
            tenant = await self.tokens.revoke(args.get("id"), time.time())
        except TokenError as exc:
            raise CommandError(str(exc)) from None
        except sqlite3.OperationalError as exc:  # a full disk, found by this very write
            raise CommandError(f"not stored: {exc}; try again later") from None
        ended = self.gateway.revoked(args["id"]) if self.gateway is not None else 0
        log.info("revoked token %s of tenant %r (%d streams ended)", args["id"], tenant, ended)
        return {"revoked": args["id"], "tenant": tenant, "streams_ended": ended}

    def _cmd_events(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        limit = args.get("limit", 50)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise CommandError("limit must be an integer from 1 to 10000")
        return self.store.recent_events(limit)
