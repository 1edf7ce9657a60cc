"""Maintenance windows: the provider's window aligned to the job's checkpoints, the
tenant's counter taken within the condition's urgency, overridden past it, standing when
the tenant is silent."""

from __future__ import annotations

import pytest

from controller.negotiation.maintenance import (
    URGENCY,
    Cause,
    MaintenanceAnswer,
    MaintenanceProposal,
    MaintenanceWindow,
    MState,
    checkpoint_starts,
)
from controller.negotiation.types import Error
from tests.controller.negotiation.helpers import T0, one, world

pytestmark = pytest.mark.negotiation

HOUR = 3600.0


def notice(cause: Cause = Cause.CORRECTABLE_TREND, start: float = T0 + 2 * HOUR,
           **kw: object) -> MaintenanceProposal:
    return MaintenanceProposal("vn-1", "a", "job-7", cause, start, 600.0, T0,
                               **kw)  # type: ignore[arg-type]


def test_the_urgency_table_orders_the_conditions_as_the_guide_says() -> None:
    assert URGENCY[Cause.GPU_FAULT].most_wait <= HOUR
    assert URGENCY[Cause.UNCORRECTABLE_MEMORY].most_wait <= 4 * HOUR
    assert URGENCY[Cause.CORRECTABLE_TREND].most_wait >= 24 * HOUR
    assert set(URGENCY) == set(Cause)
    waits = [URGENCY[c].most_wait for c in Cause]
    assert waits == sorted(waits)


def test_the_providers_window_moves_to_the_jobs_next_checkpoint() -> None:
    engine = world()
    window = one(engine, notice(start=T0 + 2 * HOUR, checkpoint_every=HOUR,
                                last_checkpoint=T0 - 600))
    assert isinstance(window, MaintenanceWindow) and window.state is MState.PROPOSED
    assert window.start == T0 + 3 * HOUR - 600
    assert window.latest == T0 + URGENCY[Cause.CORRECTABLE_TREND].most_wait


def test_a_counter_within_the_urgency_is_agreed_at_its_earliest_fitting_window() -> None:
    engine = world()
    one(engine, notice())
    windows = checkpoint_starts(T0, 6 * HOUR, T0 + HOUR, T0 + 72 * HOUR)
    assert windows == (T0 + 6 * HOUR, T0 + 12 * HOUR, T0 + 18 * HOUR, T0 + 24 * HOUR)
    settled = one(engine, MaintenanceAnswer("a", "vn-1", windows), T0 + 60)
    assert (settled.state, settled.start) == (MState.AGREED, T0 + 6 * HOUR)
    # a retry answers the same; another answer is refused
    assert one(engine, MaintenanceAnswer("a", "vn-1", windows), T0 + 61) == settled
    error = one(engine, MaintenanceAnswer("a", "vn-1", ()), T0 + 62)
    assert isinstance(error, Error) and error.field == "notice_id"


def test_a_counter_past_the_urgency_is_overridden_with_the_providers_window() -> None:
    engine = world()
    one(engine, notice(Cause.UNCORRECTABLE_MEMORY, start=T0 + HOUR))
    settled = one(engine, MaintenanceAnswer("a", "vn-1", (T0 + 5 * HOUR,)), T0 + 60)
    assert (settled.state, settled.start) == (MState.OVERRIDDEN, T0 + HOUR)


def test_accepting_keeps_the_providers_window() -> None:
    engine = world()
    one(engine, notice())
    settled = one(engine, MaintenanceAnswer("a", "vn-1"), T0 + 60)
    assert (settled.state, settled.start) == (MState.AGREED, T0 + 2 * HOUR)


def test_a_silent_tenant_lets_the_window_stand_and_it_is_forgotten_later() -> None:
    engine = world()
    one(engine, notice())
    answer_by = T0 + 2 * HOUR - URGENCY[Cause.CORRECTABLE_TREND].least_notice
    out, deadline = engine.step([], answer_by - 1)
    assert out == [] and deadline == answer_by
    out, deadline = engine.step([], answer_by)
    assert [w.state for w in out] == [MState.STOOD]
    assert deadline is not None
    engine.step([], deadline)
    assert engine.maintenance.items == {}


@pytest.mark.parametrize(("item", "field"), [
    (notice(start=T0 + 60), "start"),  # less notice than the condition's least
    (notice(Cause.GPU_FAULT, start=T0 + 2 * HOUR), "start"),  # later than it may wait
    (MaintenanceProposal("vn 1", "a", "j", Cause.ROUTINE, T0 + HOUR * 2, 60.0, T0),
     "notice_id"),
    (MaintenanceProposal("vn-1", "a", "j", Cause.ROUTINE, T0 + HOUR * 2, 0.0, T0), "pause"),
    (MaintenanceAnswer("a", "vn-9", ()), "notice_id"),
    (MaintenanceAnswer("mallory", "vn-9", ()), "tenant"),
])
def test_bad_maintenance_input_names_its_field(item: object, field: str) -> None:
    engine = world()
    error = one(engine, item)
    assert isinstance(error, Error) and error.field == field
    assert engine.maintenance.items == {}


def test_another_tenants_notice_and_too_many_windows_are_refused() -> None:
    engine = world()
    one(engine, notice())
    error = one(engine, MaintenanceAnswer("b", "vn-1", ()), T0 + 1)
    assert isinstance(error, Error) and error.message == "no such notice of yours"
    error = one(engine, MaintenanceAnswer("a", "vn-1", tuple(T0 + i * HOUR
                                                             for i in range(3, 8))))
    assert isinstance(error, Error) and error.field == "windows"
    assert engine.maintenance.items["vn-1"].state is MState.PROPOSED
