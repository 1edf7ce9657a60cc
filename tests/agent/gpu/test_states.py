"""A GPU's states as one table: every move of it, the engine and validation sending
events through it, illegal moves counted at the agent's metrics endpoint (the XID's
way through the domains: tests/architecture/test_gpu_domains.py)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.conditions import Action
from agent.gpu import health, states
from agent.gpu.health import GpuHealthEngine
from agent.gpu.settings import GpuObserverSection
from agent.gpu.states import GPU, GpuEvent, GpuState
from agent.gpu.types import GpuProcess
from agent.validation.service import ValidationService
from agent.validation.settings import CommandSection, ValidationSection
from harmonaize import statemachine
from harmonaize.messages import Severity
from harmonaize.statemachine import IllegalTransition, Machine
from tests.agent.gpu.test_health import counters, sample, telemetry
from tests.conftest import free_port
from tests.daemons import NO_LINKS, agent_config, serving, wait_until
from tests.ops.test_metrics import metrics_section, parse_text, scrape, value

pytestmark = [pytest.mark.gpu, pytest.mark.architecture]

ROOT = Path(__file__).resolve().parents[3]
H, S, V, Q, L = (GpuState.HEALTHY, GpuState.SUSPECT, GpuState.VALIDATING,
                 GpuState.QUARANTINED, GpuState.LOST)
ALL = {H, S, V, Q, L}

#: The table written out again by hand, event by event: (from which states, to where).
#: A move added to, dropped from or redirected in agent/gpu/states.py fails here.
EXPECTED: dict[GpuEvent, tuple[set[GpuState], GpuState | None]] = {
    GpuEvent.FELL_OFF: (ALL, L),
    GpuEvent.FAULT: ({H, S, V}, Q),
    GpuEvent.SUSPECT_SIGNAL: ({H, S}, S),
    GpuEvent.SUSPICION_CLEARED: ({S}, H),
    GpuEvent.VALIDATION_STARTED: (ALL, V),
    GpuEvent.VALIDATION_PASSED: (ALL, H),
    GpuEvent.VALIDATION_FAILED: (ALL, Q),
    GpuEvent.UNDECIDED_WAS_HEALTHY: ({V}, H),
    GpuEvent.UNDECIDED_WAS_SUSPECT: ({V}, S),
    GpuEvent.UNDECIDED_WAS_QUARANTINED: ({V}, Q),
    GpuEvent.UNDECIDED_WAS_LOST: ({V}, L),
    GpuEvent.QUARANTINE_RESTORED: (ALL, Q),
    GpuEvent.OPERATOR_DRAIN: (ALL, Q),
    GpuEvent.OPERATOR_RELEASE: (ALL, H),
}


# --- item 1: the GPU's state machine as data ---------------------------------------


def test_every_gpu_state_and_event_pair_moves_as_the_table_says_or_raises() -> None:
    # The table as states.moves() builds it (so a mutation of it is seen), and as built.
    machine = Machine("gpu", states.moves(), states=tuple(GpuState), events=tuple(GpuEvent))
    assert machine.moves == GPU.moves
    assert set(EXPECTED) == set(GpuEvent) and set(GPU.states) == ALL
    pairs = list(machine.pairs())
    assert len(pairs) == len(GpuState) * len(GpuEvent)
    for state, event in pairs:
        sources, target = EXPECTED[event]
        if state in sources:
            assert machine.move(state, event) is target, (state, event)
        else:
            with pytest.raises(IllegalTransition, match="gpu: no move from"):
                machine.move(state, event)


def test_quarantine_and_loss_are_latched_against_the_rules_own_events() -> None:
    for latched in (Q, L):
        assert GpuEvent.FAULT not in GPU.events_from(latched)
        assert GpuEvent.SUSPECT_SIGNAL not in GPU.events_from(latched)
        assert GpuEvent.SUSPICION_CLEARED not in GPU.events_from(latched)
    # Only an undecided validation returns to a state remembered from before it.
    for before, event in health.UNDECIDED.items():
        assert {s for s in ALL if GPU.legal(s, event)} == {V}
        assert GPU.move(V, event) is before


def test_no_gpu_state_is_assigned_outside_the_table() -> None:
    """``.state =`` appears in the GPU domain only where the engine applies a move."""
    assignments = []
    for path in sorted((ROOT / "agent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                       else [])
            for target in targets:
                for leaf in ast.walk(target):
                    if (isinstance(leaf, ast.Attribute) and leaf.attr == "state"
                            and isinstance(leaf.value, ast.Name) and leaf.value.id == "gpu"):
                        assignments.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(assignments) == 1 and assignments[0].startswith("agent/gpu/health.py"), \
        assignments


class Recorder:
    """The GPU table, recording every (state, event) the engine sends it."""

    def __init__(self, machine: Machine[GpuState, GpuEvent]) -> None:
        self.machine = machine
        self.sent: list[tuple[int, GpuState, GpuEvent]] = []
        self.gpu = -1

    def legal(self, state: GpuState, event: GpuEvent) -> bool:
        return self.machine.legal(state, event)

    def move(self, state: GpuState, event: GpuEvent) -> GpuState:
        self.sent.append((state, event))  # type: ignore[arg-type]
        return self.machine.move(state, event)


def two_gpus(sbe: int) -> Any:
    """Two GPUs whose single-bit ECC errors climb together (a suspect signal)."""
    first = sample(counters(ecc_sbe_volatile=sbe), index=0)
    second = sample(counters(ecc_sbe_volatile=sbe), index=1)
    snap = dataclasses.replace(second.gpus[0], identity=dataclasses.replace(
        second.gpus[0].identity, uuid="GPU-1"))
    return dataclasses.replace(first, gpus=(first.gpus[0], snap))


@pytest.mark.validation
def test_the_engine_and_validation_move_a_suspect_gpu_through_validating_to_a_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real engine makes both GPUs suspect; the real validation service runs a real
    check (GPU 0 passes, GPU 1 fails) and sends the verdicts as events."""
    recorder = Recorder(GPU)
    monkeypatch.setattr(health, "GPU", recorder)
    engine = GpuHealthEngine(GpuObserverSection(sbe_per_minute=10))
    seen: dict[int, list[GpuState]] = {0: [], 1: []}

    def step(sbe: int) -> tuple[Any, ...]:
        views = engine.step(two_gpus(sbe), time.time()).gpus
        for view in views:
            if not seen[view.index] or seen[view.index][-1] is not view.state:
                seen[view.index].append(view.state)
        return views

    check = CommandSection("verdict", (sys.executable, "-c",
                                       "import sys; sys.exit(0 if sys.argv[1] == '0' else 1)",
                                       "{gpu}"), levels=(2,), budget=30.0)
    service = ValidationService(
        ValidationSection(commands=(check,), cooldown=0.0), tmp_path, engine,
        retired_pages_limit=60, publish=lambda message: None, emit=lambda event: None,
        allowance=lambda job: 1e9)

    async def run() -> None:
        service.start(asyncio.get_running_loop())
        step(0)
        views = step(1000)
        assert {v.state for v in views} == {S}
        service.step(views, time.time())
        step(1000)
        for _ in range(3000):  # the verdicts come back through the event loop
            if all(i in service.last_done for i in ("gpu:0", "gpu:1")):
                break
            await asyncio.sleep(0.01)
        step(1000)

    try:
        asyncio.run(run())
    finally:
        service.stop()
    assert seen == {0: [H, S, V, H], 1: [H, S, V, Q]}
    events = [event for _, event in recorder.sent]
    assert events.count(GpuEvent.SUSPECT_SIGNAL) == 2
    assert events.count(GpuEvent.VALIDATION_STARTED) == 2
    assert (S, GpuEvent.VALIDATION_STARTED) in recorder.sent
    assert (V, GpuEvent.VALIDATION_PASSED) in recorder.sent
    assert (V, GpuEvent.VALIDATION_FAILED) in recorder.sent


