"""The agent says when a validation waits for its host to be idle (``idle_wanted``), so
the controller can reserve the node in Slurm; and scontrol's output as the loop reads it."""

from __future__ import annotations

import pytest

from agent.gpu.types import JobRef
from agent.validation.planner import Device, Planner, PlannerSettings
from controller.scheduler.slurm import parse_nodes, parse_reservations

pytestmark = pytest.mark.scheduler


def _step(p: Planner, devices: list[Device], now: float, running: set[str] | None = None,
          allowance: float = 0.0) -> list[str]:
    starts, _ = p.step(devices, now, running=running or set(), last_done={},
                       allowance=lambda job: allowance)
    return [plan.key for plan in starts]


def test_a_validation_waiting_for_a_tenants_job_wants_the_host_idle_until_it_ran() -> None:
    p = Planner(PlannerSettings(cooldown=100.0), lambda key, level: 60.0)
    busy = Device("gpu:2", 2, "suspect", (JobRef("job-a", "0"),))
    assert _step(p, [busy], 0.0) == [] and p.idle_wanted == {"gpu:2"}
    assert _step(p, [busy], 1.0) == [] and p.idle_wanted == {"gpu:2"}
    idle = Device("gpu:2", 2, "suspect")  # the job ended: the validation starts
    assert _step(p, [idle], 2.0) == ["gpu:2"] and p.idle_wanted == {"gpu:2"}
    assert _step(p, [idle], 3.0, running={"gpu:2"}) == [] and p.idle_wanted == {"gpu:2"}
    done = Device("gpu:2", 2, "healthy")
    assert _step(p, [done], 4.0) == [] and p.idle_wanted == set()


def test_a_validation_with_no_job_in_the_way_wants_nothing_of_the_scheduler() -> None:
    p = Planner(PlannerSettings(), lambda key, level: 60.0)
    assert _step(p, [Device("gpu:0", 0, "suspect")], 0.0) == ["gpu:0"]
    assert p.idle_wanted == set()


SHOW_NODE = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 State=IDLE+DRAIN "
    "ThreadsPerCore=1 Partitions=gpu,debug  BootTime=2026-12-03T09:42:46 "
    "ExtSensorsTemp=n/s Reason=hz: gpu 2 quarantined: drain [root@2026-12-03T14:57:31]\n"
    "NodeName=n2 Arch=x86_64 State=DOWN+DRAIN+REBOOT_ISSUED Partitions=gpu  "
    "Reason=hz: reboot : reboot issued [slurm@2026-12-03T14:57:32]\n"
    "NodeName=n3 Arch=x86_64 State=IDLE* Partitions=gpu  CapWatts=n/a\n"
    "NodeName=n4 State=MIXED Partitions=gpu Reason=fan = broken, see [ticket 7]\n"
)


def test_scontrol_show_node_is_read_with_flags_reason_and_partitions() -> None:
    n1, n2, n3, n4 = parse_nodes(SHOW_NODE)
    assert n1.flags == {"IDLE", "DRAIN"} and n1.partitions == ("gpu", "debug")
    assert n1.reason == "hz: gpu 2 quarantined: drain"
    assert n2.rebooting and n2.reason == "hz: reboot : reboot issued"
    assert n3.flags == {"IDLE", "NOT_RESPONDING"} and n3.reason == ""
    assert n4.reason == "fan = broken, see [ticket 7]"
    assert parse_reservations("No reservations in the system\n") == frozenset()
    assert parse_reservations("ReservationName=hz-validate-n1 StartTime=now\n") == {
        "hz-validate-n1"}
