"""Configuration: defaults without a file, and bad files named precisely."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent import config as agent_config
from controller import config as controller_config
from harmonaize.config import ConfigError, parse
from tests.conftest import python

pytestmark = pytest.mark.foundation


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_config, "DEFAULT_PATH", tmp_path / "absent.toml")
    cfg, source = agent_config.load(None)
    assert source is None
    assert cfg.agent.interval == 0.1
    assert cfg.socket.path == "/run/harmonaize/agent.sock"
    assert cfg.controller.endpoint == ""


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        agent_config.load(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[agent]\nintervall = 0.5\n", "agent.intervall: unknown key"),
        ("[agnet]\n", "agnet: unknown key"),
        ("[agent]\ninterval = 'fast'\n", "agent.interval: expected a number"),
        ("[agent]\ninterval = 0\n", "agent.interval: 0.0 is below the minimum"),
        ("[agent]\npool = 'has space'\n", "agent.pool"),
        ("[socket]\npath = 'relative/agent.sock'\n", "socket.path"),
        ("[controller]\nendpoint = 'http://x'\n", "controller.endpoint"),
        ("[observers.host]\nenabled = 'yes'\n", "observers.host.enabled: expected true or false"),
        ("[observers.host]\nmemory_available_min = 2.0\n", "observers.host.memory_available_min"),
        ("[agent]\nlog_level = 'loud'\n", "agent.log_level: 'loud' is not one of"),
        ("agent = 3\n", "agent: expected a map"),
        ("[agent\n", "not valid TOML"),
    ],
)
def test_bad_agent_files_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        agent_config.load(path)
    assert needle in str(info.value)
    assert str(path) in str(info.value)


def test_a_full_agent_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        "[agent]\nhost_id = 'gpu-17'\npool = 'east'\ninterval = 0.25\n"
        "[socket]\nmode = 0o640\n"
        "[controller]\nendpoint = 'tcp://10.0.0.1:7400'\nheartbeat = 2.0\n"
        "[observers.host]\nsustain = 5\n"
    )
    cfg, source = agent_config.load(path)
    assert source == path
    assert (cfg.agent.host_id, cfg.agent.pool, cfg.agent.interval) == ("gpu-17", "east", 0.25)
    assert cfg.socket.mode == 0o640
    assert cfg.controller.heartbeat == 2.0
    assert cfg.observers.host.sustain == 5.0


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"redaction": {"host_buckets": [1, 2]}}, "must start at 0"),
        ({"redaction": {"gpu_buckets": [0, 8, 8]}}, "increase strictly"),
        ({"redaction": {"gpu_buckets": []}}, "list too short"),
        ({"redaction": {"mode": "partial"}}, "redaction.mode"),
        ({"redaction": {"min_hosts": 0}}, "redaction.min_hosts"),
        ({"liveness": {"missed_heartbeats": 0}}, "liveness.missed_heartbeats"),
        ({"controller": {"database": "db.sqlite"}}, "controller.database"),
    ],
)
def test_bad_controller_settings(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse(controller_config.ControllerConfig, data)


def test_agent_binary_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[agent]\nsampling = 1\n")
    result = subprocess.run(python("agent.main", "-c", str(path)), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert "agent.sampling: unknown key" in result.stderr


def test_controller_binary_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "controller.toml"
    path.write_text("[feed]\nrepublish = -1\n")
    result = subprocess.run(python("controller.main", "-c", str(path)), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert "feed.republish" in result.stderr
