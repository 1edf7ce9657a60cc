"""What the links domain offers the other domains: nothing else of ``agent.links`` may be
imported outside it (the composition layer aside).

The tuning domain takes a pass's judgement of each link (:class:`LinkJudgement`) as
its input (it holds its own choice with the shared :mod:`harmonaize.hysteresis`); it
shapes bulk traffic on the links a :class:`LinkSample` lists, and shows link health's
thresholds (:class:`LinksSection`) beside its jobs. Job health takes each link's held
levels (:class:`LinkLevels`), and the retransmissions they carry, to tell a network fault
under a job's ranks.
"""

from agent.links.health import LinkJudgement, LinkLevels
from agent.links.settings import LinksSection
from agent.links.types import LinkRates, LinkSample

__all__ = ["LinkJudgement", "LinkLevels", "LinkRates", "LinkSample", "LinksSection"]
