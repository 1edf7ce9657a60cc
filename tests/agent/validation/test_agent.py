"""Validation for real: the agent, fake GPUs, fake check commands, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harmonaize.messages import JobHealth, PoolCapacity, ValidationNotice
from testbed.netns import Lab
from tests.conftest import needs_root, python
from tests.daemons import (
    NO_LINKS,
    Agent,
    fake_gpus,
    gpu_section,
    start_agent,
    start_controller,
    tenant_feed,
)
from tests.daemons import wait_until as wait

pytestmark = [pytest.mark.validation, needs_root]

FAKE_CHECK = Path(__file__).resolve().parents[2] / "bin" / "fake_check.py"


def validation_section(control: Path, *, budget: float = 5.0, baseline: float | None = None,
                       extra: str = "") -> str:
    baselines = f"\nbaselines = {{ gflops = {baseline} }}" if baseline else ""
    return (
        "[validation]\ncooldown = 3600\nnotice_lead = 1\n" + extra
        + "[[validation.commands]]\nname = \"burn\"\n"
        f'command = ["{sys.executable}", "{FAKE_CHECK}", "{control}", "{{gpu}}"]\n'
        f'parser = "metrics"\nlevels = [2, 3]\nbudget = {budget}{baselines}\n'
    )


def gpu_agent(spawn, workdir: Path, control: Path, *, endpoint: str = "", **kw) -> tuple:
    control.mkdir(exist_ok=True)
    (control / "behaviour.all").write_text("print metric gflops 100\n")
    fake, env = fake_gpus(workdir)
    agent = start_agent(spawn, workdir, "g1", endpoint=endpoint, env=env,
                        links=NO_LINKS + gpu_section() + validation_section(control, **kw))
    return agent, fake


def gpu_state(agent: Agent, index: int) -> str:
    return next(g for g in agent.request("health")["gpus"] if g["index"] == index)["state"]


def history(agent: Agent) -> list[dict]:
    return agent.request("validations")["history"]


def finished(agent: Agent, count: int = 1) -> list[dict] | None:
    rows = [r for r in history(agent) if r["finished"]]
    return rows if len(rows) >= count else None


def test_a_suspect_gpu_that_passes_is_healthy_again(spawn, workdir: Path) -> None:
    agent, fake = gpu_agent(spawn, workdir, workdir / "control")
    fake.set(3, ecc_sbe_volatile=500)  # climbing single-bit errors: suspect
    (run,) = wait(lambda: finished(agent), what="the validation")
    assert (run["target"], run["trigger"], run["outcome"], run["level"]) == (
        "gpu:3", "suspect", "pass", 2)
    burn = next(c for c in run["checks"] if c["check"] == "burn")
    assert burn["measurements"][0]["value"] == 100.0
    assert wait(lambda: gpu_state(agent, 3) == "healthy", what="healthy again")


def test_a_suspect_gpu_that_fails_is_quarantined(spawn, workdir: Path) -> None:
    control = workdir / "control"
    agent, fake = gpu_agent(spawn, workdir, control)
    (control / "behaviour.1").write_text("print metric gflops 50\nexit 2\n")
    fake.set(1, pcie_replay=0)
    fake.set(1, nvlinks=18)
    fake.set_link(1, 4, recovery=1)  # an NVLink recovery: suspect
    (run,) = wait(lambda: finished(agent), what="the validation")
    assert run["outcome"] == "fail" and run["action"] == "reset-gpu" and "exited 2" in run["reason"]
    assert wait(lambda: gpu_state(agent, 1) == "quarantined", what="quarantined")
    assert agent.request("health")["gpu_counts"]["quarantined"] == 1


def test_the_baseline_rule_fails_6_percent_below_and_passes_4(spawn, workdir: Path) -> None:
    control = workdir / "control"
    agent, _ = gpu_agent(spawn, workdir, control, baseline=100.0)
    for index, value in ((4, 94), (5, 96)):
        (control / f"behaviour.{index}").write_text(f"print metric gflops {value}\n")
        agent.request("validate", {"gpu": index, "level": 2})
    rows = wait(lambda: finished(agent, 2), what="two validations")
    by_target = {r["target"]: r for r in rows}
    assert by_target["gpu:4"]["outcome"] == "fail"
    assert "6.0% below its baseline 100" in by_target["gpu:4"]["reason"]
    assert by_target["gpu:5"]["outcome"] == "pass"
    burn = next(c for c in by_target["gpu:5"]["checks"] if c["check"] == "burn")
    assert burn["measurements"][0]["baseline"] == 100.0


def test_learned_baselines_catch_a_slower_gpu(spawn, workdir: Path) -> None:
    control = workdir / "control"
    agent, _ = gpu_agent(spawn, workdir, control)
    for run in range(3):
        agent.request("validate", {"gpu": 0, "level": 2})
        wait(lambda n=run + 1: finished(agent, n), what=f"passing run {run + 1}")
    (control / "behaviour.0").write_text("print metric gflops 90\n")
    agent.request("validate", {"gpu": 0, "level": 2})
    rows = wait(lambda: finished(agent, 4), what="the slow run")
    assert rows[0]["outcome"] == "fail" and "10.0% below its baseline 100" in rows[0]["reason"]


def test_a_check_over_its_budget_is_killed_and_fails(spawn, workdir: Path) -> None:
    control = workdir / "control"
    agent, _ = gpu_agent(spawn, workdir, control, budget=1.0)
    (control / "behaviour.2").write_text("sleep 300\n")
    agent.request("validate", {"gpu": 2, "level": 2})
    (run,) = wait(lambda: finished(agent), what="the overrun")
    assert run["outcome"] == "fail" and "overran its budget of 1 s and was killed" in run["reason"]
    pid = int((control / "pid.2").read_text())
    assert not Path(f"/proc/{pid}").exists()


def test_no_validation_on_a_tenants_gpu_unless_the_job_allows_it(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    control = workdir / "control"
    agent, fake = gpu_agent(spawn, workdir, control, endpoint=controller.listen)
    env = {**os.environ, "HARMONAIZE_JOB": "job-7", "RANK": "12"}
    tenant = spawn([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    fake.set(6, processes={tenant.pid: 1 << 30})
    wait(lambda: any(g["jobs"] for g in agent.request("health")["gpus"]), what="the job")
    controller.request("place", {"job": "job-7", "tenant": "acme",
                                 "members": [{"name": "12", "host": "g1"}]})
    with tenant_feed(controller, ["job/acme/job-7/", "pool/"]) as feed:
        fake.set(6, ecc_sbe_volatile=900)  # suspect, but job-7 uses it
        waiting = wait(lambda: agent.request("validations")["waiting"].get("gpu:6"),
                       what="the validation to wait")
        assert "does not allow" in waiting
        time.sleep(1.5)
        assert finished(agent) is None and gpu_state(agent, 6) == "suspect"
        declaration = workdir / "decl.json"
        declaration.write_text(json.dumps({"job": "job-7", "max_validation_pause": 600}))
        result = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket),
                                       "declare", str(declaration)),
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        notice = None
        while notice is None:
            message = feed.recv(timeout=10)
            assert message is not None, "the tenant was not told"
            if isinstance(message.body, ValidationNotice):
                notice = message.body
        assert (notice.job, notice.members) == ("job-7", ("12",))
        assert 0 < notice.pause_seconds <= 600 and notice.starts_at > time.time() - 5
        assert "burn" not in repr(notice) and "g1" not in repr(notice)
        (run,) = wait(lambda: finished(agent), what="the allowed validation")
        assert run["target"] == "gpu:6"


def test_restarting_mid_validation_leaves_no_orphan_and_a_defined_state(
    spawn, workdir: Path
) -> None:
    control = workdir / "control"
    agent, fake = gpu_agent(spawn, workdir, control, budget=300.0)
    (control / "behaviour.5").write_text("sleep 300\n")
    agent.request("validate", {"gpu": 5, "level": 2})
    wait(lambda: (control / "pid.5").exists() and gpu_state(agent, 5) == "validating",
         what="the check to run")
    check_pid = int((control / "pid.5").read_text())
    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait(timeout=10)
    assert wait(lambda: not Path(f"/proc/{check_pid}").exists(), what="the check to die")
    (control / "behaviour.5").write_text("print metric gflops 100\n")
    agent = start_agent(spawn, workdir, "g1", env={**os.environ,
                                                  "HARMONAIZE_FAKE_NVML_STATE": str(fake.path)},
                        links=NO_LINKS + gpu_section() + validation_section(control))
    (row,) = [r for r in history(agent) if r["target"] == "gpu:5"]
    assert row["outcome"] == "error" and "interrupted" in row["reason"]
    assert gpu_state(agent, 5) == "healthy"
    # SIGTERM during a check: the agent kills it on the way out.
    (control / "behaviour.5").write_text("sleep 300\n")
    (control / "pid.5").unlink()
    agent.request("validate", {"gpu": 5, "level": 2})
    wait((control / "pid.5").exists, what="the second check")
    second = int((control / "pid.5").read_text())
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=20) == 0
    assert not Path(f"/proc/{second}").exists()


def test_quarantine_survives_a_restart_and_release_validates_first(
    spawn, workdir: Path
) -> None:
    control = workdir / "control"
    agent, fake = gpu_agent(spawn, workdir, control)
    agent.request("drain", {"gpu": 7, "reason": "fan noise"})
    assert gpu_state(agent, 7) == "quarantined"
    agent.proc.send_signal(signal.SIGTERM)
    agent.proc.wait(timeout=20)
    env = {**os.environ, "HARMONAIZE_FAKE_NVML_STATE": str(fake.path)}
    agent = start_agent(spawn, workdir, "g1", env=env,
                        links=NO_LINKS + gpu_section() + validation_section(control))
    assert wait(lambda: gpu_state(agent, 7) == "quarantined", what="the recorded quarantine")
    (control / "behaviour.7").write_text("exit 1\n")
    agent.request("release", {"gpu": 7})
    (run,) = wait(lambda: finished(agent), what="the release validation")
    assert run["trigger"] == "release" and run["outcome"] == "fail"
    # The runner records the verdict from its thread, then hands it to the loop: the
    # state follows the history a moment later.
    assert wait(lambda: gpu_state(agent, 7) == "quarantined", what="quarantined again")
    (control / "behaviour.7").write_text("print metric gflops 100\n")
    agent.request("release", {"gpu": 7})
    wait(lambda: finished(agent, 2), what="the second release validation")
    assert wait(lambda: gpu_state(agent, 7) == "healthy", what="released")
    table = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket),
                                  "validations"), capture_output=True, text=True,
                           timeout=30).stdout
    assert "release" in table and "TRIGGER" in table


def test_the_tenant_sees_only_the_capacity_change(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    control = workdir / "control"
    agent, fake = gpu_agent(spawn, workdir, control, endpoint=controller.listen)
    (control / "behaviour.0").write_text("exit 1\n")
    with tenant_feed(controller, ["pool/", "job/acme/"]) as feed:
        # The host's hello and its first summary may land in different batches: the
        # capacity may read 0 GPUs first, for as long as that takes.
        deadline = time.monotonic() + 10
        first = feed.recv(timeout=10)
        while first is not None and time.monotonic() < deadline and not (
                isinstance(first.body, PoolCapacity) and first.body.gpus_available.lo == 8):
            first = feed.recv(timeout=10)
        assert isinstance(first.body, PoolCapacity) and first.body.gpus_available.lo == 8
        fake.set(0, ecc_sbe_volatile=500)
        wait(lambda: gpu_state(agent, 0) == "quarantined", what="quarantined")
        seen = []
        while (message := feed.recv(timeout=2)) is not None:
            seen.append(message)
    assert seen and all(isinstance(m.body, PoolCapacity | JobHealth) for m in seen)
    assert seen[-1].body.gpus_available.lo == 1  # 7 GPUs: the bucket below 8
    text = repr(seen)
    for secret in ("burn", "gflops", "g1", "quarantine", "ecc"):
        assert secret not in text


def test_the_network_check_runs_between_two_namespace_hosts(spawn, workdir: Path,
                                                            make_lab) -> None:
    lab: Lab = make_lab(["a", "b"], pair=True)
    serve = "[validation]\n[validation.network]\nserve = true\nport = 5301\n"
    start_agent(spawn, workdir, "b", lab=lab, links=NO_LINKS + serve)

    def peer_check(baseline: float) -> str:
        return ("[validation]\n[validation.network]\n"
                f'peer = "{lab.addr("b")}"\nport = 5301\nseconds = 1\n'
                f"baseline_gbps = {baseline}\n")

    agent = start_agent(spawn, workdir, "a", lab=lab, links=NO_LINKS + peer_check(0))
    wait(lambda: subprocess.run(lab.cmd("b", ["ss", "-ltn"]), capture_output=True,
                                text=True).stdout.count(":5301") > 0, what="iperf3 on b")
    agent.request("validate", {"host": True, "level": 2})
    (run,) = wait(lambda: finished(agent), what="the network check")
    check = run["checks"][0]
    assert (run["target"], run["outcome"], check["check"]) == ("host", "pass",
                                                                "network-bandwidth")
    assert check["measurements"][0]["unit"] == "Gb/s" and check["measurements"][0]["value"] > 0
    agent.proc.send_signal(signal.SIGTERM)
    agent.proc.wait(timeout=20)
    agent = start_agent(spawn, workdir, "a", lab=lab, links=NO_LINKS + peer_check(1e6))
    agent.request("validate", {"host": True, "level": 2})
    rows = wait(lambda: finished(agent, 2), what="the failing network check")
    assert rows[0]["outcome"] == "fail" and "below its baseline" in rows[0]["reason"]
    conditions = {c["type"]: c for c in agent.request("status")["conditions"]}
    assert wait(lambda: {c["type"]: c for c in agent.request("status")["conditions"]}
                ["HostValidationFailed"]["status"] == "True", what="the host condition")
    assert conditions  # the status call above answered while a check had run
