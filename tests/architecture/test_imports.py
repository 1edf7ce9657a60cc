"""The house's rules, read from the import statements of every module.

The agent's domains stand side by side: each imports its own modules, the shared
layers under it (the kernel's interfaces, the tuner plugin's files, the shared
vocabulary of findings, the observer framework) and, of another domain, only what that
domain declares in its ``interface`` module. Nothing a domain imports climbs back into
the agent's composition (its configuration, its pass record, its step, its daemon).
The installed packages import nothing of the test harness; the agent and the
controller share only the wire package. Imports under ``TYPE_CHECKING`` count: a
dependency for the type checker is a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.architecture

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"

#: The agent's domains: siblings, none above another.
DOMAINS = ("energy", "gpu", "host", "jobhealth", "links", "rdma", "remediation", "tuning",
           "validation")
#: What every domain may use: layers under the domains, with no domain logic.
LAYERS = ("agent.kernel", "agent.plugin", "agent.conditions", "agent.observers.base")
#: Packages outside the agent that any agent module may use.
SHARED_PACKAGES = ("harmonaize",)
#: The installed packages (pyproject's packages.find).
INSTALLED = ("agent", "controller", "harmonaize", "sim")
#: The test harness, never imported by what is installed.
HARNESS = ("testbed", "tests")


def modules(package: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every absolute module an import statement names (and ``from m import x`` as both
    ``m`` and ``m.x``: x may be a module), with its line."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def domain_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "agent" and parts[1] in DOMAINS:
        return parts[1]
    return None


def is_module(name: str) -> bool:
    base = ROOT / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def allowed_for_domain(domain: str, name: str) -> bool:
    if not under(name, "agent"):
        return True  # the standard library, third parties, harmonaize
    if under(name, f"agent.{domain}") or any(under(name, layer) for layer in LAYERS):
        return True
    other = domain_of(name)
    if other is not None:
        # another domain's declared interface (``from agent.x import interface`` too)
        return name in (f"agent.{other}.interface", f"agent.{other}") or under(
            name, f"agent.{other}.interface")
    return False


def violations_of_domains() -> list[str]:
    found = []
    for module, path in modules(AGENT):
        domain = domain_of(module)
        if domain is None:
            continue
        for line, name in imported(path):
            if not is_module(name) and not name.startswith("agent."):
                continue
            if name.count(".") and not is_module(name) and is_module(name.rsplit(".", 1)[0]):
                continue  # ``from m import Name``: m was checked on its own
            if not allowed_for_domain(domain, name):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_no_domain_imports_another_domains_modules_or_the_agents_composition() -> None:
    found = violations_of_domains()
    assert not found, "domains must stand side by side:\n" + "\n".join(found)


def test_the_shared_layers_import_no_domain_and_no_composition() -> None:
    found = []
    for layer in ("kernel", "plugin"):
        for _module, path in modules(AGENT / layer):
            for line, name in imported(path):
                if under(name, "agent") and not under(name, f"agent.{layer}") \
                        and not under(name, "agent.kernel"):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    for shared in ("conditions.py", "observers/base.py"):
        path = AGENT / shared
        for line, name in imported(path):
            if under(name, "agent") and not any(under(name, layer) for layer in LAYERS):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not found, "\n".join(found)


def test_an_interface_declares_only_its_own_domain() -> None:
    found = []
    for domain in DOMAINS:
        path = AGENT / domain / "interface.py"
        if not path.exists():
            continue
        for line, name in imported(path):
            other = domain_of(name)
            if other is not None and other != domain:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("package", INSTALLED)
def test_the_installed_packages_import_nothing_of_the_test_harness(package: str) -> None:
    found = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for _module, path in modules(ROOT / package)
             for line, name in imported(path)
             if any(under(name, harness) for harness in HARNESS)]
    assert not found, "\n".join(found)


def test_the_agent_and_the_controller_share_only_the_wire_package() -> None:
    found = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for this, other in (("agent", "controller"), ("controller", "agent"))
             for _module, path in modules(ROOT / this)
             for line, name in imported(path) if under(name, other)]
    assert not found, "\n".join(found)


def test_the_checks_see_a_cross_domain_import(tmp_path: Path) -> None:
    """The rule above would fail for a domain reaching into another's internals, or
    into the composition, and pass for a declared interface and a shared layer."""
    assert not allowed_for_domain("validation", "agent.gpu.health")
    assert not allowed_for_domain("tuning", "agent.config")
    assert not allowed_for_domain("tuning", "agent.observations")
    assert not allowed_for_domain("gpu", "agent.step")
    assert allowed_for_domain("validation", "agent.gpu.interface")
    assert allowed_for_domain("energy", "agent.plugin.shm")
    assert allowed_for_domain("links", "agent.kernel.tc")
    assert allowed_for_domain("gpu", "harmonaize.messages")
    planted = tmp_path / "planted.py"
    planted.write_text("from agent.gpu.health import GpuState\nimport testbed.netns\n"
                       "def f():\n    import tests.daemons as d\n"
                       "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from tests.conftest import python\n"
                       "import testbedding\nfrom harmonaize import tests\n")
    names = {name for _line, name in imported(planted)}
    assert {"agent.gpu.health", "testbed.netns", "tests.daemons", "tests.conftest"} <= names
    harness = {name for name in names if any(under(name, h) for h in HARNESS)}
    assert {"testbed.netns", "tests.daemons", "tests.conftest"} <= harness
    assert not harness & {"testbedding", "harmonaize.tests"}