def test_each_hook_sends_one_event_and_reports_the_move_exactly() -> None:
    """Validation's and operators' hooks: the state, the reason and the action they
    leave, the host event of a move (none without one), and a re-judgement at once."""
    engine = GpuHealthEngine(GpuObserverSection())
    engine.step(sample(counters()), 1.0)
    gpu = engine.gpus[0]
    assert engine.reset_seen(0) == float("-inf") and engine.reset_seen(9) == float("-inf")

    def moved(event: Any, state: GpuState, why: str, action: Action) -> None:
        assert (gpu.state, gpu.why, gpu.action) == (state, why, action)
        assert engine.changed and engine.next_deadline() == float("-inf")
        engine.step(sample(counters()), gpu.since + 0.5)  # judged at once
        assert not engine.changed and engine.next_deadline() > gpu.since
        if event is not None:
            assert event.message == f"gpu 0: {previous.value} -> {state.value}: {why}"

    previous = H
    event = engine.begin_validation(0, 2.0)
    assert (event.reason, event.severity) == ("GpuValidating", Severity.INFO)
    moved(event, V, "validating ()", Action.NONE)
    previous = V
    event = engine.abort_validation(0, "undecided", 3.0)
    assert (event.reason, event.severity) == ("GpuHealthy", Severity.INFO)
    moved(event, H, "undecided", Action.NONE)
    assert engine.abort_validation(0, "again", 3.5) is None and gpu.why == "undecided"
    previous = H
    event = engine.quarantine(0, "fan noise", 4.0)
    assert (event.reason, event.severity) == ("GpuQuarantined", Severity.CRITICAL)
    moved(event, Q, "fan noise", Action.DRAIN)
    assert engine.quarantine(0, "fan noise", 4.2) is None  # nothing new: no move at all
    assert not engine.changed
    # The same state with a new reason: no event, but the reason, action and time move.
    assert engine.quarantine(0, "recorded", 4.5, Action.RMA,
                             GpuEvent.QUARANTINE_RESTORED) is None
    moved(None, Q, "recorded", Action.RMA)
    assert gpu.since == 4.5
    previous = Q
    event = engine.release(0, "operator", 5.0)
    assert (event.reason, event.severity) == ("GpuHealthy", Severity.INFO)
    moved(event, H, "operator", Action.NONE)
    assert gpu.acknowledged_at == 5.0
    engine.begin_validation(0, 6.0)
    previous = V
    event = engine.end_validation(0, False, "burn failed", 7.0, Action.RESET_GPU)
    assert (event.reason, event.severity) == ("GpuQuarantined", Severity.CRITICAL)
    moved(event, Q, "burn failed", Action.RESET_GPU)
    engine.begin_validation(0, 8.0)
    assert gpu.before_validation is Q and gpu.why == "validating (burn failed)"
    previous = V
    event = engine.end_validation(0, True, "burn passed", 9.0)
    moved(event, H, "burn passed", Action.NONE)
    assert gpu.acknowledged_at == 9.0
    long_why = "x" * 2000
    event = engine.quarantine(0, long_why, 10.0)
    assert len(event.message) == 1000 and gpu.why == long_why


