"""The controller core's handling of tenants' requests (see controller/core.py).

Subscriptions are answered at once from stored state; a declaration or an answer to a
validation notice is checked against the tenant's own jobs and placements, forwarded to
the job's hosts, and answered only after the Commit that stores it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from controller.corenegotiation import REQUESTS as NEGOTIATION_REQUESTS
from controller.corestate import CoreState
from controller.declarations import for_host
from controller.outputs import (
    AnswerTenant,
    BadFrame,
    Output,
    SendToAgent,
    TenantPeer,
)
from harmonaize.messages import (
    Envelope,
    ErrorCode,
    JobDeclaration,
    Message,
    NegotiationList,
    Reply,
    Subscribe,
    ValidationAnswer,
)

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    pass


log = logging.getLogger("harmonaize.controller")

#: Negotiation requests that change what is stored (a list only reads).
NEGOTIATION_WRITES = tuple(r for r in NEGOTIATION_REQUESTS if r is not NegotiationList)


class TenantRequests(CoreState):
    """Tenants' requests in, declarations and answers out to the job's hosts: a part of
    :class:`controller.core.ControllerCore`, which holds the state."""

    if TYPE_CHECKING:  # in controller/core.py and controller/corenegotiation.py
        def _release(self) -> list[Output]: ...

        def _negotiate(self, peer: bytes, tenant: str, seq: int, body: Message,
                       now: float) -> list[Output]: ...

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
        if self.storage_paused and isinstance(body, (JobDeclaration, ValidationAnswer,
                                                     *NEGOTIATION_WRITES)):
            stats["refused_disk_full"] += 1
            return [AnswerTenant(peer.peer, Reply(
                message.seq, False, "the controller cannot store anything now (its disk is "
                "full): try again later", ErrorCode.UNAVAILABLE.value))]
        if isinstance(body, NEGOTIATION_REQUESTS):
            return self._negotiate(peer.peer, peer.tenant, message.seq, body, now)
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

