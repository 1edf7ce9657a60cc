"""What the gateway's parts share: what they need of the controller's shell, how a
request is refused, the gateway's counts, and the prefix of its peers' names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from harmonaize.messages import Envelope, ErrorCode, Reply

if TYPE_CHECKING:
    from controller.core import ControllerCore
    from controller.gateway.tokens import TokenBook
    from controller.outputs import Output
    from controller.store import Store

#: The gateway's peers are ``b"h" + a number`` (ZeroMQ's are ``b"z" + routing id``).
PEER = b"h"


class Shell(Protocol):
    """What the gateway needs of the controller's shell."""

    core: ControllerCore
    store: Store
    anonymous: bool  # auth.mode = "none": no identity needed, pool topics only
    #: Where tokens are kept (the controller's database, or a cluster's bus).
    tokens: TokenBook

    def execute(self, outputs: list[Output]) -> None: ...

    async def ask(self, tenant: str, request: Envelope) -> Reply | None:
        """A request the core of another replica answers (a cluster's leader); None:
        this replica's own core answers it."""

    async def query(self, name: str, args: dict[str, Any]) -> Any:
        """A view of state this replica does not hold (a cluster's leader's); None: it
        holds it."""


class Refused(Exception):
    def __init__(self, code: ErrorCode, message: str, *, status: int | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra
        #: The HTTP status, where it is not the code's own (events.STATUS).
        self.status = status


@dataclass
class GatewayStats:
    streams: int = 0
    events: int = 0
    requests: int = 0
    refused: int = 0
    overflowed: int = 0
    body_timeouts: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
