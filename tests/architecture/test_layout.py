"""The layout holds: domain packages, engines that import no I/O and read no clock.

Read from the source (the import statements, followed through the project's own
modules), so a change that makes an engine reach for a socket, a file mapping,
NVML or the clock fails here rather than in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.redesign

ROOT = Path(__file__).resolve().parents[2]

#: The sans-I/O engines: decisions from inputs and an explicit ``now``.
ENGINES = (
    "agent.step", "agent.host.rules", "agent.gpu.health", "agent.gpu.rules", "agent.gpu.record",
    "agent.gpu.attribution", "agent.gpu.xidevents", "agent.kernel.kmsgformat",
    "agent.gpu.states", "agent.energy.engine", "agent.energy.jobs", "agent.energy.types",
    "agent.links.health", "agent.jobhealth.engine", "agent.jobhealth.types",
    "agent.tuning.loop", "agent.tuning.policies", "agent.plugin.layout",
    "agent.tuning.phases", "agent.tuning.entries", "agent.tuning.jobstate",
    "agent.tuning.readiness", "agent.tuning.reports", "agent.tuning.multihost",
    "agent.tuning.adoption", "agent.tuning.htbplan", "agent.plugin.policy", "agent.plugin.codec",
    "agent.plugin.reference", "agent.plugin.stats", "harmonaize.hysteresis", "harmonaize.progress",
    "agent.validation.planner", "agent.conditions", "agent.outbox", "agent.declarations",
    "agent.rdma.cc", "agent.rdma.ccparams",
    "agent.remediation.engine", "agent.remediation.types",
    "controller.cluster", "controller.redaction", "controller.agreement", "controller.core",
    "controller.agreementphases", "controller.agreementrules", "controller.agreementstate",
    "controller.redactionconfig", "controller.poolredaction", "controller.jobredaction",
    "controller.coreagents", "controller.corestate", "controller.coretenants",
    "controller.jobhealth", "controller.corejobhealth",
    "controller.declarations", "controller.publications", "controller.outputs",
    "controller.views", "controller.types", "controller.notices",
    "controller.scheduler.engine", "controller.scheduler.table",
    "controller.scheduler.reasons", "controller.scheduler.types",
    "harmonaize.tenant.sequencer",
    "controller.negotiation.engine", "controller.negotiation.capacity",
    "controller.negotiation.checks", "controller.negotiation.maintenance",
    "controller.negotiation.table", "controller.negotiation.types",
    "controller.negotiation.plain",
)
#: Modules that do I/O (or serve it), directly or by what they exist for.
IO_MODULES = frozenset({
    "asyncio", "socket", "selectors", "ssl", "subprocess", "threading", "sqlite3", "mmap",
    "fcntl", "os", "shutil", "ctypes", "http", "urllib", "zmq", "pynvml", "bcc", "psutil",
    "aiohttp", "prometheus_client", "signal",
})
CLOCKS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"),
          ("time", "time_ns"), ("time", "monotonic_ns"), ("datetime", "now")}

DOMAINS = ("gpu", "links", "rdma", "host", "tuning", "validation", "remediation", "energy",
           "jobhealth")
#: Layers every domain may use: the kernel's interfaces, the tuner plugin's files.
LAYERS = ("kernel", "plugin")
#: The agent's top level besides the domains: the shell and a few shared modules.
SHARED = {"__init__", "main", "daemon", "daemoncommands", "daemonmessages", "config",
          "observations", "conditions", "declarations", "outbox", "uplink", "spool",
          "selfmetrics", "step"}


def source(module: str) -> Path | None:
    path = ROOT / (module.replace(".", "/") + ".py")
    if path.exists():
        return path
    package = ROOT / module.replace(".", "/") / "__init__.py"
    return package if package.exists() else None


def imports(module: str) -> set[str]:
    """What a module imports at run time (imports under TYPE_CHECKING do not count)."""
    path = source(module)
    assert path is not None, module
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = []
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names
                       if source(f"{node.module}.{alias.name}"))
    return out


def closure(module: str) -> tuple[set[str], set[str]]:
    """(the project's modules it reaches, the outside modules they import)."""
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imported in imports(name):
            if source(imported):
                todo.append(imported)
            else:
                outside.add(imported.split(".")[0])
    return seen, outside


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_imports_no_io_module(engine: str) -> None:
    reached, outside = closure(engine)
    assert not outside & IO_MODULES, (
        f"{engine} reaches {sorted(outside & IO_MODULES)} through {sorted(reached)}")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_reads_no_clock(engine: str) -> None:
    path = source(engine)
    assert path is not None
    calls = {
        (node.func.value.id, node.func.attr)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
    }
    assert not calls & CLOCKS, f"{engine} reads {sorted(calls & CLOCKS)}"


def test_the_checks_see_an_io_import_and_a_clock() -> None:
    """The checks above would fail for a module that does what engines must not."""
    _, outside = closure("agent.plugin.shm")
    assert {"mmap", "fcntl", "os"} <= outside
    _, outside = closure("agent.daemon")
    assert {"asyncio", "zmq"} <= outside


def test_the_agents_top_level_is_domains_the_shell_and_a_few_shared_modules() -> None:
    top = ROOT / "agent"
    packages = {p.name for p in top.iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in top.glob("*.py")}
    assert packages == {*DOMAINS, *LAYERS, "observers"}, packages
    assert modules == SHARED, modules ^ SHARED
    # The observer framework holds no observer of its own: each is in its domain.
    assert {p.stem for p in (top / "observers").glob("*.py")} == {"__init__", "base"}


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_domain_with_commands_holds_them_and_the_daemon_only_wires_them(
        domain: str) -> None:
    if domain == "energy":  # no operator command of its own: harmonctl reads its metrics
        return
    assert source(f"agent.{domain}.commands"), domain
    daemon = (ROOT / "agent/daemoncommands.py").read_text()
    assert f"{domain}_commands.commands(self" in daemon or (
        domain == "links" and "link_commands.commands(self." in daemon)
