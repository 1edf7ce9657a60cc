"""Placements from Slurm's controller-side prolog and epilog (issue 29, item 1), the hook
run as slurmctld runs it (a real process, only Slurm's variables) against a real
controller: recorded and removed, every bad input one line and exit 0, the spool and
its replay (a spooled placement arrives once), idempotence, and SlurmUser's access."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from controller.core import ControllerCore
from controller.outputs import AgentPeer, TenantPeer
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.opsocket import CommandError, request
from harmonaize.slurm.hookconfig import HookConfig
from tests.conftest import ROOT, Spawn
from tests.controller.test_core_with_outbox import (
    HOST,
    JOB,
    TENANT,
    WALL,
    agent_frame,
    hello,
    tenant_frame,
)
from tests.controller.test_core_with_outbox import config as core_config
from tests.daemons import Controller, FakeAgent, start_controller, wait_until
from tests.slurmhook import HOOK, Hook, job_env, make_hook

pytestmark = pytest.mark.scheduler

SCHEDULER = 'scheduler_users = ["slurm"]\n'


def jobs(controller: Controller) -> dict[str, dict]:
    return {j["job"]: j for j in controller.request("jobs")}


def hook_for(workdir: Path, controller: Controller | None = None, **kwargs) -> Hook:
    socket_path = controller.admin if controller else workdir / "controller.sock"
    return make_hook(workdir, socket_path, accounts={"physics": "acme"},
                     users={"bob": "globex"}, hosts={"gpu-02": "h2"}, **kwargs)


def test_prolog_places_the_job_and_epilog_removes_it(spawn: Spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    hook = hook_for(workdir, controller)
    done = hook.run(None, job_env("7"))
    assert done.returncode == 0, done.stderr
    placed = jobs(controller)["7"]
    assert placed["tenant"] == "acme"  # from the account, through [accounts]
    # Members in the tenant's terms (its node index), hosts through [hosts].
    assert placed["members"] == [{"name": "node0", "host_id": "gpu-01"},
                                 {"name": "node1", "host_id": "h2"}]
    assert placed["group"] == "4242"  # the job's gid: the agent's check of its processes
    assert hook.queued() == []
    assert hook.run(None, job_env("7", context="epilog_slurmctld")).returncode == 0
    assert "7" not in jobs(controller)
    assert hook.queued() == [] and hook.rejected() == []


def test_tenant_from_the_user_when_the_account_maps_to_none(spawn: Spawn,
                                                              workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    hook = hook_for(workdir, controller)
    assert hook.run("prolog", job_env("8", account="(null)", user="bob")).returncode == 0
    assert jobs(controller)["8"]["tenant"] == "globex"


@pytest.mark.parametrize(("env", "says"), [
    ({"SLURM_JOB_ID": ""}, "not a job id"),
    ({"SLURM_JOB_ID": "../../etc"}, "not a job id"),
    ({"SLURM_JOB_NODELIST": ""}, "no SLURM_JOB_NODELIST"),
    ({"SLURM_JOB_NODELIST": "gpu-[01-"}, "not a host list"),
    ({"SLURM_JOB_NODELIST": "gpu-[1-99999999]"}, "not a host list"),
    ({"SLURM_JOB_NODELIST": "bad/node"}, "not a host name"),
    ({"SLURM_SCRIPT_CONTEXT": "prolog"}, "no subcommand"),
])
def test_prolog_with_missing_or_odd_variables_is_one_line_and_exit_0(
        spawn: Spawn, workdir: Path, env: dict[str, str], says: str) -> None:
    controller = start_controller(spawn, workdir)
    hook = hook_for(workdir, controller)
    done = hook.run(None, job_env("9", **env) | env)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    lines = hook.lines()
    assert len(lines) == 1 and says in lines[0], lines
    assert jobs(controller) == {} and hook.queued() == []


def test_account_mapped_to_no_tenant_is_one_line_and_no_placement(spawn: Spawn,
                                                                 workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    hook = hook_for(workdir, controller)
    done = hook.run("prolog", job_env("10", account="chemistry", user="carol"))
    assert done.returncode == 0
    [line] = hook.lines()
    assert "'chemistry'" in line and "'carol'" in line and "no tenant" in line
    assert jobs(controller) == {} and hook.queued() == []
    # An account the operator marks as no tenant's ("") is passed over without a line.
    hook.config.write_text(hook.config.read_text().replace(
        "[accounts]\n", '[accounts]\n"chemistry" = ""\n'))
    assert hook.run("prolog", job_env("10", account="chemistry")).returncode == 0
    assert len(hook.lines()) == 1 and jobs(controller) == {} and hook.queued() == []


def test_node_unknown_to_the_controller_is_placed_and_named_in_the_log(
        spawn: Spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir)
    agent = FakeAgent(ctx, controller, host="gpu-01")
    agent.hello()
    wait_until(lambda: any(h["host_id"] == "gpu-01" for h in controller.request("hosts")),
               what="the controller to know gpu-01")
    hook = hook_for(workdir, controller)
    assert hook.run("prolog", job_env("11")).returncode == 0
    assert "11" in jobs(controller)
    [line] = hook.lines()
    assert "hosts h2 are unknown to the controller" in line and "gpu-01" not in line
    agent.close()


def test_controller_down_spools_and_replay_delivers_once(spawn: Spawn, workdir: Path) -> None:
    hook = hook_for(workdir)  # no controller yet
    assert hook.run("prolog", job_env("12")).returncode == 0
    assert hook.run("prolog", job_env("13")).returncode == 0
    assert hook.run("epilog", job_env("12")).returncode == 0
    assert len(hook.queued()) == 3
    assert any("not running" in line for line in hook.lines())
    controller = start_controller(spawn, workdir)
    assert hook.run("replay", {}).returncode == 0
    # In order: 12 placed then removed, 13 placed; each once (generation 1).
    placed = jobs(controller)
    assert list(placed) == ["13"] and placed["13"]["generation"] == 1
    assert hook.queued() == [] and hook.rejected() == []
    assert hook.run("replay", {}).returncode == 0
    assert jobs(controller)["13"]["generation"] == 1


def test_the_next_job_start_replays_what_was_spooled(spawn: Spawn, workdir: Path) -> None:
    hook = hook_for(workdir)
    assert hook.run("prolog", job_env("14")).returncode == 0
    controller = start_controller(spawn, workdir)
    assert hook.run("prolog", job_env("15")).returncode == 0  # delivers 14 first, then 15
    assert sorted(jobs(controller)) == ["14", "15"]
    assert hook.queued() == []


def test_controller_hung_leaves_the_request_spooled(workdir: Path) -> None:
    hung = workdir / "controller.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(hung))
        server.listen(16)  # accepts connections in the kernel, never answers
        hook = hook_for(workdir)
        done = hook.run("prolog", job_env("16"))
    assert done.returncode == 0
    assert len(hook.queued()) == 1
    assert any("did not answer" in line for line in hook.lines()), hook.lines()


def test_identical_placement_and_repeated_epilog_are_no_ops(spawn: Spawn,
                                                           workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    hook = hook_for(workdir, controller)
    for _ in range(3):
        assert hook.run("prolog", job_env("17")).returncode == 0
    assert jobs(controller)["17"]["generation"] == 1
    # Placed anew on other nodes (a requeued job): a new generation.
    assert hook.run("prolog", job_env("17", nodes="gpu-03")).returncode == 0
    assert jobs(controller)["17"]["generation"] == 2
    for _ in range(2):
        assert hook.run("epilog", job_env("17")).returncode == 0
    assert "17" not in jobs(controller)
    assert hook.queued() == [] and hook.rejected() == []
    # Only that no agent has reported from these hosts yet: nothing refused or left.
    assert all("unknown to the controller" in line for line in hook.lines())


def test_request_the_controller_refuses_is_kept_aside_and_the_rest_delivered(
        spawn: Spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    hook = hook_for(workdir)
    queue = hook.spool / "queue"
    queue.mkdir()
    bad = {"cmd": "place", "args": {"job": "18", "tenant": "acme", "members": []}}
    (queue / "0000000000000001.json").write_text(json.dumps(bad))
    (queue / "0000000000000002.json").write_text("{not json")
    assert hook.run("prolog", job_env("19")).returncode == 0
    assert list(jobs(controller)) == ["19"]
    assert len(hook.rejected()) == 2 and hook.queued() == []
    assert sum("refused by the controller" in line for line in hook.lines()) == 2


def test_slurm_user_may_place_through_the_socket_and_nothing_more(spawn: Spawn,
                                                                 workdir: Path) -> None:
    controller = start_controller(spawn, workdir, admin_group="slurm", extra=SCHEDULER)
    hook = hook_for(workdir, controller, owner="slurm")
    assert hook.run("prolog", job_env("20"), user="slurm").returncode == 0
    assert "20" in jobs(controller) and hook.queued() == []
    assert all("unknown to the controller" in line for line in hook.lines())
    assert hook.run("epilog", job_env("20"), user="slurm").returncode == 0
    assert "20" not in jobs(controller)
    # Other changes stay root's: the scheduler's user may not reload (nor drain...).
    code = ("from harmonaize.opsocket import request; import sys\n"
            "try: request(sys.argv[1], 'reload')\nexcept Exception as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code, str(controller.admin)], user="slurm",
                         group="slurm", extra_groups=[],
                         capture_output=True, text=True, timeout=30, check=False,
                         env={"PYTHONPATH": str(ROOT)})
    assert "permission denied" in out.stdout


def test_socket_group_member_not_named_a_scheduler_user_cannot_place(
        spawn: Spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir, admin_group="slurm")
    hook = hook_for(workdir, controller, owner="slurm")
    assert hook.run("prolog", job_env("21"), user="slurm").returncode == 0
    assert jobs(controller) == {}
    assert len(hook.queued()) == 1  # kept: placed once the operator fixes the access
    assert any("permission denied" in line for line in hook.lines()), hook.lines()
    with pytest.raises(CommandError):
        request(controller.admin, "unplace", {"job": "nope"})


def test_identical_placement_changes_nothing_in_the_controllers_core() -> None:
    # The core itself: said again, a placement publishes, forwards and stores nothing
    # (no new generation, no second notice or declaration sent to its hosts).
    core = ControllerCore(core_config(), 0.0)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    placement = Placement(JOB, TENANT, (Member("node0", HOST),), group="4242")
    core.place(placement, 0.0, WALL)
    core.receive(TenantPeer(b"t1", TENANT), tenant_frame(m.JobDeclaration(JOB, revision=1)),
                 0.1)
    core.tick(0.2, WALL)
    assert core.place(placement, 0.3, WALL) == []
    assert core.tick(0.4, WALL) == []
    assert core.redactor.placements[JOB].generation == 1
    moved = Placement(JOB, TENANT, (Member("node0", "gpu-host-18"),), group="4242")
    assert core.place(moved, 0.5, WALL) != []
    assert core.redactor.placements[JOB].generation == 2


def test_concurrent_prologs_are_each_delivered_once(spawn: Spawn, workdir: Path) -> None:
    # slurmctld runs prologs of jobs starting together in parallel: one delivers at a
    # time, the others leave their requests to it, and none is left behind.
    controller = start_controller(spawn, workdir)
    hook = hook_for(workdir, controller)
    argv = [*HOOK, "--config", str(hook.config)]
    procs = [subprocess.Popen(argv, env={"PYTHONPATH": str(ROOT), **job_env(str(job))},
                              cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for job in range(100, 112)]
    try:
        assert all(proc.wait(timeout=60) == 0 for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
    placed = jobs(controller)
    assert sorted(placed) == [str(job) for job in range(100, 112)]
    assert all(p["generation"] == 1 for p in placed.values())
    assert hook.queued() == [] and hook.rejected() == []


def test_unreadable_tenant_map_is_one_line_and_never_fails_the_job(workdir: Path) -> None:
    hook = hook_for(workdir)
    for text, says in (('socket = "relative/path"\n', "must be an absolute path"),
                       ("[accounts\n", "not TOML")):
        hook.config.write_text(text)
        done = hook.run(None, job_env("40"))
        assert done.returncode == 0 and "Traceback" not in done.stderr
        # Without its own settings, the line goes to the default log, else to stderr.
        default = Path(HookConfig().log)
        logged = done.stderr + (default.read_text() if default.exists() else "")
        assert says in logged
    # The timer's replay says so to systemd instead: the operator sees a failed unit.
    assert hook.run("replay", {}).returncode == 1
    assert hook.queued() == []


def test_replay_as_another_user_than_the_spools_is_refused_in_one_line(workdir: Path) -> None:
    hook = hook_for(workdir, owner="slurm")
    assert hook.run("prolog", job_env("41"), user="slurm").returncode == 0
    done = hook.run("replay", {})  # root's, not SlurmUser's
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "run it as that user" in hook.lines()[-1]
    assert len(hook.queued()) == 1
