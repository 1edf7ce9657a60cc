"""Configuration files: any bytes give a configuration or one ConfigError,
for the agent's and the controller's files alike."""

from __future__ import annotations

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from agent.config import AgentConfig
    from controller.config import ControllerConfig
    from harmonaize.config import ConfigError, loads


def one(data: bytes) -> None:
    for cls in (AgentConfig, ControllerConfig):
        try:
            loads(cls, data, "<fuzz>")
        except ConfigError as exc:
            if "\n" in str(exc):
                raise AssertionError(f"a refusal of more than one line: {exc!r:.300}") from None


if __name__ == "__main__":
    run(one)
