"""The simulator's trace loaders: validation with line/record and field, subsetting, scaling."""

from __future__ import annotations

import json

import pytest

from sim import regimes
from sim.cluster import Cluster, Pool, map_trace_faults, model_faults
from sim.model import SimConfig
from sim.scenario import evaluate, from_traces
from sim.traces import (
    INFINITEHBD_FAULTS,
    PHILLY_JOBS,
    JobTraceOptions,
    TraceError,
    load_faults,
    load_jobs,
    parse_fault_records,
    parse_job_rows,
    select_jobs,
    with_tenants,
)

pytestmark = pytest.mark.sim

HEADER = ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"]


def rows(*lines: str) -> list[list[str]]:
    return [HEADER, *(line.split(",") for line in lines)]


def test_good_rows_parse_to_seconds_gpus_and_pool():
    out = parse_job_rows(rows("2017-10-09 07:01:55,66.0,1,66.0,11cb48",
                              "2017-10-09 07:02:00,10,4,40,6214e9"), "t.csv")
    assert [(d, g, p) for _, d, g, p in out] == [(66.0, 1, "11cb48"), (10.0, 4, "6214e9")]
    assert out[1][0] - out[0][0] == 5.0


@pytest.mark.parametrize(("line", "field"), [
    ("yesterday,66,1,66,p", "timestamp"),
    ("2017-10-09 07:01:55,abc,1,66,p", "duration"),
    ("2017-10-09 07:01:55,-5,1,-5,p", "duration"),
    ("2017-10-09 07:01:55,66,1.5,99,p", "num_gpus"),
    ("2017-10-09 07:01:55,66,0,0,p", "num_gpus"),
    ("2017-10-09 07:01:55,66,2,66,p", "gpu_time"),
    ("2017-10-09 07:01:55,66,1,66,bad pool!", "cluster"),
    ("2017-10-09 07:01:55,inf,1,inf,p", "duration"),
])
def test_bad_rows_name_the_line_and_field(line, field):
    with pytest.raises(TraceError) as err:
        parse_job_rows(rows("2017-10-09 07:01:55,66.0,1,66.0,p", line), "jobs.csv")
    assert "jobs.csv:3:" in str(err.value)
    assert repr(field) in str(err.value)


def test_wrong_width_and_missing_columns_are_reported():
    with pytest.raises(TraceError, match=r"jobs\.csv:2: expected 5 fields, got 3"):
        parse_job_rows([HEADER, ["1", "2", "3"]], "jobs.csv")
    with pytest.raises(TraceError, match="lacks column"):
        parse_job_rows([["timestamp", "duration"], ["1", "2"]], "jobs.csv")
    with pytest.raises(TraceError, match="empty file"):
        parse_job_rows([], "jobs.csv")


