"""The systemd units, sysusers and tmpfiles entries, checked by systemd's own tools."""

from __future__ import annotations

import grp
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from agent.config import AgentConfig
from controller.config import ControllerConfig
from harmonaize.config import parse
from tests.conftest import ROOT

pytestmark = pytest.mark.ops

UNITS = ROOT / "systemd"
AGENT = UNITS / "harmonaize-agent.service"
CONTROLLER = UNITS / "harmonaize-controller.service"
#: Exposure levels as measured (systemd 252); a unit that loses hardening fails here.
#: The agent's 3.7 is 3.4 plus reading the kernel's log (ProtectKernelLogs= off, 0.2;
#: CAP_SYSLOG, 0.1), which the driver's XID lines that name a process need.
MAX_EXPOSURE = {"harmonaize-agent.service": 3.7, "harmonaize-controller.service": 1.5}

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze is not installed (./scripts/setup)")


def service(path: Path) -> dict[str, list[str]]:
    """The [Service] section: each key with all its values, in order."""
    values: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def with_prefix(tmp: Path) -> Path:
    """Copies of the units whose commands exist: verify checks ExecStart= paths."""
    prefix = tmp / "opt" / "harmonaize"
    (prefix / "bin").mkdir(parents=True)
    for command in ("harmonaize-agent", "harmonaize-controller"):
        script = prefix / "bin" / command
        script.write_text("#!/bin/sh\n")
        script.chmod(0o755)
    out = tmp / "units"
    out.mkdir()
    for unit in (AGENT, CONTROLLER):
        (out / unit.name).write_text(unit.read_text().replace("/opt/harmonaize", str(prefix)))
    return out


@needs_analyze
def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    units = with_prefix(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(u) for u in sorted(units.iterdir()))],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stderr


@needs_analyze
def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    units = with_prefix(tmp_path)
    unit = units / AGENT.name
    unit.write_text(unit.read_text().replace("Type=notify", "Type=notifyy"))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=60)
    assert "notifyy" in done.stderr


def exposure(unit: Path) -> float:
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                          capture_output=True, text=True, timeout=60, cwd=unit.parent)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


@needs_analyze
def test_exposure_levels_stay_low(tmp_path: Path) -> None:
    units = with_prefix(tmp_path)
    levels = {name: exposure(units / name) for name in MAX_EXPOSURE}
    for name, level in levels.items():
        assert level <= MAX_EXPOSURE[name], levels
    # The unprivileged controller is exposed less than the privileged agent.
    assert levels[CONTROLLER.name] < levels[AGENT.name]


def test_every_option_left_off_says_why() -> None:
    for unit in (AGENT, CONTROLLER):
        lines = unit.read_text().splitlines()
        left_off = re.compile(r"#[A-Z][A-Za-z]+=.*")
        for i, line in enumerate(lines):
            if left_off.fullmatch(line):
                above = i - 1  # options left off together may share their reason
                while above >= 0 and left_off.fullmatch(lines[above]):
                    above -= 1
                assert above >= 0 and lines[above].startswith("# ") and len(
                    lines[above]) > 10, f"{unit.name}: {line} has no comment saying why"


def test_units_agree_with_the_code() -> None:
    agent, controller = service(AGENT), service(CONTROLLER)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for unit in (agent, controller):
        command = unit["ExecStart"][0].split()[0]
        assert command.startswith("/opt/harmonaize/bin/")
        assert Path(command).name in scripts
        assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    acfg, ccfg = parse(AgentConfig, {}), parse(ControllerConfig, {})
    # The default paths live in the directories systemd makes writable.
    assert acfg.agent.state_dir == "/var/lib/" + agent["StateDirectory"][0]
    assert Path(acfg.socket.path).parent == Path("/run", agent["RuntimeDirectory"][0])
    assert Path(ccfg.controller.database).parent == Path("/var/lib",
                                                         controller["StateDirectory"][0])
    assert Path(ccfg.controller.admin_socket).parent == Path(
        "/run", controller["RuntimeDirectory"][0])
    # The agent may hand its socket to the operator group, which is the controller's.
    assert agent["SupplementaryGroups"] == [acfg.socket.group]
    assert controller["Group"] == [ccfg.controller.admin_group] == controller["User"]
    sysusers = (UNITS / "harmonaize.sysusers").read_text()
    assert re.search(rf"^u {controller['User'][0]} ", sysusers, re.M)
    # What bcc, tc, the job lookup, the jobs' tuner directories and the kernel's XID
    # lines need, and nothing more; the controller needs nothing.
    assert set(agent["CapabilityBoundingSet"][0].split()) == {
        "CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH",
        "CAP_CHOWN", "CAP_SYSLOG"}
    # Policies outlive the agent: the next one adopts them.
    assert agent["RuntimeDirectoryPreserve"] == ["yes"]
    assert controller["CapabilityBoundingSet"] == [""]
    assert agent["WatchdogSec"] and "WatchdogSec" not in controller  # only the agent pings


def test_the_install_guide_explains_every_option() -> None:
    guide = (ROOT / "docs" / "install.md").read_text()
    for unit in (AGENT, CONTROLLER):
        keys = set(service(unit))
        keys |= {m.group(1) for m in re.finditer(r"^#([A-Z][A-Za-z]+)=", unit.read_text(), re.M)}
        missing = sorted(k for k in keys if f"`{k}=" not in guide)
        assert not missing, f"docs/install.md does not explain {missing} ({unit.name})"


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="no systemd-sysusers")
def test_sysusers_and_tmpfiles_apply_to_a_root(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        (tmp_path / "etc" / name).write_text("root:x:0:0:root:/root:/bin/sh\n" if name ==
                                              "passwd" else "root:x:0:\n")
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(UNITS / "harmonaize.sysusers")],
                   check=True, capture_output=True, timeout=60)
    users = (tmp_path / "etc" / "passwd").read_text()
    line = next(u for u in users.splitlines() if u.startswith("harmonaize:"))
    uid, gid, home, shell = line.split(":")[2], line.split(":")[3], *line.split(":")[5:7]
    assert int(uid) < 1000 and home == "/var/lib/harmonaize" and shell.endswith("nologin")
    assert f"harmonaize:x:{gid}:" in (tmp_path / "etc" / "group").read_text()

    done = subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create",
                           str(UNITS / "harmonaize.tmpfiles")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    keys = (tmp_path / "etc" / "harmonaize" / "keys").stat()
    assert stat.S_IMODE(keys.st_mode) == 0o750 and keys.st_uid == 0
    # tmpfiles resolves the group in the root it was given, or in the host's database.
    host_gid = grp.getgrnam("harmonaize").gr_gid if _has_group("harmonaize") else None
    assert keys.st_gid in {int(gid), host_gid}


def _has_group(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True
