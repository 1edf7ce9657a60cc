"""The validation domain's metrics: verdicts by outcome, what runs, what is quarantined."""

from __future__ import annotations

from collections.abc import Mapping

from agent.validation.service import ValidationService
from harmonaize.metrics import Family, counter, gauge

#: Host events that are validation verdicts, and the outcome label they count under.
VERDICTS = {"ValidationPassed": "passed", "ValidationFailed": "failed",
            "ValidationUndecided": "undecided"}


def families(prefix: str, service: ValidationService | None,
             events_by_reason: Mapping[str, int]) -> list[Family]:
    verdicts = counter(f"{prefix}_validations_total", "Validations finished, by outcome.")
    for reason, outcome in VERDICTS.items():
        verdicts.add(events_by_reason.get(reason, 0), outcome=outcome)
    if service is None:
        return [verdicts]
    status = service.status()
    return [
        verdicts,
        gauge(f"{prefix}_validations_running", "Validations running now.").add(
            len(status["running"])),
        gauge(f"{prefix}_quarantined", "Devices in quarantine.").add(len(status["quarantined"])),
    ]
