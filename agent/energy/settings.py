"""The energy loop's settings (``[energy]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from harmonaize.schema import Fraction, Num


@dataclass(frozen=True)
class EnergySection:
    """GPU power limits inside the slowdown a job declares (agent/gpu/energy.py)."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    #: Seconds between two looks of the loop (it also looks when a deadline of its own comes).
    interval: Annotated[float, Num(0.05, 60.0)] = 1.0
    #: A step lowers a GPU's limit by this share of the limit it had before.
    step: Annotated[float, Num(0.01, 0.5)] = 0.05
    #: Seconds after a change before its effect is measured (clocks and the job settle).
    settle: Annotated[float, Num(0.0, 600.0)] = 5.0
    #: Seconds of the job's progress per measurement, the baseline's too.
    window: Annotated[float, Num(0.05, 3600.0)] = 20.0
    #: Back off (raise the limit) once the measured slowdown reaches this share of the
    #: job's declared max_slowdown ...
    backoff_at: Fraction = 0.8
    #: ... and lower further only while it is below this share (between: hold).
    probe_below: Fraction = 0.5
    #: Seconds at a settled limit before trying lower again.
    hold: Annotated[float, Num(0.0, 86400.0)] = 300.0
    #: Seconds after which the job's progress at its GPUs' own limits is measured again
    #: (its work may have changed); 0: never.
    rebaseline: Annotated[float, Num(0.0, 7 * 86400.0)] = 3600.0
    #: Lowerings per GPU and minute at most (a raise back toward the GPU's own limit, and
    #: a restore, are never held back).
    max_changes_per_minute: Annotated[int, Num(1, 600)] = 4
    #: Operator bounds: never below this share of a GPU's default limit ...
    min_share: Fraction = 0.5
    #: ... nor below this many watts (0: no floor of its own).
    min_watts: Annotated[float, Num(0.0, 100_000.0)] = 0.0
    #: A rank whose collectives are ahead of the slowest local rank's in at least this
    #: share of a window's looks waits on the others: its GPU is lowered first.
    waiting_share: Fraction = 0.6
    #: Seconds between reports of each job's energy to the controller.
    report_interval: Annotated[float, Num(1.0, 86400.0)] = 60.0

    def __post_init__(self) -> None:
        if self.probe_below > self.backoff_at:
            raise ValueError("probe_below must not exceed backoff_at")
