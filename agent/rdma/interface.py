"""What the RDMA domain offers the other domains: nothing else of ``agent.rdma`` may be
imported outside it (the composition layer aside).

Link health judges RDMA ports beside the kernel's links: it reads an
:class:`RdmaSample`'s ports (:class:`RdmaPortRates`) and the ports that vanished.
"""

from agent.rdma.types import RdmaPortRates, RdmaSample

__all__ = ["RdmaPortRates", "RdmaSample"]