def three_gpus(sbe: int, xid_on_0: bool = False) -> Any:
    """GPU 0 (busy, an XID 79 if asked), 1, and 2 whose single-bit errors climb."""
    gpus = []
    for index in range(3):
        one = sample(counters(ecc_sbe_volatile=sbe if index == 2 else 0),
                     telemetry(processes=(GpuProcess(7, 1 << 30),)) if index == 0 else None,
                     index=index)
        gpus.append(dataclasses.replace(one.gpus[0], identity=dataclasses.replace(
            one.gpus[0].identity, uuid=f"GPU-{index}")))
    first = sample(counters(), xids=(79,) if xid_on_0 else ())
    return dataclasses.replace(first, gpus=tuple(gpus))


def test_the_gpu_step_counts_states_and_lists_failed_and_suspect_gpus_for_the_host() -> None:
    """The host's view of its GPUs' states: counts, and the two host findings."""
    engine = GpuHealthEngine(GpuObserverSection(sbe_per_minute=10))
    step = engine.step(three_gpus(0), 1.0)
    assert (step.counts.healthy, step.counts.in_use) == (3, 1)
    failure, suspect = step.findings
    assert (failure.type, failure.holds, failure.severity, failure.reason, failure.message) \
        == ("GpuFailure", False, Severity.WARNING, "", "")
    assert (suspect.type, suspect.holds, suspect.reason, suspect.message) == (
        "GpuSuspect", False, "", "")
    engine.quarantine(1, "fan noise", 1.5)
    step = engine.step(three_gpus(1000), 2.0)
    counts = step.counts
    assert (counts.healthy, counts.suspect, counts.validating, counts.quarantined,
            counts.lost, counts.in_use) == (1, 1, 0, 1, 0, 1)
    failure, suspect = step.findings
    assert (failure.holds, failure.severity, failure.reason, failure.message) == (
        True, Severity.WARNING, "GpuOutOfService", "gpu 1 quarantined: fan noise (drain)")
    assert (suspect.holds, suspect.severity, suspect.reason) == (
        True, Severity.WARNING, "GpuUnderSuspicion")
    assert suspect.message == ("gpu 2 suspect: EccCorrectableRate: 1000 single-bit ECC "
                               "errors in the last minute (none)")
    assert step.action is Action.DRAIN
    step = engine.step(three_gpus(1000, xid_on_0=True), 3.0)
    counts = step.counts
    assert (counts.healthy, counts.suspect, counts.quarantined, counts.lost) == (0, 1, 1, 1)
    failure, _ = step.findings
    assert (failure.holds, failure.severity, failure.reason) == (
        True, Severity.CRITICAL, "NodeRebootRequired")
    lost, drained = failure.message.split("; ")
    assert lost.startswith("gpu 0 lost: Xid: xid 79 (") and lost.endswith("(reboot-node)")
    assert drained == "gpu 1 quarantined: fan noise (drain)"
    assert step.action is Action.REBOOT_NODE
    views = {v.index: v for v in step.gpus}
    assert (views[0].state, views[0].action, views[0].xid_count) == (L, Action.REBOOT_NODE, 1)
    assert views[0].actions["Xid"] is Action.REBOOT_NODE
    assert [c.type for c in health.holding(views[0])] == ["Xid"]


