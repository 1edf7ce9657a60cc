"""Validation checks behind one small interface, and the results they give.

A check validates one target (a GPU, or the host) within a time budget and
returns a structured result: pass, fail or error, the values it measured
(each with its baseline), why, and what to do if it failed. Three kinds:

* static checks over the latest NVML snapshot (no load, seconds);
* external commands the operator configures (``dcgmi diag``, a GEMM or memory
  burn, nccl-tests' ``all_reduce_perf``), with a parser for their output;
* a network check: iperf3 bandwidth over the data interface to a peer host.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agent.conditions import RECOVERY_ACTIONS, Action
from agent.gpu.interface import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, GpuSnapshot


class Outcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"  # the check could not say (missing tool, bad output): not the GPU's fault


@dataclass(frozen=True)
class Measurement:
    name: str
    value: float
    unit: str = ""
    baseline: float | None = None
    higher_is_better: bool = True


@dataclass(frozen=True)
class CheckResult:
    check: str
    outcome: Outcome
    reason: str
    measurements: tuple[Measurement, ...] = ()
    duration: float = 0.0
    #: What to do when it failed.
    action: Action = Action.NONE


@dataclass(frozen=True)
class Target:
    """What is validated: one GPU (with its latest snapshot), or the host."""

    gpu: int | None
    snapshot: GpuSnapshot | None = None

    @property
    def key(self) -> str:
        return "host" if self.gpu is None else f"gpu:{self.gpu}"


# --- static checks over NVML ------------------------------------------------------------


@dataclass(frozen=True)
class StaticLimits:
    retired_pages_limit: int = 60


def static_checks(target: Target, limits: StaticLimits) -> list[CheckResult]:
    """The level-1 checks: what the driver already knows, judged without load."""
    snap = target.snapshot
    if snap is None:
        return [CheckResult("nvml-static", Outcome.ERROR, "no NVML snapshot of this GPU")]
    if snap.lost:
        return [CheckResult("nvml-static", Outcome.FAIL, "the GPU is lost",
                            action=Action.REBOOT_NODE)]
    results = []
    counters = snap.counters.values if snap.counters else {}
    failed = bool(counters.get("remap_failure"))
    pending = bool(counters.get("remap_pending")) or bool(counters.get("retired_pending"))
    retired = (counters.get("retired_sbe") or 0) + (counters.get("retired_dbe") or 0)
    if failed or retired >= limits.retired_pages_limit:
        results.append(CheckResult(
            "memory-repair", Outcome.FAIL,
            "a row remapping failed" if failed else f"{retired} retired pages",
            (Measurement("retired_pages", retired, "pages", limits.retired_pages_limit, False),),
            action=Action.RMA))
    elif pending:
        results.append(CheckResult("memory-repair", Outcome.FAIL,
                                   "a row remap or page retirement waits for a reset",
                                   action=Action.RESET_GPU))
    else:
        results.append(CheckResult("memory-repair", Outcome.PASS, "no pending or failed repair"))
    identity, telemetry = snap.identity, snap.telemetry
    if telemetry is not None and identity.pcie_max_width and telemetry.pcie_width is not None:
        narrow = telemetry.pcie_width < identity.pcie_max_width
        results.append(CheckResult(
            "pcie-link", Outcome.FAIL if narrow else Outcome.PASS,
            f"PCIe width x{telemetry.pcie_width} of x{identity.pcie_max_width}",
            (Measurement("pcie_width", telemetry.pcie_width, "lanes", identity.pcie_max_width),),
            action=Action.RESET_GPU if narrow else Action.NONE))
    if identity.nvlinks and telemetry is not None and telemetry.nvlinks_up is not None:
        down = telemetry.nvlinks_up < identity.nvlinks
        results.append(CheckResult(
            "nvlink", Outcome.FAIL if down else Outcome.PASS,
            f"{telemetry.nvlinks_up} of {identity.nvlinks} NVLinks up",
            (Measurement("nvlinks_up", telemetry.nvlinks_up, "links", identity.nvlinks),),
            action=Action.RESET_GPU if down else Action.NONE))
    reasons = snap.counters.clocks_event_reasons if snap.counters else None
    if reasons is not None:
        # Software caps (power limit, app clocks, idle) are policy; these come from the board.
        hardware = reasons & (HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE)
        results.append(CheckResult(
            "clocks", Outcome.FAIL if hardware else Outcome.PASS,
            f"hardware clock slowdown active (reasons {reasons:#x})" if hardware
            else "no hardware clock slowdown", action=Action.DRAIN if hardware else Action.NONE))
    recovery = RECOVERY_ACTIONS.get(counters.get("recovery_action") or 0, Action.RESET_GPU)
    results.append(CheckResult(
        "recovery-action", Outcome.FAIL if recovery is not Action.NONE else Outcome.PASS,
        f"the driver asks for {recovery.value}" if recovery is not Action.NONE
        else "the driver asks for nothing", action=recovery))
    return results


# --- output parsers for external commands ------------------------------------------------

Parser = Callable[[str, int], tuple[Outcome, str, list[Measurement]]]

_METRIC = re.compile(r"^metric\s+([A-Za-z0-9_.:-]+)\s+([-+0-9.eE]+)(?:\s+(\S+))?\s*$")


def parse_exit_code(out: str, code: int) -> tuple[Outcome, str, list[Measurement]]:
    if code == 0:
        return Outcome.PASS, "exited 0", []
    return Outcome.FAIL, f"exited {code}", []


def parse_metrics(out: str, code: int) -> tuple[Outcome, str, list[Measurement]]:
    """Lines ``metric NAME VALUE [UNIT]``; a name starting with ``-`` is lower-is-better."""
    measurements = []
    for line in out.splitlines():
        match = _METRIC.match(line.strip())
        if match is None:
            continue
        try:
            value = float(match[2])
        except ValueError:
            continue
        if math.isfinite(value):
            name = match[1]
            measurements.append(Measurement(name.lstrip("-"), value, match[3] or "",
                                            higher_is_better=not name.startswith("-")))
    if code != 0:
        return Outcome.FAIL, f"exited {code}", measurements
    if not measurements:
        return Outcome.ERROR, "exited 0 but printed no 'metric NAME VALUE' line", []
    return Outcome.PASS, "exited 0", measurements


_BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)")


def parse_nccl_tests(out: str, code: int) -> tuple[Outcome, str, list[Measurement]]:
    """nccl-tests: the "Avg bus bandwidth" line (GB/s), and "Out of bounds values : 0"."""
    match = _BUSBW.search(out)
    if code != 0:
        return Outcome.FAIL, f"exited {code}", []
    if match is None:
        return Outcome.ERROR, "no 'Avg bus bandwidth' line in the output", []
    wrong = re.search(r"Out of bounds values\s*:\s*(\d+)", out)
    if wrong and int(wrong[1]) > 0:
        return Outcome.FAIL, f"{wrong[1]} wrong values", []
    return Outcome.PASS, "completed", [Measurement("busbw", float(match[1]), "GB/s")]


def parse_dcgmi_json(out: str, code: int) -> tuple[Outcome, str, list[Measurement]]:
    """``dcgmi diag -j``: any test whose result is "Fail" fails the check."""
    try:
        report = json.loads(out[out.index("{"):]) if "{" in out else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        return (Outcome.FAIL if code else Outcome.ERROR), "no JSON report from dcgmi", []
    failed: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = node.get("test_name") or node.get("name")
            results = node.get("results")
            status = node.get("status") or node.get("result")
            if isinstance(status, str) and status.lower() == "fail" and isinstance(name, str):
                failed.append(name)
            if isinstance(results, list):
                for item in results:
                    if isinstance(item, dict) and str(item.get("status", "")).lower() == "fail":
                        failed.append(str(name or "a test"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(report)
    if failed:
        return Outcome.FAIL, "failed: " + ", ".join(sorted(set(failed)))[:500], []
    if code != 0:
        return Outcome.FAIL, f"dcgmi exited {code}", []
    return Outcome.PASS, "every test passed", []


def parse_iperf3(out: str, code: int) -> tuple[Outcome, str, list[Measurement]]:
    try:
        report = json.loads(out)
        bps = float(report["end"]["sum_received"]["bits_per_second"])
    except (ValueError, KeyError, TypeError):
        return Outcome.ERROR, f"no iperf3 result (exit {code})", []
    if code != 0:
        return Outcome.ERROR, f"iperf3 exited {code}", []
    return Outcome.PASS, "transferred", [Measurement("bandwidth", bps / 1e9, "Gb/s")]


PARSERS: Mapping[str, Parser] = {
    "exit-code": parse_exit_code,
    "metrics": parse_metrics,
    "nccl-tests": parse_nccl_tests,
    "dcgmi-json": parse_dcgmi_json,
    "iperf3": parse_iperf3,
}


@dataclass(frozen=True)
class CommandSpec:
    """An external check: a command line with {gpu} and {level} placeholders."""

    name: str
    argv: Sequence[str]
    parser: str = "exit-code"
    levels: frozenset[int] = frozenset({2, 3})
    budget: float = 120.0
    #: "gpu" runs once per validated GPU; "host" once for the host.
    scope: str = "gpu"
    #: Fixed baselines per measurement name; others are learned from passing runs.
    baselines: Mapping[str, float] = field(default_factory=dict)
    #: What to recommend when it fails.
    on_fail: Action = Action.RESET_GPU

    def render(self, target: Target, level: int) -> list[str]:
        values = {"gpu": "" if target.gpu is None else str(target.gpu), "level": str(level)}
        return [part.format_map(values) for part in self.argv]
