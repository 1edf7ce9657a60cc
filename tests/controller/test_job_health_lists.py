"""A job-health message stays within the wire's limits for a job of any size."""

from __future__ import annotations

import pytest

from controller.jobredaction import MEMBERS_LISTED, job_health
from controller.redactionconfig import RedactionConfig
from controller.types import Member, Placement
from harmonaize.messages import TuningStatus, decode, encode

pytestmark = pytest.mark.jobhealth


def test_a_job_of_2048_members_on_lost_hosts_is_told_the_first_ones_in_a_valid_message():
    members = tuple(Member(f"{r:04d}", f"h{r // 8}") for r in range(2048))
    health = job_health(RedactionConfig(), Placement("big", "acme", members), {},
                        ("default", TuningStatus.STEADY))
    assert health.lost == tuple(f"{r:04d}" for r in range(MEMBERS_LISTED))
    assert decode(encode(health, sender="controller")).body == health
