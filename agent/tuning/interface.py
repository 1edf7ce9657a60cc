"""What the tuning domain offers the other domains: nothing else of ``agent.tuning`` may be
imported outside it (the composition layer aside).

Energy reads the plugin's stats files through :mod:`agent.plugin`, not through
tuning. Declared here: the named choices a job follows, the phases a communicator's
change goes through, for whoever reports on them, and the ranks' records the tuning
service read this pass (:class:`RanksRead`): job health judges them as they are, without
reading a tenant's stats files a second time.
"""

from collections.abc import Mapping
from typing import Protocol

from agent.plugin.layout import StatsSlots
from agent.tuning.phases import Event, Phase
from agent.tuning.policies import CHOICE_NAMES, DEFAULT

__all__ = ["CHOICE_NAMES", "DEFAULT", "Event", "Phase", "RanksRead", "StatsSlots"]


class RanksRead(Protocol):
    """The tuning service as job health sees it: per declared job, the live slots
    its bounded reader returned at the latest pass (a job no longer in it ended)."""

    @property
    def stats(self) -> Mapping[str, StatsSlots]: ...
