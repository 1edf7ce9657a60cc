"""Self-metrics in Prometheus' text format (0.0.4), served on ``GET /metrics``.

The text itself is written by prometheus_client (the ecosystem's reference
exposition); what is ours is where the numbers come from and how they are
served.

A :class:`Registry` holds *collectors*: functions that read a daemon's own
counters at scrape time and return :class:`Family` objects. Nothing is
stored between scrapes, so there is no second copy of any state to keep in
step. Names follow node_exporter's conventions: a ``harmonaize_`` prefix,
base units (seconds, bytes), ``_total`` on counters, and labels only from
small fixed sets (observer, state, reason), never per flow, job or peer.

:class:`MetricsServer` is a deliberately small HTTP/1.1 server on the
daemon's own asyncio loop, so collectors read state on the thread that owns
it (no locks, no torn reads). It answers ``GET`` and ``HEAD`` on
``/metrics`` only, one request per connection, with bounded request size,
time and concurrency; anything else gets a clear status and the server
keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from harmonaize.config import split_address

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: A scrape request is one line and a few headers; anything bigger is refused.
MAX_REQUEST = 8192
#: Seconds a client may take to send its request.
REQUEST_TIMEOUT = 5.0
MAX_CLIENTS = 16

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"


@dataclass
class Family:
    """One metric: its name, help, type, and a sample per label set."""

    name: str
    help: str
    type: MetricType = MetricType.GAUGE
    samples: list[tuple[tuple[tuple[str, str], ...], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _METRIC_NAME.fullmatch(self.name):
            raise ValueError(f"invalid metric name {self.name!r}")
        if self.type is MetricType.COUNTER and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name!r} must end in _total")

    def add(self, value: float | bool | None, **labels: str) -> Family:
        """Add a sample; ``None`` (not known yet) adds nothing."""
        if value is None:
            return self
        for label in labels:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r}")
        self.samples.append((tuple(sorted(labels.items())), float(value)))
        return self


def counter(name: str, help: str) -> Family:
    return Family(name, help, MetricType.COUNTER)


def gauge(name: str, help: str) -> Family:
    return Family(name, help, MetricType.GAUGE)


Collector = Callable[[], Iterable[Family]]


def render(families: Iterable[Family]) -> str:
    """The text exposition of ``families`` (one family per name), written by
    prometheus_client: its escaping and number formats are the reference ones."""
    seen: set[str] = set()
    metrics = []
    for family in families:
        if family.name in seen:
            raise ValueError(f"metric {family.name!r} appears twice")
        seen.add(family.name)
        # prometheus_client names a counter family without its _total suffix and
        # writes the suffix on the samples and the HELP/TYPE lines itself.
        base = family.name.removesuffix("_total") if family.type is MetricType.COUNTER \
            else family.name
        metric = Metric(base, family.help, family.type.value)
        for labels, value in family.samples:
            metric.add_sample(family.name, dict(labels), value)
        metrics.append(metric)
    return generate_latest(_Snapshot(metrics)).decode()


class _Snapshot:
    """One scrape's metrics, in the shape prometheus_client's exposition reads."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


class Registry:
    """Named collectors; a failing one is logged and reported, the rest still render."""

    def __init__(self, prefix: str = "harmonaize") -> None:
        self.prefix = prefix
        self._collectors: dict[str, Collector] = {}

    def register(self, name: str, collector: Collector) -> None:
        if name in self._collectors:
            raise ValueError(f"collector {name!r} is already registered")
        self._collectors[name] = collector

    def collect(self) -> list[Family]:
        families: list[Family] = []
        success = gauge(f"{self.prefix}_scrape_collector_success",
                        "Whether a collector of these metrics worked on this scrape.")
        duration = gauge(f"{self.prefix}_scrape_collector_duration_seconds",
                         "Time a collector of these metrics took on this scrape.")
        for name, collector in self._collectors.items():
            began = time.perf_counter()
            try:
                families.extend(collector())
                ok = True
            except Exception:
                log.exception("metrics collector %s failed", name)
                ok = False
            duration.add(time.perf_counter() - began, collector=name)
            success.add(ok, collector=name)
        return [*families, success, duration]

    def render(self) -> str:
        return render(self.collect())


@dataclass
class ServerStats:
    scrapes: int = 0
    refused: int = 0


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


class MetricsServer:
    """``GET /metrics`` on ``address``, served on the running asyncio loop."""

    def __init__(self, address: str, registry: Registry) -> None:
        self.host, self.port = split_address(address)
        self.address = address
        self.registry = registry
        self.stats = ServerStats()
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, limit=MAX_REQUEST, reuse_address=True)
        except OSError as exc:
            raise RuntimeError(
                f"metrics: cannot listen on {self.address}: {exc.strerror or exc}") from None
        sockets = self._server.sockets
        if sockets and self.port == 0:  # tests ask for any free port
            self.port = sockets[0].getsockname()[1]
        log.info("metrics on http://%s/metrics", self.address)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._clients):
            task.cancel()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None

    def families(self) -> list[Family]:
        """The server's own counters, for the daemon's collector."""
        return [
            counter(f"{self.registry.prefix}_metrics_scrapes_total",
                    "Requests for /metrics answered.").add(self.stats.scrapes),
            counter(f"{self.registry.prefix}_metrics_refused_total",
                    "Requests to the metrics endpoint refused (bad, oversized, slow, "
                    "other paths or methods).").add(self.stats.refused),
        ]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            if len(self._clients) > MAX_CLIENTS:
                await self._respond(writer, 503, "too many clients\n")
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            except (asyncio.LimitOverrunError, ValueError):
                await self._respond(writer, 431, f"request over {MAX_REQUEST} bytes\n")
                return
            except TimeoutError:
                await self._respond(writer, 408, "request not received in time\n")
                return
            except asyncio.IncompleteReadError:
                self.stats.refused += 1  # closed before a full request: nobody to answer
                return
            await self._answer(writer, head)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, head: bytes) -> None:
        try:
            method, target, version = head.split(b"\r\n", 1)[0].decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            await self._respond(writer, 400, "malformed request line\n")
            return
        if not version.startswith("HTTP/1."):
            await self._respond(writer, 400, "HTTP/1.x only\n")
            return
        path = target.split("?", 1)[0]
        if path != "/metrics":
            await self._respond(writer, 404, "only /metrics is served here\n")
            return
        if method not in ("GET", "HEAD"):
            await self._respond(writer, 405, "only GET and HEAD\n",
                                extra=("Allow: GET, HEAD",))
            return
        try:
            body = self.registry.render()
        except Exception as exc:  # a collector bug must not take the endpoint down
            log.exception("rendering metrics failed")
            await self._respond(writer, 500, f"rendering failed: {exc}\n")
            return
        self.stats.scrapes += 1
        await self._respond(writer, 200, body, content_type=CONTENT_TYPE,
                            head_only=method == "HEAD")

    async def _respond(self, writer: asyncio.StreamWriter, status: int, body: str, *,
                       content_type: str = "text/plain; charset=utf-8",
                       extra: tuple[str, ...] = (), head_only: bool = False) -> None:
        if status != 200:
            self.stats.refused += 1
        data = body.encode()
        headers = [f"HTTP/1.1 {status} {_REASONS[status]}", f"Content-Type: {content_type}",
                   f"Content-Length: {len(data)}", "Connection: close", *extra]
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("ascii"))
        if not head_only:
            writer.write(data)
        await writer.drain()
