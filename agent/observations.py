"""One pass's observations: what each observer saw, as one typed record.

The engines (health, tuning) take this instead of a dict they pick samples out of
by name and type; the record is built in one place, from what the observer set
returned, and says by its type what each field holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from agent.gpu.types import GpuSample
from agent.host.types import HostSample
from agent.links.types import LinkSample
from agent.rdma.types import RdmaSample

_TYPES = {"host": HostSample, "links": LinkSample, "rdma": RdmaSample, "gpu": GpuSample}


@dataclass(frozen=True)
class Observations:
    """None where the observer is disabled, absent, failed or its sample failed.

    Observers hand on the same sample object while nothing moved; engines may
    rely on that identity to skip work.
    """

    host: HostSample | None = None
    links: LinkSample | None = None
    rdma: RdmaSample | None = None
    gpu: GpuSample | None = None

    @classmethod
    def of(cls, samples: Mapping[str, object]) -> Observations:
        """From the observer set's samples by observer name. A sample of another
        type than its observer's is a programming error, not an input to skip."""
        unknown = set(samples) - set(_TYPES)
        if unknown:
            raise TypeError(f"no observation field for observer(s) {', '.join(sorted(unknown))}")
        for name, sample in samples.items():
            if not isinstance(sample, _TYPES[name]):
                raise TypeError(f"observer {name} returned a {type(sample).__name__}, "
                                f"not a {_TYPES[name].__name__}")
        return cls(**samples)  # type: ignore[arg-type]


assert {f.name for f in fields(Observations)} == set(_TYPES)
