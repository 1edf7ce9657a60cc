"""Reading the HTTP gateway as a tenant's tools would: curl for streams and requests."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from tests.conftest import Spawn


@dataclass(frozen=True)
class Event:
    id: str | None
    data: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.data["type"].removeprefix("io.harmonaize.feed.").rsplit(".v", 1)[0]

    @property
    def key(self) -> tuple[str, int]:
        return self.data["subject"], self.data["seq"]


class CurlStream:
    """``curl -N`` on an SSE URL; events parsed as they come, on a thread."""

    def __init__(self, spawn: Spawn, url: str, *curl_args: str) -> None:
        self.proc = spawn(["curl", "-sSN", "--max-time", "120", *curl_args, url],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.events: queue.Queue[Event] = queue.Queue()
        self.comments = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        ident: str | None = None
        data: list[str] = []
        for raw in self.proc.stdout:
            line = raw.decode().rstrip("\n")
            if line.startswith(":"):
                self.comments += 1
            elif line.startswith("id: "):
                ident = line[4:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif not line and data:
                self.events.put(Event(ident, json.loads("\n".join(data))))
                ident, data = None, []

    def next(self, timeout: float = 20.0) -> Event:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no event from the gateway") from None

    def take(self, count: int, timeout: float = 30.0) -> list[Event]:
        deadline = time.monotonic() + timeout
        return [self.next(max(0.1, deadline - time.monotonic())) for _ in range(count)]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def curl(method: str, url: str, *args: str, body: object = None,
         timeout: float = 30) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of one request."""
    argv = ["curl", "-sS", "-X", method, "-D", "-", url, *args]
    data = None
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
    out = subprocess.run(argv, input=data, capture_output=True, timeout=timeout, check=True)
    head, _, text = out.stdout.decode().partition("\r\n\r\n")
    lines = head.split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return status, json.loads(text) if text.strip() else {}, headers
