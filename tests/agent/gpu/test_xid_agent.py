"""XID attribution in the real agent: fake GPUs (the real pynvml on the fake NVML), a
fake kernel log source in /dev/kmsg's format, tenant stand-in processes, the real
controller and a tenant's feed. An application's XID quarantines nothing and reaches the
job's owner as its own; a hardware XID still quarantines; a forged kernel line ties
nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harmonaize.messages import ApplicationXid
from testbed.fakekmsg import FakeKernelLog
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

pytestmark = pytest.mark.jobhealth


def rank(spawn, job: str, name: str) -> subprocess.Popen:
    env = {**os.environ, "HARMONAIZE_JOB": job, "RANK": name}
    return spawn([sys.executable, "-c", "import time; time.sleep(600)"], env=env)


def gpu(agent: Agent, index: int) -> dict:
    return next(g for g in agent.request("gpus")["gpus"] if g["index"] == index)


def xids(agent: Agent, index: int) -> list[dict]:
    return gpu(agent, index)["recent_xids"]


def owner_told(tenant) -> object:
    """The next application-xid the job's owner receives (through the controller)."""
    while True:
        message = tenant.recv(timeout=15)
        assert message is not None, "no application-xid reached the job's owner"
        if isinstance(message.body, ApplicationXid):
            return message


def teardown_xid(agent: Agent, fake, c0: subprocess.Popen) -> None:
    """A teardown: job-c's process ends and leaves its GPU, then the driver cleans up."""
    c0.send_signal(signal.SIGKILL)
    c0.wait()
    fake.set(5, processes=None)
    wait_until(lambda: not gpu(agent, 5)["jobs"], what="job-c gone from gpu 5")
    fake.inject_xid(5, 45)
    (teardown,) = wait_until(lambda: xids(agent, 5), what="xid 45 attributed")
    assert (teardown["verdict"], teardown["job"]) == ("application", "job-c")
    assert gpu(agent, 5)["state"] == "healthy"


