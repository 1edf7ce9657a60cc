"""A job's own XID goes out once, however often the host's step repeats a pass it has
nothing new for (a duplicate reached the owner once: the step repeated the GPU step)."""

from __future__ import annotations

import pytest

from agent.config import ObserversSection
from agent.gpu.types import GpuProcess, JobRef
from agent.observations import Observations
from agent.step import HostHealthEngine
from tests.agent.gpu.test_health import sample, telemetry

pytestmark = pytest.mark.jobhealth


def test_an_application_xid_is_published_once_across_repeated_passes() -> None:
    engine = HostHealthEngine(ObserversSection())
    ref = JobRef("job-1", "0")
    busy = telemetry(processes=(GpuProcess(100, 1 << 30),))
    engine.step(Observations(gpu=sample(t=busy, jobs=(ref,), owners={100: ref})), 0.0)
    observed = Observations(gpu=sample(t=busy, xids=(13,), jobs=(ref,), owners={100: ref}))
    engine.step(observed, 1.0)
    told = []
    for now in (3.5, 3.6, 3.7, 4.0):  # the same observation: the step repeats its last
        told += engine.step(observed, now).gpus.application_xids
    assert [(x.job, x.xid, x.ranks) for x in told] == [("job-1", 13, ("0",))]
