"""The controller core's state, as the core's parts declare it.

:class:`controller.core.ControllerCore` sets every attribute in its ``__init__``; its
handlers of agents' frames (``coreagents.py``) and of tenants' requests
(``coretenants.py``) act on it, and inherit these declarations from here instead of
each repeating them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.agreement import Agreement
from controller.cluster import Cluster
from controller.declarations import Declarations
from controller.notices import Notices
from controller.outputs import Output
from controller.publications import Publications
from controller.redaction import Redactor

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    from controller.config import ControllerConfig


class CoreState:
    """What every part of the core reads and changes (set by ControllerCore.__init__)."""

    cfg: ControllerConfig
    cluster: Cluster
    redactor: Redactor
    agreement: Agreement
    declarations: Declarations
    notices: Notices
    feed: Publications
    storage_paused: bool
    _held: list[Output]
