"""harmonctl: every command's --json parses, watch, completion, and clear errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from harmonaize.harmonctl import LOCAL, TOKEN_COMMANDS, build_parser, subcommands
from harmonaize.harmonctl.controller import _cluster_fields
from tests.conftest import needs_root, python
from tests.daemons import NO_LINKS, fake_gpus, gpu_section, start_agent, start_controller

pytestmark = pytest.mark.ops

#: How each command is run in the test: (target, arguments). Targets: "agent",
#: "controller" (-C), "local" (no daemon). A command missing here fails the
#: coverage check below: add it with arguments that succeed.
COMMANDS: list[tuple[str, str, list[str]]] = [
    ("status", "agent", []),
    ("links", "agent", []),
    ("rdma", "agent", []),
    ("gpus", "agent", []),
    ("health", "agent", []),
    ("energy", "agent", []),
    ("job-health", "agent", []),
    ("job-health", "agent", ["--job", "j1"]),
    ("drain", "agent", ["--reason", "maintenance"]),
    ("undrain", "agent", []),
    ("drain", "agent", ["--gpu", "1", "--reason", "looks odd"]),
    ("release", "agent", ["--gpu", "1", "--force"]),
    ("validate", "agent", ["--gpu", "0", "--level", "1"]),
    ("validations", "agent", ["--limit", "5"]),
    ("remediation", "agent", ["--limit", "5"]),
    ("declare", "agent", ["@declaration"]),
    ("jobs", "agent", []),
    ("policy", "agent", ["j1"]),
    ("reload", "agent", []),
    ("help", "agent", []),
    ("status", "controller", []),
    ("hosts", "controller", []),
    ("capacity", "controller", []),
    ("events", "controller", ["--limit", "5"]),
    ("place", "controller", ["@placement"]),
    ("jobs", "controller", []),
    ("feed", "controller", []),
    ("tenants", "controller", []),
    ("pools", "controller", []),
    ("privacy", "controller", []),
    ("job-findings", "controller", []),
    ("scheduler", "controller", []),
    ("holds", "controller", []),
    ("token", "controller", ["issue", "--tenant", "acme", "--days", "1"]),
    ("token", "controller", ["list"]),
    ("unplace", "controller", ["j1"]),
    ("help", "controller", []),
    ("keygen", "local", ["ops-test", "--dir", "@keys"]),
    ("completion", "local", ["bash"]),
]


def harmonctl(*args: str, env: dict[str, str] | None = None,
              user: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(python("harmonaize.harmonctl", *args), capture_output=True, text=True,
                          timeout=120, env=env, user=user)


def test_the_table_covers_every_command() -> None:
    covered = {name for name, _, _ in COMMANDS} | {"watch"}  # watch: its own test below
    assert set(subcommands(build_parser())) == covered


@needs_root
def test_every_command_prints_json_that_parses(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    _, env = fake_gpus(workdir, gpus=2)
    agent = start_agent(spawn, workdir, "c1", endpoint=controller.listen, env=env,
                        links=NO_LINKS + gpu_section())
    files = {
        "@declaration": workdir / "declaration.json",
        "@placement": workdir / "placement.json",
        "@keys": workdir / "keys-test",
    }
    files["@declaration"].write_text(json.dumps({"job": "j1", "max_validation_pause": 60}))
    files["@placement"].write_text(json.dumps(
        {"job": "j1", "tenant": "acme", "members": [{"name": "0", "host": "c1"}]}))
    offered = {
        "agent": set(agent.request("help")),
        "controller": set(controller.request("help")),
    }
    for name, target, args in COMMANDS:
        remote = TOKEN_COMMANDS[args[0]] if name == "token" else name
        if target != "local":
            assert remote in offered[target], f"the {target} does not offer {remote!r}"
        argv = [str(files.get(a, a)) for a in args]
        prefix = {"agent": ["-s", str(agent.socket)],
                  "controller": ["-C", str(controller.admin)], "local": []}[target]
        done = harmonctl(*prefix, name, *argv, "--json")
        assert done.returncode == 0, f"{name} ({target}): {done.stderr}"
        try:
            json.loads(done.stdout)
        except ValueError as exc:
            raise AssertionError(f"{name} ({target}) --json: {exc}\n{done.stdout[:500]}") \
                from None
        # The same command as a table also works.
        if name not in LOCAL and name not in {"drain", "release", "place", "unplace",
                                              "validate", "declare", "reload", "undrain"}:
            table = harmonctl(*prefix, name, *argv)
            assert table.returncode == 0 and table.stdout.strip(), table.stderr


def test_watch_redraws_and_prints_json_lines(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir, "w1")
    done = harmonctl("-s", str(agent.socket), "watch", "health", "--count", "3",
                     "--interval", "0.1", "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 3 and all("health" in line["result"] for line in lines)
    assert lines[0]["time"] < lines[2]["time"]

    text = harmonctl("-s", str(agent.socket), "watch", "--count", "2", "--interval", "0.1")
    assert text.returncode == 0
    assert text.stdout.count("harmonctl status, every 0.1 s") == 2 and "host:" in text.stdout
    assert "\x1b[2J" not in text.stdout  # no screen control codes into a pipe

    refused = harmonctl("watch", "drain")
    assert refused.returncode == 2 and "invalid choice" in refused.stderr


def test_watch_keeps_going_while_the_agent_is_away(workdir: Path) -> None:
    done = harmonctl("-s", str(workdir / "none.sock"), "watch", "--count", "2",
                     "--interval", "0.05", "--json")
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 2 and all("is harmonaize-agent running?" in x["error"] for x in lines)


def test_clear_errors_when_the_agent_is_not_there(workdir: Path) -> None:
    missing = harmonctl("-s", str(workdir / "none.sock"), "status")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (f"harmonctl: no agent socket at {workdir / 'none.sock'}: "
                                      "is harmonaize-agent running?")
    # A socket file left behind by a killed agent.
    stale = workdir / "stale.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(stale))
    refused = harmonctl("-s", str(stale), "status")
    assert refused.returncode == 1 and "harmonaize-agent is not running" in refused.stderr
    not_ours = workdir / "plain-file.sock"
    not_ours.write_text("")
    other = harmonctl("-s", str(not_ours), "status")
    assert other.returncode == 1 and other.stderr.startswith("harmonctl: ")
    assert "Traceback" not in other.stderr


@needs_root
def test_clear_errors_when_the_caller_may_not(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir, "p1")  # socket mode 0660, root's group only
    done = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), "status"),
                          capture_output=True, text=True, timeout=60, user=65534, group=65534,
                          extra_groups=[], cwd=Path(__file__).resolve().parents[2])
    if "No module named" in done.stderr or "Permission denied: '/" in done.stderr:
        pytest.skip("the checkout is not readable by other users here")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (f"harmonctl: permission denied on {agent.socket}: use root, "
                                   "or join the socket's group (harmonaize)")


def test_dash_c_before_a_command_means_the_default_admin_socket(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    env = {**os.environ, "HARMONCTL_ADMIN_SOCKET": str(controller.admin)}
    done = harmonctl("-C", "hosts", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_bash_completion_completes_commands_options_and_choices(workdir: Path) -> None:
    script = workdir / "harmonctl.bash"
    done = harmonctl("completion", "bash")
    script.write_text(done.stdout)
    probe = f"""
source {script}
comp() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=()
         _shtab_harmonctl; echo "${{COMPREPLY[*]}}"; }}
comp harmonctl va
comp harmonctl -C ho
comp harmonctl -s /x.sock drain --
comp harmonctl validate --level ""
comp harmonctl watch gp
comp harmonctl --ti
"""
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30,
                         check=True).stdout.splitlines()
    assert out == ["validate validations", "hosts holds", "--help --json --reason --gpu", "1 2 3",
                   "gpus", "--timeout"]
    zsh = harmonctl("completion", "zsh")
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef harmonctl\n")
    assert all(command in zsh.stdout for command in subcommands(build_parser()))


def test_a_replicas_status_tells_an_unread_leader_from_an_election() -> None:
    """A leader the bus did not answer for is not shown as nobody leading."""
    def leader(cluster: dict[str, object]) -> object:
        return dict(_cluster_fields({"replica": "r2", "bus": "connected", **cluster}))["leader"]
    assert leader({"leader": "r3"}) == "r3"
    assert leader({"leader": None}) == "none (an election is under way)"
    assert leader({"leader": None, "leader_unread": True}) == (
        "unknown (the bus did not answer in time)")
