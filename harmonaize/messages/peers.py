"""Which kinds each peer may send: what the receiving side passes to
:func:`harmonaize.messages.decode` as ``allowed``. Kept in one place so that what a peer
may send is read at a glance, beside the families that define the kinds."""

from __future__ import annotations

#: What an agent sends its controller.
AGENT_KINDS = frozenset({"hello", "heartbeat", "host-summary", "host-event", "job-advisory",
                         "validation-notice", "tuning-report", "tuning-ack", "rank-progress",
                         "application-xid", "goodbye"})
#: What a controller sends an agent.
CONTROLLER_KINDS = frozenset({"ack", "resync", "job-declaration", "tuning-arm",
                              "tuning-resolve", "validation-decision"})
#: What a tenant sends the controller (its requests).
TENANT_KINDS = frozenset({"subscribe", "job-declaration", "validation-answer",
                          "negotiation-propose", "negotiation-counter", "negotiation-accept",
                          "negotiation-reject", "negotiation-release", "negotiation-list",
                          "maintenance-counter"})
#: What the controller sends a tenant on its feed.
FEED_KINDS = frozenset({"pool-capacity", "job-advisory", "job-health", "validation-notice",
                        "job-progress", "application-xid", "negotiation-expired",
                        "subscribed", "reply"})
#: Every kind a tenant sends or receives: what the wire audit records.
TENANT_FACING = FEED_KINDS | TENANT_KINDS
