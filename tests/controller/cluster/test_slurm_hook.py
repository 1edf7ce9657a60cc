"""The Slurm hook against a cluster-mode replica (issue 29, item 1): the slurmctld host
runs a replica, whose admin socket forwards place and unplace to the leader; a
placement said again and an epilog said twice are delivered once, as with one
controller."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.natscluster import Clustered, wait_for
from tests.conftest import needs_root
from tests.slurmhook import job_env, make_hook

pytestmark = [pytest.mark.scheduler, pytest.mark.cluster, needs_root]


@pytest.fixture
def cluster(make_lab, workdir: Path) -> Iterator[Clustered]:
    lab = make_lab(("n1", "n2", "n3", "r1"), subnet="10.233.0.0/24")
    clustered = Clustered(lab, workdir)
    clustered.start_all_nats()
    yield clustered
    for log in sorted(workdir.glob("r*/controller.log")):
        print(f"===== {log.relative_to(workdir)}\n{log.read_text()[-4000:]}")


def test_hook_places_through_a_cluster_replica_once(cluster: Clustered, workdir: Path) -> None:
    replica = cluster.start_replica("r1")
    cluster.leader()
    hook = make_hook(workdir, replica.admin, accounts={"physics": "acme"})

    def placed() -> dict[str, dict]:
        return {j["job"]: j for j in replica.request("jobs")}

    for _ in range(2):
        assert hook.run("prolog", job_env("31")).returncode == 0
    wait_for(lambda: "31" in placed(), what="the placement at the leader")
    assert placed()["31"]["generation"] == 1 and placed()["31"]["tenant"] == "acme"
    for _ in range(2):
        assert hook.run("epilog", job_env("31")).returncode == 0
    assert "31" not in placed()
    assert hook.queued() == [] and hook.rejected() == []