def test_each_xid_is_an_event_by_its_effect_and_a_reload_judges_every_gpu_again() -> None:
    engine = GpuHealthEngine(GpuObserverSection())
    engine.step(sample(counters()), 1.0)
    step = engine.step(sample(counters(), xids=(999, 74)), 2.0)
    xids = [e for e in step.events if e.reason == "Xid"]
    assert [(e.severity, e.message) for e in xids] == [
        (Severity.INFO, "gpu 0: xid 999 (not in the catalog): none"),
        (Severity.WARNING, "gpu 0: xid 74 (NVLink error): reset-gpu")]
    gpu = engine.gpus[0]
    assert gpu.xid_count == 2 and set(gpu.xids) == {74}  # only an XID with an effect holds
    assert gpu.state is S
    step = engine.step(sample(counters(), xids=(79,)), 3.0)
    assert [e.severity for e in step.events if e.reason == "Xid"] == [Severity.CRITICAL]
    assert step.gpus[0].xid_count == 3
    engine.step(sample(counters()), 3.1)  # a pass without news after the move
    assert engine.next_deadline() > 3.1 and not engine.changed
    new = GpuObserverSection(sbe_per_minute=1)
    engine.configure(new)
    assert engine.cfg is new and engine.changed and engine.next_deadline() == float("-inf")


def test_an_illegal_move_in_production_changes_nothing_and_is_counted() -> None:
    engine = GpuHealthEngine(GpuObserverSection())
    engine.step(sample(counters(), xids=(79,)), 1.0)  # xid 79: the GPU is lost
    gpu = engine.gpus[0]
    assert gpu.state is L
    before = (gpu.state, gpu.why, gpu.since)
    statemachine.set_strict(False)
    try:
        counted = statemachine.illegal_counts().get("gpu", 0)
        assert engine._send(gpu, GpuEvent.SUSPICION_CLEARED, "cleared", 2.0) is None
        assert statemachine.illegal_counts()["gpu"] == counted + 1
    finally:
        statemachine.set_strict(True)
    assert (gpu.state, gpu.why, gpu.since) == before
    with pytest.raises(IllegalTransition):
        engine._send(gpu, GpuEvent.SUSPICION_CLEARED, "cleared", 3.0)


PROVOKE = """
import sys
from agent.gpu.states import GPU, GpuEvent, GpuState
from agent import main
# A bug's move, before the agent starts (production: counted, not raised).
GPU.move(GpuState.LOST, GpuEvent.SUSPICION_CLEARED)
sys.exit(main.main(sys.argv[1:]))
"""


def test_illegal_transitions_are_exported_at_the_agents_metrics_endpoint(
    spawn, workdir: Path
) -> None:
    port = free_port()
    config = agent_config(workdir, "t1", links=NO_LINKS + "[observers.gpu]\nenabled = false\n"
                          + metrics_section(port))
    log = workdir / "t1.log"
    env = {k: v for k, v in os.environ.items() if k != statemachine.STRICT_ENV}
    with log.open("ab") as out:
        proc = spawn([sys.executable, "-c", PROVOKE, "-c", str(config)], stdout=out,
                     stderr=subprocess.STDOUT, env=env)
    wait_until(serving(workdir / "t1.sock", proc, log), what="agent t1")
    families = parse_text(scrape(port))
    assert value(families, "harmonaize_agent_illegal_transitions_total", machine="gpu") == 1
    assert value(families, "harmonaize_agent_illegal_transitions_total",
                 machine="remediation") == 0
    assert "gpu: no move from" in log.read_text()
