"""The host's own rules: failing observers, an operator's drain, memory pressure and
a failed host validation, as findings for the condition tracker. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from agent.conditions import Finding
from agent.host.settings import HostObserverSection
from agent.host.types import HostSample
from harmonaize.messages import Severity


def host_findings(
    cfg: HostObserverSection,
    host: HostSample | None,
    failing: Mapping[str, str],
    drained: str | None,
    validation_failure: str | None,
) -> list[Finding]:
    found = [
        Finding(
            "ObserverFailure",
            bool(failing),
            Severity.WARNING,
            "ObserverFailing" if failing else "",
            "; ".join(f"{name}: {err}" for name, err in sorted(failing.items()))[:1000],
            sustain=0.0,
        ),
        Finding(
            "Drained",
            drained is not None,
            Severity.INFO,
            "OperatorDrain" if drained is not None else "",
            drained or "",
        ),
    ]
    if host is not None:
        fraction = host.memory_available_fraction
        found.append(
            Finding(
                "MemoryPressure",
                fraction < cfg.memory_available_min,
                Severity.WARNING,
                "LowAvailableMemory",
                f"{fraction:.1%} of memory available",
                sustain=cfg.sustain,
            )
        )
    found.append(Finding(
        "HostValidationFailed", validation_failure is not None, Severity.WARNING,
        "HostCheckFailed" if validation_failure else "", validation_failure or ""))
    return found
