"""The observations record: built in one place, typed, strict about what it holds."""

from __future__ import annotations

import dataclasses

import pytest

from agent.host.types import HostSample
from agent.observations import Observations
from agent.observers import registered

pytestmark = pytest.mark.redesign


def test_every_registered_observer_has_a_field() -> None:
    assert set(registered()) == {f.name for f in dataclasses.fields(Observations)}


def test_samples_land_in_their_fields_and_a_missing_one_is_none() -> None:
    host = HostSample(0.1, 100, 50, 0.5, 100.0)
    observations = Observations.of({"host": host})
    assert observations.host is host  # the same object: engines skip unchanged samples
    assert (observations.links, observations.rdma, observations.gpu) == (None, None, None)


def test_a_sample_of_the_wrong_kind_or_observer_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="observer gpu returned a HostSample, not a GpuSample"):
        Observations.of({"gpu": HostSample(0.1, 100, 50, 0.5, 100.0)})
    with pytest.raises(TypeError, match="no observation field for observer"):
        Observations.of({"disks": object()})


# --- "did anything change?" is the observation's number, not the object ----------------


def test_the_gpu_engine_judges_by_numbers_not_by_objects() -> None:
    import copy  # noqa: PLC0415

    from agent.gpu.health import GpuHealthEngine  # noqa: PLC0415
    from agent.gpu.settings import GpuObserverSection  # noqa: PLC0415
    from agent.gpu.types import XID_EVENT, GpuSample, NvmlEvent  # noqa: PLC0415
    from tests.agent.gpu.test_health import sample  # noqa: PLC0415

    engine = GpuHealthEngine(GpuObserverSection())
    first = sample(xids=(999,))
    engine.step(first, 0.0)
    assert engine.gpus[0].xid_count == 1
    # An equal copy under the same number is the same observation: its XID is not
    # counted twice, whatever object carries it.
    engine.step(copy.deepcopy(first), 0.1)
    assert engine.gpus[0].xid_count == 1
    evaluated = engine.gpus[0].evaluated_at
    # A new observation whose readings did not move: the GPU is not judged again
    # before its next full evaluation, though every object in it is new ...
    quiet = GpuSample(copy.deepcopy(first.gpus), (), call_timeout=2.0, seq=first.seq + 10_000)
    engine.step(quiet, 0.2)
    assert engine.gpus[0].evaluated_at == evaluated
    # ... and a new observation's events count even with the same readings.
    again = GpuSample(first.gpus, (NvmlEvent(0, XID_EVENT, 999, 0.3),), call_timeout=2.0,
                      seq=first.seq + 10_001)
    engine.step(again, 0.3)
    assert engine.gpus[0].xid_count == 2 and engine.gpus[0].evaluated_at == 0.3


def test_observation_numbers_and_reading_versions_never_repeat_across_observers() -> None:
    from agent.gpu import nvml, observer  # noqa: PLC0415

    # Process-wide counters: an observer restarted by a reload cannot reuse a number
    # the engine already stepped on (its new events would be taken for old ones).
    assert next(observer.SAMPLES) < next(observer.SAMPLES)
    assert next(nvml.VERSIONS) < next(nvml.VERSIONS)
