"""The feed client's negotiation requests (docs/tenant-guide.md, "Negotiating capacity
and maintenance"): each is one request, its answer the controller's ``Negotiated``."""

from __future__ import annotations

from collections.abc import Sequence

from harmonaize.messages import (
    Flexible,
    MaintenanceCounter,
    Message,
    Negotiated,
    NegotiationAccept,
    NegotiationCounter,
    NegotiationList,
    NegotiationPropose,
    NegotiationReject,
    NegotiationRelease,
    Reply,
)


class RequestError(RuntimeError):
    """The controller refused a request, or did not answer; the message says which, and
    ``code`` is the refusal's :class:`~harmonaize.messages.ErrorCode` ("" for no answer)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code



class Negotiating:
    """A part of :class:`harmonaize.tenant.client.FeedClient`, which sends requests."""

    def request(self, body: Message, timeout: float = 10.0) -> Reply:
        raise NotImplementedError

    def propose(self, request_id: str, *, pool: str, gpu_class: str, min_count: int,
                max_count: int, earliest_start: float, latest_start: float, duration: float,
                flexibility: Flexible | str = Flexible.NONE, timeout: float = 10.0
                ) -> Negotiated:
        """Propose a reservation window; the controller's offer, counter or refusal.
        Proposing again under the same ``request_id`` is a retry (the same answer)."""
        return self._negotiate(NegotiationPropose(
            request_id, pool, gpu_class, min_count, max_count, earliest_start, latest_start,
            duration, Flexible(flexibility)), timeout)

    def counter(self, request_id: str, offer_id: str, *, pool: str, gpu_class: str,
                min_count: int, max_count: int, earliest_start: float, latest_start: float,
                duration: float, flexibility: Flexible | str = Flexible.NONE,
                timeout: float = 10.0) -> Negotiated:
        """Counter an offer with a new proposal (the next round); the controller's answer."""
        return self._negotiate(NegotiationCounter(
            request_id, offer_id, pool, gpu_class, min_count, max_count, earliest_start,
            latest_start, duration, Flexible(flexibility)), timeout)

    def accept(self, request_id: str, offer_id: str, timeout: float = 10.0) -> Negotiated:
        """Accept an offer before it expires: the hold."""
        return self._negotiate(NegotiationAccept(request_id, offer_id), timeout)

    def reject(self, request_id: str, offer_id: str, timeout: float = 10.0) -> Negotiated:
        return self._negotiate(NegotiationReject(request_id, offer_id), timeout)

    def release(self, request_id: str, timeout: float = 10.0) -> Negotiated:
        """Give a hold back (free up to an hour before its start)."""
        return self._negotiate(NegotiationRelease(request_id), timeout)

    def counter_window(self, notice: str, windows: Sequence[float] = (),
                       timeout: float = 10.0) -> Negotiated:
        """Answer a validation notice's window: none accepts it; else your starts (your
        checkpoints). The window as it stands."""
        return self._negotiate(MaintenanceCounter(notice, tuple(windows)), timeout)

    def negotiations(self, timeout: float = 10.0) -> tuple[Negotiated, ...]:
        """Your negotiations, holds and maintenance windows as they stand."""
        return self.request(NegotiationList(), timeout).negotiation

    def _negotiate(self, body: Message, timeout: float) -> Negotiated:
        answer = self.request(body, timeout).negotiation
        if not answer:
            raise RequestError("the controller's answer carried no negotiation")
        return answer[0]
