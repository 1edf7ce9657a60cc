"""The links, RDMA and tuning domains side by side: what each imports of the others, how
their observers and commands are composed, their modules' sizes, and the congestion
trace (links observer -> the step -> link health -> tuning -> the plugin's files), each
domain visited once, followed through a real pass with a real rank.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import agent.observers
from agent.config import AgentConfig, ObserversSection
from agent.links.observer import LinksObserver
from agent.links.settings import LinksSection
from agent.observations import Observations
from agent.rdma.observer import RdmaObserver
from agent.step import HostHealthEngine
from agent.tuning.loop import LoopSettings
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from harmonaize.messages import Algorithm, Collective, JobDeclaration, Protocol, TuningRange
from testbed.ranks import RankKit, stop
from testbed.tuningsim import link_judgements, link_sample
from tests.conftest import needs_root
from tests.daemons import wait_until

pytestmark = [pytest.mark.links, pytest.mark.rdma, pytest.mark.tuning,
              pytest.mark.architecture]

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("gpu", "links", "rdma", "host", "tuning", "validation", "remediation", "energy")
OURS = ("links", "rdma", "tuning")
#: Shared layers any domain may import.
LAYERS = ("kernel", "plugin")
SHARED = {"agent.conditions", "agent.observers.base"}
#: The composition layer: no domain module imports it.
COMPOSITION = {"agent.config", "agent.observations", "agent.step", "agent.daemon",
               "agent.main", "agent.selfmetrics", "agent.uplink", "agent.outbox",
               "agent.spool", "agent.declarations", "agent.observers"}


def modules_of(tree: str) -> list[Path]:
    return sorted((ROOT / "agent" / tree).glob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, those under ``if TYPE_CHECKING:`` included."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def forbidden(domain: str, module: str) -> bool:
    """Whether a module of ``domain`` may not import ``module``."""
    def within(names: set[str]) -> bool:
        return any(module == name or module.startswith(f"{name}.") for name in names)

    if within(SHARED):
        return False
    if within(COMPOSITION):
        return True
    parts = module.split(".")
    if parts[0] in {"testbed", "tests"}:
        return True
    if parts[0] != "agent" or len(parts) < 2 or parts[1] not in DOMAINS or parts[1] == domain:
        return False
    # Another domain: only its declared interface (the module or a name in it).
    return parts[2:3] != ["interface"]






@pytest.mark.parametrize("domain", OURS)
def test_item2_each_domain_declares_what_it_offers_in_its_interface(domain: str) -> None:
    path = ROOT / "agent" / domain / "interface.py"
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree)
    exported = next(node for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", "") == "__all__" for t in node.targets))
    assert exported.value.elts  # type: ignore[attr-defined]


def test_item2_generic_ebpf_probing_lives_in_the_kernel_layer() -> None:
    import agent.kernel.bpfprobe as probe  # noqa: PLC0415 - the module under test
    assert {"BpfUnavailable", "bcc_present", "default_bpf_dir", "headers_present"} <= set(
        vars(probe))
    for domain in OURS:
        for path in modules_of(domain):
            assert "agent.links.datapath.BpfUnavailable" not in imported(path) or \
                domain == "links", path


def test_item2_observers_take_their_section_and_register_in_the_composition_layer() -> None:
    for observer in (LinksObserver, RdmaObserver):
        parameters = inspect.signature(observer.__init__).parameters
        assert parameters["cfg"].annotation in {"LinksSection", "RdmaSection"}, observer
    for path in (ROOT / "agent/links/observer.py", ROOT / "agent/rdma/observer.py"):
        assert "register(" not in path.read_text(), path
    registered = agent.observers.registered()
    cfg = AgentConfig()
    assert isinstance(registered["links"].factory(cfg), LinksObserver)
    assert isinstance(registered["rdma"].factory(cfg), RdmaObserver)


def test_item2_services_take_their_own_part_of_a_pass() -> None:
    from agent.rdma.service import RdmaCcService  # noqa: PLC0415 - the module under test
    assert list(inspect.signature(TuningService.step).parameters)[1] == "sample"
    assert list(inspect.signature(RdmaCcService.step).parameters)[1] == "sample"


def test_item2_the_tuning_loop_reads_its_own_part_of_the_tuning_section() -> None:
    section = TuningSection(max_changes_per_minute=7, hold=2.5, activation_lead=0.25,
                            activation_margin=99, report_interval=3.0, stall=4.0,
                            link_classes=["data", "storage"])
    assert LoopSettings.of(section) == LoopSettings(
        max_changes_per_minute=7, hold=2.5, activation_lead=0.25, activation_margin=99,
        report_interval=3.0, stall=4.0, link_classes=("data", "storage"))




# --- the congestion trace ------------------------------------------------------------


def domain_of(module: str) -> str | None:
    """The domain or shared layer a module belongs to; None for the composition layer,
    the shared package and everything outside the agent."""
    parts = module.split(".")
    if parts[0] == "agent" and len(parts) > 2 and parts[1] in (*DOMAINS, *LAYERS):
        return parts[1]
    return None


@contextmanager
def crossings() -> Iterator[list[tuple[str | None, str]]]:
    """Every call that enters a domain or layer from elsewhere: (from, into)."""
    seen: list[tuple[str | None, str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        into = domain_of(frame.f_globals.get("__name__", ""))
        origin = domain_of(frame.f_back.f_globals.get("__name__", ""))
        if into is not None and into != origin:
            seen.append((origin, into))

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


JOB = "trace-job"
COMM = 0x7ACE000000000001
DECLARATION = JobDeclaration(JOB, revision=1, tuning=(TuningRange(
    (Collective.ALLREDUCE,), (Algorithm.RING, Algorithm.TREE), (Protocol.LL, Protocol.SIMPLE),
    0, 1 << 40, 2, 16),))


@pytest.fixture
def kit():
    with RankKit() as made:
        yield made


@needs_root
def test_item3_a_congestion_onset_visits_links_then_tuning_then_the_plugin_each_once(
        tmp_path: Path, kit) -> None:
    service = TuningService(TuningSection(policy_dir=str(tmp_path / "tuner"), htb=False,
                                          activation_margin=64),
                            LinksSection(), publish=lambda message: None)
    engine = HostHealthEngine(ObserversSection())
    service.start(0.0)
    service.declare(DECLARATION, 0.0)
    rank = kit.start(job=JOB, directory=tmp_path / "tuner", comm=COMM, n_ranks=1, n_nodes=1,
                     rate=200)
    try:
        now = 0.0

        def seen() -> bool:
            nonlocal now
            now += 0.1
            service.step(link_sample(0), link_judgements(0), now)
            return bool(service.loop.jobs[JOB].comms)

        wait_until(seen, what="the rank's stats")
        now += 0.1
        # One pass as the daemon runs it: the step judges the links, tuning takes the
        # judgement, the plugin's files carry the change.
        observations = Observations(links=link_sample(2))
        with crossings() as seen_calls:
            result = engine.step(observations, now)
            service.step(observations.links, result.links.judged, now)
        history = [change.kind for change in service.loop.jobs[JOB].history]
        assert history[-2:] == ["local", "confirmed"], history
        from_composition = [into for origin, into in seen_calls
                            if origin is None and into in OURS]
        visits = [d for i, d in enumerate(from_composition)
                  if i == 0 or from_composition[i - 1] != d]
        assert visits == ["links", "tuning"]
        between = {(origin, into) for origin, into in seen_calls if origin is not None}
        assert between == {("tuning", "plugin")}
    finally:
        stop([rank])
        service.stop(now)
