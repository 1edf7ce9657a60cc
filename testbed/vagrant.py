"""The Vagrant test cluster (see the Vagrantfile), driven from the machine running the tests.

``vagrant ssh`` starts Ruby for every call; this module asks Vagrant for the
SSH settings once and then runs commands with plain ``ssh``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

NODES = ("controller", "h1", "h2")
UP_HINT = "./scripts/vagrant-box, then vagrant up --provider=libvirt"


def _vagrant(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["vagrant", *args], check=False, cwd=root, capture_output=True,
                          text=True, timeout=timeout)


def states(root: Path) -> dict[str, str]:
    """Each VM's state as Vagrant reports it (``running``, ``shutoff``, ``not_created``)."""
    done = _vagrant(root, "status", "--machine-readable")
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        parts = line.split(",")
        if len(parts) >= 4 and parts[2] == "state":
            found[parts[1]] = parts[3]
    return found


def not_up(root: Path) -> str | None:
    """Why the VMs cannot be used, or None when all of them run."""
    if shutil.which("vagrant") is None:
        return f"vagrant is not installed ({UP_HINT})"
    if not (root / "Vagrantfile").is_file():
        return "no Vagrantfile"
    try:
        found = states(root)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"vagrant status failed: {exc}"
    down = {node: found.get(node, "unknown") for node in NODES if found.get(node) != "running"}
    if down:
        listed = ", ".join(f"{node} {state}" for node, state in down.items())
        return f"the VMs are not all running ({listed}): {UP_HINT}"
    return None


class VagrantCluster:
    """Commands on the VMs over SSH, as root where asked."""

    __test__ = False

    def __init__(self, root: Path, workdir: Path) -> None:
        self.root = root
        self.config = workdir / "ssh_config"
        done = _vagrant(root, "ssh-config", *NODES)
        if done.returncode != 0:
            raise RuntimeError(f"vagrant ssh-config failed: {done.stderr.strip()}")
        self.config.write_text(done.stdout)

    def run(self, node: str, argv: Sequence[str], *, sudo: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = shlex.join(["sudo", *argv] if sudo else list(argv))
        return subprocess.run(["ssh", "-F", str(self.config), "-o", "LogLevel=ERROR", node,
                               command], check=False, capture_output=True, text=True,
                              timeout=timeout)
