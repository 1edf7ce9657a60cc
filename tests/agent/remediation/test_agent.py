"""Remediation that acts, for real: the agent, the fake NVML, the fake nvidia-smi's resets,
fake validation checks, real files and SQLite, restarts by signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.fakegpu import FakeNvml
from tests.conftest import needs_root, python
from tests.daemons import NO_LINKS, Agent, fake_gpus, gpu_section, start_agent
from tests.daemons import wait_until as wait

pytestmark = [pytest.mark.scheduler, needs_root]

FAKE_CHECK = Path(__file__).resolve().parents[2] / "bin" / "fake_check.py"
FAKE_SMI = [sys.executable, "-m", "testbed.fakesmi", "--gpu-reset", "-i",
            "{pci_bus_id}"]


def sections(workdir: Path, *, mode: str = "act", max_resets: int = 2, per_hour: int = 100,
             interval: float = 0.0, reset: list[str] = FAKE_SMI, timeout: float = 30) -> str:
    control = workdir / "control"
    command = ", ".join(f'"{part}"' for part in reset)
    return (
        NO_LINKS + gpu_section()
        + "[validation]\ncooldown = 3600\nnotice_lead = 1\n"
        "[[validation.commands]]\nname = \"burn\"\n"
        f'command = ["{sys.executable}", "{FAKE_CHECK}", "{control}", "{{gpu}}"]\n'
        'parser = "metrics"\nlevels = [2, 3]\nbudget = 10\n'
        f'[remediation]\nenabled = true\nmode = "{mode}"\nmax_resets = {max_resets}\n'
        f"reset_interval = {interval}\nmax_resets_per_hour = {per_hour}\n"
        f"reset_command = [{command}]\nreset_timeout = {timeout}\n"
        f'boot_id_file = "{workdir / "boot_id"}"\n'
    )


def agent_with_gpus(spawn, workdir: Path, **kw: Any) -> tuple[Agent, FakeNvml]:
    control = workdir / "control"
    control.mkdir(exist_ok=True)
    (control / "behaviour.all").write_text("print metric gflops 100\n")
    if not (workdir / "boot_id").exists():
        (workdir / "boot_id").write_text("boot-a\n")
    fake, env = fake_gpus(workdir)
    agent = start_agent(spawn, workdir, "r1", env=env, links=sections(workdir, **kw))
    wait(lambda: agent.request("health")["gpu_counts"].get("healthy") == 8, what="8 GPUs")
    return agent, fake


def restart(spawn, workdir: Path, agent: Agent, fake: FakeNvml, **kw: Any) -> Agent:
    agent.proc.send_signal(signal.SIGTERM)
    agent.proc.wait(timeout=30)
    env = {**os.environ, "HARMONAIZE_FAKE_NVML_STATE": str(fake.path)}
    return start_agent(spawn, workdir, "r1", env=env, links=sections(workdir, **kw))


def gpu_state(agent: Agent, index: int) -> str:
    return next(g for g in agent.request("health")["gpus"] if g["index"] == index)["state"]


def steps(agent: Agent, gpu: int | None = None) -> list[str]:
    """Remediation steps, oldest first."""
    rows = agent.request("remediation", {"limit": 500})["steps"]
    return [r["step"] for r in reversed(rows) if gpu is None or r["gpu"] == gpu]


def record(agent: Agent, gpu: int) -> dict | None:
    return next((r for r in agent.request("remediation")["gpus"] if r["gpu"] == gpu), None)


def holds(agent: Agent) -> list[tuple[str, int]]:
    return [(h["kind"], h["gpu"]) for h in agent.request("status")["holds"]]


def harmonctl(agent: Agent, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), *args),
                          capture_output=True, text=True, timeout=30)


def processes_on(agent: Agent, gpu: int) -> list:
    return next(g for g in agent.request("gpus")["gpus"] if g["index"] == gpu)["processes"]


def reset_file(fake: FakeNvml) -> Path:
    return fake.path.with_name(fake.path.name + ".reset")


def test_an_idle_quarantined_gpu_is_reset_revalidated_and_released(spawn, workdir) -> None:
    agent, fake = agent_with_gpus(spawn, workdir)
    fake.set(2, ecc_dbe_volatile=1)  # a new double-bit error: quarantined, reset-gpu
    wait(lambda: "released" in steps(agent, 2), what="the GPU released after its reset")
    assert steps(agent, 2) == ["reset", "reset-done", "released"]
    # The verdict is recorded as it is applied; the health view follows at the next pass.
    wait(lambda: gpu_state(agent, 2) == "healthy", what="gpu 2 healthy")
    assert "gpu.2.ecc_dbe_volatile = 1" in reset_file(fake).read_text()
    # NVML counts from the reset, as on a real GPU (read at the next counter sample).
    wait(lambda: next(g for g in agent.request("gpus")["gpus"]
                      if g["index"] == 2)["counters"]["ecc_dbe_volatile"] == 0,
         what="the volatile counter back at zero")
    runs = agent.request("validations")["history"]
    assert [(r["trigger"], r["outcome"]) for r in runs] == [("after-reset", "pass")]
    first = agent.request("remediation")["steps"][-1]
    assert first["step"] == "reset" and "EccUncorrectable" in first["trigger"]
    shown = harmonctl(agent, "validations").stdout
    assert "remediation:" in shown and "reset-done" in shown
    assert record(agent, 2) is None and holds(agent) == []


def test_no_reset_while_a_process_uses_the_gpu(spawn, workdir) -> None:
    agent, fake = agent_with_gpus(spawn, workdir)
    fake.set(2, processes={os.getpid(): 1 << 30})
    wait(lambda: processes_on(agent, 2), what="the process seen on gpu 2")
    fake.set(2, ecc_dbe_volatile=1)
    waiting = wait(lambda: (r := record(agent, 2)) and "in use" in r["detail"] and r,
                   what="remediation waiting for the GPU to be idle")
    assert waiting["phase"] == "waiting" and steps(agent) == []
    assert not reset_file(fake).exists()
    fake.set(2, processes=None)  # the job ended
    wait(lambda: "released" in steps(agent, 2), what="the reset once idle")
    assert steps(agent, 2) == ["reset", "reset-done", "released"]


def test_failed_resets_are_counted_and_escalate_to_a_reboot_hold(spawn, workdir) -> None:
    agent, fake = agent_with_gpus(spawn, workdir, max_resets=2)
    fake.set(2, reset_error=255)  # the driver refuses every reset of this GPU
    fake.set(2, ecc_dbe_volatile=1)
    wait(lambda: ("reboot", 2) in holds(agent), what="the reboot hold")
    assert steps(agent, 2) == ["reset", "reset-failed", "reset", "reset-failed", "reboot"]
    failed = [r for r in agent.request("remediation")["steps"] if r["step"] == "reset-failed"]
    assert all("exit 255" in r["trigger"] for r in failed)
    assert record(agent, 2)["failures"] == 2 and not reset_file(fake).exists()
    assert "reboot gpu 2" in harmonctl(agent, "remediation").stdout
    assert "2 failed reset(s)" in harmonctl(agent, "status").stdout


def test_rma_after_a_reboot_that_did_not_help_is_cleared_only_by_an_operator(
    spawn, workdir
) -> None:
    agent, fake = agent_with_gpus(spawn, workdir, max_resets=1)
    (workdir / "control" / "behaviour.2").write_text("exit 1\n")  # the GPU stays bad
    fake.set(2, ecc_dbe_volatile=1)
    wait(lambda: ("reboot", 2) in holds(agent), what="the reboot hold")
    assert steps(agent, 2) == ["reset", "reset-done", "revalidation-failed", "reboot"]
    (workdir / "boot_id").write_text("boot-b\n")  # the scheduler rebooted the host
    agent = restart(spawn, workdir, agent, fake, max_resets=1)
    wait(lambda: ("rma", 2) in holds(agent), what="the RMA hold")
    assert steps(agent, 2)[-2:] == ["rebooted", "rma"]
    runs = [r["trigger"] for r in agent.request("validations")["history"]]
    assert runs[0] == "after-reboot"
    agent = restart(spawn, workdir, agent, fake, max_resets=1)  # latched across restarts
    wait(lambda: agent.request("status")["holds"], what="the summary after the restart")
    assert holds(agent) == [("gpu-quarantined", 2), ("rma", 2)]
    refused = harmonctl(agent, "remediation", "cancel", "--gpu", "2")
    assert refused.returncode != 0 and "RMA" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    cleared = harmonctl(agent, "remediation", "clear", "--gpu", "2")
    assert cleared.returncode == 0 and len(cleared.stdout.strip().splitlines()) == 1
    assert wait(lambda: ("rma", 2) not in holds(agent), what="the hold cleared")
    assert steps(agent, 2)[-1] == "cleared" and record(agent, 2)["phase"] == "cancelled"


def test_rate_limit_holds_resets_back_across_an_agent_restart(spawn, workdir) -> None:
    agent, fake = agent_with_gpus(spawn, workdir, per_hour=1)
    fake.set(2, ecc_dbe_volatile=1)
    wait(lambda: "released" in steps(agent, 2), what="the first reset")
    fake.set(3, ecc_dbe_volatile=1)
    wait(lambda: (r := record(agent, 3)) and "rate limit" in r["detail"],
         what="the second GPU held back by the hourly limit")
    agent = restart(spawn, workdir, agent, fake, per_hour=1)
    fake.set(3, ecc_dbe_volatile=2)  # quarantined again after the restart
    held = wait(lambda: (r := record(agent, 3)) and "rate limit" in r["detail"] and r,
                what="the limit still holding after the restart")
    assert held["phase"] == "waiting" and steps(agent).count("reset") == 1


def test_shadow_mode_logs_what_it_would_do_and_does_nothing(spawn, workdir) -> None:
    agent, fake = agent_with_gpus(spawn, workdir, mode="shadow")
    fake.set(2, ecc_dbe_volatile=1)
    wait(lambda: "would reset" in agent.log.read_text(), what="the shadow line")
    assert "nothing done" in agent.log.read_text()
    assert record(agent, 2)["phase"] == "waiting" and steps(agent) == []
    assert not reset_file(fake).exists() and gpu_state(agent, 2) == "quarantined"
    assert agent.request("validations")["history"] == []


def test_an_operator_cancel_stops_remediating_the_gpu(spawn, workdir) -> None:
    agent, fake = agent_with_gpus(spawn, workdir)
    fake.set(2, processes={os.getpid(): 1 << 30})
    wait(lambda: processes_on(agent, 2), what="the process seen on gpu 2")
    fake.set(2, ecc_dbe_volatile=1)
    wait(lambda: (r := record(agent, 2)) and "in use" in r["detail"], what="waiting")
    answer = harmonctl(agent, "remediation", "cancel", "--gpu", "2")
    assert answer.returncode == 0 and "cancelled" in answer.stdout
    fake.set(2, processes=None)
    wait(lambda: not processes_on(agent, 2), what="the GPU seen idle")
    passes = agent.request("status")["loop"]["passes"]
    wait(lambda: agent.request("status")["loop"]["passes"] > passes + 20, what="more passes")
    assert record(agent, 2)["phase"] == "cancelled" and steps(agent, 2) == ["cancelled"]
    assert not reset_file(fake).exists()
    assert harmonctl(agent, "remediation", "resume", "--gpu", "2").returncode == 0
    wait(lambda: "released" in steps(agent, 2), what="the reset after resume")


def test_a_reload_from_shadow_to_act_starts_resetting(spawn, workdir) -> None:
    agent, fake = agent_with_gpus(spawn, workdir, mode="shadow")
    fake.set(2, ecc_dbe_volatile=1)
    wait(lambda: "would reset" in agent.log.read_text(), what="the shadow line")
    agent.config.write_text(agent.config.read_text().replace('mode = "shadow"',
                                                             'mode = "act"'))
    assert harmonctl(agent, "reload").returncode == 0
    assert agent.request("remediation")["mode"] == "act"
    wait(lambda: "released" in steps(agent, 2), what="the reset after the reload")


def test_a_reset_command_that_hangs_or_cannot_run_is_a_failed_reset(spawn, workdir) -> None:
    hang = f"sleep 600; echo {workdir} {{pci_bus_id}}"  # marked with this test's directory
    agent, fake = agent_with_gpus(spawn, workdir, max_resets=2, timeout=1, interval=3600,
                                  reset=["sh", "-c", hang])
    fake.set(2, ecc_dbe_volatile=1)
    wait(lambda: "reset-failed" in steps(agent, 2), what="the hung reset killed")
    failed = next(r for r in agent.request("remediation")["steps"] if r["step"] == "reset-failed")
    assert "killed after 1 s" in failed["trigger"]
    # Killed with its process group: nothing of it is left.
    assert subprocess.run(["pgrep", "-f", f"echo {workdir}"]).returncode == 1
    agent.config.write_text(agent.config.read_text().replace(
        f'"sh", "-c", "{hang}"'.replace("{{", "{").replace("}}", "}"),
        '"/nonexistent/nvidia-smi"').replace("reset_interval = 3600", "reset_interval = 0"))
    assert harmonctl(agent, "reload").returncode == 0
    wait(lambda: ("reboot", 2) in holds(agent), what="the second failure escalated")
    last = next(r for r in agent.request("remediation")["steps"] if r["step"] == "reset-failed")
    assert "cannot run /nonexistent/nvidia-smi" in last["trigger"]
    assert agent.proc.poll() is None and agent.request("status")["ready"]
