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

(About 600 lines: agents' and tenants' messages share the held sends and the
Commit that releases them, and the rules that bind them (notices to their
placement, their bounds, what is refused while the disk is full) act on that
same state, so they stay one class; declarations, notices, the feed and the
operator views are modules of their own.)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controller.agreement import Agreement
from controller.cluster import Cluster
from controller.declarations import Declarations, for_host
from controller.notices import Notice, Notices
from controller.outputs import (
    AgentPeer,
    AnswerTenant,
    BadFrame,
    Commit,
    Delivery,
    FeedEntry,
    Output,
    Peer,
    Prune,
    Restored,
    SendToAgent,
    SendToTenant,
    TenantPeer,
    Writes,
)
from controller.publications import Publications
from controller.redaction import Redactor
from controller.redactionconfig import PoolNames, job_topic
from controller.types import Placement
from harmonaize.messages import (
    Category,
    Envelope,
    ErrorCode,
    Hello,
    JobDeclaration,
    PoolCapacity,
    Reply,
    Resync,
    Subscribe,
    Subscribed,
    TuningReport,
    TuningStatus,
    ValidationAnswer,
    ValidationNotice,
    WireError,
    decode,
)

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    from controller.config import ControllerConfig

log = logging.getLogger("harmonaize.controller")

#: Rejected frames logged per window; all of them are counted.
REJECT_LOG_BURST = 10
REJECT_LOG_WINDOW = 10.0
#: Undeclared pool and class names logged (each once) before the log says no more.
MAX_HELD_BACK_TOLD = 1000
#: Seconds between prunings of old host events and of the feed log beyond its retention.
FEED_PRUNE_INTERVAL = 60.0
#: A host silent for longer than this many of its heartbeat intervals gets no new arm.
ARM_QUIET = 2.0


