"""The agent protocol at a replica's door, before an agent's message is on the bus.

Sans-I/O. A replica takes agents' frames on its ZeroMQ socket as the embedded
controller does, but what it stores is the frame itself, on the agents' stream of the
bus, one subject per host; the leader applies it from there. So the replica only
decides, per frame, whether to store it and what to answer, from what the bus holds
for the host (:class:`HostLog`: its epoch, the last sequence number stored, and the
stream position of its subject's last message, which every store is fenced on: if
another replica stored for the host since, the store fails and the log is read again).

The answers are the embedded controller's (controller/cluster.py): in-order messages
are acknowledged once stored, duplicates and gaps with the last stored number, anything
before a hello with a resync. A hello is stored too (the leader binds the host and
resends what it lacks); heartbeats are not stored but summed up for the leader.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from harmonaize.messages import Ack, Category, Envelope, Goodbye, Heartbeat, Hello, Message, Resync


@dataclass(frozen=True)
class HostLog:
    """What the bus holds for one host."""

    epoch: int = 0
    #: The last sequence number stored in this epoch.
    seq: int = 0
    #: The stream position of the last message on the host's subject (0: none).
    subject_seq: int = 0


class Verdict(Enum):
    STORE = "store"    # put it on the bus, then answer
    ANSWER = "answer"  # answer at once, store nothing
    BEAT = "beat"      # alive: count it for the leader, no answer
    IGNORE = "ignore"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    #: What to answer: at once (ANSWER), or once stored (STORE); None: nothing.
    answer: Message | None = None
    #: The host's log once stored (STORE).
    after: HostLog | None = None


def judge(log: HostLog | None, env: Envelope) -> Decision:
    """What to do with one frame from a host whose bus log is ``log`` (None: the
    connection has not said hello)."""
    body = env.body
    if isinstance(body, Hello):
        base = log or HostLog()
        # A restarted agent numbers from 1 again: trust what it says was acknowledged.
        seq = base.seq if base.epoch == body.epoch else body.acked
        return Decision(Verdict.STORE, Ack(seq), HostLog(body.epoch, seq, base.subject_seq))
    if log is None:
        return Decision(Verdict.ANSWER, Resync("say hello first"))
    if isinstance(body, Heartbeat):
        return Decision(Verdict.BEAT)
    if isinstance(body, Goodbye):
        return Decision(Verdict.STORE, None, log)
    if body.CATEGORY is Category.CONTROL:
        return Decision(Verdict.IGNORE)
    if env.seq != log.seq + 1:
        return Decision(Verdict.ANSWER, Ack(log.seq))
    return Decision(Verdict.STORE, Ack(env.seq), HostLog(log.epoch, env.seq, log.subject_seq))


def message_id(host: str, log: HostLog, env: Envelope) -> str | None:
    """The bus's de-duplication id of a stored frame (a resend within its window is
    stored once); hellos and goodbyes have none."""
    if isinstance(env.body, Hello | Goodbye):
        return None
    return f"{host}:{log.epoch}:{env.seq}"
