"""A rank launched by plain srun names its job to the tuner plugin by SLURM_JOB_ID (issue
29, item 1: no variable of ours), the id its placement and the agent use; HARMONAIZE_JOB,
where set, still comes first."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from tests.plugin.test_tuner_abi import COMM as COMM_ID
from tests.plugin.test_tuner_abi import (
    JOB,
    RULES,
    choice,
    environ,
    listed,
    opened,
    publish,
)

# The plugin tests' fixtures, under these names here.
from tests.plugin.test_tuner_abi import lib as lib_fixture  # noqa: F401
from tests.plugin.test_tuner_abi import tuner_dir as tuner_dir_fixture  # noqa: F401

pytestmark = pytest.mark.scheduler


def test_plugin_follows_the_policy_of_the_slurm_job_that_launched_it(
        lib_fixture: ctypes.CDLL, tuner_dir_fixture: Path) -> None:  # noqa: F811
    lib, tuner_dir = lib_fixture, tuner_dir_fixture
    publish(tuner_dir, listed(COMM_ID, None, 0, 0, RULES))
    with environ(SLURM_JOB_ID=JOB), opened(lib, 5, tuner_dir, job=None) as ctx:
        assert ctx.handle.value is not None
        assert choice(ctx) is not None
    # Another job's id names another directory: nothing there, NCCL's own choice.
    with environ(SLURM_JOB_ID="other-job"), opened(lib, 5, tuner_dir, job=None) as ctx:
        assert choice(ctx) is None
    # HARMONAIZE_JOB, where a launcher sets it, is what names the job.
    with environ(SLURM_JOB_ID="other-job"), opened(lib, 5, tuner_dir, job=JOB) as ctx:
        assert choice(ctx) is not None
    # Neither: inert, as before.
    with environ(SLURM_JOB_ID=None), opened(lib, 5, tuner_dir, job=None) as ctx:
        assert ctx.handle.value is None
