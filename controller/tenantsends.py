"""Sending to tenants without ever blocking: a full queue or a gone peer is reported to
the core (which counts it and lets the tenant resume), never waited on.

A peer is the feed socket's routing id behind :data:`~controller.sockets.ZMQ_PEER`, or
a gateway stream's id; a publication for many peers goes out in one loop
(:func:`fan_out`), the streams among them handed to the gateway together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from controller.outputs import Delivery, FanOut
from controller.sockets import ZMQ_PEER, sent

if TYPE_CHECKING:
    from controller.gateway.http import Gateway


def _failed(exc: BaseException) -> Delivery:
    if isinstance(exc, zmq.ZMQError) and exc.errno == zmq.EHOSTUNREACH:
        return Delivery.GONE
    return Delivery.FULL


def fan_out(tenants: zmq.asyncio.Socket | None, gateway: Gateway | None,
            out: FanOut) -> tuple[list[bytes], list[bytes]]:
    """One publication to all its subscribers in one loop; the peers found full and
    those found gone (the core counted it sent to each of the others)."""
    full: list[bytes] = []
    gone: list[bytes] = []
    streams: list[bytes] = []
    topic, frame = out.topic.encode(), out.frame
    send = tenants.send_multipart if tenants is not None else None
    zmq_peer, noblock = ZMQ_PEER[0], zmq.NOBLOCK
    for peer in out.peers:
        if peer[0] != zmq_peer:
            streams.append(peer)  # the gateway's, or a gone gateway's
        elif send is None:
            gone.append(peer)
        elif (exc := sent(send([peer[1:], topic, frame], flags=noblock))) is not None:
            (gone if _failed(exc) is Delivery.GONE else full).append(peer)
    if streams:
        if gateway is None:
            gone += streams
        else:
            gateway.deliver_all(out, streams, full=full, gone=gone)
    return full, gone


def to_tenant(tenants: zmq.asyncio.Socket, peer: bytes, topic: bytes,
              frame: bytes) -> Delivery:
    """One frame to one feed subscriber."""
    if not peer.startswith(ZMQ_PEER):
        return Delivery.GONE  # a gateway's peer after the gateway closed
    exc = sent(tenants.send_multipart([peer[1:], topic, frame], flags=zmq.NOBLOCK))
    return Delivery.SENT if exc is None else _failed(exc)
