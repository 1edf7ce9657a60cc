"""Hostile paths and endpoints in the configuration: one line naming the setting,
a non-zero exit, no traceback, and nothing of the operator's deleted."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port, needs_root, python
from tests.daemons import agent_config

pytestmark = [pytest.mark.hardening, pytest.mark.ops, needs_root]


def run(module: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(python(module, "-c", str(config)), capture_output=True, text=True,
                          timeout=60)


def said(result: subprocess.CompletedProcess[str]) -> str:
    """The failure's one line (log lines before it are the service's normal start)."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def controller_config(workdir: Path, **keys: str) -> Path:
    values = {"listen": f"tcp://127.0.0.1:{free_port()}",
              "feed": f"tcp://127.0.0.1:{free_port()}",
              "admin_socket": str(workdir / "c.sock"), "database": str(workdir / "c.db"),
              **keys}
    path = workdir / "controller.toml"
    path.write_text("[controller]\n" + "".join(f'{k} = "{v}"\n' for k, v in values.items())
                    + 'admin_group = ""\n[auth]\nmode = "none"\n')
    return path


def test_the_controllers_paths_and_endpoints(workdir: Path) -> None:
    a_file, a_dir = workdir / "notes.txt", workdir / "a-dir"
    a_file.write_text("keep me\n")
    a_dir.mkdir()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    cases = {
        "database": (dict(database=str(a_dir)), "controller.database: "),
        "database under a file": (dict(database=f"{a_file}/c.db"), "controller.database: "),
        "admin socket is a directory": (dict(admin_socket=str(a_dir)),
                                        "controller.admin_socket: "),
        "admin socket is a file": (dict(admin_socket=str(a_file)),
                                   "controller.admin_socket: "),
        "listen not an endpoint": (dict(listen="tcp://nope:abc"), "controller.listen: "),
        "listen port out of range": (dict(listen="tcp://127.0.0.1:99999"),
                                     "controller.listen: "),
        "listen port taken": (dict(listen=f"tcp://127.0.0.1:{port}"),
                              "controller.listen = "),
        "feed unknown host": (dict(feed="tcp://nope.invalid:7401"), "controller.feed = "),
    }
    try:
        for name, (keys, expected) in cases.items():
            line = said(run("controller.main", controller_config(workdir, **keys)))
            assert expected in line, (name, line)
    finally:
        taken.close()
    assert a_file.read_text() == "keep me\n" and a_dir.is_dir()


def test_the_agents_paths_and_endpoints(workdir: Path) -> None:
    a_file, a_dir = workdir / "notes.txt", workdir / "a-dir"
    a_file.write_text("keep me\n")
    a_dir.mkdir()
    base = agent_config(workdir, "h1").read_text()
    cases = {
        "state_dir is a file": (base.replace(f'state_dir = "{workdir / "h1"}"',
                                             f'state_dir = "{a_file}"'), "agent.state_dir"),
        "socket is a directory": (base.replace(f'path = "{workdir / "h1"}.sock"',
                                               f'path = "{a_dir}"'), "socket.path"),
        "socket is a file": (base.replace(f'path = "{workdir / "h1"}.sock"',
                                          f'path = "{a_file}"'), "socket.path"),
        "endpoint": (base.replace('endpoint = ""', 'endpoint = "tcp://x:0"'),
                     "controller.endpoint"),
    }
    config = workdir / "agent.toml"
    for name, (text, expected) in cases.items():
        config.write_text(text)
        line = said(run("agent.main", config))
        assert expected in line, (name, line)
    assert a_file.read_text() == "keep me\n" and a_dir.is_dir()


def test_a_configuration_that_is_not_text(workdir: Path) -> None:
    config = workdir / "agent.toml"
    config.write_bytes(b'[agent]\nhost_id = "h\xff\xfe1"\n')
    for module in ("agent.main", "controller.main"):
        line = said(run(module, config))
        assert line.endswith(f"{config}: not UTF-8 text (byte 20)"), line
