"""Writes the seed corpora under fuzz/corpus/: one valid input of every kind
each target takes, for the fuzzer to start from. Run again when a format
changes; the files are kept in the tree.

    .venv/bin/python fuzz/seeds.py
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.plugin.layout import (
    FLAG_MAPPED,
    STATS_HEADER,
    STATS_HEADER_SIZE,
    STATS_MAGIC,
    STATS_SIZE,
    STATS_SLOT_SIZE,
    STATS_SLOTS,
    STATS_VERSION,
    Algo,
    Coll,
    CommEntry,
    Policy,
    Pref,
    Proto,
    Rule,
    encode_policy,
)
from harmonaize import messages as m
from harmonaize.schema import to_plain
from tests.wire.test_codec import SAMPLES

CORPUS = ROOT / "fuzz" / "corpus"


def put(target: str, data: bytes) -> None:
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main() -> None:
    for body in SAMPLES:
        put("wire", m.encode(body, sender="host-1", seq=7, now=1000.0))
    for body in SAMPLES:
        if body.KIND in m.TENANT_KINDS:
            put("tenant", m.encode(body, sender="tenant", seq=3, now=1000.0))
    put("tenant", m.encode(m.Subscribe(("job/acme/",), (m.Position("job/acme/j1/", 2),), 5),
                           sender="t"))
    for line in (
        {"cmd": "status"}, {"cmd": "help"}, {"cmd": "hosts"}, {"cmd": "capacity"},
        {"cmd": "jobs"}, {"cmd": "events", "args": {"limit": 5}}, {"cmd": "feed"},
        {"cmd": "tenants"}, {"cmd": "pools"},
        {"cmd": "place", "args": {"job": "j1", "tenant": "acme", "group": "acme-j1",
                                  "members": [{"name": "0", "host": "h1"},
                                              {"name": "1", "host": "h2"}]}},
        {"cmd": "unplace", "args": {"job": "j1"}},
    ):
        put("operator_requests", json.dumps(line).encode() + b"\n")
    for text in (
        '[agent]\nhost_id = "h1"\nstate_dir = "/var/lib/harmonaize"\n'
        '[socket]\npath = "/run/harmonaize/agent.sock"\ngroup = "harmonaize"\n'
        '[controller]\nendpoint = "tcp://10.0.0.1:7400"\n',
        '[controller]\nlisten = "tcp://*:7400"\nfeed = "tcp://*:7401"\n'
        '[feed]\nretention = 100\nreplay_rate = 50.0\n[redaction]\nmin_hosts = 5\n'
        'host_buckets = [0, 2, 4, 8]\n[tuning]\nlead = 2.0\n',
        '[observers.links]\nenabled = false\n[observers.gpu]\ncall_timeout = 0.5\n'
        '[validation]\nenabled = true\n[metrics]\nlisten = "127.0.0.1:9400"\n',
    ):
        put("configuration", text.encode())
    gateway_seeds()
    rules = (
        (Rule(frozenset({Coll.ALL_REDUCE}), 0, 1 << 20, (Pref(Algo.RING, Proto.LL128),)),
         Rule(frozenset(), 0, 2**64 - 1, (Pref(Algo.TREE, Proto.SIMPLE),), max_channels=4)),
        (Rule(prefs=(Pref(Algo.TREE, Proto.SIMPLE),)),),
    )
    comm = 0x0123456789ABCDEF
    for held, new in (
        (Policy(7, (CommEntry(comm, 0, None, 0, 1, False),), rules),
         Policy(7, (CommEntry(comm, 100, 0, 1, 2, True),), rules)),
        (Policy(7, (CommEntry(comm, 50, 0, 1, 3, False),), rules),
         Policy(8, (CommEntry(comm, 50, 0, 1, 3, False),
                    CommEntry(comm ^ 1, 9, None, 1, 1, False)), rules)),
    ):
        for flags in (3, 7 | (8 << 3)):
            put("policy", struct.pack("<QQB", comm, 80, flags) + encode_policy(held)
                + encode_policy(new))

    stats_seeds()


def stats_seeds() -> None:
    """Stats files as the plugin writes them: settled slots, one left mid-update, none."""
    hot, cold = struct.Struct("<QIIQII"), struct.Struct("<IIQQQQQQIIQQQII")
    for seqs in ((2,), (2, 4, 6), (3,), (2, 5), ()):
        image = bytearray(STATS_SIZE)
        STATS_HEADER.pack_into(image, 0, STATS_MAGIC, STATS_VERSION, STATS_SLOTS, 4242, 22900,
                               0x5EED)
        for index, seq in enumerate(seqs):
            offset = STATS_HEADER_SIZE + index * STATS_SLOT_SIZE
            image[offset:offset + STATS_SLOT_SIZE] = (
                hot.pack(0xC0FFEE + index, 8, 2, 1000 * seq, 1, seq)
                + cold.pack(FLAG_MAPPED, 3, 1000, 1, 2, 900, 7, 6, 1, 0, 1, 2, 0, 0, 0))
        put("stats", bytes(image))


def gateway_seeds() -> None:
    """Requests for every route of the HTTP gateway, cursors and bodies."""
    token = "hzt_0123456789abcdef_" + "A" * 43  # the one fuzz/targets/gateway_requests files
    bodies = [json.dumps(to_plain(body)).encode() for body in SAMPLES
              if isinstance(body, m.JobDeclaration | m.ValidationAnswer)]
    bodies += [b'{"action": "defer", "seconds": 300}', b"[[[[1]]]]", b'{"a": NaN}']
    for body in bodies:
        put("gateway_bodies", body)
    for cursor in ("2b1f9c0e33a1-1520-33", "1-0-0", f"1-{2**62}-0", f"1-{2**63}-0",
                   "ffffffffffffffff-0-0", " 1-2-3 "):
        put("gateway_cursors", cursor.encode())
    auth = f"Authorization: Bearer {token}\r\n"
    requests = [
        "GET /v1/spec HTTP/1.1\r\nHost: h\r\n\r\n",
        f"GET /v1/feed?topic=pool/&topic=job/acme/ HTTP/1.1\r\nHost: h\r\n{auth}"
        "Last-Event-ID: 1-0-0\r\n\r\n",
        "GET /v1/feed?since=1-2-3 HTTP/1.1\r\nHost: h\r\nCookie: hz_session=x\r\n\r\n",
        f"GET /v1/notices HTTP/1.1\r\nHost: h\r\n{auth}X-Request-Id: r-1\r\n\r\n",
        f"POST /v1/session HTTP/1.1\r\nHost: h\r\n{auth}Content-Length: 0\r\n\r\n",
        "DELETE /v1/session HTTP/1.1\r\nHost: h\r\nCookie: hz_session=hzs_x\r\n\r\n",
        "OPTIONS /v1/feed HTTP/1.1\r\nHost: h\r\nOrigin: https://a.example\r\n\r\n",
        "GET /v1/spec HTTP/1.1\r\nHost: h\r\n\r\nGET /nothing HTTP/1.1\r\nHost: h\r\n\r\n",
    ]
    for body in bodies[:3]:
        for path in ("/v1/declarations", "/v1/notices/n1"):
            requests.append(f"POST {path} HTTP/1.1\r\nHost: h\r\n{auth}Content-Type: "
                            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                            + body.decode())
    for request in requests:
        put("gateway_requests", request.encode())


if __name__ == "__main__":
    main()
