"""Pytest fixtures for a real Slurm cluster (testbed.slurm).

A test module names this module in ``pytest_plugins = ["tests.slurmcluster"]``:
``slurm`` is a started two-node cluster; ``make_slurm(...)`` starts clusters with the
caller's nodes and ``slurm.conf`` lines. Both are torn down after the test, pass or fail,
and skip the test where Slurm cannot run (not root, packages missing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from testbed import slurm as testbed
from testbed.slurm import SlurmCluster


def _skip_unless_runnable() -> None:
    reason = testbed.missing()
    if reason is not None:
        pytest.skip(f"Slurm testbed: {reason}")


@pytest.fixture
def make_slurm() -> Iterator[Callable[..., SlurmCluster]]:
    """Start Slurm clusters (SlurmCluster's arguments); all are stopped at teardown."""
    _skip_unless_runnable()
    clusters: list[SlurmCluster] = []

    def start(*args: Any, **kwargs: Any) -> SlurmCluster:
        cluster = SlurmCluster(*args, **kwargs)
        clusters.append(cluster)  # before start: a half-started cluster is stopped too
        cluster.start()
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()


@pytest.fixture
def slurm(make_slurm: Callable[..., SlurmCluster]) -> SlurmCluster:
    """A started cluster of two nodes in one partition ``gpu``."""
    return make_slurm(count=2)
