"""The controller core's handling of agents' messages (see controller/core.py).

A frame from an agent is checked (its sender is the key's host, it is readable, the
disk has room) and applied to the cluster's state; its effects wait for the core's
next tick, which hands the agreement its reports and acknowledgements, the redactor
the hosts' advisories and notices, and stages what tenants may now be told.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controller.corestate import CoreState
from controller.notices import Notice
from controller.outputs import (
    AgentPeer,
    BadFrame,
    Output,
    SendToAgent,
)
from harmonaize.messages import (
    Category,
    Envelope,
    Hello,
    JobDeclaration,
    NoticeStatus,
    PoolCapacity,
    Resync,
    TuningReport,
    TuningStatus,
    ValidationCause,
    ValidationNotice,
)

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    from controller.cluster import Cluster


log = logging.getLogger("harmonaize.controller")

#: Rejected frames logged per window; all of them are counted.
REJECT_LOG_BURST = 10
REJECT_LOG_WINDOW = 10.0
#: Undeclared pool and class names logged (each once) before the log says no more.
MAX_HELD_BACK_TOLD = 1000
#: A host silent for longer than this many of its heartbeat intervals gets no new arm.
ARM_QUIET = 2.0


class Reachable:
    """The hosts an arm can reach at ``now`` (a container, asked host by host)."""

    def __init__(self, cluster: Cluster, now: float) -> None:
        self.cluster, self.now = cluster, now

    def __contains__(self, host_id: object) -> bool:
        host = self.cluster.hosts.get(host_id) if isinstance(host_id, str) else None
        return (host is not None and host.alive and host_id in self.cluster.conn_of
                and self.now - host.last_seen <= ARM_QUIET * host.heartbeat)


class AgentMessages(CoreState):
    """Agents' frames in, the agreement and the redactor stepped: a part of
    :class:`controller.core.ControllerCore`, which holds the state."""

    # The core's state these handlers act on beyond CoreState's (set by ControllerCore).
    frames: int
    rejected: Counter[str]
    _reject_window: tuple[float, int]
    _held_back_told: set[tuple[str, str]]
    _tuning: dict[str, Mapping[str, Any] | None]
    _staged: bool
    _stepped_at: float
    _now: float

    if TYPE_CHECKING:  # in controller/coretenants.py
        def _declarations_for(self, host_id: str, conn: bytes) -> list[Output]: ...
        def _hosts_of(self, job: str) -> frozenset[str]: ...
        def _job_health(self, now: float, wall: float) -> None: ...  # corejobhealth.py
        # controller/corenegotiation.py
        def _released_capacity(self, topic: str, body: PoolCapacity, wall: float) -> None: ...
        def _maintenance_window(self, notice_id: str, tenant: str, job: str, *,
                                start: float, pause: float, wall: float,
                                cause: ValidationCause = ...,
                                checkpoints: tuple[float, float] = ...) -> None: ...

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

    def heartbeat(self, peer: AgentPeer, sender: str, now: float) -> bool:
        """A well-formed heartbeat from ``sender`` (controller/heartbeats.py read it):
        True when it was handled as :meth:`receive` would handle its message; False when
        it is anything but the common case (a key speaking for another host, an unbound
        connection, a host that was down, the disk full), for :meth:`receive` to see
        whole. It did nothing then."""
        if ((peer.host is not None and sender != peer.host) or self.storage_paused
                or not self.cluster.beat(peer.conn, sender, now)):
            return False
        self._now = now
        self.frames += 1
        self._staged = True
        return True

    def heard(self, hosts: list[str], now: float) -> None:
        """Known hosts a replica heard (cluster mode): each one's heartbeat, as a
        heartbeat frame from it applies it, in one pass (a replica says so of every
        host it serves, twice a second)."""
        self.frames += self.cluster.heard(hosts, now)
        self._staged = True

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
        self._job_health(now, wall)
        self._staged = False
        if self.cluster.changed:
            self.cluster.changed = False
            # The hosts that changed move their pools' counts (not a pass over them all).
            self.redactor.observe_changes(self.cluster.take_touched(), now)
            self._tell_held_back()
        for publication in self.redactor.due(now):
            body = publication.body
            if isinstance(body, PoolCapacity):
                self._released_capacity(publication.topic, body, wall)
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
        if (known := self.notices.get(notice_id)) is not None and known.window:
            # A negotiated window may lie beyond the horizon a start is clamped to.
            max_defer = max(max_defer, known.window - wall)
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
        if body.status is NoticeStatus.SCHEDULED:
            cadence = (declared[1].checkpoint_every, declared[1].last_checkpoint
                       ) if declared else (0.0, 0.0)
            self._maintenance_window(notice_id, placement.tenant, notice.job,
                                     start=body.not_before, pause=float(body.pause_seconds),
                                     wall=wall, cause=body.cause, checkpoints=cadence)
        return None

    def _reachable(self, now: float) -> Reachable:
        """Hosts an arm can reach now: up, and heard from within ``ARM_QUIET`` of their
        heartbeat intervals. A host already silent may never get the arm: it would arm
        nothing while its job's tenant is told ``paused``, so no change is armed then.
        Asked host by host (only the hosts of a job about to be armed are), not listed:
        a tick comes after every batch, and a list of every host cost a pass over them
        all each time."""
        return Reachable(self.cluster, now)

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

