"""RDMA congestion control inside the agent: the I/O shell around :class:`CcLoop`.

At start it puts back what a previous agent changed and could not restore (it
was killed), then finds each configured device's settings (MLNX_OFED's sysfs
tree or upstream mlx5's debugfs). At each window the loop asks for, it reads
the declared settings, steps the loop with them and the RDMA observer's
counters, and carries out its decisions: each value's original is recorded
durably before the first change, then the new value is written. At stop every
original is written back.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from agent.rdma import knobs
from agent.rdma.cc import CcLoop, CcObservations, DeviceSettings, SetKnob
from agent.rdma.ccparams import PARAMS, enable_knob
from agent.rdma.observer import discover
from agent.rdma.originals import Original, Originals, OriginalsError
from agent.rdma.settings import CcDeviceSection, RdmaCcSection, Switch
from agent.rdma.types import RdmaSample
from harmonaize.schema import to_plain

log = logging.getLogger(__name__)

ORIGINALS_FILE = "rdma-cc-originals.json"


class RdmaCcService:
    def __init__(self, cfg: RdmaCcSection, sysfs_root: str, state_dir: str) -> None:
        self.cfg = cfg
        self.sysfs_root = sysfs_root
        self.loop = CcLoop(cfg)
        self.originals = Originals(Path(state_dir) / ORIGINALS_FILE)
        #: Configured device -> where its settings are, or why there are none.
        self.devices: dict[str, knobs.CcDevice | str] = {}
        self.ports: dict[str, str] = {}
        self.current: dict[str, DeviceSettings] = {}
        self.changes: Counter[str] = Counter()
        self.failures = 0
        self.restored_at_start = 0
        #: Set when changing anything would break the promise to restore it.
        self.refused = ""
        self.last_error = ""

    # --- lifecycle ------------------------------------------------------------------

    def start(self, now: float) -> None:
        try:
            left = self.originals.load()
        except OriginalsError as exc:
            self.refused = (f"not changing anything: {exc} (restore the values it names, "
                            "then remove it)")
            log.error("rdma cc: %s", self.refused)
            left = []
        if left:
            back, kept = self._put_back(left)
            self.restored_at_start = len(back)
            log.warning("rdma cc: put back %d value(s) a previous agent left changed%s",
                        len(back), f"; {len(kept)} could not be, kept for the next start"
                        if kept else "")
        self._resolve()

    def _resolve(self) -> None:
        by_netdev = {p.netdev: f"{p.device}/{p.port}" for p in discover(self.sysfs_root)
                     if p.netdev}
        by_device = {f"{p.device}": (p.netdev, f"{p.device}/{p.port}")
                     for p in discover(self.sysfs_root)}
        for device in self.cfg.devices:
            netdev, port = device.device, by_netdev.get(device.device, "")
            if device.device in by_device:
                netdev, port = by_device[device.device]
            self.ports[device.device] = port
            found = knobs.find(self.sysfs_root, self.cfg.debugfs_root, netdev, self.cfg.layout)
            self.devices[device.device] = found
            if isinstance(found, str):
                log.warning("rdma cc: %s: %s", device.device, found)
            else:
                log.info("rdma cc: %s: %s layout at %s, port %s", device.device, found.layout,
                         found.base, port or "not found")

    def stop(self) -> None:
        """Every changed value back to what it was."""
        if not self.originals.values:
            return
        back, kept = self._put_back(list(self.originals.values.values()))
        log.info("rdma cc: put back %d value(s)%s", len(back),
                 f"; {len(kept)} could not be and wait for the next start" if kept else "")

    def _put_back(self, originals: list[Original]) -> tuple[list[str], list[str]]:
        back, kept, dropped = [], [], []
        for original in originals:
            if not knobs.allowed_path(original.path, self.sysfs_root, self.cfg.debugfs_root):
                log.error("rdma cc: %s is not a DCQCN setting under the configured roots: "
                          "left alone", original.path)
                dropped.append(original.path)
                continue
            try:
                knobs.write_value(Path(original.path), original.value)
            except knobs.KnobError as exc:
                log.warning("rdma cc: putting back %s: %s", original.knob, exc)
                kept.append(original.path)
                continue
            back.append(original.path)
        self.originals.forget(back + dropped)
        return back, kept

    # --- each window ------------------------------------------------------------------

    def next_deadline(self) -> float:
        return float("inf") if self.refused else self.loop.next_deadline()

    def step(self, sample: RdmaSample | None, now: float) -> None:
        if now < self.next_deadline():
            return
        settings = tuple(self._settings(device) for device in self.cfg.devices)
        self.current = {s.device: s for s in settings}
        for action in self.loop.step(CcObservations(sample, settings), now):
            self._apply(action, now)

    @staticmethod
    def _knobs(device: CcDeviceSection) -> list[str]:
        out = [str(name) for name in device.ranges]
        for point, switch in (("rp", device.rp_enable), ("np", device.np_enable)):
            if switch is not Switch.KEEP:
                out += [enable_knob(point, p) for p in device.priorities]
        return out

    def _settings(self, device: CcDeviceSection) -> DeviceSettings:
        found = self.devices.get(device.device)
        port = self.ports.get(device.device, "")
        if found is None or isinstance(found, str):
            return DeviceSettings(device.device, port, error=found or "not resolved")
        values, unsettable = {}, []
        for knob in self._knobs(device):
            value = found.read(knob)
            if value is None:
                unsettable.append(knob)
            else:
                values[knob] = value
        return DeviceSettings(device.device, port, found.layout, values, tuple(unsettable))

    def _apply(self, action: SetKnob, now: float) -> None:
        found = self.devices[action.device]
        assert isinstance(found, knobs.CcDevice)
        path = found.path(action.knob)
        try:
            if path is None:
                raise knobs.KnobError(f"{action.knob} has no file in the {found.layout} layout")
            # Durable before the NIC changes: a crash between the two restores a value
            # that was never changed, which is harmless.
            self.originals.remember(Original(action.device, action.knob, str(path),
                                             action.previous))
            found.write(action.knob, action.value)
        except OSError as exc:
            self.failures += 1
            self.last_error = f"{action.device} {action.knob}: {exc}"
            log.warning("rdma cc: %s", self.last_error)
            self.loop.failed(action, str(exc), now)
            return
        self.changes[action.device] += 1
        log.info("rdma cc: %s %s %d -> %d: %s", action.device, action.knob, action.previous,
                 action.value, action.reason)

    # --- views ------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        loop = self.loop.describe()
        devices = []
        for device in self.cfg.devices:
            found = self.devices.get(device.device)
            current = self.current.get(device.device)
            originals = {o.knob: o.value for o in self.originals.values.values()
                         if o.device == device.device}
            knobs_ = []
            switches = {"rp": device.rp_enable.value, "np": device.np_enable.value}
            for knob in self._knobs(device):
                param = PARAMS.get(knob)
                knobs_.append({
                    "knob": knob, "unit": param.unit if param else "flag",
                    # A parameter's [lo, hi]; an enable flag's switch (on, off, auto).
                    "range": loop[device.device]["ranges"].get(knob) if param
                    else switches[knob[:2]],
                    "current": current.values.get(knob) if current else None,
                    "original": originals.get(knob),
                })
            state = loop[device.device]
            devices.append({
                "device": device.device,
                "port": self.ports.get(device.device, ""),
                "layout": found.layout if isinstance(found, knobs.CcDevice) else None,
                "where": str(found.base) if isinstance(found, knobs.CcDevice) else None,
                "error": found if isinstance(found, str) else "",
                "level": state["level"], "steps": state["steps"],
                "waiting": state["waiting"],
                "evidence": to_plain(state["evidence"]) if state["evidence"] else None,
                "priorities": state["priorities"],
                "rp_enable": state["rp_enable"], "np_enable": state["np_enable"],
                "settings": knobs_,
                "changes": self.changes[device.device],
            })
        return {
            "enabled": self.cfg.enabled,
            "refused": self.refused,
            "window": self.cfg.window,
            "restored_at_start": self.restored_at_start,
            "failures": self.failures,
            "last_error": self.last_error,
            "devices": devices,
            "history": [dataclasses.asdict(d) for d in reversed(self.loop.history)],
        }
