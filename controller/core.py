"""The controller's sans-I/O core: everything it decides, with time as a parameter.

It holds the hosts' state (:class:`Cluster`), what tenants may see
(:class:`Redactor`, shared with the simulator), multi-host tuning
(:class:`Agreement`), tenants' declarations, jobs' placements, the feed's
numbering and tenants' access (:mod:`controller.feed`). It imports no socket,
database or event loop, and never reads a clock: the shell passes ``now`` (its
monotonic clock) and, where a tenant is told a time of day, ``wall``.

The shell (controller/server.py) decodes each frame and hands it in with where
it came from (:meth:`ControllerCore.receive`); it calls
:meth:`ControllerCore.tick` after each batch of frames and when
:meth:`ControllerCore.next_deadline` comes, and executes the outputs
(controller/outputs.py) in order.

Batching and persistence: agents' messages are applied one by one and their
acknowledgements held. ``tick`` then lets the agreement and the redactor work
on what changed and numbers what tenants may now see; it returns one
:class:`Commit` (the batch's hosts, events, publications with their numbers,
declarations, placements, tuning state) and after it the held
acknowledgements, declarations and tuning messages for agents, and each
subscriber's publications. The shell stores the Commit in one transaction
before it sends anything after it, so nothing an agent was told is stored can
be lost for a tenant: one that missed it resumes from its last sequence number
(answered with a :class:`Replay` of the stored feed log).

What a tenant gets is rebuilt here from the controller's own state, never
copied from an agent: the redactor rebuilds advisories and aggregates, the
agreement's choice is one of its own names, a declaration reaches a host with
the placement's group. Bad input is counted and logged in one line (at most a
burst per window), and the core keeps going.

Agents' messages are handled in controller/coreagents.py and tenants' requests in
controller/coretenants.py, as parts of the one :class:`ControllerCore`: they share the
held sends and the Commit that releases them, which stay here with the state.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from controller.agreement import Agreement
from controller.cluster import Cluster
from controller.coreagents import AgentMessages
from controller.corejobhealth import JobHealthPart
from controller.corenegotiation import NegotiationPart, policy_of, restore_engine
from controller.coretenants import TenantRequests
from controller.declarations import Declarations
from controller.jobhealth import JobHealthBoard
from controller.notices import Notices
from controller.outputs import (
    AnswerTenant,
    BadFrame,
    Commit,
    Delivery,
    FeedEntry,
    Output,
    Peer,
    Prune,
    Restored,
    SendToTenant,
    TenantPeer,
    Writes,
)
from controller.pooltally import PoolTally
from controller.publications import Publications
from controller.redaction import Redactor
from controller.redactionconfig import PoolNames, job_topic
from controller.types import Placement
from harmonaize.messages import (
    Envelope,
    Subscribed,
    WireError,
    decode,
)

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    from controller.config import ControllerConfig

log = logging.getLogger("harmonaize.controller")

#: Seconds between prunings of old host events and of the feed log beyond its retention.
FEED_PRUNE_INTERVAL = 60.0


class ControllerCore(AgentMessages, TenantRequests, JobHealthPart, NegotiationPart):
    def __init__(self, cfg: ControllerConfig, now: float, restored: Restored | None = None,
                 *, rng: random.Random | None = None, follower: bool = False,
                 wall: float | None = None, tally: PoolTally | None = None) -> None:
        """Begin from what the store kept (nothing: a new controller). ``rng`` draws the
        redaction's release jitter (seed it for a reproducible run). ``follower``: a
        cluster replica's core, whose feed the leader numbers and whose placements are
        the leader's (its store holds none). ``wall``: the Unix time at ``now`` (each
        tick says it again), for what is negotiated in Unix time. ``tally``: the restored
        hosts' views counted by pool already (a warm standby keeps one as the leader's
        commits come, controller/bus/standby.py); None: counted here."""
        restored = restored or Restored()
        self.cfg = cfg
        #: Unix time minus the core's clock, as the last tick (or the start) said it.
        self._wall_offset = 0.0 if wall is None else wall - now
        #: Capacity reservations and maintenance windows in rounds (a replica's requests
        #: go to its leader: its own engine stays empty).
        self.negotiation = restore_engine(cfg.negotiation, None if follower
                                          else restored.negotiation)
        self._dirty_tenants: set[str] = set()
        self._dirty_view = False
        self.cluster = Cluster(missed_heartbeats=cfg.liveness.missed_heartbeats)
        self.cluster.restore(list(restored.hosts), now)
        self.redactor = Redactor(cfg.redaction, rng or random.Random())
        self.redactor.names = PoolNames.of(cfg.pools.names, cfg.pools.gpu_classes)
        # Each pool's private release plan goes on from the hosts the store kept.
        self.redactor.restore_inventory(self.cluster.views() if tally is None else (),
                                        tally)
        # Counted there: the first tick need not move the counts by every host again.
        self.cluster.touched.clear()
        #: (pool, class) names agents reported that are not declared, each logged once.
        self._held_back_told: set[tuple[str, str]] = set()
        for topic, (_, frame, _) in restored.latest.items():
            try:
                self.redactor.restore(topic, decode(frame).body)
            except WireError as exc:  # written by another version: published anew
                log.warning("feed topic %s: its stored condition is unreadable: %s", topic, exc)
        #: Multi-host jobs' tuning: two-phase changes every host applies alike.
        self.agreement = Agreement(cfg.tuning)
        for job, state in restored.tuning.items():
            try:
                self.agreement.restore(job, state, now)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("job %s: unreadable tuning state ignored: %s", job, exc)
        for placement in restored.placements:
            self.redactor.place(placement)
            self.agreement.set_hosts(placement.job, placement.hosts)
        self.declarations = Declarations(restored.declarations)
        #: Jobs' progress across their hosts (hangs, stalls, stragglers) and their XIDs.
        self.jobhealth = JobHealthBoard(cfg.jobhealth)
        if not follower:  # a replica's findings are its leader's
            self.jobhealth.restore(restored.progress, self.redactor.placements, now)
        self.notices = Notices(restored.notices, rng=rng)
        self.feed = Publications(cfg.feed, dict(restored.feed_seqs), dict(restored.latest),
                                 restored.feed_epoch, dict(restored.feed_offsets))
        self._forget_undeclared_pools()
        self.feed.follower = follower
        placed = {job_topic(p.tenant, p.job) for p in restored.placements}
        for topic in [t for t in self.feed.latest if t.startswith("job/") and t not in placed
                      and not follower]:
            self.feed.forget(topic)  # an unplaced job's last health is not its present
        self.frames = 0
        self.rejected: Counter[str] = Counter()
        self._reject_window = (-math.inf, 0)
        #: Sends that wait for the next Commit.
        self._held: list[Output] = []
        self._placements: dict[str, Placement | None] = {}
        self._tuning: dict[str, Mapping[str, Any] | None] = {}
        self._now = now
        #: Agents' messages applied since the last tick (their effects wait for it).
        self._staged = False
        self._stepped_at = now
        self._liveness_checked = -math.inf
        self._expiry_checked = -math.inf
        self._next_republish = now + cfg.feed.republish
        self._next_prune = now  # at once: the log as the retention in force says
        #: Set by the shell while its disk is full: nothing new can be stored, so agents'
        #: sequenced messages are left unapplied (unacknowledged: they come again) and
        #: tenants' writes are refused with "try later".
        self.storage_paused = False

    # --- the interface ----------------------------------------------------------------

    def receive(self, peer: Peer, message: Envelope | BadFrame, now: float) -> list[Output]:
        """Apply one message from ``peer``. Returns what may go out at once; whatever
        depends on new state is held for the next Commit (a tick's, or at once for a
        declaration, whose answer says it is stored)."""
        self._now = now
        if isinstance(peer, TenantPeer):
            return self._tenant(peer, message, now)
        return self._agent(peer, message, now)

    def tick(self, now: float, wall: float) -> list[Output]:
        """The batch is over, or a deadline came: do what is due, then a Commit and the
        sends it allows."""
        self._now = now
        self._wall_offset = wall - now
        self._step_negotiation([], wall)  # offers and holds that expired
        if now >= self._liveness_due():
            self._liveness_checked = now
            for host_id in self.cluster.tick(now):
                log.warning("host %s is down: %s", host_id,
                            self.cluster.hosts[host_id].down_reason)
        self._publish_changes(now, wall)  # also what the redactor held back until now
        if now >= self._expiry_due():
            self._expiry_checked = now
            self.feed.expire(now)
        if now >= self._next_republish:
            # Every condition again, as it was: a safety net only.
            self._held += self.feed.republish()
            self._next_republish = now + self.cfg.feed.republish
        if now >= self._next_prune:
            self._held.append(Prune(self.cfg.feed.retention))
            self.notices.expire(wall)
            self._next_prune = now + FEED_PRUNE_INTERVAL
        return self._release()

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do, on the clock of ``now``; the time
        of the last input or tick while received messages wait for one."""
        if self._held or self._staged or self.cluster.changed or self.jobhealth.waiting:
            return self._now
        times = (self._liveness_due(), self._expiry_due(), self._next_republish,
                 self._next_prune, self.redactor.next_due(), self._job_health_due(),
                 self.agreement.next_deadline(self._stepped_at), self.negotiation_deadline())
        return min((t for t in times if t is not None), default=None)

    def fanned(self, full: Iterable[bytes], gone: Iterable[bytes]) -> None:
        """How a fan-out went: the peers found full (dropped) and gone (dropped)."""
        self.feed.fanned(full, gone)

    def delivered(self, send: SendToTenant | AnswerTenant, outcome: Delivery) -> None:
        """How sending to a tenant went (counted per subscriber; a gone one is dropped)."""
        self.feed.delivered(send, outcome)

    def attach(self, peer: TenantPeer, topics: tuple[str, ...], now: float
               ) -> Subscribed | None:
        """A stream subscribes for as long as it is connected (the HTTP gateway's); the
        answer, or None when the tenant is over its request budget."""
        self._now = now
        return self.feed.attach(peer, topics, now)

    def accept_feed(self, entries: list[FeedEntry], now: float) -> list[Output]:
        """Publications a cluster's leader numbered: a Commit of them, then their sends
        to this replica's subscribers."""
        self._now = now
        self._held += self.feed.accept(entries)
        return self._release()

    def detach(self, peer: bytes) -> None:
        """The stream's connection ended."""
        self.feed.hub.drop([peer])

    def replay_allowance(self, tenant: str, want: int, now: float) -> int:
        """How many retained messages the tenant may be sent again now (its budget is
        the same on every transport)."""
        return self.feed.hub.replay_allowance(tenant, want, now)

    def place(self, placement: Placement, now: float, wall: float) -> list[Output]:
        """The scheduler placed a job (or moved it): what tenants see follows at once."""
        self._now = now
        previous = self.redactor.placements.get(placement.job)
        placement = self._numbered(placement, previous)
        if previous == placement:
            # Said again (a scheduler's hook replaying what it spooled): nothing changes,
            # so nothing is published, forwarded or stored anew.
            return []
        if previous is not None and previous.tenant != placement.tenant:
            # A job id now belongs to someone else: the old owner's declaration is void.
            self._withdraw(placement.job)
            self.feed.forget(job_topic(previous.tenant, placement.job))
        if previous is not None and previous.generation != placement.generation:
            self.jobhealth.drop_job(placement.job)  # its ranks are elsewhere now
        if previous is not None and previous.generation != placement.generation:
            # What was issued for the old placement is not the new one's to answer.
            voided = self.notices.forget_job(placement.job)
            if voided:
                log.info("job %s placed anew: %d validation notice(s) of its previous "
                         "placement withdrawn", placement.job, voided)
        self._placements[placement.job] = placement
        self.redactor.place(placement)
        self.agreement.set_hosts(placement.job, placement.hosts)
        self.cluster.changed = True
        self._publish_changes(now, wall)
        declared = self.declarations.get(placement.job)
        if declared is not None:
            self._forward(declared[1])  # hosts the job has moved to learn it now
        return self._release()

    @staticmethod
    def _numbered(placement: Placement, previous: Placement | None) -> Placement:
        """The placement with its generation: the previous one's when nothing changed (a
        scheduler saying it again), else the next."""
        if previous is None:
            return dataclasses.replace(placement, generation=1)
        if (previous.tenant, previous.members, previous.group) == (
                placement.tenant, placement.members, placement.group):
            return dataclasses.replace(placement, generation=previous.generation)
        return dataclasses.replace(placement, generation=previous.generation + 1)

    def unplace(self, job: str, now: float) -> list[Output]:
        """The job ended: its declaration, placement and tuning state go."""
        if job not in self.redactor.placements:
            raise KeyError(job)
        self._now = now
        # Its last job-health is no present any more: new subscribers are not sent it.
        self.feed.forget(job_topic(self.redactor.placements[job].tenant, job))
        self._withdraw(job)
        self.jobhealth.drop_job(job)  # its findings are withdrawn at the next tick
        self._placements[job] = None
        self.redactor.remove_job(job)
        self.notices.forget_job(job)
        self.agreement.forget(job)
        self._agree(now)  # its stored tuning state goes too
        return self._release()

    def reconfigure(self, cfg: ControllerConfig) -> None:
        """New rules (a reload): liveness, feed timing and budgets, redaction, tuning."""
        old, self.cfg = self.cfg, cfg
        if self.cluster.missed_heartbeats != cfg.liveness.missed_heartbeats:
            self.cluster.missed_heartbeats = cfg.liveness.missed_heartbeats
            self.cluster.reschedule()  # fewer heartbeats may be missed now: deadlines anew
        self.feed.configure(cfg.feed)
        if cfg.feed.retention != old.feed.retention:
            # Pruned at once: the ZeroMQ feed's replays follow the new retention at once,
            # and the HTTP gateway reads the log, so the log must too.
            self._next_prune = -math.inf
        if cfg.redaction != old.redaction:
            self.redactor.cfg = cfg.redaction
            self.cluster.changed = True  # recompute what tenants see under the new rules
        if cfg.pools != old.pools:
            self.redactor.names = PoolNames.of(cfg.pools.names, cfg.pools.gpu_classes)
            self._held_back_told.clear()
            self._forget_undeclared_pools()
            self.cluster.changed = True
        self.agreement.settings = cfg.tuning
        if cfg.negotiation != old.negotiation:
            self.negotiation.policy = policy_of(cfg.negotiation)
        if cfg.jobhealth != old.jobhealth:
            self.jobhealth.configure(cfg.jobhealth)

    def close(self) -> list[Output]:
        """The last Commit before stopping. Held sends are dropped: agents resend what
        was not acknowledged, tenants resume."""
        self._held = []
        return self._release()

    # --- commits and deadlines ---------------------------------------------------------

    def _release(self) -> list[Output]:
        """A Commit of everything changed, then every held send."""
        records, events = self.cluster.take_dirty()
        seqs, entries, offsets = self.feed.take_dirty()
        placements, self._placements = self._placements, {}
        tuning, self._tuning = self._tuning, {}
        # Copies as of now (the records change after the Commit is made); shallow, as
        # every field is an immutable value.
        writes = Writes(hosts=tuple(copy.copy(r) for r in records),
                        events=tuple(events), feed_seqs=seqs, feed_log=entries,
                        feed_offsets=offsets, declarations=self.declarations.take_dirty(),
                        placements=placements, tuning=tuning,
                        notices=self.notices.take_dirty(),
                        negotiation=self.take_negotiation())
        out: list[Output] = [Commit(writes)] if writes else []
        out += self._held
        self._held = []
        return out

    def _liveness_due(self) -> float:
        # When a host may first be silent, and at most once per check interval (a look
        # finds nobody down at the very instant of the limit).
        return max(self.cluster.silent_from,
                   self._liveness_checked + self.cfg.liveness.check_interval)

    def _expiry_due(self) -> float:
        first = self.feed.next_expiry()
        if first is None:
            return math.inf
        return max(first, self._expiry_checked + self.cfg.liveness.check_interval)
