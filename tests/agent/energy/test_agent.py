"""The real agent lowers a declared job's power limits on the fake GPUs, shows them, puts
them back when it stops, and after SIGKILL its successor puts them back at start; with the
real controller, a tenant's declaration reaches the GPUs and the share saved reaches it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harmonaize.messages import Bucket, EnergyAllowance, JobDeclaration, JobHealth
from tests.conftest import python
from tests.daemons import (
    NO_LINKS,
    Agent,
    fake_gpus,
    gpu_section,
    start_agent,
    start_controller,
    tenant_feed,
    wait_until,
)

pytestmark = pytest.mark.energy

W = 1000
#: A loop that decides every few tenths of a second (the defaults take minutes).
FAST = ("[energy]\ninterval = 0.1\nsettle = 0.5\nwindow = 0.6\nhold = 600\nrebaseline = 0\n"
        "max_changes_per_minute = 60\n")


def busy_gpus(workdir: Path, spawn, gpus: int = 2):
    """Fake GPUs each running a rank of job-e (real processes, labelled as a scheduler
    would), drawing 600 W at full clock."""
    fake, env = fake_gpus(workdir, gpus=gpus)
    ranks = [spawn([sys.executable, "-c", "import time; time.sleep(600)"],
                   env={**os.environ, "HARMONAIZE_JOB": "job-e", "RANK": str(i)})
             for i in range(gpus)]
    for i, rank in enumerate(ranks):
        fake.set(i, power_mw=600 * W, clock_sm_mhz=1980, clock_graphics_mhz=1980,
                 power_static_mw=100 * W, util_gpu=100, clocks_event_reasons=0,
                 processes={rank.pid: 1 << 30})
    return fake, env


def agent(spawn, workdir: Path, env: dict[str, str], name: str = "e1") -> Agent:
    return start_agent(spawn, workdir, name, env=env,
                       links=NO_LINKS + gpu_section(extra="") + FAST)


def declare(agent: Agent, **energy: float) -> None:
    agent.request("declare", {"declaration": {"job": "job-e", "revision": 1,
                                              "energy": energy}})


def originals(workdir: Path, name: str = "e1") -> dict:
    path = workdir / name / "energy.json"
    return json.loads(path.read_text())["gpus"] if path.exists() else {}


def lowered(fake) -> bool:
    limits = fake.set_limits()
    return len(limits) == 2 and all(v < 700 * W for v in limits.values())


def test_a_declared_job_gets_lower_limits_and_a_stop_puts_them_back(spawn, workdir) -> None:
    fake, env = busy_gpus(workdir, spawn)
    a = agent(spawn, workdir, env)
    declare(a, max_slowdown=0.1)
    wait_until(lambda: lowered(fake), what="lower power limits")
    view = wait_until(lambda: (v := a.request("energy"))["jobs"] and v, what="the job")
    (job,) = view["jobs"]
    assert job["max_slowdown"] == 0.1 and job["progress"] == "clocks"  # no stats files here
    rows = {g["index"]: g for g in view["gpus"]}
    assert rows[0]["original_w"] == 700 and rows[0]["job"] == "job-e"
    table = subprocess.run(python("harmonaize.harmonctl", "-s", str(a.socket), "energy"),
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "ORIGINAL" in table.stdout and "job-e" in table.stdout
    # The GPUs are capped in software: not a slowdown the health engine counts against them.
    assert a.request("health")["gpu_counts"]["healthy"] == 2
    assert set(originals(workdir)) == {g["uuid"] for g in view["gpus"]}
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(timeout=60) == 0
    assert set(fake.set_limits().values()) == {700 * W} and originals(workdir) == {}


def test_after_sigkill_the_next_agent_puts_the_limits_back_at_start(spawn, workdir) -> None:
    fake, env = busy_gpus(workdir, spawn)
    a = agent(spawn, workdir, env)
    declare(a, max_slowdown=0.1)
    wait_until(lambda: lowered(fake), what="lower power limits")
    wait_until(lambda: len(originals(workdir)) == 2, what="the originals on disk")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=30)
    # Killed: the GPUs keep what it set, and the originals wait on disk.
    assert lowered(fake)
    saved = originals(workdir)
    assert {g["original_mw"] for g in saved.values()} == {700 * W}
    b = agent(spawn, workdir, env)  # its successor (the declaration is not on this host now)
    wait_until(lambda: set(fake.set_limits().values()) == {700 * W}, what="the limits back")
    assert originals(workdir) == {}
    assert "did not stop cleanly" in b.log.read_text()
    assert b.request("energy")["left_lowered"] == []


def test_withdrawing_the_declaration_puts_the_limits_back(spawn, workdir) -> None:
    fake, env = busy_gpus(workdir, spawn)
    a = agent(spawn, workdir, env)
    declare(a, max_slowdown=0.1, min_watts=600)
    wait_until(lambda: lowered(fake), what="lower power limits")
    assert min(fake.set_limits().values()) >= 600 * W  # the tenant's floor
    a.request("declare", {"declaration": {"job": "job-e", "revision": 2, "withdrawn": True}})
    wait_until(lambda: set(fake.set_limits().values()) == {700 * W}, what="the limits back")
    wait_until(lambda: a.request("energy")["gpus"] == [], what="the GPUs let go")
    assert originals(workdir) == {}


def test_end_to_end_a_declared_slack_lowers_the_limits_and_the_tenant_sees_the_share(
        spawn, workdir) -> None:
    controller = start_controller(spawn, workdir, extra=(
        '[redaction]\nmode = "redacted"\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n'
        "energy_min_kj = 1\n"))
    fake, env = busy_gpus(workdir, spawn)
    start_agent(spawn, workdir, "e1", endpoint=controller.listen, env=env,
                links=NO_LINKS + gpu_section() + FAST + "report_interval = 1\n")
    controller.request("place", {"job": "job-e", "tenant": "acme", "members": [
        {"name": "0", "host": "e1"}, {"name": "1", "host": "e1"}]})
    with tenant_feed(controller, ["job/acme/job-e/"]) as feed:
        feed.declare(JobDeclaration("job-e", revision=1, energy=EnergyAllowance(0.1)))
        wait_until(lambda: lowered(fake), what="lower power limits")

        def share() -> Bucket | None:
            message = feed.recv(timeout=0.5)
            if message is not None and isinstance(message.body, JobHealth):
                return message.body.energy
            return None

        bucket = wait_until(share, what="the energy share in job-health")
        assert bucket.lo in (0, 2, 5, 10, 20)
        feed.declare(JobDeclaration("job-e", revision=2, withdrawn=True))
        wait_until(lambda: set(fake.set_limits().values()) == {700_000},
                   what="the limits back")
