"""What the tuning domain offers the other domains: nothing else of ``agent.tuning`` may be
imported outside it (the composition layer aside).

No other domain uses tuning today (energy reads the plugin's stats files through
:mod:`agent.plugin`, not through tuning). Declared here: the named choices a job
follows, and the phases a communicator's change goes through, for whoever reports on
them.
"""

from agent.tuning.phases import Event, Phase
from agent.tuning.policies import CHOICE_NAMES, DEFAULT

__all__ = ["CHOICE_NAMES", "DEFAULT", "Event", "Phase"]