class ControllerCore:
    def __init__(self, cfg: ControllerConfig, now: float, restored: Restored | None = None,
                 *, rng: random.Random | None = None, follower: bool = False) -> None:
        """Begin from what the store kept (nothing: a new controller). ``rng`` draws the
        redaction's release jitter (seed it for a reproducible run). ``follower``: a
        cluster replica's core, whose feed the leader numbers and whose placements are
        the leader's (its store holds none)."""
        restored = restored or Restored()
        self.cfg = cfg
        self.cluster = Cluster(missed_heartbeats=cfg.liveness.missed_heartbeats)
        self.cluster.restore(list(restored.hosts), now)
        self.redactor = Redactor(cfg.redaction, rng or random.Random())
        self.redactor.names = PoolNames.of(cfg.pools.names, cfg.pools.gpu_classes)
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
        if self._held or self._staged or self.cluster.changed:
            return self._now
        times = (self._liveness_due(), self._expiry_due(), self._next_republish,
                 self._next_prune, self.redactor.next_due(),
                 self.agreement.next_deadline(self._stepped_at))
        return min((t for t in times if t is not None), default=None)

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
        self._placements[job] = None
        self.redactor.remove_job(job)
        self.notices.forget_job(job)
        self.agreement.forget(job)
        self._agree(now)  # its stored tuning state goes too
        return self._release()

    def reconfigure(self, cfg: ControllerConfig) -> None:
        """New rules (a reload): liveness, feed timing and budgets, redaction, tuning."""
        old, self.cfg = self.cfg, cfg
        self.cluster.missed_heartbeats = cfg.liveness.missed_heartbeats
        self.cluster.silent_from = -math.inf  # fewer heartbeats may be missed now: look
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

    def close(self) -> list[Output]:
        """The last Commit before stopping. Held sends are dropped: agents resend what
        was not acknowledged, tenants resume."""
        self._held = []
        return self._release()

    # --- agents ------------------------------------------------------------------------

    def _agent(self, peer: AgentPeer, message: Envelope | BadFrame,
               now: float) -> list[Output]:
        self.frames += 1
        if isinstance(message, BadFrame):
            self._reject(message.reason, message.detail, now)
            return []
        if peer.host is not None and message.sender != peer.host:
            # The key decides who a host is; the frame's sender must agree with it.
            self._reject("identity", f"key of {peer.host!r} used to speak for "
                         f"{message.sender!r:.60}", now)
            return []
        if self.storage_paused and message.body.CATEGORY is not Category.CONTROL:
            self.cluster.counters["unapplied_disk_full"] += 1
            return []
        at_once: list[Output] = []
        for reply in self.cluster.receive(peer.conn, message, now):
            send = SendToAgent(reply.conn, reply.body)
            if isinstance(reply.body, Resync):
                at_once.append(send)  # "say hello first": about no state
            else:
                self._held.append(send)
        self._staged = True
        if (isinstance(message.body, Hello)
                and self.cluster.bindings.get(peer.conn) == message.sender):
            self._held += self._declarations_for(message.sender, peer.conn)
        return at_once

    def _reject(self, reason: str, detail: str, now: float) -> None:
        self.rejected[reason] += 1
        if self._may_log(now):
            log.warning("rejected a frame (%s): %s", reason, detail)

    def _may_log(self, now: float) -> bool:
        """Whether an agent's bad input may be logged now (a burst per window; every one
        is counted), so that no agent can flood the log."""
        start, count = self._reject_window
        if now - start > REJECT_LOG_WINDOW:
            start, count = now, 0
        self._reject_window = (start, count + 1)
        return count < REJECT_LOG_BURST

    def _publish_changes(self, now: float, wall: float) -> None:
        """Feed the agreement and the redactor what changed; stage what they let out."""
        self._agree(now)
        advisories, self.cluster.advisories = self.cluster.advisories, []
        for host_id, advisory in advisories:
            declared = self.declarations.get(advisory.job)
            max_pause = declared[1].max_validation_pause if declared else None
            if isinstance(advisory, ValidationNotice):
                refused = self._notice(host_id, advisory, declared, now, wall)
            else:
                refused = self.redactor.advisory(host_id, advisory, now, wall, max_pause)
            if refused is not None:
                # Acknowledged to the host (it was delivered) but not passed on: a host
                # speaking for a job it does not run, or beyond what the job allows.
                self.cluster.counters[f"job_message_{refused}"] += 1
                if self._may_log(now):
                    log.warning("host %s: %s for job %.60r not passed on (%s)", host_id,
                                advisory.KIND, advisory.job, refused.replace("_", " "))
        self._staged = False
        if self.cluster.changed:
            self.cluster.changed = False
            self.redactor.observe(self.cluster.views(), now)
            self._tell_held_back()
        for publication in self.redactor.due(now):
            body = publication.body
            if isinstance(body, PoolCapacity):
                log.info("capacity %s: hosts up %s, down %s, gpus %s (%s)", publication.topic,
                         body.hosts_up, body.hosts_down, body.gpus_available, body.trend.value)
            self._held += self.feed.publish(body, publication.topic, wall)

    def _forget_undeclared_pools(self) -> None:
        """Pool topics whose names are not declared are neither republished nor given to
        new subscribers (names an agent made up, kept by an older version, or taken out
        of [pools] by a reload)."""
        names = self.redactor.names
        assert names is not None
        gone = set(self.redactor.forget_undeclared())
        for topic in [t for t in self.feed.latest if t.startswith("pool/")]:
            if not names.declares(topic):
                del self.feed.latest[topic]
                gone.add(topic)
        if gone:
            log.warning("%d pool topic(s) whose names [pools] does not declare are no longer "
                        "published", len(gone))

    def _tell_held_back(self) -> None:
        """Count and log, once each, the undeclared names hosts were left out for."""
        for names in self.redactor.held_back.keys() - self._held_back_told:
            if len(self._held_back_told) >= MAX_HELD_BACK_TOLD:
                break  # the counter goes on; the log and the memory do not
            self._held_back_told.add(names)
            self.cluster.counters["pool_names_held_back"] += 1
            log.warning("hosts report pool %.60r and GPU class %.60r, which [pools] does not "
                        "declare: left out of every tenant's capacity (declare them in "
                        "pools.names and pools.gpu_classes, then reload)", *names)

    def _notice(self, host_id: str, notice: ValidationNotice,
                declared: tuple[str, JobDeclaration] | None, now: float,
                wall: float) -> str | None:
        """A host's validation notice under the controller's own id, with what the tenant
        may still do about it; why it is not passed on, if it is not."""
        max_defer = declared[1].max_validation_defer if declared else 0.0
        # Hosts before answerable notices sent no plan id: each notice stands alone.
        plan = notice.id or f"@{notice.starts_at}"
        notice_id = self.notices.id_for(host_id, plan, notice.job)
        if self.notices.get(notice_id) is None and self.notices.full(
                host_id, notice.job, self.cfg.notices.per_host, self.cfg.notices.per_job):
            return "too_many_notices"
        body = self.redactor.notice(
            host_id, notice, now, wall, declared[1].max_validation_pause if declared else None,
            notice_id=notice_id, defer_seconds=self.notices.defer_left(notice_id, max_defer),
            max_defer=max_defer)
        if isinstance(body, str):
            return body
        placement = self.redactor.placements[notice.job]
        self.notices.record(Notice(notice_id, placement.tenant, notice.job, host_id, plan,
                                   body.status, body.not_before, body.pause_seconds,
                                   placement=placement.generation))
        return None

    def _reachable(self, now: float) -> set[str]:
        """Hosts an arm can reach now: up, and heard from within ``ARM_QUIET`` of their
        heartbeat intervals. A host already silent may never get the arm: it would arm
        nothing while its job's tenant is told ``paused``, so no change is armed then."""
        return {host.host_id for host in self.cluster.hosts.values()
                if host.alive and host.host_id in self.cluster.conn_of
                and now - host.last_seen <= ARM_QUIET * host.heartbeat}

    def _agree(self, now: float) -> None:
        """Reports and acknowledgements from the job's own hosts in; arms and resolves
        out, each stored (in the Commit before them) so a restart resends or cancels it."""
        messages, self.cluster.tuning = self.cluster.tuning, []
        for host_id, body in messages:
            if host_id not in self._hosts_of(body.job):
                self.feed.stats["foreign_tuning_messages"] += 1
                continue
            if isinstance(body, TuningReport):
                if not self.agreement.report(host_id, body, now):
                    log.warning("host %s: tuning report for job %r refused (wish %r at "
                                "severity %d is no choice a declaration gives)", host_id,
                                body.job, body.want, body.severity)
            else:
                self.agreement.ack(host_id, body, now)
        hellos, self.cluster.hellos = self.cluster.hellos, []
        for host_id in hellos:
            self.agreement.reconnected(host_id)
        outgoing = self.agreement.step(now, self._reachable(now))
        self._stepped_at = now
        dirty, gone = self.agreement.take_dirty()
        self._tuning.update({job: self.agreement.snapshot(job) for job in dirty})
        self._tuning.update(dict.fromkeys(gone))
        # After this batch's replies: a host saying hello gets the declarations of its
        # jobs before any arm or outcome for them.
        for host_id, body in outgoing:
            log.info("job %s: %s decision %d to host %s", body.job, body.KIND,  # type: ignore[attr-defined]
                     body.decision, host_id)  # type: ignore[attr-defined]
            conn = self.cluster.conn_of.get(host_id)
            if conn is not None:
                self._held.append(SendToAgent(conn, body))
        for job in sorted(self.redactor.placements):
            choice, status = self.agreement.health(job, now)
            if self.redactor.tuning(job, choice, status):
                self.cluster.changed = True
                if status is not TuningStatus.STEADY:
                    log.warning("job %s: tuning %s: %s", job, status.value,
                                self.agreement.status(job, now).get("diverged")
                                or "ranks wait at a switching point")

    # --- tenants -----------------------------------------------------------------------

    def _tenant(self, peer: TenantPeer, message: Envelope | BadFrame,
                now: float) -> list[Output]:
        stats = self.feed.stats
        # Every request spends the budget, a bad one too, before any answer is made:
        # over budget it is dropped unanswered (a renewal comes again).
        if not peer.admitted and not self.feed.admit(peer.tenant, now):
            return []
        if isinstance(message, BadFrame):
            stats["bad_request"] += 1
            if message.reason == "framing":
                return []  # nothing to answer: not one request
            # A readable envelope with a wrong body is invalid (seq 0 too); an unreadable
            # one is malformed.
            code = ErrorCode.INVALID if message.readable else ErrorCode.MALFORMED
            return [AnswerTenant(peer.peer, Reply(message.seq, False,
                                                  f"rejected: {message.detail}"[:1000],
                                                  code.value))]
        body = message.body
        if isinstance(body, Subscribe):
            # About stored state only: the feed's numbers move in tick(), committed at once.
            return self.feed.subscribe(peer, body, now, number=message.seq)
        if self.storage_paused and isinstance(body, JobDeclaration | ValidationAnswer):
            stats["refused_disk_full"] += 1
            return [AnswerTenant(peer.peer, Reply(
                message.seq, False, "the controller cannot store anything now (its disk is "
                "full): try again later", ErrorCode.UNAVAILABLE.value))]
        if isinstance(body, JobDeclaration):
            error = self._declare(peer.tenant, body)
        elif isinstance(body, ValidationAnswer):
            error = self._answer_notice(peer.tenant, body)
        else:
            return []
        # After the Commit that stores what it changed: "ok" means it is kept.
        self._held.append(AnswerTenant(peer.peer, Reply(
            message.seq, error is None, error[1] if error else "",
            error[0].value if error else "")))
        return self._release()

    def _declare(self, tenant: str,
                 declaration: JobDeclaration) -> tuple[ErrorCode, str] | None:
        """Take and forward a tenant's declaration; the error for the tenant, if any."""
        error = self.declarations.refusal(tenant, declaration,
                                          self.redactor.placements.get(declaration.job))
        if error is not None:
            self.feed.stats["refused_declarations"] += 1
            log.warning("refused a declaration from %r: %s", tenant or "(no key)", error[1])
            return error
        if declaration.withdrawn:
            self._withdraw(declaration.job)
            return None
        self.declarations.put(tenant, declaration)
        self.feed.stats["declarations"] += 1
        self._forward(declaration)
        return None

    def _answer_notice(self, tenant: str,
                       answer: ValidationAnswer) -> tuple[ErrorCode, str] | None:
        """A tenant's answer to a validation notice, for the host that planned it."""
        notice = self.notices.get(answer.notice)
        declared = self.declarations.get(notice.job) if notice is not None else None
        max_defer = (declared[1].max_validation_defer
                     if declared is not None and declared[0] == tenant else 0.0)
        result = self.notices.answer(tenant, answer, max_defer, None if notice is None
                                     else self.redactor.placements.get(notice.job))
        if isinstance(result, tuple):
            self.feed.stats["refused_notice_answers"] += 1
            log.warning("refused an answer to a validation notice from %r: %s",
                        tenant or "(no key)", result[1])
            return result
        assert notice is not None
        self.feed.stats["notice_answers"] += 1
        log.info("job %s: validation notice %s: %s", notice.job, notice.id,
                 answer.action.value)
        conn = self.cluster.conn_of.get(notice.host)
        if conn is not None:  # else at the host's next hello
            self._held.append(SendToAgent(conn, result))
        return None

    def _hosts_of(self, job: str) -> frozenset[str]:
        placement = self.redactor.placements.get(job)
        return placement.hosts if placement is not None else frozenset()

    def _forward(self, declaration: JobDeclaration) -> None:
        placement = self.redactor.placements.get(declaration.job)
        body = for_host(declaration, placement)
        for host_id in sorted(self._hosts_of(declaration.job)):
            conn = self.cluster.conn_of.get(host_id)
            if conn is not None:
                self._held.append(SendToAgent(conn, body))

    def _withdraw(self, job: str) -> None:
        # Hosts step back to NCCL's own choices at agreed points, then forget the job.
        self.agreement.withdraw(job)
        if self.declarations.remove(job):
            self._forward(JobDeclaration(job, withdrawn=True))

    def _declarations_for(self, host_id: str, conn: bytes) -> list[Output]:
        """A (re)connecting agent learns the declarations of the jobs it hosts (the
        agreement resends it any arm or resolve it has not acknowledged)."""
        out: list[Output] = []
        for _, declaration in self.declarations.by_job.values():
            if host_id in self._hosts_of(declaration.job):
                placement = self.redactor.placements.get(declaration.job)
                out.append(SendToAgent(conn, for_host(declaration, placement)))
        # Tenants' answers to its notices, which the host may not have had.
        out += [SendToAgent(conn, decision) for decision in self.notices.of_host(host_id)]
        return out

    # --- commits and deadlines ---------------------------------------------------------

    def _release(self) -> list[Output]:
        """A Commit of everything changed, then every held send."""
        records, events = self.cluster.take_dirty()
        seqs, entries, offsets = self.feed.take_dirty()
        placements, self._placements = self._placements, {}
        tuning, self._tuning = self._tuning, {}
        writes = Writes(hosts=tuple(dataclasses.replace(r) for r in records),
                        events=tuple(events), feed_seqs=seqs, feed_log=entries,
                        feed_offsets=offsets, declarations=self.declarations.take_dirty(),
                        placements=placements, tuning=tuning,
                        notices=self.notices.take_dirty())
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
