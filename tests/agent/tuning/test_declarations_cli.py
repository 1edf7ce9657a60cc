"""Declarations, ``harmonctl jobs`` / ``policy``, files and restarts, with a real agent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agent.plugin.shm import (
    PolicyFile,
    launch_path,
    policy_path,
    prepare_dirs,
    prepare_job_dir,
    read_policy,
)
from agent.tuning import nextlaunch
from agent.tuning.loop import Entry, build_policy
from agent.tuning.policies import derive
from harmonaize.messages import JobDeclaration
from harmonaize.schema import from_plain
from tests.conftest import python
from tests.daemons import NO_LINKS, Agent, start_agent, wait_until

pytestmark = pytest.mark.tuning

JOB = "train-1"
DECLARATION = {
    "job": JOB, "revision": 2, "max_validation_pause": 30,
    "tuning": [{"collectives": ["allreduce", "reducescatter"], "algorithms": ["ring", "tree"],
                "protocols": ["ll128", "simple"], "min_bytes": 0, "max_bytes": 1 << 34,
                "min_channels": 4, "max_channels": 32}],
    "bulk": {"floor_mbps": 200, "ports": [9000], "dscp": [10]},
}


def tuner_dir(workdir: Path) -> Path:
    return workdir / "tuner"


def agent(spawn, workdir: Path, **extra: object) -> Agent:
    tuning = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
    return start_agent(spawn, workdir, "h1", links=NO_LINKS + (
        f'[tuning]\npolicy_dir = "{tuner_dir(workdir)}"\nhtb = false\n' + tuning))


def harmonctl(agent: Agent, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), *argv),
                          capture_output=True, text=True, timeout=30)


def test_declare_then_jobs_and_policy_tables_and_json(spawn, workdir: Path) -> None:
    daemon = agent(spawn, workdir)
    file = workdir / "declaration.json"
    file.write_text(json.dumps(DECLARATION))
    assert harmonctl(daemon, "declare", str(file)).returncode == 0
    jobs = harmonctl(daemon, "jobs")
    assert jobs.returncode == 0, jobs.stderr
    assert "JOB" in jobs.stdout and JOB in jobs.stdout and "one host" in jobs.stdout
    row = json.loads(harmonctl(daemon, "jobs", "--json").stdout)["jobs"][0]
    assert (row["job"], row["revision"], row["choice"], row["bulk_floor_mbps"]) == \
        (JOB, 2, "default", 200.0)
    table = harmonctl(daemon, "policy", JOB).stdout
    assert "allreduce,reducescatter" in table and "ring,tree" in table
    assert "severe" in table and "ring/simple tree/simple ring/ll128 tree/ll128" in table
    assert "floor 200.0 Mb/s" in table and "next launch" in table
    view = json.loads(harmonctl(daemon, "policy", JOB, "--json").stdout)
    declared = from_plain(JobDeclaration, DECLARATION)
    assert view["fingerprint"] == derive(declared).fingerprint
    assert [c["name"] for c in view["choices"]] == ["default", "congested", "severe"]
    # The plugin's file is there, valid, and lists nothing yet (NCCL's own choices).
    policy = read_policy(policy_path(tuner_dir(workdir), JOB))
    assert policy.comms == () and len(policy.rulesets) == 0
    # So is the next-launch file, in the format NCCL reads.
    launch = wait_until(lambda: (p := launch_path(tuner_dir(workdir), JOB)).exists() and p,
                        what="the next-launch file")
    assert "# HarmonAIze next-launch recommendations" in launch.read_text()
    assert all(k.startswith("NCCL_") for k in nextlaunch.parse(launch.read_text()))


def test_bad_input_is_refused_with_a_reason_and_the_agent_keeps_serving(
        spawn, workdir: Path) -> None:
    daemon = agent(spawn, workdir)
    bad = {**DECLARATION, "tuning": [{**DECLARATION["tuning"][0], "max_channels": 99}]}
    file = workdir / "bad.json"
    file.write_text(json.dumps(bad))
    refused = harmonctl(daemon, "declare", str(file))
    assert refused.returncode == 1 and "tuning[0].max_channels" in refused.stderr
    unknown = harmonctl(daemon, "policy", "no-such-job")
    assert unknown.returncode == 1 and "no declaration for job 'no-such-job'" in unknown.stderr
    assert "no declared jobs" in harmonctl(daemon, "jobs").stdout


def test_withdrawal_removes_the_jobs_files(spawn, workdir: Path) -> None:
    daemon = agent(spawn, workdir)
    daemon.request("declare", {"declaration": DECLARATION})
    policy = policy_path(tuner_dir(workdir), JOB)
    wait_until(lambda: policy.exists() and launch_path(tuner_dir(workdir), JOB).exists(),
               what="the job's files")
    daemon.request("declare", {"declaration": {"job": JOB, "revision": 3, "withdrawn": True}})
    wait_until(lambda: not policy.exists(), what="the policy to go")
    assert not policy.parent.exists()  # the job's whole directory
    assert daemon.request("jobs")["jobs"] == []


def test_a_restarted_agent_adopts_the_policy_and_cleans_up_orphans(spawn, workdir: Path) -> None:
    directory = tuner_dir(workdir)
    prepare_dirs(directory)
    prepare_job_dir(directory, JOB, None)
    prepare_job_dir(directory, "finished-job", None)
    severe = derive(from_plain(JobDeclaration, DECLARATION)).get("severe").rules
    published = build_policy([Entry(0xABC, 5000, "default", "severe", (), severe, 2)], 41)
    with PolicyFile(policy_path(directory, JOB)) as handle:
        handle.write(published)
    with PolicyFile(policy_path(directory, "finished-job")) as handle:
        handle.write(build_policy([], 3))
    (directory / "notes.txt").write_text("not ours")
    daemon = agent(spawn, workdir, orphan_grace=0.5)
    daemon.request("declare", {"declaration": DECLARATION})
    view = daemon.request("policy", {"job": JOB})
    assert view["choice"] == "severe"
    assert view["history"][-1]["kind"] == "adopted"
    (comm,) = view["communicators"]
    assert (comm["comm"], comm["at"], comm["after"]) == ("0x0000000000000abc", 5000, "severe")
    republished = read_policy(policy_path(directory, JOB))
    assert republished.comms == published.comms and republished.rulesets == published.rulesets
    wait_until(lambda: not policy_path(directory, "finished-job").exists(),
               what="the orphan to be removed")
    assert (directory / "notes.txt").exists() and policy_path(directory, JOB).exists()
