"""A reload changes rules, not history: engines live as long as the daemon.

Before, SIGHUP with any change under [observers] built a new health engine while
validation kept the old one: quarantines vanished and NVML restarted for a
threshold. Now rule settings apply to the running engines; only what the
observers were started with restarts them.
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import pytest

from agent.config import ObserversSection, changes
from agent.gpu.health import GpuState
from agent.gpu.settings import GpuObserverSection
from agent.host.settings import HostObserverSection
from agent.links.health import LinkHealthEngine, LinkView
from agent.links.settings import LinksSection
from agent.observations import Observations
from agent.step import HostHealthEngine
from harmonaize.messages import Level
from tests.agent.validation.test_agent import gpu_agent, gpu_state
from tests.conftest import needs_root
from tests.daemons import NO_LINKS, gpu_section, start_agent
from tests.daemons import wait_until as wait

pytestmark = pytest.mark.redesign


# --- what a reload may apply live ------------------------------------------------------


def test_every_live_setting_is_a_field_and_the_rest_restart_the_observers() -> None:
    for section in (HostObserverSection, LinksSection, GpuObserverSection):
        names = {f.name for f in dataclasses.fields(section)}
        assert names >= section.LIVE, section.LIVE - names
    old = ObserversSection()
    new = dataclasses.replace(
        old, gpu=dataclasses.replace(old.gpu, sbe_per_minute=5.0, slow_interval=3.0),
        links=dataclasses.replace(old.links, hold=9.0),
        host=dataclasses.replace(old.host, interval=2.0))
    live, io = changes(old, new)
    assert live == ["observers.links.hold", "observers.gpu.sbe_per_minute"]
    assert io == ["observers.host.interval", "observers.gpu.slow_interval"]
    assert changes(old, old) == ([], [])


def link(utilization: float) -> LinkView:
    return LinkView("eth0", "data", True, utilization, 0.0, 0.0, 0.0, 1e5)


def test_a_link_keeps_its_level_and_takes_the_new_hold() -> None:
    engine = LinkHealthEngine(LinksSection(hold=100.0))
    engine.step([link(0.95)], 0.0)
    engine.configure(LinksSection(hold=1.0, utilization_high=0.99))
    (levels,) = engine.step([link(0.95)], 0.5).links
    assert levels.congestion is Level.HIGH  # held: the drop to low starts now
    (levels,) = engine.step([link(0.95)], 1.6).links
    assert levels.congestion is Level.LOW   # 0.95 is below the new high after 1 s


def test_gpu_states_survive_new_rules_and_are_judged_again() -> None:
    engine = HostHealthEngine(ObserversSection())
    engine.step(Observations(), 0.0)
    from agent.gpu.record import GpuRecord as _Gpu  # noqa: PLC0415

    engine.gpus.gpus[7] = _Gpu(7)
    engine.gpus.quarantine(7, "fan noise", 1.0)
    before = engine.step(Observations(), 1.1)
    engine.configure(dataclasses.replace(
        ObserversSection(), gpu=GpuObserverSection(sbe_per_minute=5.0)))
    assert engine.gpus.changed and engine.gpus.cfg.sbe_per_minute == 5.0
    after = engine.step(Observations(), 1.2)
    assert engine.gpus.gpus[7].state is GpuState.QUARANTINED
    assert after.summary == before.summary


# --- the daemon ------------------------------------------------------------------------


def gpu_samples(agent) -> int:
    (gpu,) = [o for o in agent.request("status")["observers"] if o["name"] == "gpu"]
    return gpu["samples"]


def reload(agent, old: str, new: str) -> None:
    text = agent.config.read_text()
    assert old in text
    agent.config.write_text(text.replace(old, new))
    agent.proc.send_signal(signal.SIGHUP)


@needs_root
def test_a_quarantine_survives_a_reload_with_new_thresholds(spawn, workdir: Path) -> None:
    agent, _ = gpu_agent(spawn, workdir, workdir / "control")
    agent.request("drain", {"gpu": 7, "reason": "fan noise"})
    assert gpu_state(agent, 7) == "quarantined"
    samples = gpu_samples(agent)
    reload(agent, "slow_interval = 0.2\n", "slow_interval = 0.2\nsbe_per_minute = 30\n")
    wait(lambda: "configuration reloaded" in agent.log.read_text(), what="the reload")
    passes = agent.request("status")["loop"]["passes"]
    wait(lambda: agent.request("status")["loop"]["passes"] > passes + 20, what="20 passes")
    assert gpu_state(agent, 7) == "quarantined"
    assert agent.request("health")["gpu_counts"]["quarantined"] == 1
    assert gpu_samples(agent) > samples  # the same observer: NVML was not restarted
    log = agent.log.read_text()
    assert "applied observers.gpu.sbe_per_minute to the running rules" in log
    assert "restarting the observers" not in log


@needs_root
def test_an_observer_setting_restarts_the_observers_and_keeps_the_quarantine(
        spawn, workdir: Path) -> None:
    agent, _ = gpu_agent(spawn, workdir, workdir / "control")
    agent.request("drain", {"gpu": 3, "reason": "fan noise"})
    reload(agent, "slow_interval = 0.2\n", "slow_interval = 0.3\n")
    wait(lambda: "configuration reloaded" in agent.log.read_text(), what="the reload")
    passes = agent.request("status")["loop"]["passes"]
    wait(lambda: agent.request("status")["loop"]["passes"] > passes + 20, what="20 passes")
    assert gpu_state(agent, 3) == "quarantined"
    assert agent.request("health")["gpu_counts"]["quarantined"] == 1
    assert ("restarting the observers: observers.gpu.slow_interval changed"
            in agent.log.read_text())


@needs_root
def test_tuning_follows_new_link_thresholds_after_a_reload(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir, links=NO_LINKS + gpu_section())
    assert agent.request("jobs")["thresholds"]["utilization_high"] == 0.85
    reload(agent, "enabled = false\n", "enabled = false\nutilization_high = 0.9\n")
    wait(lambda: agent.request("jobs")["thresholds"]["utilization_high"] == 0.9,
         what="the new threshold in tuning")
    assert "restarting the observers" not in agent.log.read_text()
