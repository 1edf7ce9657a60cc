"""scripts/install and scripts/uninstall into a staging root: everything in place, then nothing."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sysconfig
from pathlib import Path

import pytest

from agent import config as agent_config
from controller import config as controller_config
from tests.conftest import ROOT

pytestmark = pytest.mark.ops

INSTALL = ROOT / "scripts" / "install"
UNINSTALL = ROOT / "scripts" / "uninstall"
PLUGIN = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"


def run(script: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(script), "--root", str(root), *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    return root


def test_install_puts_everything_in_place_and_uninstall_removes_it(stage: Path) -> None:
    run(INSTALL, stage, "--no-deps")
    units = stage / "usr/lib/systemd/system"
    for unit in ("harmonaize-agent.service", "harmonaize-controller.service"):
        assert (units / unit).read_text() == (ROOT / "systemd" / unit).read_text()
    assert (stage / "usr/lib/sysusers.d/harmonaize.conf").is_file()
    assert (stage / "usr/lib/tmpfiles.d/harmonaize.conf").is_file()
    assert (stage / "usr/lib/harmonaize/libnccl-tuner-harmonaize.so").read_bytes() == \
        PLUGIN.read_bytes()
    assert (stage / "usr/share/harmonaize/bpf/link_counters.c").is_file()
    assert (stage / "usr/share/doc/harmonaize/install.md").is_file()
    keys = (stage / "etc/harmonaize/keys").stat()
    assert stat.S_IMODE(keys.st_mode) == 0o750
    # The default configuration is valid for the real loaders.
    acfg, _ = agent_config.load(stage / "etc/harmonaize/agent.toml")
    ccfg, _ = controller_config.load(stage / "etc/harmonaize/controller.toml")
    assert acfg.metrics.listen == "" and ccfg.metrics.listen == ""
    for command in ("harmonctl", "harmonaize-agent", "harmonaize-controller"):
        link = stage / "usr/local/bin" / command
        assert os.readlink(link) == f"/opt/harmonaize/bin/{command}"
        script = stage / "opt/harmonaize/bin" / command
        assert script.read_text().startswith("#!/opt/harmonaize/bin/python\n")
    completion = stage / "usr/share/bash-completion/completions/harmonctl"
    assert "-F _shtab_harmonctl harmonctl" in completion.read_text()
    subprocess.run(["bash", "-n", str(completion)], check=True)

    # The installed package (not the checkout) imports and runs; its dependencies
    # come from the checkout's environment here, since --no-deps left them out.
    python = stage / "opt/harmonaize/bin/python"
    deps = sysconfig.get_paths()["purelib"]
    done = subprocess.run(
        [str(python), "-c", "import agent.main, harmonaize.metrics; print(agent.main.__file__)"],
        capture_output=True, text=True, timeout=60, cwd="/",
        env={**os.environ, "PYTHONPATH": deps})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(stage / "opt/harmonaize/lib/"))

    # The installed units verify against the installed tree.
    if shutil.which("systemd-analyze"):
        copies = []
        for unit in sorted(units.iterdir()):
            copy = stage.parent / unit.name
            copy.write_text(unit.read_text().replace("/opt/harmonaize", f"{stage}/opt/harmonaize"))
            copies.append(str(copy))
        verify = subprocess.run(["systemd-analyze", "verify", "--man=no", *copies],
                                capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0, verify.stderr

    run(UNINSTALL, stage)
    assert files(stage) == []


def test_a_second_install_upgrades_in_place_and_keeps_changed_configuration(
        stage: Path) -> None:
    run(INSTALL, stage, "--no-deps")
    agent_toml = stage / "etc/harmonaize/agent.toml"
    agent_toml.write_text(agent_toml.read_text().replace('# pool = "default"', 'pool = "east"'))
    assert agent_config.load(agent_toml)[0].agent.pool == "east"
    (stage / "etc/harmonaize/keys/agent.key_secret").write_text("secret")
    first = files(stage)

    second = run(INSTALL, stage, "--no-deps")
    assert "keeping /etc/harmonaize/agent.toml" in second.stderr
    assert 'pool = "east"' in agent_toml.read_text()
    assert files(stage) == first  # nothing new, nothing lost: idempotent

    kept = run(UNINSTALL, stage)
    assert "keeping /etc/harmonaize/agent.toml (changed" in kept.stderr
    assert files(stage) == ["etc", "etc/harmonaize", "etc/harmonaize/agent.toml",
                            "etc/harmonaize/keys", "etc/harmonaize/keys/agent.key_secret"]
    run(UNINSTALL, stage, "--purge")
    assert files(stage) == []


def test_bad_arguments_are_refused_and_change_nothing(stage: Path) -> None:
    for args in (["--role", "gpu"], ["--frobnicate"], ["--root", str(stage / "missing")]):
        done = subprocess.run([str(INSTALL), "--root", str(stage), *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and done.stderr.strip()
    assert files(stage) == []


def test_cluster_mode_adds_the_controllers_drop_in_and_going_back_removes_it(
        stage: Path) -> None:
    run(INSTALL, stage, "--no-deps", "--role", "controller", "--cluster")
    dropin = stage / "usr/lib/systemd/system/harmonaize-controller.service.d/cluster.conf"
    shipped = ROOT / "systemd/harmonaize-controller.service.d/cluster.conf"
    assert dropin.read_text() == shipped.read_text()
    assert "TimeoutStartSec=150s" in dropin.read_text()
    assert (stage / "usr/share/doc/harmonaize/scaling.md").is_file()
    # The same install without --cluster is the embedded controller again.
    run(INSTALL, stage, "--no-deps", "--role", "controller")
    assert not dropin.parent.exists()
    run(INSTALL, stage, "--no-deps", "--role", "controller", "--cluster")
    run(UNINSTALL, stage)
    assert files(stage) == []
