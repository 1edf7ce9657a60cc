"""An XID's way through the agent visits each domain once: from the step into the GPU
engine, back as conditions and events; no domain calls into another."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agent.observations import Observations
from agent.step import HostHealthEngine
from tests.agent.gpu.test_health import counters, sample

pytestmark = [pytest.mark.gpu, pytest.mark.architecture]

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("gpu", "links", "rdma", "host", "tuning", "validation", "remediation", "energy")


# --- item 3: an XID visits each domain once -------------------------------------------


def domain_of(filename: str) -> str:
    """The agent domain a code file belongs to; "step", "conditions" and the like for
    the agent's top level and shared layers; "" outside the agent."""
    try:
        relative = Path(filename).resolve().relative_to(ROOT / "agent")
    except ValueError:
        return ""
    parts = relative.parts
    return parts[0] if len(parts) > 1 else relative.stem


def test_an_xid_goes_observer_step_gpu_engine_conditions_and_visits_each_domain_once(
) -> None:
    """From the step on, an XID enters the GPU domain once (its engine), from the step,
    and comes back as conditions and events; no domain calls into another."""
    from agent.config import ObserversSection  # noqa: PLC0415

    engine = HostHealthEngine(ObserversSection())
    engine.step(Observations(gpu=sample(counters())), 1.0)
    entries: list[tuple[str, str, str]] = []  # (caller's module, domain entered, function)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee = domain_of(frame.f_code.co_filename)
        caller = domain_of(frame.f_back.f_code.co_filename)
        if callee in DOMAINS and caller != callee:
            entries.append((caller, callee, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        step = engine.step(Observations(gpu=sample(counters(), xids=(79,))), 2.0)
    finally:
        sys.setprofile(None)
    assert any(e.reason == "Xid" for e in step.events)
    assert any(e.reason == "GpuLost" for e in step.events)
    assert [e for e in entries if e[1] == "gpu"] == [("step", "gpu", "step")], entries
    assert [e for e in entries if e[1] == "host"] == [("step", "host", "host_findings")]
    assert {caller for caller, _, _ in entries} == {"step"}, entries
