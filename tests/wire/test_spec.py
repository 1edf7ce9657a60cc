"""The published spec (docs/feed.asyncapi.yaml): generated from the message types, and
the check every test's tenant-facing messages go through (tests/wirecheck.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.gateway.events import STATUS
from harmonaize import messages as m
from harmonaize import spec
from harmonaize.schema import to_plain
from tests import wirecheck
from tests.wire.test_codec import SAMPLES

pytestmark = pytest.mark.tenant

ROOT = Path(__file__).resolve().parents[2]


def test_the_published_spec_is_what_the_code_generates(capsys, tmp_path: Path) -> None:
    assert spec.main(["--check", str(ROOT / "docs" / "feed.asyncapi.yaml")]) == 0, (
        "docs/feed.asyncapi.yaml is out of date: python -m harmonaize.spec > "
        "docs/feed.asyncapi.yaml")
    stale = tmp_path / "stale.yaml"
    stale.write_text(spec.render().replace("maxItems: 64", "maxItems: 65", 1))
    assert spec.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_every_kind_a_tenant_sends_or_receives_is_in_the_spec() -> None:
    published = wirecheck.spec()["components"]["messages"]
    assert set(m.FEED_KINDS | m.TENANT_KINDS) <= set(published)
    # The agents' own protocol is not the tenants' business.
    assert not set(published) & (m.AGENT_KINDS | m.CONTROLLER_KINDS) - m.FEED_KINDS - m.TENANT_KINDS
    codes = wirecheck.spec()["components"]["schemas"]["ErrorCode"]
    assert set(codes["enum"]) == {c.value for c in m.ErrorCode} == set(codes["x-meanings"])


@pytest.mark.parametrize("body", [s for s in SAMPLES
                                  if s.KIND in m.FEED_KINDS | m.TENANT_KINDS],
                         ids=lambda b: b.KIND)
def test_samples_of_every_tenant_kind_conform(body: m.Message) -> None:
    assert wirecheck.problems(body.KIND, to_plain(body)) == []


def test_the_check_finds_what_the_spec_does_not_say() -> None:
    capacity = to_plain(m.PoolCapacity("p", "H200", m.Bucket(0, 1), m.Bucket(0, 0),
                                       m.Bucket(8, 15), m.Trend.STEADY, 3))
    assert wirecheck.problems("pool-capacity", capacity) == []
    assert wirecheck.problems("pool-capacity", {**capacity, "host": "gpu-17"})  # unnamed field
    assert wirecheck.problems("pool-capacity", {k: v for k, v in capacity.items()
                                                if k != "trend"})  # a required one missing
    assert wirecheck.problems("pool-capacity", {**capacity, "trend": "up"})  # no such value
    assert wirecheck.problems("job-health", {"job": "j", "degraded": ["x" * 129]})
    assert wirecheck.problems("host-summary", {})  # the agents' protocol is not published


def test_what_this_process_encodes_for_tenants_is_audited(wire_audit) -> None:
    wire_audit.check()
    m.encode(m.Reply(4, False, "no job 'j' of yours is placed", "not-placed"),
             sender="controller")
    m.encode(m.Heartbeat(1.0, 2), sender="h1")  # not tenant-facing: not audited
    records = list(wire_audit.new())
    assert [r["kind"] for r in records] == ["reply"]
    assert records[0]["body"]["code"] == "not-placed"


def test_the_guides_list_every_error_code_and_the_gateways_status() -> None:


    guide = (ROOT / "docs" / "tenant-guide.md").read_text()
    wire = (ROOT / "docs" / "wire.md").read_text()
    for code in m.ErrorCode:
        assert f"| `{code.value}` |" in guide, f"tenant guide lacks {code.value}"
        assert f"`{code.value}`" in wire, f"wire.md lacks {code.value}"
        assert code in STATUS