def test_an_application_xid_quarantines_nothing_and_a_hardware_xid_still_does(
        spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    kmsg = FakeKernelLog(workdir / "kmsg")  # before the agent: it starts at the end
    fake, env = fake_gpus(workdir)
    a0, b0, c0 = rank(spawn, "job-a", "0"), rank(spawn, "job-b", "0"), rank(spawn, "job-c", "5")
    fake.set(2, processes={a0.pid: 1 << 30, b0.pid: 1 << 30})  # two jobs share gpu 2
    fake.set(3, processes={a0.pid: 1 << 30, b0.pid: 1 << 30})
    fake.set(4, processes={a0.pid: 1 << 30})
    fake.set(5, processes={c0.pid: 1 << 30})
    agent = start_agent(spawn, workdir, "g1", endpoint=controller.listen, env=env,
                        links=NO_LINKS + gpu_section(extra=f'kmsg_path = "{kmsg.path}"\n'
                                                          "kmsg_wait = 1.0\n"))
    wait_until(lambda: len(gpu(agent, 5)["jobs"]) == 1 and len(gpu(agent, 2)["jobs"]) == 2,
               what="the jobs on their GPUs")
    for job, member in (("job-b", "0"), ("job-c", "5")):
        controller.request("place", {"job": job, "tenant": "acme",
                                     "members": [{"name": member, "host": "g1"}]})
    feed = tenant_feed(controller, ["job/acme/"])
    told: list = []
    with feed as tenant:
        # The placed jobs' health comes first: the subscription is in place (an XID
        # judged before it would reach no one, and the test would wait in vain).
        assert tenant.recv(timeout=15) is not None, "the owner's subscription not answered"
        # The kernel names job-b's process: its own fault, though job-a shares the GPU.
        kmsg.xid(2, 31, pid=b0.pid, name="python")
        fake.inject_xid(2, 31)
        (seen,) = wait_until(lambda: xids(agent, 2), what="xid 31 attributed")
        assert (seen["xid"], seen["verdict"], seen["job"]) == (31, "application", "job-b")
        assert gpu(agent, 2)["state"] == "healthy"
        told.append(owner_told(tenant))
        teardown_xid(agent, fake, c0)
        told.append(owner_told(tenant))
    assert [(m.topic, m.body.job, m.body.xid, m.body.fault.value, m.body.ranks,
             m.body.teardown) for m in told] == [
        ("job/acme/job-b/", "job-b", 31, "memory-management", ("0",), False),
        ("job/acme/job-c/", "job-c", 45, "cleanup-after-error", ("5",), True)]
    assert not any("g1" in repr(m) or "GPU-" in repr(m) or "PCI" in repr(m) for m in told)

    # The same line written by a process (LOG_USER) is a forgery: no tie, doubt.
    kmsg.xid(3, 31, pid=b0.pid, name="python", facility=1)
    fake.inject_xid(3, 31)
    (doubt,) = wait_until(lambda: xids(agent, 3), what="xid 31 on gpu 3 attributed")
    assert doubt["verdict"] == "hardware"
    wait_until(lambda: gpu(agent, 3)["state"] == "suspect", what="gpu 3 suspect")

    # A hardware XID with a job's pid in the kernel's line is the hardware's still.
    kmsg.xid(4, 48, pid=a0.pid)
    fake.inject_xid(4, 48)
    wait_until(lambda: gpu(agent, 4)["state"] == "quarantined", what="gpu 4 quarantined")

    log = agent.log.read_text()
    assert "xid 31 is job job-b's own (memory-management)" in log
    assert "xid 45 is job job-c's own (cleanup-after-error), at its teardown" in log
    assert "Traceback" not in log and "sampling pass failed" not in log  # encoded, sent
    health = agent.request("health")
    assert health["gpu_counts"]["quarantined"] == 1 and health["gpu_counts"]["suspect"] == 1
    status = {o["name"]: o for o in agent.request("status")["observers"]}
    assert status["gpu"]["kernel_log"]["not_kernel"] == 1
    # The operator's application event reached the controller.
    events = wait_until(lambda: [e for e in controller.request("events", {"limit": 200})
                                 if e.get("reason") == "ApplicationXid"] or None,
                        what="the application events at the controller")
    assert any("job-b" in e.get("message", "") for e in events)


def test_a_rank_killed_before_its_gpu_let_go_keeps_its_job_for_the_teardown_xid(
        spawn, workdir: Path) -> None:
    """The kill wins the race with the GPU's list: the process is gone from /proc while
    NVML still lists it (its job no longer resolves), then it leaves the list, then the
    driver's cleanup XID 45 comes: still the job's teardown, not the hardware's."""
    kmsg = FakeKernelLog(workdir / "kmsg")
    fake, env = fake_gpus(workdir)
    c0 = rank(spawn, "job-c", "5")
    fake.set(5, processes={c0.pid: 1 << 30})
    agent = start_agent(spawn, workdir, "g1", env=env,
                        links=NO_LINKS + gpu_section(extra=f'kmsg_path = "{kmsg.path}"\n'
                                                          "kmsg_wait = 1.0\n"))
    wait_until(lambda: gpu(agent, 5)["jobs"], what="job-c on gpu 5")
    c0.send_signal(signal.SIGKILL)
    c0.wait()  # reaped: /proc no longer has it, NVML still lists it ...
    fake.set(5, processes={c0.pid: 1 << 29})  # ... and reads anew (its memory moved)
    wait_until(lambda: not gpu(agent, 5)["jobs"], what="job-c unresolved on gpu 5")
    fake.set(5, processes=None)
    fake.inject_xid(5, 45)
    (teardown,) = wait_until(lambda: xids(agent, 5), what="xid 45 attributed")
    assert (teardown["verdict"], teardown["job"]) == ("application", "job-c")
    assert gpu(agent, 5)["state"] == "healthy"
