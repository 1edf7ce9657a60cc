"""The Prometheus endpoint: renderer, HTTP behaviour, and both daemons' self-metrics."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import config as agent_config
from controller import config as controller_config
from harmonaize.config import ConfigError, parse
from harmonaize.metrics import (
    MAX_REQUEST,
    Family,
    MetricsServer,
    Registry,
    counter,
    gauge,
    render,
)
from tests.conftest import free_port, python
from tests.daemons import (
    NO_LINKS,
    fake_gpus,
    gpu_section,
    start_agent,
    start_controller,
    tenant_feed,
    wait_until,
)

pytestmark = pytest.mark.ops

#: Every label the daemons may use: small fixed sets, never a host, job, flow or GPU.
ALLOWED_LABELS = {"observer", "state", "hook", "health", "type", "reason", "outcome",
                  "collector", "version", "pool", "gpu_class",
                  "port",  # the controller's two ports: agents, feed; an RDMA device's port
                  # The host's own NICs, as node_exporter labels them, with the direction,
                  # traffic class and where a drop happened.
                  "device", "direction", "class", "source",
                  "setting",  # a DCQCN setting's name (RDMA congestion control)
                  "machine",  # a state machine's name (illegal moves refused)
                  "finding", "cause",  # a job-health finding and its cause class (fixed sets)
                  "fault"}  # an application XID's fault class (a fixed set)


def parse_text(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict, name: str, **labels: str) -> float | None:
    """A sample's value by its full sample name (``x_total`` for counters)."""
    for family in families.values():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return reply.read().decode()


def check_conventions(text: str) -> dict[str, object]:
    families = parse_text(text)
    assert families, "no metrics at all"
    for family in families.values():
        assert family.documentation, f"{family.name} has no HELP"
        assert family.name.startswith("harmonaize_")
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (sample.name, sample.labels)
    for line in text.splitlines():
        if line.startswith("# TYPE") and line.endswith(" counter"):
            assert line.split()[2].endswith("_total"), line
    return families


# --- the renderer --------------------------------------------------------------------


def test_label_values_are_escaped_and_parse_back() -> None:
    nasty = 'a\\b"c\nd'
    text = render([gauge("harmonaize_test_thing", "help with \\ and\nnewline").add(
        1.5, kind=nasty)])
    assert 'kind="a\\\\b\\"c\\nd"' in text
    (family,) = text_string_to_metric_families(text)
    assert family.samples[0].labels == {"kind": nasty}
    assert family.documentation == "help with \\ and\nnewline"


def test_values_render_as_prometheus_expects() -> None:
    family = gauge("harmonaize_test_values", "v")
    for v in (3, 0.25, float("nan"), float("inf"), float("-inf"), True):
        family.add(v, i=str(v))
    text = render([family])
    assert 'i="3"} 3.0\n' in text and 'i="0.25"} 0.25\n' in text
    assert "NaN" in text and "+Inf" in text and "-Inf" in text and 'i="True"} 1.0\n' in text
    (family,) = text_string_to_metric_families(text)
    assert len(family.samples) == 6


def test_counters_are_written_with_their_total_suffix_once() -> None:
    text = render([counter("harmonaize_test_events_total", "events").add(4, kind="x")])
    assert "# TYPE harmonaize_test_events_total counter\n" in text
    assert 'harmonaize_test_events_total{kind="x"} 4.0\n' in text
    assert "_total_total" not in text


def test_naming_rules_are_enforced() -> None:
    with pytest.raises(ValueError, match="_total"):
        counter("harmonaize_test_things", "no suffix")
    with pytest.raises(ValueError, match="invalid metric name"):
        gauge("harmonaize-test", "dash")
    with pytest.raises(ValueError, match="invalid label name"):
        gauge("harmonaize_test_x", "x").add(1, __reserved="x")
    with pytest.raises(ValueError, match="twice"):
        render([gauge("harmonaize_test_x", "x"), gauge("harmonaize_test_x", "x")])
    assert gauge("harmonaize_test_x", "x").add(None).samples == []  # unknown: no sample


