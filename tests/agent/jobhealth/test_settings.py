"""``[jobhealth]`` in the agent's configuration: defaults, values, and bad input refused
with one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import load
from harmonaize.config import ConfigError

pytestmark = pytest.mark.jobhealth


def test_item3_jobhealth_settings_load_with_defensible_defaults(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[jobhealth]\nhang_after = 2.5\nreport_interval = 5\n")
    cfg, _ = load(path)
    assert (cfg.jobhealth.hang_after, cfg.jobhealth.stall_after) == (2.5, 60.0)
    assert cfg.jobhealth.report_interval == 5.0 and cfg.jobhealth.enabled
    assert cfg.jobhealth.progress().hang_after == 2.5


@pytest.mark.parametrize(("text", "named"), [
    ("hang_after = 0", "hang_after"),
    ("stall_after = 1.0", "stall_after"),
    ("ranks_per_comm = 1000", "ranks_per_comm"),
    ("hang_afterr = 3", "hang_afterr"),
])
def test_item5_a_bad_jobhealth_setting_is_one_line_naming_it(tmp_path: Path, text: str,
                                                            named: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(f"[jobhealth]\n{text}\n")
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert named in str(caught.value) and "\n" not in str(caught.value)
