"""A compressed-time fault campaign for live retuning, in one process.

The parts are the real ones: every rank is a context of the real tuner
plugin (one thread each, issuing collectives at its own pace and skew; a rank
that reaches an unconfirmed switching point blocks inside the plugin, as a
real one would), every host runs a real :class:`TuningService` on its own
policy directory, and the controller is the real :class:`Agreement`, stored
and restored through its snapshots. What is simulated: the clock (sim
seconds advance in ticks, faster than real time), the links' congestion
(each host's data link as a :class:`LinkSample`), and the network between
agents and the controller (delays, loss and partitions).

A :class:`Schedule` says what happens: hosts, ranks, rates, skews,
congestion episodes, and faults at random times (agents killed, stopped,
restarted with their policy file recreated, corrupted or gone, killed right
after arming; the controller killed, also between sending one host an
outcome and the next; messages delayed, lost, hosts partitioned; a
declaration arriving after the ranks started; ranks stalling).
:func:`run` plays it and compares, collective by collective, what every rank
answered: the schedule *diverged* if any two ranks of a communicator
answered differently at any index both issued. After the faults it lets the
system settle and counts ranks still waiting (a liveness failure).

Its parts: the schedules (testbed/tuningschedule.py), the ranks (tuningranks.py), the
network and the controller (tuningnet.py); the agents and the play are here.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.links.health import LinkJudgement, judge, views
from agent.links.settings import LinksSection
from agent.links.types import LinkRates, LinkSample
from agent.plugin.shm import policy_path, prepare_dirs
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from controller.agreementstate import AgreementSettings
from harmonaize.messages import (
    Message,
    TuningArm,
    TuningResolve,
)
from testbed.tuningnet import Controller, Network
from testbed.tuningranks import RankThread, disagreement
from testbed.tuningschedule import (
    AGENT_INTERVAL,
    CONTROLLER,
    CONTROLLER_INTERVAL,
    DECLARATION,
    FAULT_KINDS,
    JOB,
    SETTLE,
    TICK,
    UTILIZATION,
    Fault,
    Result,
    Schedule,
    random_schedule,
)

#: What the campaign's tests and the bench use (schedules are drawn here, beside run()).
__all__ = ["FAULT_KINDS", "Fault", "Result", "Schedule", "link_judgements", "link_sample",
           "random_schedule", "run"]


class AgentKilled(BaseException):
    """Raised inside an agent to stop it dead at a chosen point (a BaseException, so
    the service's own error handling does not catch it: SIGKILL is not caught either)."""


# --- agents and the controller ---------------------------------------------------------


class SimService(TuningService):
    """The real service, with a way to die right after writing an armed change, and
    a pause (real seconds) before each write: an agent descheduled between reading the
    ranks' records and writing lets the ranks run on, as on a busy host."""

    die_after_arm = False
    pause = 0.0

    def _write(self, action: Any) -> bool:
        if self.pause:
            time.sleep(self.pause)
        return super()._write(action)

    def _run(self, actions: list[Any], now: float) -> None:
        if self.die_after_arm and any(j.arming or j.acking for j in self.loop.jobs.values()):
            for action in actions:
                if type(action).__name__ == "WritePolicy":
                    self._write(action)
            raise AgentKilled
        super()._run(actions, now)


@dataclass
class Host:
    index: int
    name: str
    directory: Path
    service: SimService | None = None
    alive: bool = True
    stopped_until: float = -1.0
    declared: bool = False
    declare_at: float = 0.0
    restart_at: float | None = None
    restart_mode: str = ""
    #: Seconds a host killed right after arming stays dead.
    kill_delay: float = 1.0
    #: After a restart, whether the declaration is handled before queued messages.
    declare_first: bool = True
    inbox: list[Message] = field(default_factory=list)


# --- the campaign ------------------------------------------------------------------------


def tuning_config(directory: Path, schedule: Schedule) -> TuningSection:
    return TuningSection(policy_dir=str(directory), hold=1.0, max_changes_per_minute=30,
                         activation_lead=schedule.lead, activation_margin=schedule.margin,
                         report_interval=0.5, stall=30.0, htb=False, orphan_grace=3600.0)


def run(schedule: Schedule, *, workdir: Path | None = None) -> Result:
    """Play ``schedule`` and compare every rank's answers, collective by collective."""
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="hz-campaign-", dir=workdir))
    play = _Play(schedule, root)
    try:
        play.setup()
        play.run()
        play.finish()
    finally:
        play.close()
        shutil.rmtree(root, ignore_errors=True)
    play.result.seconds = time.monotonic() - began
    return play.result


