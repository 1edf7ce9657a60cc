"""RDMA congestion control on fixture trees of both layouts: values written, originals kept
durably, put back at stop and, after the agent was killed, at its next start."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent.rdma import knobs
from agent.rdma.observer import RdmaObserver
from agent.rdma.originals import Original, Originals, OriginalsError
from agent.rdma.service import ORIGINALS_FILE, RdmaCcService
from agent.rdma.settings import CcDeviceSection, CcLayout, RdmaCcSection, RdmaSection, Switch
from tests.conftest import FIXTURES, free_port, python
from tests.daemons import NO_LINKS, start_agent, wait_until
from tests.ops.test_metrics import check_conventions, scrape, value

pytestmark = pytest.mark.rdma

ECN = "class/net/eth2/ecn"
CC = "mlx5/0000:3b:00.1/cc_params"


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the fixture sysfs and debugfs roots."""
    shutil.copytree(FIXTURES / "rdma", tmp_path / "rdma")
    return tmp_path / "rdma" / "sys", tmp_path / "rdma" / "debug"


def read(path: Path) -> int:
    return int(path.read_text())


def bump(sys_root: Path, device: str, packets: int = 100_000, retrans: int = 1000) -> None:
    """The port sent ``packets`` more and retransmitted ``retrans`` more."""
    port = sys_root / "class/infiniband" / device / "ports/1"
    for rel, by in (("counters/port_xmit_packets", packets), ("counters/port_rcv_packets",
                    packets), ("hw_counters/roce_adp_retrans", retrans)):
        path = port / rel
        path.write_text(f"{read(path) + by}\n")


def devices() -> tuple[CcDeviceSection, ...]:
    return (
        CcDeviceSection("eth2", (3,), Switch.KEEP, Switch.ON,
                        {"rpg_ai_rate": (1, 5), "rpg_time_reset": (300, 3000),
                         "cnp_dscp": (26, 26)}),  # type: ignore[dict-item]
        CcDeviceSection("mlx5_1", (), Switch.KEEP, Switch.KEEP,
                        {"rpg_ai_rate": (1, 5), "min_time_between_cnps": (0, 4),
                         "cnp_dscp": (26, 26)}),  # type: ignore[dict-item]
    )


def test_both_layouts_are_found_read_and_written(trees: tuple[Path, Path]) -> None:
    sys_root, debug_root = trees
    mlnx = knobs.find(sys_root, debug_root, "eth2", CcLayout.AUTO)
    upstream = knobs.find(sys_root, debug_root, "eth3", CcLayout.AUTO)
    assert isinstance(mlnx, knobs.CcDevice) and mlnx.layout == "sysfs"
    assert isinstance(upstream, knobs.CcDevice) and upstream.layout == "debugfs"
    assert mlnx.read("rpg_ai_rate") == 5 and mlnx.read("np_enable/3") == 0
    assert mlnx.read("rp_enable/3") == 1 and mlnx.read("cnp_802p_prio") == 6
    assert upstream.read("cnp_802p_prio") == 6 and upstream.read("rpg_time_reset") == 300
    assert upstream.path("np_enable/3") is None          # no enable files upstream
    upstream.write("min_time_between_cnps", 2)
    assert read(debug_root / CC / "np_min_time_between_cnps") == 2
    mlnx.write("rp_enable/0", 1)
    assert read(sys_root / ECN / "roce_rp/enable/0") == 1
    with pytest.raises(knobs.KnobError, match="no file in the debugfs layout"):
        upstream.write("rp_enable/0", 1)
    assert knobs.find(sys_root, debug_root, "eth2", CcLayout.DEBUGFS) == (
        f"{debug_root}/mlx5/0000:3b:00.0/cc_params is missing (is debugfs mounted?)")
    assert "roce_rp is missing" in str(knobs.find(sys_root, debug_root, "eth3",
                                                   CcLayout.SYSFS))
    assert "no net device eth9" in str(knobs.find(sys_root, debug_root, "eth9",
                                                   CcLayout.AUTO))
    (sys_root / "class/net/eth4/device").mkdir(parents=True)   # a NIC without RoCE
    assert "no PCI function" in str(knobs.find(sys_root, debug_root, "eth4", CcLayout.AUTO))
    (sys_root / "class/net/eth4/device/uevent").write_text("PCI_SLOT_NAME=0000:5e:00.0\n")
    assert "neither" in str(knobs.find(sys_root, debug_root, "eth4", CcLayout.AUTO))