def test_a_failing_collector_is_reported_and_the_rest_still_render() -> None:
    registry = Registry()
    registry.register("good", lambda: [gauge("harmonaize_test_good", "g").add(1)])

    def broken() -> list[Family]:
        raise RuntimeError("collector bug")

    registry.register("broken", broken)
    families = parse_text(registry.render())
    assert value(families, "harmonaize_test_good") == 1
    assert value(families, "harmonaize_scrape_collector_success", collector="good") == 1
    assert value(families, "harmonaize_scrape_collector_success", collector="broken") == 0


# --- the HTTP server -----------------------------------------------------------------


async def _exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


def test_the_server_answers_only_get_metrics_and_keeps_serving() -> None:
    async def run() -> dict[str, bytes]:
        registry = Registry()
        registry.register("t", lambda: [counter("harmonaize_test_hits_total", "h").add(7)])
        server = MetricsServer("127.0.0.1:0", registry)
        await server.start()
        try:
            answers = {
                "get": await _exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
                "head": await _exchange(server.port, b"HEAD /metrics HTTP/1.0\r\n\r\n"),
                "other_path": await _exchange(server.port, b"GET / HTTP/1.1\r\n\r\n"),
                "post": await _exchange(server.port, b"POST /metrics HTTP/1.1\r\n\r\n"),
                "garbage": await _exchange(server.port, b"\x00\xff nonsense\r\n\r\n"),
                "huge": await _exchange(server.port, b"GET /metrics HTTP/1.1\r\nX: "
                                        + b"a" * (2 * MAX_REQUEST) + b"\r\n\r\n"),
                "again": await _exchange(server.port, b"GET /metrics?x=1 HTTP/1.1\r\n\r\n"),
            }
            answers["stats"] = f"{server.stats.scrapes} {server.stats.refused}".encode()
        finally:
            await server.close()
        return answers

    answers = asyncio.run(run())
    assert answers["get"].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"harmonaize_test_hits_total 7.0\n" in answers["get"]
    head, _, body = answers["head"].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == b""
    assert answers["other_path"].startswith(b"HTTP/1.1 404")
    assert answers["post"].startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in answers["post"]
    assert answers["garbage"].startswith(b"HTTP/1.1 400")
    assert answers["huge"].startswith(b"HTTP/1.1 431")
    assert answers["again"].startswith(b"HTTP/1.1 200")
    assert answers["stats"] == b"3 4"


