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
"""

# Over 400 lines because a test harness: the in-process divergence campaign (hosts, ranks,
# controller, network and faults) in one deterministic simulation.

from __future__ import annotations

import contextlib
import heapq
import math
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.links.health import LinkJudgement, judge, views
from agent.links.settings import LinksSection
from agent.links.types import LinkRates, LinkSample
from agent.plugin.shm import policy_path, prepare_dirs
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from controller.agreement import Agreement
from controller.agreementstate import AgreementSettings
from harmonaize.messages import (
    Algorithm,
    Collective,
    JobDeclaration,
    Message,
    Protocol,
    TuningAck,
    TuningArm,
    TuningRange,
    TuningReport,
    TuningResolve,
)
from testbed.plugin import Outcome, Rank

JOB = "campaign"
CONTROLLER = "controller"
TICK = 0.01
AGENT_INTERVAL = 0.1
CONTROLLER_INTERVAL = 0.05
LATENCY = 0.001
#: Seconds without faults at the end, for every change in flight to settle.
SETTLE = 8.0
DECLARATION = JobDeclaration(JOB, revision=1, tuning=(TuningRange(
    (Collective.ALLREDUCE,), (Algorithm.RING, Algorithm.TREE),
    (Protocol.LL, Protocol.SIMPLE), 0, 1 << 40, 2, 16),))
UTILIZATION = {0: 0.10, 1: 0.75, 2: 0.97}

FAULT_KINDS = (
    "agent-kill", "agent-stop", "agent-recreate", "agent-corrupt", "agent-lost",
    "agent-kill-armed", "controller-kill", "controller-kill-midsend", "delay", "drop",
    "partition", "late-declaration", "rank-stall",
)


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    host: int = 0
    duration: float = 0.0
    rank: int = 0


@dataclass(frozen=True)
class Schedule:
    seed: int
    hosts: int
    ranks_per_host: int
    rate: float
    skew: float
    duration: float
    congestion: tuple[tuple[float, float, int, int], ...]  # start, end, host, level
    faults: tuple[Fault, ...]
    #: How far ahead switching points are set: at least ``margin`` collectives, and
    #: ``lead`` seconds of them. Safety may not depend on either (small ones make
    #: races between arming and ranks passing ``at`` common); only liveness does.
    margin: int = 32
    lead: float = 0.5
    #: Real seconds an agent is descheduled before each policy write.
    pause: float = 0.0

    def describe(self) -> str:
        faults = ", ".join(f"{f.kind}@{f.at:.1f}s(h{f.host},{f.duration:.1f}s)"
                           for f in self.faults)
        return (f"seed {self.seed}: {self.hosts} host(s) x {self.ranks_per_host} rank(s), "
                f"{self.rate:.0f}/s, skew {self.skew:.2f}s, margin {self.margin}, lead "
                f"{self.lead:g}s, pause {self.pause * 1000:g}ms, {self.duration:.0f}s; {faults}")


def random_schedule(seed: int, *, max_rate: float = 10_000.0, duration: float = 12.0,
                    kinds: tuple[str, ...] = FAULT_KINDS) -> Schedule:
    """A schedule drawn from ``seed``: every fault kind is as likely, timing random."""
    rng = random.Random(seed)
    hosts = rng.choice((1, 2, 2, 3))
    ranks = rng.choice((1, 2, 3))
    rate = round(10 ** rng.uniform(1.0, math.log10(max_rate)), 1)
    skew = rng.choice((0.0, 0.001, 0.01, 0.05, 0.2, 0.5, 1.0)) * rng.random()
    congestion = []
    t = rng.uniform(0.5, 2.0)
    while t < duration - 1.0:
        length = rng.uniform(1.0, 4.0)
        congestion.append((t, t + length, rng.randrange(hosts), rng.choice((1, 2))))
        t += length + rng.uniform(0.5, 3.0)
    faults = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choice(kinds)
        if kind == "late-declaration":
            faults.append(Fault(kind, 0.0, rng.randrange(hosts), rng.uniform(0.2, 3.0)))
            continue
        faults.append(Fault(kind, rng.uniform(0.5, duration - 1.0), rng.randrange(hosts),
                            rng.choice((0.2, 0.5, 1.5, 3.0, 6.0)) * rng.uniform(0.5, 1.0),
                            rng.randrange(ranks)))
    margin = rng.choice((2, 4, 8, 32, 64))
    lead = rng.choice((0.0, 0.01, 0.05, 0.2, 0.5, 1.0))
    pause = rng.choice((0.0, 0.0, 0.0005, 0.002, 0.01))
    return Schedule(seed, hosts, ranks, rate, skew, duration, tuple(congestion),
                    tuple(sorted(faults, key=lambda f: f.at)), margin, lead, pause)


@dataclass
class Result:
    schedule: Schedule
    diverged: str = ""
    #: Ranks still waiting at an unconfirmed switch once every fault had healed.
    stuck: int = 0
    switches: int = 0
    #: Rank-seconds (simulated) spent waiting at unconfirmed switches.
    waiting: float = 0.0
    cancelled: int = 0
    collectives: int = 0
    seconds: float = 0.0


class AgentKilled(BaseException):
    """Raised inside an agent to stop it dead at a chosen point (a BaseException, so
    the service's own error handling does not catch it: SIGKILL is not caught either)."""


# --- ranks ---------------------------------------------------------------------------


class RankThread:
    """One rank: issues collectives up to a target index the driver raises."""

    def __init__(self, comm: int, n_ranks: int, n_nodes: int, directory: Path,
                 offset: float) -> None:
        self.rank = Rank(comm, n_ranks, n_nodes, job=JOB, directory=directory)
        self.offset = offset
        self.changes: list[tuple[int, Outcome]] = []
        self.target = 0
        self.stalled_until = -1.0
        self._cond = threading.Condition()
        self.idle = threading.Event()
        self._done = False
        self.in_call = False
        self.call_started = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def n(self) -> int:
        return self.rank.n

    def advance(self, target: int) -> None:
        with self._cond:
            if target > self.target:
                self.target = target
                self.idle.clear()
                self._cond.notify()

    def _run(self) -> None:
        stepper = self.rank.stepper()
        last: tuple[bytes, int] | None = None
        rank = self.rank
        while True:
            with self._cond:
                while not self._done and rank.n >= self.target:
                    self.idle.set()
                    self._cond.wait()
                if self._done:
                    return
                goal = self.target
            while rank.n < goal:
                self.call_started = time.monotonic()
                self.in_call = True
                key = stepper.step()
                self.in_call = False
                if key != last:
                    self.changes.append((rank.n - 1, stepper.outcome(key)))
                    last = key
                if rank.n % 4 == 0:
                    # Let the agents' and the controller's code run between collectives,
                    # so their reads and writes interleave with the ranks' progress.
                    time.sleep(0)

    def blocked(self, grace: float = 0.02) -> bool:
        """In a call for longer than any call takes: waiting inside the plugin."""
        return self.in_call and time.monotonic() - self.call_started > grace

    def stop(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify()

    def close(self) -> None:
        self.stop()
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.rank.close()


def disagreement(ranks: list[RankThread]) -> str:
    """The first collective index at which two ranks answered differently."""
    def answer_at(changes: list[tuple[int, Outcome]], index: int) -> Outcome | None:
        found = None
        for start, outcome in changes:
            if start > index:
                break
            found = outcome
        return found

    for i, a in enumerate(ranks):
        for b in ranks[i + 1:]:
            limit = min(a.n, b.n)
            points = sorted({0, *(s for s, _ in a.changes), *(s for s, _ in b.changes)})
            for index in points:
                if index >= limit:
                    break
                x, y = answer_at(a.changes, index), answer_at(b.changes, index)
                if x != y:
                    return f"collective {index}: one rank ran {x}, another {y}"
    return ""


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


class Network:
    """Messages between agents and the controller, in simulated time."""

    def __init__(self) -> None:
        self._queue: list[tuple[float, int, str, str, Message]] = []
        self._count = 0
        self.now = 0.0
        #: host -> (until, kind): "delay" holds both directions, "drop" loses the
        #: controller's messages (agents resend theirs: they are held), "partition" both.
        self.faults: dict[str, list[tuple[float, float, str]]] = {}

    def _state(self, host: str, now: float) -> tuple[str, float]:
        for start, until, kind in self.faults.get(host, ()):
            if start <= now < until:
                return kind, until
        return "", now

    def send(self, src: str, dst: str, message: Message, now: float) -> None:
        host = src if dst == CONTROLLER else dst
        kind, until = self._state(host, now)
        deliver = now + LATENCY
        if kind in ("drop", "partition") and src == CONTROLLER:
            return  # lost; the controller resends until acknowledged
        if kind:
            deliver = until + LATENCY  # held (TCP, or the agent's outbox), then delivered
        self._count += 1
        heapq.heappush(self._queue, (deliver, self._count, src, dst, message))

    def due(self, now: float) -> Iterator[tuple[str, str, Message]]:
        while self._queue and self._queue[0][0] <= now:
            _, _, src, dst, message = heapq.heappop(self._queue)
            yield src, dst, message


class Controller:
    def __init__(self, settings: AgreementSettings, hosts: list[str]) -> None:
        self.settings = settings
        self.hosts = hosts
        self.store: dict[str, dict[str, Any]] = {}
        self.agreement: Agreement | None = None
        self.down_until = -1.0
        self.inbox: list[tuple[str, Message]] = []
        self.kill_midsend = False
        self.start(0.0)

    def start(self, now: float) -> None:
        self.agreement = Agreement(self.settings)
        for job, state in self.store.items():
            self.agreement.restore(job, state, now)
        self.agreement.set_hosts(JOB, self.hosts)
        for host in self.hosts:
            self.agreement.reconnected(host)

    def step(self, network: Network, now: float) -> None:
        if self.agreement is None:
            if now >= self.down_until:
                self.start(now)
            else:
                return
        assert self.agreement is not None
        inbox, self.inbox = self.inbox, []
        for host, message in inbox:
            if isinstance(message, TuningReport):
                self.agreement.report(host, message, now)
            elif isinstance(message, TuningAck):
                self.agreement.ack(host, message, now)
        outgoing = self.agreement.step(now)
        dirty, gone = self.agreement.take_dirty()
        for job in dirty:
            snapshot = self.agreement.snapshot(job)
            if snapshot is not None:
                self.store[job] = snapshot
        for job in gone:
            self.store.pop(job, None)
        for i, (host, message) in enumerate(outgoing):
            if self.kill_midsend and i == 1 and isinstance(message, TuningResolve):
                self.kill_midsend = False
                self.kill(now, 1.0)
                return
            network.send(CONTROLLER, host, message, now)

    def kill(self, now: float, duration: float) -> None:
        self.agreement = None
        self.down_until = now + duration
        self.inbox.clear()  # unprocessed: the agents' outboxes resend them


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
