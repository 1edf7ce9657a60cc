"""The agent with fake GPUs: the real pynvml binding loads the fake NVML library."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from harmonaize.messages import JobAdvisory, PoolCapacity
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

pytestmark = pytest.mark.gpu


def gpu_agent(spawn, workdir: Path, *, endpoint: str = "", call_timeout: float = 0.5):
    fake, env = fake_gpus(workdir)
    agent = start_agent(spawn, workdir, "g1", endpoint=endpoint, env=env,
                        links=NO_LINKS + gpu_section(call_timeout))
    return agent, fake


def gpu(agent: Agent, index: int) -> dict:
    return next(g for g in agent.request("health")["gpus"] if g["index"] == index)


def state_of(agent: Agent, index: int, want: str) -> dict | None:
    row = gpu(agent, index)
    return row if row["state"] == want else None


def tenant_process(spawn, job: str, rank: str) -> subprocess.Popen:
    """A stand-in for a training process, labelled by the provider's scheduler."""
    env = {**os.environ, "HARMONAIZE_JOB": job, "RANK": rank}
    return spawn([sys.executable, "-c", "import time; time.sleep(600)"], env=env)


def test_eight_fake_gpus_are_observed(spawn, workdir: Path) -> None:
    agent, _ = gpu_agent(spawn, workdir)
    gpus = wait_until(lambda: (r := agent.request("gpus"))["gpus"] and r, what="GPU rows")
    assert gpus["gpu_class"] == "H200" and len(gpus["gpus"]) == 8
    first = gpus["gpus"][0]
    assert first["name"] == "NVIDIA H200" and first["pcie_max_gen"] == 5
    assert first["counters"]["ecc_dbe_volatile"] == 0 and first["nvlinks"] == 18
    assert agent.request("health")["gpu_counts"]["healthy"] == 8
    status = {o["name"]: o for o in agent.request("status")["observers"]}
    assert status["gpu"]["state"] == "running" and "8 GPU(s), H200" in status["gpu"]["detail"]


def test_xid_79_loses_the_gpu_the_node_needs_a_reboot_and_the_job_is_advised(
    spawn, workdir: Path
) -> None:
    controller = start_controller(spawn, workdir)
    process = tenant_process(spawn, "job-42", "3")
    agent, fake = gpu_agent(spawn, workdir, endpoint=controller.listen)
    fake.set(3, processes={process.pid: 1 << 30})
    wait_until(lambda: gpu(agent, 3)["jobs"] == [{"job": "job-42", "rank": "3"}],
               what="the job on gpu 3")
    controller.request("place", {"job": "job-42", "tenant": "acme",
                                 "members": [{"name": "3", "host": "g1"}]})
    with tenant_feed(controller, ["job/acme/job-42/", "pool/"]) as tenant:
        wait_until(lambda: controller.request("capacity"), what="capacity")
        # The job's health comes first: the subscription is in place (an advisory sent
        # before it would reach no one, and the test would wait in vain).
        assert tenant.recv(timeout=15) is not None, "the tenant's subscription not answered"
        fake.inject_xid(3, 79)
        lost = wait_until(lambda: state_of(agent, 3, "lost"), what="gpu 3 lost")
        assert lost["action"] == "reboot-node" and "xid 79" in lost["why"]
        health = agent.request("health")
        assert health["health"] == "unhealthy" and health["action"] == "reboot-node"
        advisory = None
        while advisory is None:
            message = tenant.recv(timeout=20)
            assert message is not None, "no advisory reached the tenant"
            if isinstance(message.body, JobAdvisory):
                advisory = message
        assert advisory.topic == "job/acme/job-42/"
        assert (advisory.body.advice.value, advisory.body.reason, advisory.body.ranks) == (
            "checkpoint-now", "gpu-failure", ("3",))
        assert "g1" not in repr(advisory) and "GPU-" not in repr(advisory)
    # An unhealthy host (a node reboot is needed) is no longer capacity. Its GPUs show
    # it: one host up and none read the same in the default host buckets (0-1).
    def gpus_available() -> int | None:
        pools = [c for c in controller.request("capacity") if c["kind"] == "pool-capacity"]
        return pools[0]["gpus_available"]["hi"] if pools else None

    wait_until(lambda: gpus_available() == 0, what="capacity to drop")


def test_xid_13_of_the_gpus_only_job_leaves_the_gpu_healthy(spawn, workdir: Path) -> None:
    process = tenant_process(spawn, "job-7", "0")
    agent, fake = gpu_agent(spawn, workdir)
    fake.set(1, processes={process.pid: 1 << 30})
    wait_until(lambda: gpu(agent, 1)["jobs"], what="the job on gpu 1")
    fake.inject_xid(1, 13)
    row = wait_until(lambda: gpu(agent, 1)["xids"] == 1 and gpu(agent, 1), what="the XID")
    assert row["state"] == "healthy" and row["action"] == "none"
    assert agent.request("health")["health"] == "healthy"
    assert "xid 13 (graphics engine exception) is job job-7's own" in agent.log.read_text()


