"""The agent daemon's side of the controller: its hello and keys, what it publishes
(events, advisories, summaries), and the controller's messages applied as they arrive
(declarations, a multi-host change's phases, a tenant's answer to a notice).

A mixin of :class:`agent.daemon.AgentDaemon`, whose state it reads.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from harmonaize import __version__, keys
from harmonaize.messages import (
    Hello,
    HostEvent,
    JobDeclaration,
    Message,
    Severity,
    TuningArm,
    TuningResolve,
    ValidationDecision,
)

log = logging.getLogger("harmonaize.agent")


class ControllerMessages:
    """What goes to the controller, and its messages applied as they arrive."""

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

    def _publish(self, message: Message) -> None:
        if self.uplink is not None:
            self.uplink.publish(message)

    def _declared(self, declaration: JobDeclaration) -> None:
        self._tune_declared(declaration)
        self.declarations.receive(declaration)
        # The job's group may now back (or no longer back) a process's claim: its GPUs'
        # jobs are resolved again at the next pass, not when a reading next moves.
        gpu = self.observers.get("gpu")
        if gpu is not None and hasattr(gpu, "judge_jobs_again"):
            gpu.judge_jobs_again()

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
