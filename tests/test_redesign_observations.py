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