def test_numeric_timestamps_and_any_column_order(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("cluster,num_gpus,duration,gpu_time,timestamp\n"
                    "a,2,50,100,1000\nb,1,10,10,900\n")
    jobs = load_jobs(path)
    assert [(j.arrival, j.pool, j.gpus) for j in jobs] == [(0.0, "b", 1), (100.0, "a", 2)]


def test_unreadable_files_are_trace_errors(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_jobs(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="cannot read"):
        load_faults(tmp_path / "missing.json")


def test_subsetting_window_pools_sample_and_scaling():
    raw = [(i * 3600.0, 100.0, 1, "a" if i % 2 else "b") for i in range(240)]
    assert len(select_jobs(raw)) == 240
    window = select_jobs(raw, JobTraceOptions(start_day=1, days=2))
    assert len(window) == 48 and window[0].arrival == 0.0
    only_a = select_jobs(raw, JobTraceOptions(pools=("a",)))
    assert {j.pool for j in only_a} == {"a"}
    first = select_jobs(raw, JobTraceOptions(max_jobs=5, arrival_scale=0.5,
                                             duration_scale=2.0))
    assert [j.arrival for j in first] == [0, 1800, 3600, 5400, 7200]
    assert {j.duration for j in first} == {200.0}
    sampled = select_jobs(raw, JobTraceOptions(sample=0.5, seed=3))
    assert 80 < len(sampled) < 160
    assert sampled == select_jobs(raw, JobTraceOptions(sample=0.5, seed=3))
    assert [j.index for j in sampled] == list(range(len(sampled)))


def test_bad_options_are_refused():
    for kwargs in ({"sample": 0.0}, {"arrival_scale": 0}, {"days": -1}, {"max_jobs": 0}):
        with pytest.raises(ValueError):
            JobTraceOptions(**kwargs)


def test_tenants_are_assigned_reproducibly_and_kept_when_given():
    jobs = select_jobs([(float(t), 10.0, 1, "p") for t in range(100)])
    a = with_tenants(jobs, ("x", "y", "z"), seed=4)
    assert a == with_tenants(jobs, ("x", "y", "z"), seed=4)
    assert {j.tenant for j in a} == {"x", "y", "z"}
    assert with_tenants(a, ("q",), seed=1) == a


def fault(node="n1", t=1.0, kind="fault_start", desc="GPU Lost", cls="GPU"):
    return {"node_id": node, "event_time": t, "event_type": kind,
            "fault_type": {"Level": "Hardware Failure", "Class": cls, "Desc": desc}}


def test_faults_pair_start_and_end_by_node_and_type():
    trace = parse_fault_records([
        fault("n1", 1.0), fault("n2", 2.0, desc="NIC Lost", cls="NIC"),
        fault("n1", 3.0, "fault_end"), fault("n2", 2.5, "fault_end", "NIC Lost", "NIC"),
        fault("n3", 4.0),
    ], "f.json")
    spans = [(r.node, r.start_day, r.end_day, r.open_ended) for r in trace.records]
    assert spans == [("n1", 1.0, 3.0, False), ("n2", 2.0, 2.5, False), ("n3", 4.0, 4.0, True)]
    assert trace.span_days == 4.0 and trace.nodes == ["n1", "n2", "n3"]


@pytest.mark.parametrize(("record", "field"), [
    ({"node_id": "n", "event_time": 1, "event_type": "fault_start"}, "fault_type"),
    (fault(node=""), "node_id"),
    (fault(t=-1), "event_time"),
    (fault(t=True), "event_time"),
    (fault(kind="fault_middle"), "event_type"),
    ({**fault(), "fault_type": "GPU"}, "fault_type"),
    ({**fault(), "fault_type": {"Level": "x", "Class": "y"}}, "fault_type.Desc"),
])
def test_bad_fault_records_name_the_index_and_field(record, field):
    with pytest.raises(TraceError) as err:
        parse_fault_records([fault("n0", 0.5), record], "f.json")
    assert "record 1" in str(err.value) and repr(field) in str(err.value)


def test_fault_end_without_start_or_before_it_is_refused():
    with pytest.raises(TraceError, match="record 0: fault_end without an open fault_start"):
        parse_fault_records([fault(kind="fault_end")], "f.json")
    with pytest.raises(TraceError, match=r"record 1: field 'event_time': fault ends"):
        parse_fault_records([fault(t=5.0), fault(t=4.0, kind="fault_end")], "f.json")
    with pytest.raises(TraceError, match="expected a JSON list"):
        parse_fault_records({"a": 1}, "f.json")


def test_broken_json_names_the_line(tmp_path):
    path = tmp_path / "f.json"
    path.write_text('[\n {"node_id": "a",\n  oops\n]')
    with pytest.raises(TraceError, match=r"f\.json:3: not valid JSON"):
        load_faults(path)


def test_fault_mapping_replays_the_trace_on_nodes_and_time_scales(tmp_path):
    path = tmp_path / "f.json"
    path.write_text(json.dumps([fault("a", 1.0), fault("a", 2.0, "fault_end"),
                                fault("b", 1.5, desc="NIC Link Speed low", cls="NIC"),
                                fault("b", 3.0, "fault_end", "NIC Link Speed low", "NIC")]))
    trace = load_faults(path)
    cluster = Cluster((Pool(0, "p", "g", 0, 4),), 8)
    cfg = SimConfig(trace_nodes=2, precursor_fraction=1.0, fault_time_scale=0.5)
    specs = map_trace_faults(trace, cluster, cfg)
    # Four nodes over two slots: each fault twice, the second pass shifted in time.
    assert len(specs) == 4
    assert sorted({s.node % 2 for s in specs if s.desc == "GPU Lost"}) in ([0], [1])
    first_pass = [s for s in specs if s.node < 2 and s.desc == "GPU Lost"]
    assert len(first_pass) == 1
    assert first_pass[0].start == pytest.approx(0.5 * 86400)
    assert first_pass[0].end == pytest.approx(86400)
    gpu = [s for s in specs if s.desc == "GPU Lost"]
    assert all(s.lead is not None and not s.soft for s in gpu)
    assert all(s.soft and s.lead is None for s in specs if s.desc != "GPU Lost")
    # Replayed for as long as asked, when the scaled trace is shorter.
    longer = map_trace_faults(trace, cluster, cfg, until=4 * 1.5 * 86400)
    assert len(longer) == 4 * len(specs)
    modelled = model_faults(trace, cluster, cfg, horizon=200 * 86400)
    assert modelled == model_faults(trace, cluster, cfg, horizon=200 * 86400)
    assert len(modelled) > 0


traces_present = pytest.mark.skipif(
    not (PHILLY_JOBS.exists() and INFINITEHBD_FAULTS.exists()),
    reason="public traces not found at ../shared/data/traces (outside the repository)")


@traces_present
def test_the_public_traces_load_whole():
    jobs = load_jobs()
    assert len(jobs) == 82247
    assert sum(j.duration * j.gpus for j in jobs) / 3600 == pytest.approx(978078, rel=1e-4)
    faults = load_faults()
    assert len(faults.records) == 584
    assert len(faults.nodes) == 231
    assert 348 < faults.span_days < 350
    assert not any(r.open_ended for r in faults.records)


@traces_present
def test_a_slice_of_the_public_traces_simulates_to_the_end():
    scenario = from_traces(SimConfig(), opts=JobTraceOptions(start_day=30, days=2))
    assert 1000 < len(scenario.jobs) < 10000 and scenario.faults
    for regime in (regimes.none(), regimes.coarse()):
        outcome = evaluate(scenario, regime)
        assert outcome.summary.finished == len(scenario.jobs)
        assert outcome.summary.utilization <= 1.0


def test_a_timestamp_with_an_offset_is_the_same_instant_in_utc():
    out = parse_job_rows(rows("2017-10-09T07:00:00+02:00,10,1,10,p",
                              "2017-10-09 05:00:30,10,1,10,p"), "t.csv")
    assert out[1][0] - out[0][0] == 30.0
