"""The agent's operator socket: credentials, hostile requests, harmonctl."""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import needs_root, python
from tests.daemons import start_agent

pytestmark = [pytest.mark.foundation, needs_root]

NOBODY, NOGROUP, STRANGER = 65534, 65534, 65533

CLIENT = textwrap.dedent("""
    import json, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
    except OSError as exc:
        print(json.dumps({"connect_error": exc.strerror})); sys.exit(0)
    try:
        s.sendall(json.dumps({"cmd": sys.argv[2]}).encode() + b"\\n")
    except BrokenPipeError:
        pass  # refused before we spoke: the refusal is still there to read
    print(s.makefile().readline().strip())
""")


def as_user(uid: int, gid: int, path: Path, cmd: str) -> dict:
    # Only the system interpreter and the standard library: the checkout may not
    # be readable by other users.
    result = subprocess.run(
        ["/usr/bin/python3", "-c", CLIENT, str(path), cmd],
        user=uid, group=gid, extra_groups=[], capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def raw(path: Path, payload: bytes) -> list[dict]:
    """Send raw bytes, return every reply line until the server closes or goes quiet."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_group_members_read_and_only_root_changes(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir, group="nogroup")
    mode = agent.socket.stat().st_mode & 0o777
    assert mode == 0o660 and agent.socket.stat().st_gid == NOGROUP
    assert as_user(NOBODY, NOGROUP, agent.socket, "status")["ok"] is True
    reply = as_user(NOBODY, NOGROUP, agent.socket, "drain")
    assert reply == {"ok": False, "error": "permission denied: 'drain' is for root only"}
    # Outside the group the file mode already keeps the caller out.
    assert "connect_error" in as_user(STRANGER, STRANGER, agent.socket, "status")
    assert agent.request("drain", {"reason": "maintenance"})["schedulable"] is False
    assert agent.request("status")["schedulable"] is False
    assert agent.request("status")["socket"]["denied"] == 1


def test_peer_credentials_are_checked_even_if_the_mode_is_open(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir, group="nogroup", extra="")
    agent.socket.chmod(0o666)  # a careless operator
    reply = as_user(STRANGER, STRANGER, agent.socket, "status")
    assert reply == {"ok": False, "error": "permission denied"}
    assert as_user(NOBODY, NOGROUP, agent.socket, "status")["ok"] is True


def test_malformed_requests_get_errors_and_the_agent_keeps_serving(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir)
    replies = raw(agent.socket, b"".join([
        b"this is not json\n",
        b"[1, 2, 3]\n",
        b'{"cmd": 42}\n',
        b'{"cmd": "status", "args": "all"}\n',
        b'{"cmd": "self-destruct"}\n',
        b'{"cmd": "drain", "args": {"reason": 5}}\n',
        b"\xff\xfe\x00\n",
        b'{"cmd": "status"}\n',
    ]))
    assert [r["ok"] for r in replies] == [False] * 7 + [True]
    assert "not JSON" in replies[0]["error"]
    assert "expected" in replies[1]["error"] and "expected" in replies[2]["error"]
    assert "args must be an object" in replies[3]["error"]
    assert "unknown command 'self-destruct'" in replies[4]["error"]
    assert "reason must be a string" in replies[5]["error"]
    (too_long,) = raw(agent.socket, b"x" * (200 * 1024) + b"\n")
    assert too_long["ok"] is False and "bytes" in too_long["error"]
    status = agent.request("status")
    assert status["ready"] is True and status["socket"]["errors"] == 8
    assert agent.proc.poll() is None


def test_harmonctl_tables_json_and_errors(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir)

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), *args),
                              capture_output=True, text=True, timeout=30)

    table = ctl("status")
    assert table.returncode == 0
    assert "health:      healthy" in table.stdout and "OBSERVER" in table.stdout
    parsed = json.loads(ctl("status", "--json").stdout)
    assert parsed["host_id"] == "h1"
    assert "host" in {o["name"] for o in parsed["observers"]}
    assert json.loads(ctl("--json", "drain", "--reason", "rma").stdout)["reason"] == "rma"
    assert json.loads(ctl("--json", "help").stdout)["drain"]["root_only"] is True
    missing = subprocess.run(
        python("harmonaize.harmonctl", "-s", str(workdir / "none.sock"), "status"),
        capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1
    assert "is harmonaize-agent running?" in missing.stderr
