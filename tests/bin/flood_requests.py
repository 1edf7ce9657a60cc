"""A tenant that floods the controller with declarations, none waiting for its answer.

    flood_requests.py ENDPOINT KEY SERVER_KEY JOB COUNT

Sends COUNT declarations of JOB as fast as the socket takes them, then listens for
five seconds and prints, as JSON, how many were answered (accepted or refused).
"""

from __future__ import annotations

import json
import sys
import time

import zmq

from harmonaize import keys
from harmonaize.messages import JobDeclaration, Reply, decode, encode


def main(endpoint: str, key: str, server_key: str, job: str, count: int) -> None:
    pair = keys.load_pair(key)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, count + 100)
    sock.curve_secretkey, sock.curve_publickey = pair.secret, pair.public
    sock.curve_serverkey = keys.load_public(server_key)
    sock.connect(endpoint)
    time.sleep(1.0)  # the handshake
    for seq in range(1, count + 1):
        sock.send(encode(JobDeclaration(job, revision=1), sender="tenant", seq=seq))
    answered = 0
    deadline = time.monotonic() + 5.0
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000)):
            frames = sock.recv_multipart()
            if isinstance(decode(frames[-1]).body, Reply):
                answered += 1
    print(json.dumps({"sent": count, "answered": answered}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
