"""The HTTP gateway's negotiation routes (docs/wire.md; the tenant guide's "Negotiating
capacity and maintenance"): each is a tenant's request to the core, like a declaration,
and answers with what the controller's answer carries (``reply.negotiation``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from controller.gateway.shell import Refused
from controller.outputs import BadFrame
from harmonaize.messages import (
    ErrorCode,
    MaintenanceCounter,
    Message,
    NegotiationAccept,
    NegotiationCounter,
    NegotiationList,
    NegotiationPropose,
    NegotiationReject,
    NegotiationRelease,
    Reply,
)
from harmonaize.schema import to_plain

#: ``POST /v1/negotiations/<step>``: the message each step's body is.
NEGOTIATION_STEPS: dict[str, type[Message]] = {
    "propose": NegotiationPropose, "counter": NegotiationCounter,
    "accept": NegotiationAccept, "reject": NegotiationReject,
    "release": NegotiationRelease}


class NegotiationRoutes:
    """A part of :class:`controller.gateway.http.Gateway`."""

    if TYPE_CHECKING:  # in controller/gateway/http.py and identity.py
        def _admitted(self, request: web.Request, *, session: bool = False) -> str: ...
        async def _ask(self, request: web.Request, tenant: str,
                       body: Message | BadFrame) -> Reply: ...
        def _typed(self, cls: type[Message], data: Any) -> Message | BadFrame: ...
        async def _json(self, request: web.Request) -> Any: ...

    async def _negotiate(self, request: web.Request) -> web.Response:
        """``POST /v1/negotiations/<step>`` (propose, counter, accept, reject, release):
        the body is that message; the answer carries the controller's (offer, counter,
        refusal, hold, closed)."""
        tenant = self._admitted(request)
        step = request.match_info["step"]
        cls = NEGOTIATION_STEPS.get(step)
        if cls is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no negotiation step {step!r:.40}: one of "
                          + ", ".join(NEGOTIATION_STEPS))
        reply = await self._ask(request, tenant, self._typed(cls, await self._json(request)))
        return self._negotiated(request, reply)

    async def _negotiations(self, request: web.Request) -> web.Response:
        """``GET /v1/negotiations``: yours, and your maintenance windows, as they stand."""
        tenant = self._admitted(request)
        reply = await self._ask(request, tenant, NegotiationList())
        return self._negotiated(request, reply)

    async def _windows(self, request: web.Request) -> web.Response:
        """``POST /v1/notices/<id>/windows``: counter a notice's window with your own."""
        tenant = self._admitted(request)
        data = await self._json(request)
        if not isinstance(data, dict):
            raise Refused(ErrorCode.INVALID, "maintenance-counter: expected a JSON object")
        notice = request.match_info["notice"]
        if "notice" in data and data["notice"] != notice:
            raise Refused(ErrorCode.INVALID, f"maintenance-counter.notice: "
                          f"{data['notice']!r:.80} differs from the path's notice "
                          f"{notice!r:.80}: leave it out")
        body = self._typed(MaintenanceCounter, {**data, "notice": notice})
        return self._negotiated(request, await self._ask(request, tenant, body))

    @staticmethod
    def _negotiated(request: web.Request, reply: Reply) -> web.Response:
        return web.json_response({"ok": True, "request_id": request["request_id"],
                                  "negotiation": to_plain(reply.negotiation)})