def test_a_slow_client_gets_408_without_holding_up_others(monkeypatch) -> None:
    monkeypatch.setattr("harmonaize.metrics.REQUEST_TIMEOUT", 0.3)

    async def run() -> tuple[bytes, bytes]:
        registry = Registry()
        server = MetricsServer("127.0.0.1:0", registry)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the headers
            fast = await _exchange(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
            slow = await asyncio.wait_for(reader.read(), 10)
            writer.close()
        finally:
            await server.close()
        return fast, slow

    fast, slow = asyncio.run(run())
    assert fast.startswith(b"HTTP/1.1 200") and slow.startswith(b"HTTP/1.1 408")


def test_listen_addresses_are_checked_in_both_configurations() -> None:
    for cls in (agent_config.AgentConfig, controller_config.ControllerConfig):
        assert parse(cls, {"metrics": {"listen": "[::1]:9480"}}).metrics.listen == "[::1]:9480"
        assert parse(cls, {}).metrics.listen == ""
        for bad in ("9480", "127.0.0.1:0x1", "127.0.0.1:70000", "host name:1", 5):
            with pytest.raises(ConfigError, match="metrics"):
                parse(cls, {"metrics": {"listen": bad}})


# --- the daemons ---------------------------------------------------------------------


def metrics_section(port: int) -> str:
    return f'[metrics]\nlisten = "127.0.0.1:{port}"\n'


def test_agent_and_controller_metrics_follow_the_cluster(spawn, workdir: Path) -> None:
    agent_port, controller_port = free_port(), free_port()
    controller = start_controller(spawn, workdir, extra=metrics_section(controller_port))
    fake, env = fake_gpus(workdir, gpus=4)
    agent = start_agent(spawn, workdir, "m1", endpoint=controller.listen, env=env,
                        links=NO_LINKS + gpu_section() + metrics_section(agent_port))
    wait_until(lambda: value(parse_text(scrape(agent_port)),
                             "harmonaize_agent_uplink_messages_acked_total") or 0,
               what="the controller's acknowledgements")

    families = check_conventions(scrape(agent_port))
    assert value(families, "harmonaize_agent_ready") == 1
    assert value(families, "harmonaize_agent_observer_state", observer="gpu", state="running") == 1
    assert value(families, "harmonaize_agent_observer_state", observer="gpu", state="failed") == 0
    assert value(families, "harmonaize_agent_observer_last_success", observer="gpu") == 1
    assert value(families, "harmonaize_agent_observer_samples_total", observer="gpu") > 0
    assert value(families, "harmonaize_agent_gpus", state="healthy") == 4
    assert value(families, "harmonaize_agent_sampling_passes_total") > 0
    assert value(families, "harmonaize_agent_bpf_programs_attached", hook="tc") == 0
    assert value(families, "harmonaize_agent_health", health="healthy") == 1
    assert value(families, "harmonaize_agent_uplink_events_dropped_total") == 0
    assert agent.request("status")["host_id"] == "m1"
    assert value(families, "harmonaize_agent_socket_requests_total") >= 1
    # Out of descriptors at accept is counted here as at the controller (none yet).
    assert value(families, "harmonaize_agent_accept_exhausted_episodes_total") == 0

    # A fault shows in the counts (and nowhere as a per-GPU label).
    fake.inject_xid(2, 79)
    lost = wait_until(lambda: value(parse_text(scrape(agent_port)), "harmonaize_agent_gpus",
                                    state="lost") == 1 and parse_text(scrape(agent_port)),
                      what="the lost GPU in the metrics")
    assert value(lost, "harmonaize_agent_gpus", state="healthy") == 3
    assert value(lost, "harmonaize_agent_events_total", reason="Xid") >= 1
    assert value(lost, "harmonaize_agent_health", health="healthy") == 0

    with tenant_feed(controller, ["pool/"]):
        cfams = wait_until(
            lambda: (f := check_conventions(scrape(controller_port))) and value(
                f, "harmonaize_controller_feed_subscribers") == 1 and f,
            what="the subscriber in the controller's metrics")
    assert value(cfams, "harmonaize_controller_hosts", state="alive") == 1
    assert value(cfams, "harmonaize_controller_hosts", state="down") == 0
    assert value(cfams, "harmonaize_controller_frames_received_total") > 0
    assert value(cfams, "harmonaize_controller_protocol_messages_total", outcome="hello") >= 1
    assert value(cfams, "harmonaize_controller_feed_messages_published_total") >= 1
    assert value(cfams, "harmonaize_controller_scrape_collector_success",
                 collector="controller") == 1


def test_a_port_in_use_stops_the_agent_with_a_clear_message(workdir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = workdir / "a.toml"
        config.write_text(
            f'[agent]\nstate_dir = "{workdir / "state"}"\n'
            f'[socket]\npath = "{workdir / "a.sock"}"\ngroup = ""\n'
            + NO_LINKS + "[observers.gpu]\nenabled = false\n" + metrics_section(port))
        done = subprocess.run(python("agent.main", "-c", str(config)), capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 1
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert not (workdir / "a.sock").exists()  # it cleaned up what it had started


def test_nothing_listens_when_metrics_are_off(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir, "m2")
    listening = [c for c in psutil.Process(agent.proc.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening == []
