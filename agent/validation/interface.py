"""What the validation domain offers the other domains: a verdict and its outcome, the
history remediation keeps its steps in, and what remediation may ask of validation.

Other domains import from here and nowhere else in ``agent.validation``; the
composition layer (``agent/daemon.py``) builds the service and hands it over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agent.validation.checks import Outcome
from agent.validation.history import History
from agent.validation.runner import Verdict

__all__ = ["History", "Outcome", "Validation", "Verdict"]


class Validation(Protocol):
    """The validation service as remediation uses it."""

    #: The history (``validation.db``) remediation records its steps in.
    history: History
    #: Called with each verdict once applied.
    listeners: list[Callable[[Verdict], None]]

    @property
    def restored(self) -> bool:
        """Quarantines recorded before this start are applied again."""
        ...

    def request(self, gpu: int, trigger: str) -> None:
        """Validate a GPU at the suspect level soon."""
        ...