def link_sample(level: int) -> LinkSample:
    speed = 100_000
    bps = UTILIZATION[level] * speed * 1e6
    rates = LinkRates("eth0", "data", True, speed, bps, bps, 1e5, 1e5, UTILIZATION[level],
                      UTILIZATION[level], 0.0, 0.0, 0.0, 0.0, 0.0)
    return LinkSample("sim", AGENT_INTERVAL, (rates,), 0.0)


def link_judgements(level: int) -> list[LinkJudgement]:
    """What the agent's link step makes of :func:`link_sample` (default thresholds)."""
    return [judge(view, LinksSection()) for view in views(link_sample(level), None)]


class _Play:
    def __init__(self, schedule: Schedule, root: Path) -> None:
        self.schedule = schedule
        self.rng = random.Random(schedule.seed ^ 0x5EED)
        self.hosts = [Host(i, f"h{i}", root / f"h{i}") for i in range(schedule.hosts)]
        self.network = Network()
        self.controller = Controller(AgreementSettings(
            hold=2.0, max_decisions_per_minute=30, lead=schedule.lead * 2,
            margin=schedule.margin, report_ttl=5.0, arm_timeout=1.0, resend=0.25),
            [h.name for h in self.hosts])
        self.ranks: list[RankThread] = []
        self.by_host: dict[int, list[RankThread]] = {}
        self.result = Result(schedule)

    def setup(self) -> None:
        schedule = self.schedule
        comm = self.rng.getrandbits(64) | 1
        n_ranks = schedule.hosts * schedule.ranks_per_host
        for host in self.hosts:
            prepare_dirs(host.directory)
            host.service = self._service(host)
            host.service.start(0.0)
        for fault in schedule.faults:
            if fault.kind == "late-declaration":
                self.hosts[fault.host].declare_at = fault.duration
        for host in self.hosts:
            for _ in range(schedule.ranks_per_host):
                rank = RankThread(comm, n_ranks, schedule.hosts, host.directory,
                                  self.rng.random() * schedule.skew)
                self.ranks.append(rank)
                self.by_host.setdefault(host.index, []).append(rank)

    def _service(self, host: Host) -> SimService:
        network = self.network

        def publish(message: Message) -> None:
            if host.alive:
                network.send(host.name, CONTROLLER, message, network.now)

        service = SimService(tuning_config(host.directory, self.schedule), LinksSection(),
                             publish=publish)
        service.pause = self.schedule.pause
        return service

    def finish(self) -> None:
        result = self.result
        result.stuck = sum(1 for r in self.ranks if r.blocked())
        for rank in self.ranks:
            rank.stop()
        result.diverged = disagreement(self.ranks)
        result.switches = max((len(r.changes) - 1 for r in self.ranks), default=0)
        result.collectives = sum(r.n for r in self.ranks)
        result.cancelled = sum(j.aborted for h in self.hosts if h.service
                               for j in h.service.loop.jobs.values())

    def close(self) -> None:
        for rank in self.ranks:
            rank.close()

    def run(self) -> None:
        schedule, network, controller = self.schedule, self.network, self.controller
        end = schedule.duration + SETTLE
        now = previous = 0.0
        next_agent = next_controller = 0.0
        while now < end:
            now = round(now + TICK, 6)
            network.now = now
            if now <= schedule.duration:
                self._faults(now, previous)
            elif previous <= schedule.duration:
                for host in self.hosts:  # faults end with the schedule: now it settles
                    if host.service is not None:
                        host.service.die_after_arm = False
            for host in self.hosts:
                if host.restart_at is not None and now >= host.restart_at:
                    self._restart(host, now)
            for rank in self.ranks:
                if now >= rank.stalled_until:
                    rank.advance(max(0, int((now - rank.offset) * schedule.rate)))
            for src, dst, message in network.due(now):
                if dst == CONTROLLER:
                    if controller.agreement is not None:
                        controller.inbox.append((src, message))
                    else:  # the agent's outbox resends it once the controller is back
                        network.send(src, dst, message, max(now + TICK, controller.down_until))
                elif self.hosts[int(dst[1:])].alive:
                    self.hosts[int(dst[1:])].inbox.append(message)  # the dead hear nothing
            for host in self.hosts:
                self._host_step(host, now, now >= next_agent)
            if now >= next_agent:
                next_agent = now + AGENT_INTERVAL
            if now >= next_controller:
                controller.step(network, now)
                next_controller = now + CONTROLLER_INTERVAL
            waiting = _pace(self.ranks)
            self.result.waiting += waiting * TICK
            previous = now

    def _faults(self, now: float, previous: float) -> None:
        for fault in self.schedule.faults:
            if not previous < fault.at <= now:
                continue
            host = self.hosts[fault.host]
            if fault.kind in ("agent-kill", "agent-recreate", "agent-corrupt", "agent-lost"):
                _kill(host, now, fault.duration, fault.kind)
            elif fault.kind == "agent-kill-armed" and host.service is not None:
                host.service.die_after_arm = True
                host.kill_delay = fault.duration
            elif fault.kind == "agent-stop":
                host.stopped_until = now + fault.duration
            elif fault.kind == "controller-kill":
                self.controller.kill(now, fault.duration)
            elif fault.kind == "controller-kill-midsend":
                self.controller.kill_midsend = True
            elif fault.kind in ("delay", "drop", "partition"):
                self.network.faults.setdefault(host.name, []).append(
                    (now, now + fault.duration, fault.kind))
            elif fault.kind == "rank-stall":
                ranks = self.by_host.get(fault.host, [])
                if ranks:
                    ranks[fault.rank % len(ranks)].stalled_until = now + fault.duration

    def _restart(self, host: Host, now: float) -> None:
        path = policy_path(host.directory, JOB)
        if host.restart_mode == "agent-recreate":
            with contextlib.suppress(OSError):
                data = path.read_bytes()
                path.unlink()
                path.write_bytes(data)  # the same content in a new file (a new inode)
        elif host.restart_mode == "agent-corrupt":
            with contextlib.suppress(OSError), open(path, "r+b") as f:
                f.seek(200)
                f.write(b"\xde\xad\xbe\xef" * 16)
        elif host.restart_mode == "agent-lost":
            with contextlib.suppress(OSError):
                path.unlink()
        host.service = self._service(host)
        host.service.start(now)
        host.alive = True
        host.restart_at = None
        host.declared = False  # the controller sends it again on hello (or when it is due)
        host.declare_first = self.rng.random() < 0.5
        if self.controller.agreement is not None:
            self.controller.agreement.reconnected(host.name)

    def _host_step(self, host: Host, now: float, tick: bool) -> None:
        service = host.service
        if service is None or not host.alive or now < host.stopped_until:
            return
        try:
            due = not host.declared and now >= host.declare_at
            if due and host.declare_first:
                service.declare(DECLARATION, now)
                host.declared = True
            # The daemon hands every arm and outcome to the service, declared or not
            # (after a restart, an outcome may come before the declaration does).
            inbox, host.inbox = host.inbox, []
            for message in inbox:
                if isinstance(message, TuningArm):
                    service.arm(message, now)
                elif isinstance(message, TuningResolve):
                    service.resolve(message, now)
            if due and not host.declared:
                service.declare(DECLARATION, now)
                host.declared = True
            if tick:
                level = _congestion(self.schedule, host.index, now)
                service.step(link_sample(level), link_judgements(level), now)
        except AgentKilled:
            _kill(host, now, host.kill_delay, "agent-kill")


def _congestion(schedule: Schedule, host: int, now: float) -> int:
    level = 0
    for start, end, where, severity in schedule.congestion:
        if where == host and start <= now < end:
            level = max(level, severity)
    return level


def _kill(host: Host, now: float, delay: float, mode: str) -> None:
    host.service = None
    host.alive = False
    host.inbox.clear()
    host.restart_at = now + max(0.05, delay)
    host.restart_mode = mode


def _pace(ranks: list[RankThread], budget: float = 0.05) -> int:
    """Let every rank reach its target, or be seen waiting in the plugin; returns how
    many wait."""
    deadline = time.monotonic() + budget
    for rank in ranks:
        while not rank.idle.wait(0.005):
            if rank.blocked() or time.monotonic() > deadline:
                break
    return sum(1 for r in ranks if r.blocked())
