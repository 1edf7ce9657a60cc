"""What ./scripts/setup installs for the checks the guides and tests run (issue 28, item 15:
`nft`, for partition checks and fault injection between hosts)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.conftest import ROOT, needs_root

pytestmark = pytest.mark.hardening


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


# Inside the namespace: a listener, and whether a connection to it gets through in 1 s.
CONNECTS = """
import socket
server = socket.create_server(("127.0.0.1", 0))
try:
    socket.create_connection(server.getsockname(), timeout=1).close()
    print("through")
except OSError:
    print("cut off")
"""


def test_item15_setup_installs_nft() -> None:
    script = (ROOT / "scripts" / "setup").read_text()
    packages = script.split("PACKAGES=(", 1)[1].split(")", 1)[0].split()
    assert "nftables" in packages


@needs_root
def test_item15_nft_partitions_a_namespace_as_the_operator_guide_does() -> None:
    ns = f"hz-nft-{uuid.uuid4().hex[:8]}"
    assert run("ip", "netns", "add", ns).returncode == 0
    try:
        def in_ns(*argv: str) -> subprocess.CompletedProcess[str]:
            return run("ip", "netns", "exec", ns, *argv)

        assert in_ns("ip", "link", "set", "lo", "up").returncode == 0
        assert in_ns(sys.executable, "-c", CONNECTS).stdout.strip() == "through"
        for rule in (("add", "table", "inet", "hz"),
                     ("add", "chain", "inet", "hz", "out",
                      "{ type filter hook output priority 0; policy accept; }"),
                     ("add", "rule", "inet", "hz", "out", "ip", "daddr", "127.0.0.1", "drop")):
            done = in_ns("nft", *rule)
            assert done.returncode == 0, done.stderr
        assert in_ns(sys.executable, "-c", CONNECTS).stdout.strip() == "cut off"
    finally:
        run("ip", "netns", "delete", ns)