def test_only_dcqcn_settings_under_the_roots_may_be_put_back(trees: tuple[Path, Path]) -> None:
    sys_root, debug_root = trees
    ok = [sys_root / ECN / "roce_rp/rpg_ai_rate", sys_root / ECN / "roce_np/enable/7",
          debug_root / CC / "rp_ai_rate"]
    bad = [sys_root / ECN / "roce_rp/../../../../etc/passwd", Path("/etc/shadow"),
           sys_root / ECN / "roce_rp/enable/8", sys_root / "class/net/eth2/mtu",
           debug_root / CC / "rpg_ai_rate",
           debug_root / "mlx5/x/cc_params/../cc_params/np_cnp_dscp"]
    assert all(knobs.allowed_path(str(p), sys_root, debug_root) for p in ok)
    assert not any(knobs.allowed_path(str(p), sys_root, debug_root) for p in bad)


def test_originals_are_durable_and_bad_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    store = Originals(path)
    assert store.load() == []
    assert store.remember(Original("eth2", "rpg_ai_rate", "/x/rpg_ai_rate", 5))
    assert not store.remember(Original("eth2", "rpg_ai_rate", "/x/rpg_ai_rate", 9))
    assert Originals(path).load() == [Original("eth2", "rpg_ai_rate", "/x/rpg_ai_rate", 5)]
    store.forget(["/x/rpg_ai_rate"])
    assert not path.exists()
    for text, message in (("{", "not a file of original values"),
                          ('{"format": 7, "values": []}', "format 7"),
                          ('{"format": 1, "values": [{"device": "e", "knob": "k", "path": '
                           '"/p", "value": "5"}]}', "is not an integer"),
                          ("[]", "not a file of original values")):
        path.write_text(text)
        with pytest.raises(OriginalsError, match=message):
            Originals(path).load()


def service_for(sys_root: Path, debug_root: Path, state: Path) -> RdmaCcService:
    cfg = RdmaCcSection(enabled=True, debugfs_root=str(debug_root), window=1.0,
                        min_packets=1000, max_changes_per_minute=60, devices=devices())
    return RdmaCcService(cfg, str(sys_root), str(state))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_service_changes_both_layouts_and_puts_everything_back_at_stop(
        trees: tuple[Path, Path], tmp_path: Path) -> None:
    sys_root, debug_root = trees
    before = {p: p.read_text() for root in trees for p in root.rglob("*") if p.is_file()}
    clock = Clock()
    observer = RdmaObserver(RdmaSection(sysfs_root=str(sys_root)), clock)
    observer.start()
    service = service_for(sys_root, debug_root, tmp_path)
    service.start(clock.now)
    for _ in range(4):  # loss on both ports, window after window
        bump(sys_root, "mlx5_0")
        bump(sys_root, "mlx5_1")
        clock.now += 1.0
        service.step(observer.sample(clock.now), clock.now)
    assert read(sys_root / ECN / "roce_np/cnp_dscp") == 26            # pinned in range
    assert read(sys_root / ECN / "roce_np/enable/3") == 1             # declared on
    assert read(sys_root / ECN / "roce_rp/rpg_ai_rate") < 5           # more cautious
    assert read(sys_root / ECN / "roce_rp/rpg_time_reset") > 300
    assert read(debug_root / CC / "np_cnp_dscp") == 26
    assert read(debug_root / CC / "rp_ai_rate") < 5
    view = service.describe()
    eth2 = view["devices"][0]
    assert eth2["layout"] == "sysfs" and eth2["port"] == "mlx5_0/1" and eth2["changes"] > 0
    ai_rate = next(s for s in eth2["settings"] if s["knob"] == "rpg_ai_rate")
    assert ai_rate["original"] == 5 and ai_rate["current"] < 5 and ai_rate["range"] == [1, 5]
    assert any("loss" in d["reason"] for d in view["history"])
    assert view["devices"][1]["layout"] == "debugfs"
    assert (tmp_path / ORIGINALS_FILE).exists()
    service.stop()
    after = {p: p.read_text() for root in trees for p in root.rglob("*") if p.is_file()}
    changed = {p for p in before if before[p] != after[p] and "counters" not in str(p)}
    assert changed == set(), sorted(map(str, changed))
    assert not (tmp_path / ORIGINALS_FILE).exists()


