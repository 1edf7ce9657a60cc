"""The host's side of a negotiated maintenance window (sans-I/O): it names the condition
behind each validation from the GPU domain's reason, moves a plan to an agreed window,
and refuses a window later than the condition may wait, whatever the controller said."""

from __future__ import annotations

import pytest

from agent.gpu.types import JobRef
from agent.validation.causes import cause_of
from agent.validation.planner import Device, Planner, PlannerSettings, lead
from harmonaize.maintenancetables import NOTICE_MARGIN, URGENCY
from harmonaize.maintenancetables import ValidationCause as Cause

pytestmark = [pytest.mark.validation, pytest.mark.negotiation]

T0 = 1_000_000.0


@pytest.mark.parametrize(("state", "why", "trigger", "cause"), [
    ("suspect", "EccCorrectableRate: 900 single-bit ECC errors in the last minute",
     "suspect", Cause.CORRECTABLE_TREND),
    ("suspect", "RowRemapPending: row remapping waits for a GPU reset", "suspect",
     Cause.UNCORRECTABLE_MEMORY),
    ("suspect", "Xid: xid 74 (NVLink error)", "suspect", Cause.LINK_DEGRADED),
    ("suspect", "Xid: xid 92 (excessive single-bit ECC interrupts); xid 63 (row remap)",
     "suspect", Cause.UNCORRECTABLE_MEMORY),  # the most urgent of its XIDs
    ("quarantined", "Xid: xid 79 (fell off the bus)", "after-repair", Cause.GPU_FAULT),
    ("quarantined", "validation failed: burn below baseline", "after-repair",
     Cause.GPU_FAULT),
    ("suspect", "ThermalSlowdown: clock event reasons 0x20", "suspect", Cause.THERMAL),
    ("suspect", "EccCorrectableRate: climbing", "operator", Cause.ROUTINE),
    ("healthy", "", "schedule", Cause.ROUTINE),
    ("suspect", "SomethingNew: unheard of", "suspect", Cause.ROUTINE),
])
def test_the_condition_is_named_from_the_gpu_domains_reason(
        state: str, why: str, trigger: str, cause: Cause) -> None:
    assert cause_of(state, why, trigger) is cause


def planned(why: str) -> tuple[Planner, str]:
    planner = Planner(PlannerSettings(cooldown=100.0, notice_lead=600.0),
                      lambda key, level: 60.0)
    device = Device("gpu:2", 2, "suspect", (JobRef("job-a", "5"),), why=why)
    starts, (plan,) = planner.step([device], T0, running=set(), last_done={},
                                   allowance=lambda job: 600.0)
    assert starts == [] and plan.start_at == T0 + 600.0 and plan.issued_at == T0
    return planner, plan.id


def test_an_agreed_window_moves_the_plan_and_it_starts_then() -> None:
    planner, plan_id = planned("EccCorrectableRate: climbing")
    plan, why = planner.answer(plan_id, "job-a", T0 + 5, start=T0 + 60)
    assert plan is not None and (plan.start_at, plan.window) == (T0 + 60, T0 + 60), why
    device = Device("gpu:2", 2, "suspect", (JobRef("job-a", "5"),))
    step = dict(running=set(), last_done={}, allowance=lambda job: 600.0)
    assert planner.step([device], T0 + 59, **step) == ([], [])
    starts, announced = planner.step([device], T0 + 60, **step)
    # it starts, and the device (still suspect) is not planned again while it does
    assert [p.id for p in starts] == [plan_id] and announced == []


def test_a_window_past_the_conditions_bound_is_refused_by_the_host() -> None:
    planner, plan_id = planned("EccUncorrectable: 1 new double-bit ECC error(s)")
    bound = T0 + URGENCY[Cause.UNCORRECTABLE_MEMORY].most_wait
    plan, why = planner.answer(plan_id, "job-a", T0 + 5, start=bound + 1)
    assert plan is None and "uncorrectable-memory" in why
    assert planner.scheduled["gpu:2"].start_at == T0 + 600.0
    plan, _ = planner.answer(plan_id, "job-a", T0 + 5, start=bound)
    assert plan is not None and plan.start_at == bound


def test_an_approval_after_a_window_still_starts_it_now() -> None:
    planner, plan_id = planned("EccCorrectableRate: climbing")
    # What the controller sends once the window is agreed and the job then approves.
    plan, why = planner.answer(plan_id, "job-a", T0 + 5, start=T0 + 60, approve=True)
    assert plan is not None and plan.start_at == T0 + 5, why


def announced(jobs: tuple[JobRef, ...], negotiating: set[str], why: str,
              notice_lead: float = 30.0) -> float:
    """The lead the host gives a suspect GPU's jobs under ``notice_lead``, where the jobs
    in ``negotiating`` declared a checkpoint cadence."""
    planner = Planner(PlannerSettings(cooldown=100.0, notice_lead=notice_lead),
                      lambda key, level: 60.0)
    _, (plan,) = planner.step([Device("gpu:2", 2, "suspect", jobs, why=why)], T0,
                              running=set(), last_done={}, allowance=lambda job: 600.0,
                              negotiates=lambda job: job in negotiating)
    assert plan.issued_at == T0
    return plan.start_at - T0


@pytest.mark.parametrize(("why", "cause"), [
    ("GpuUnresponsive: no answer", Cause.GPU_FAULT),
    ("EccUncorrectable: 1 new double-bit ECC error(s)", Cause.UNCORRECTABLE_MEMORY),
    ("EccCorrectableRate: climbing", Cause.CORRECTABLE_TREND),
])
def test_a_job_that_negotiates_gets_its_conditions_least_notice(
        why: str, cause: Cause) -> None:
    a, b = JobRef("job-a", "5"), JobRef("job-b", "0")
    urgency = URGENCY[cause]
    # Under the default lead, a job that gave its checkpoint cadence is told early
    # enough for the controller to negotiate (its least notice, and a margin for the
    # notice's way there) ...
    assert announced((a,), {"job-a"}, why) == urgency.least_notice + NOTICE_MARGIN
    # ... one of two jobs on the GPU is enough (a window moves the plan for both) ...
    assert announced((a, b), {"job-b"}, why) == urgency.least_notice + NOTICE_MARGIN
    # ... a longer lead of the host's own stands, and jobs that declared nothing keep
    # the short one.
    assert announced((a,), {"job-a"}, why, notice_lead=3000.0) == max(
        3000.0, urgency.least_notice + NOTICE_MARGIN)
    assert announced((a, b), set(), why) == 30.0


def test_the_lead_never_passes_the_conditions_bound() -> None:
    for cause, urgency in URGENCY.items():
        for notice_lead in (0.0, 30.0, 3600.0):
            ahead = lead(notice_lead, cause, True)
            assert urgency.least_notice < ahead <= urgency.most_wait
            assert lead(notice_lead, cause, False) == notice_lead