def test_counters_drive_suspect_reset_and_quarantine(spawn, workdir: Path) -> None:
    agent, fake = gpu_agent(spawn, workdir)
    wait_until(lambda: agent.request("health")["gpu_counts"].get("healthy") == 8,
               what="all GPUs seen")
    fake.set(0, ecc_sbe_volatile=500)                  # climbing single-bit errors
    fake.set(1, remap_pending=1)                       # a remap waits for a reset
    fake.set(2, ecc_dbe_volatile=1)                    # a new double-bit error
    suspect = wait_until(lambda: state_of(agent, 0, "suspect"), what="gpu 0 suspect")
    assert "single-bit" in suspect["why"]
    reset = wait_until(lambda: state_of(agent, 1, "suspect"), what="gpu 1 suspect")
    assert reset["action"] == "reset-gpu"
    quarantined = wait_until(lambda: state_of(agent, 2, "quarantined"), what="gpu 2 out")
    assert quarantined["action"] == "reset-gpu" and "EccUncorrectable" in quarantined["why"]
    # The counts are the rows', read in one answer: by now GPUs 0 and 1 may have moved
    # on (validated back to healthy, or found faulty: a fresh-clone run on a loaded
    # machine read 6 healthy, 0 suspect, 2 quarantined), GPU 2 stays quarantined.
    health = agent.request("health")
    states = {row["index"]: row["state"] for row in health["gpus"]}
    assert {k: n for k, n in health["gpu_counts"].items() if n} == Counter(states.values())
    assert states[2] == "quarantined" and [states[i] for i in range(3, 8)] == ["healthy"] * 5
    table = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), "health"),
                           capture_output=True, text=True, timeout=30).stdout
    assert "gpu 2: quarantined" in table and "reset-gpu" in table


def test_a_hanging_call_marks_only_that_gpu_and_the_agent_keeps_serving(
    spawn, workdir: Path
) -> None:
    agent, fake = gpu_agent(spawn, workdir, call_timeout=0.5)
    wait_until(lambda: agent.request("health")["gpu_counts"].get("healthy") == 8,
               what="all GPUs seen")
    fake.hang(2, "nvmlDeviceGetFieldValues")
    try:
        row = wait_until(lambda: state_of(agent, 2, "quarantined"), what="gpu 2 unresponsive")
        assert "has not returned" in row["why"]
        passes = agent.request("status")["loop"]["passes"]
        fake.set(5, temperature=77)  # the other GPUs are still read
        wait_until(lambda: agent.request("gpus")["gpus"][5]["temperature_c"] == 77,
                   what="gpu 5 still sampled")
        assert agent.request("status")["loop"]["passes"] > passes
        assert gpu(agent, 0)["state"] == "healthy"
    finally:
        fake.release(2)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=20) == 0


def test_a_gpu_falling_off_the_bus_is_lost(spawn, workdir: Path) -> None:
    agent, fake = gpu_agent(spawn, workdir)
    wait_until(lambda: agent.request("health")["gpu_counts"].get("healthy") == 8,
               what="all GPUs seen")
    fake.lose(6)
    row = wait_until(lambda: state_of(agent, 6, "lost"), what="gpu 6 lost")
    assert row["action"] == "reboot-node"
    assert gpu(agent, 7)["state"] == "healthy"


@pytest.mark.parametrize("library", ["fake without a driver", "none at all"])
def test_a_host_without_gpus_runs_cleanly(spawn, workdir: Path, library: str) -> None:
    section = gpu_section() if library == "fake without a driver" else ""
    agent = start_agent(spawn, workdir, "g1", links=NO_LINKS + section)
    status = agent.request("status")
    (observer,) = [o for o in status["observers"] if o["name"] == "gpu"]
    assert observer["state"] == "absent"
    assert observer["detail"] in ("NVIDIA driver not loaded",
                                  "no NVML library (NVIDIA driver not installed)")
    assert status["health"] == "healthy" and status["gpu_class"] == "none"
    assert agent.request("gpus")["gpus"] == []


def test_capacity_counts_available_gpus(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    _, fake = gpu_agent(spawn, workdir, endpoint=controller.listen)

    def gpus_bucket() -> tuple[int, int | None] | None:
        rows = [c for c in controller.request("capacity") if c["kind"] == "pool-capacity"]
        if not rows:
            return None
        bucket = rows[0]["gpus_available"]
        return bucket["lo"], bucket["hi"]

    assert wait_until(lambda: gpus_bucket() == (8, 15) and gpus_bucket(), what="8 GPUs")
    fake.set(4, ecc_dbe_volatile=1)
    assert wait_until(lambda: gpus_bucket() == (1, 7) and gpus_bucket(), what="7 GPUs")
    with tenant_feed(controller, ["pool/"]) as tenant:
        message = tenant.recv(timeout=10)
    assert isinstance(message.body, PoolCapacity) and message.topic == "pool/default/H200"
    assert json.dumps(controller.request("hosts")[0]["gpus"]) == "8"