def test_a_write_that_fails_is_reported_and_nothing_is_lost(
        trees: tuple[Path, Path], tmp_path: Path) -> None:
    sys_root, debug_root = trees
    (sys_root / ECN / "roce_np/cnp_dscp").unlink()  # the driver refuses the attribute
    service = service_for(sys_root, debug_root, tmp_path)
    service.start(0.0)
    service.step(None, 0.0)
    service.step(None, 1.0)
    assert service.describe()["devices"][0]["waiting"] == "port mlx5_0/1 is not observed"
    observer = RdmaObserver(RdmaSection(sysfs_root=str(sys_root)))
    observer.start()
    for now in (2.0, 3.0):
        service.step(observer.sample(now), now)
    eth2 = service.describe()["devices"][0]
    assert "cnp_dscp" in [s["knob"] for s in eth2["settings"] if s["current"] is None]
    assert service.failures == 0  # an unreadable setting is left alone, not written


# --- the real agent, killed --------------------------------------------------------------

def cc_config(sys_root: Path, debug_root: Path, enabled: bool = True) -> str:
    return (NO_LINKS + f'[observers.rdma]\nsysfs_root = "{sys_root}"\n'
            + f'[rdma.cc]\nenabled = {"true" if enabled else "false"}\n'
            f'debugfs_root = "{debug_root}"\nwindow = 0.2\nmin_packets = 1000\n'
            "max_changes_per_minute = 600\nhold = 0\n"
            '[[rdma.cc.devices]]\ndevice = "eth2"\npriorities = [3]\nnp_enable = "on"\n'
            '[rdma.cc.devices.ranges]\nrpg_ai_rate = [1, 5]\nrpg_time_reset = [300, 3000]\n'
            "cnp_dscp = [26, 26]\n"
            '[[rdma.cc.devices]]\ndevice = "mlx5_1"\n'
            '[rdma.cc.devices.ranges]\nrpg_ai_rate = [1, 5]\ncnp_dscp = [26, 26]\n')


def watched(sys_root: Path, debug_root: Path) -> dict[str, int]:
    return {name: read(path) for name, path in (
        ("rpg_ai_rate", sys_root / ECN / "roce_rp/rpg_ai_rate"),
        ("rpg_time_reset", sys_root / ECN / "roce_rp/rpg_time_reset"),
        ("cnp_dscp", sys_root / ECN / "roce_np/cnp_dscp"),
        ("np_enable/3", sys_root / ECN / "roce_np/enable/3"),
        ("rp_ai_rate", debug_root / CC / "rp_ai_rate"),
        ("np_cnp_dscp", debug_root / CC / "np_cnp_dscp"))}


