"""RDMA settings: the observer's (``[observers.rdma]``) and congestion control's (``[rdma]``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, ClassVar

from agent.rdma.ccparams import PARAMS, CcParam
from harmonaize.config import AbsPath
from harmonaize.schema import Fraction, Ident, Len, Name, Num

#: ``[lo, hi]``: the values the loop may set a parameter to (equal ends pin it).
Bound = Annotated[tuple[Annotated[int, Num(0, 2**32 - 1)], ...], Len(2, min_len=2)]


@dataclass(frozen=True)
class RdmaSection:
    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    sysfs_root: AbsPath = "/sys"
    #: Class of each RDMA port ("mlx5_0/1") or its net device; default "data".
    link_classes: dict[Name, Ident] = field(default_factory=dict)


class CcLayout(StrEnum):
    AUTO = "auto"        # MLNX_OFED's sysfs tree where a port has it, else upstream debugfs
    SYSFS = "sysfs"      # /sys/class/net/<if>/ecn/roce_{rp,np}/ (MLNX_OFED)
    DEBUGFS = "debugfs"  # <debugfs>/mlx5/<pci>/cc_params/ (upstream mlx5)


class Switch(StrEnum):
    """What the loop may do with a per-priority enable flag."""

    KEEP = "keep"  # never touch it
    ON = "on"      # set it, and keep it, on
    OFF = "off"    # set it, and keep it, off
    AUTO = "auto"  # turn it on once the counters show it is missing (never off)


@dataclass(frozen=True)
class CcDeviceSection:
    """One RoCE NIC's ranges: ``[[rdma.cc.devices]]``."""

    STRICT_KEYS: ClassVar[bool] = True
    #: The port's net device (``eth2``) or RDMA device (``mlx5_0``).
    device: Ident
    #: Priorities whose reaction and notification point enable flags the loop may set.
    priorities: Annotated[tuple[Annotated[int, Num(0, 7)], ...], Len(8)] = ()
    rp_enable: Switch = Switch.KEEP
    np_enable: Switch = Switch.KEEP
    #: DCQCN parameter (MLNX_OFED's name) -> [lo, hi]; parameters not named are never set.
    ranges: dict[CcParam, Bound] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(set(self.priorities)) != len(self.priorities):
            raise ValueError(f"{self.device}: priorities: {list(self.priorities)} repeats one")
        for point, switch in (("rp_enable", self.rp_enable), ("np_enable", self.np_enable)):
            if switch is not Switch.KEEP and not self.priorities:
                raise ValueError(f"{self.device}: {point} = \"{switch.value}\" needs priorities")
        for name, (lo, hi) in self.ranges.items():
            param = PARAMS[name]
            if lo > hi:
                raise ValueError(f"{self.device}: ranges.{name}: [{lo}, {hi}]: the lower "
                                 "end is above the upper")
            if lo < param.lo or hi > param.hi:
                raise ValueError(f"{self.device}: ranges.{name}: [{lo}, {hi}] leaves what the "
                                 f"NIC takes, {param.lo}..{param.hi} {param.unit}")


@dataclass(frozen=True)
class RdmaCcSection:
    """DCQCN/ECN congestion control inside the operator's ranges: ``[rdma.cc]``."""

    STRICT_KEYS: ClassVar[bool] = True
    #: Opt-in: nothing on a NIC is changed unless this is true.
    enabled: bool = False
    layout: CcLayout = CcLayout.AUTO
    #: Where upstream mlx5's ``mlx5/<pci>/cc_params`` is (sysfs: observers.rdma.sysfs_root).
    debugfs_root: AbsPath = "/sys/kernel/debug"
    #: Seconds of counters judged together (one decision per device at most per window).
    window: Annotated[float, Num(0.1, 3600.0)] = 1.0
    #: Seconds without loss, throttled and below utilization_target, before a step
    #: towards faster recovery; also the least time between two such steps.
    hold: Annotated[float, Num(0.0, 86400.0)] = 30.0
    #: Decisions per device and minute, at most (a decision may set several values).
    max_changes_per_minute: Annotated[int, Num(1, 600)] = 2
    #: Lost packets (out of sequence, retransmitted, timed out) per packet: at or above
    #: loss_high a step towards a more cautious sender; only at or below loss_low may
    #: the loop step the other way.
    loss_low: Fraction = 0.00001
    loss_high: Fraction = 0.0001
    #: CNPs handled per packet sent at which the port's senders count as throttled.
    cnp_low: Fraction = 0.001
    #: Throttled senders below this utilization of the port recover too slowly.
    utilization_target: Fraction = 0.9
    #: Windows with fewer packets (both directions) are not judged.
    min_packets: Annotated[int, Num(0, 2**40)] = 10_000
    #: Levels between the cautious and the fast end of each steered range.
    steps: Annotated[int, Num(1, 64)] = 8
    devices: Annotated[tuple[CcDeviceSection, ...], Len(64)] = ()

    def __post_init__(self) -> None:
        if not self.loss_low <= self.loss_high:
            raise ValueError("cc: loss_low must not exceed loss_high")
        names = [d.device for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError(f"cc: devices: {sorted(names)} names a device twice")


@dataclass(frozen=True)
class RdmaControlSection:
    """``[rdma]``: what the agent may change on RDMA NICs (observing is [observers.rdma])."""

    STRICT_KEYS: ClassVar[bool] = True
    cc: RdmaCcSection = field(default_factory=RdmaCcSection)
