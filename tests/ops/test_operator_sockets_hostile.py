"""The operator sockets under hostile local callers: deep nesting, idle hoarding,
over-long lines; root always gets through and no caller meets a reset."""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from harmonaize.opsocket import (
    CLIENTS_PER_UID,
    OTHER_CLIENTS,
    ROOT_CLIENTS,
    OperatorSocket,
    Peer,
)
from tests.agent.test_operator_socket import NOBODY, NOGROUP, raw
from tests.conftest import needs_root
from tests.daemons import start_agent, start_controller, wait_until

pytestmark = [pytest.mark.hardening, pytest.mark.foundation]

#: Holds N idle connections as whoever runs it; prints each one's first reply
#: (if the server answered at once) and waits for its stdin to close.
HOARDER = textwrap.dedent("""
    import json, select, socket, sys
    held = []
    for _ in range(int(sys.argv[2])):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sys.argv[1])
        held.append(s)
    answers = []
    for s in held:
        ready, _, _ = select.select([s], [], [], 0.5)
        answers.append(s.recv(4096).decode().strip() if ready else "")
    print(json.dumps(answers), flush=True)
    sys.stdin.read()
""")


def peer(uid: int) -> Peer:
    return Peer(1, uid, uid, frozenset())


def test_each_uid_and_all_non_root_callers_have_a_cap_root_its_own_room() -> None:
    sock = OperatorSocket("/nonexistent", {})
    for i in range(CLIENTS_PER_UID):
        assert sock._admit(peer(1000)) is None, i
    assert "uid 1000 has 8" in (sock._admit(peer(1000)) or "")
    uid = 2000
    while sum(sock._by_uid.values()) < OTHER_CLIENTS:
        assert sock._admit(peer(uid)) is None
        uid += 1 if sock._by_uid[uid] == CLIENTS_PER_UID else 0
    assert "all non-root" in (sock._admit(peer(uid + 1)) or "")
    for _ in range(ROOT_CLIENTS):
        assert sock._admit(peer(0)) is None
    assert "root has" in (sock._admit(peer(0)) or "")
    sock._release(1000)
    assert sock._admit(peer(1000)) is None  # a slot given back can be taken again
    sock._release(0)
    assert sock._by_uid[0] == ROOT_CLIENTS - 1


@needs_root
def test_a_member_hoarding_connections_locks_out_neither_drain_nor_place(
    spawn, workdir: Path
) -> None:
    agent = start_agent(spawn, workdir, group="nogroup")
    controller = start_controller(spawn, workdir, admin_group="nogroup")
    hoarders = []
    for path in (agent.socket, controller.admin):
        proc = subprocess.Popen(["/usr/bin/python3", "-c", HOARDER, str(path), "64"],
                                user=NOBODY, group=NOGROUP, extra_groups=[],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hoarders.append(proc)
    try:
        for proc in hoarders:
            answers = json.loads(proc.stdout.readline())
            assert answers[:CLIENTS_PER_UID] == [""] * CLIENTS_PER_UID  # taken, idle
            refused = [json.loads(a) for a in answers[CLIENTS_PER_UID:]]
            assert all("too many clients: uid 65534" in r["error"] for r in refused)
        assert agent.request("drain", {"reason": "maintenance"})["schedulable"] is False
        assert controller.request("place", {"job": "j", "tenant": "acme", "members": [
            {"name": "0", "host": "h1"}]})["job"] == "j"
        assert agent.request("status")["socket"]["refused_busy"] == 64 - CLIENTS_PER_UID
        assert controller.request("status")["admin_socket"]["refused_busy"] == 56
        # Idle non-root connections are closed, and counted, well before root's would be.
        wait_until(lambda: agent.request("status")["socket"]["idle_closed"] == 8,
                   timeout=30, what="the hoarded connections closed")
    finally:
        for proc in hoarders:
            proc.kill()
            proc.wait()


@needs_root
def test_deep_nesting_gets_an_answer_on_both_sockets(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir)
    controller = start_controller(spawn, workdir)
    for path in (agent.socket, controller.admin):
        replies = raw(path, b"".join([
            b"[" * 50_000 + b"\n",                                   # past the parser's limit
            b'{"cmd": "status", "args": {"a": ' + b"[" * 40 + b"]" * 40 + b"}}\n",
            b'{"cmd": "status"}\n',
        ]))
        assert [r["ok"] for r in replies] == [False, False, True], replies
        assert all("nested deeper than 32" in r["error"] for r in replies[:2])
    assert "Traceback" not in agent_log(workdir) + controller.log.read_text()
    assert agent.request("status")["socket"]["errors"] == 2


def agent_log(workdir: Path) -> str:
    return (workdir / "h1.log").read_text()


@needs_root
def test_over_long_lines_get_their_answer_and_no_reset(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir)
    line = b'{"cmd": "status", "args": {"x": "' + b"y" * (1 << 20) + b'"}}\n'
    for _ in range(20):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(agent.socket))
            sock.sendall(line)  # no EPIPE: the server reads what it will not serve
            reply = json.loads(sock.makefile("rb").readline())
        assert reply == {"ok": False, "error": "request over 65536 bytes"}
    assert agent.request("status")["socket"]["errors"] == 20


@needs_root
def test_a_socket_path_naming_a_regular_file_is_refused_not_deleted(
    spawn, workdir: Path
) -> None:
    precious = workdir / "h1.sock"
    precious.write_text("an operator's notes\n")
    agent = start_agent(spawn, workdir, wait=False)
    assert agent.proc.wait(timeout=30) != 0
    lines = agent_log(workdir).strip().splitlines()
    assert lines[-1].endswith("exists and is not a socket; refusing to replace it "
                              "(remove it or choose another path)"), lines
    assert "Traceback" not in agent_log(workdir)
    assert precious.read_text() == "an operator's notes\n"