def test_sigkill_then_the_next_start_puts_the_originals_back(
        spawn, workdir: Path, trees: tuple[Path, Path]) -> None:
    sys_root, debug_root = trees
    originals = watched(sys_root, debug_root)
    agent = start_agent(spawn, workdir, "r1", links=cc_config(sys_root, debug_root))

    def changed_by_loss() -> dict[str, int] | None:
        bump(sys_root, "mlx5_0")
        bump(sys_root, "mlx5_1")
        now = watched(sys_root, debug_root)
        return now if now["rpg_ai_rate"] < 5 and now["rp_ai_rate"] < 5 else None

    wait_until(changed_by_loss, what="congestion control to act on the loss")

    def settled() -> dict[str, int] | None:  # the loss stopped: no further step comes
        first = watched(sys_root, debug_root)
        time.sleep(0.6)
        return first if watched(sys_root, debug_root) == first else None

    changed = wait_until(settled, what="the values to settle")
    assert changed["cnp_dscp"] == 26 and changed["np_enable/3"] == 1
    assert changed["np_cnp_dscp"] == 26 and changed["rpg_time_reset"] > 300
    table = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), "rdma"),
                           capture_output=True, text=True, timeout=30).stdout
    assert "rpg_ai_rate" in table and "loss" in table and "mlx5_0/1" in table

    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait(timeout=10)
    left = json.loads((workdir / "r1" / ORIGINALS_FILE).read_text())
    assert {v["knob"]: v["value"] for v in left["values"]}["rpg_ai_rate"] == 5
    assert watched(sys_root, debug_root) == changed      # nobody put anything back

    # The operator turns congestion control off; the next start still puts back
    # everything the killed agent changed.
    agent = start_agent(spawn, workdir, "r1",
                        links=cc_config(sys_root, debug_root, enabled=False))
    assert watched(sys_root, debug_root) == originals
    assert agent.request("rdma")["cc"]["restored_at_start"] >= 6
    assert not (workdir / "r1" / ORIGINALS_FILE).exists()
    assert "put back" in agent.log.read_text()


def test_metrics_show_the_settings_and_sigterm_puts_the_originals_back(
        spawn, workdir: Path, trees: tuple[Path, Path]) -> None:
    sys_root, debug_root = trees
    originals = watched(sys_root, debug_root)
    port = free_port()
    agent = start_agent(spawn, workdir, "r2", links=cc_config(sys_root, debug_root)
                        + f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    wait_until(lambda: watched(sys_root, debug_root)["cnp_dscp"] == 26,
               what="the declared CNP DSCP")
    families = wait_until(lambda: (f := check_conventions(scrape(port))) and value(
        f, "harmonaize_agent_rdma_cc_setting", device="mlx5_1", setting="cnp_dscp") == 26
        and f, what="the settings in the metrics")
    assert value(families, "harmonaize_agent_rdma_cc_setting", device="eth2",
                 setting="cnp_dscp") == 26
    assert value(families, "harmonaize_agent_rdma_cc_setting_original", device="eth2",
                 setting="cnp_dscp") == 48
    assert value(families, "harmonaize_agent_rdma_cc_changes_total", device="eth2") >= 2
    assert value(families, "harmonaize_agent_rdma_packets_total", device="mlx5_0", port="1",
                 direction="transmit") == 0
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=20) == 0
    assert watched(sys_root, debug_root) == originals
    assert not (workdir / "r2" / ORIGINALS_FILE).exists()


def test_an_originals_file_not_ours_stops_every_change(trees: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    sys_root, debug_root = trees
    (tmp_path / ORIGINALS_FILE).write_text("not json")
    service = service_for(sys_root, debug_root, tmp_path)
    service.start(0.0)
    assert service.refused.startswith("not changing anything: ")
    assert service.next_deadline() == float("inf")
    observer = RdmaObserver(RdmaSection(sysfs_root=str(sys_root)))
    observer.start()
    for now in (1.0, 2.0, 3.0):
        service.step(observer.sample(now), now)
    assert read(sys_root / ECN / "roce_np/cnp_dscp") == 48            # untouched
    assert (tmp_path / ORIGINALS_FILE).read_text() == "not json"       # left for a person
    assert service.describe()["refused"] == service.refused
