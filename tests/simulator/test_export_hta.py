"""Issue 18 item 7: simulated traces read like real ones. Holistic Trace Analysis (a dev dependency) runs
its temporal breakdown, comm/comp overlap and idle-time analyses on a simulated trace folder, and its
figures match the simulator's own metrics; events of a track never overlap."""
import json
import logging

import numpy as np
import pytest

from clustersim.experiment import Experiment, run_experiment
from simulator.export import perfetto_trace, rank_trace, write_rank_traces
from simulator.metrics import merge_intervals

hta = pytest.importorskip("hta.trace_analysis")


@pytest.fixture(scope="module")
def outcome():
    # 8 GPUs: tp2 x pp2 x dp2, full mode (one file per rank); steps of ~0.1 s so that HTA's rounding of each
    # event down to whole microseconds stays far below the tolerances
    return run_experiment(Experiment(cluster="dgx-h100", gpus=8, model="llama3-8b", tp=2, pp=2, seq=2048,
                                     global_batch=8, mode="full"))


def _overlapping_pairs(events) -> int:
    """Pairs of complete events on one (pid, tid) that overlap without one containing the other."""
    bad = 0
    tracks: dict = {}
    for e in events:
        if e.get("ph") == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((round(e["ts"] * 1000), round(e["dur"] * 1000)))
    for evs in tracks.values():
        evs.sort()
        stack = []
        for ts, dur in evs:
            end = ts + dur
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and end > stack[-1]:
                bad += 1
            stack.append(end)
    return bad


def test_traces_have_kineto_structure_and_no_overlap(outcome):
    res = outcome.result
    merged = perfetto_trace(res)
    assert _overlapping_pairs(merged["traceEvents"]) == 0
    t = rank_trace(res, 3)
    assert t["distributedInfo"] == {"backend": "nccl", "rank": 3, "world_size": 8}
    ev = t["traceEvents"]
    assert _overlapping_pairs(ev) == 0
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert kernels and all({"stream", "device", "correlation"} <= set(e["args"]) for e in kernels)
    assert all(e["args"]["stream"] == e["tid"] and e["pid"] == e["args"]["device"] == 3 for e in kernels)
    for e in ev:                                     # integer nanoseconds
        if e.get("ph") == "X":
            assert e["ts"] * 1000 == pytest.approx(round(e["ts"] * 1000), abs=1e-6)
            assert e["dur"] * 1000 == pytest.approx(round(e["dur"] * 1000), abs=1e-6)
    names = {(e["name"], e["pid"], e["tid"]) for e in ev if e["ph"] == "M"}
    assert {n for n, _, _ in names} >= {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 1 and steps[0]["dur"] == pytest.approx(res.step_time_s * 1e6, abs=1e-3)
    launches = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"}
    assert launches == {e["args"]["correlation"] for e in kernels}


def test_hta_analyses_agree_with_the_simulator(outcome, tmp_path):
    res, m = outcome.result, outcome.metrics
    write_rank_traces(res, tmp_path)
    logging.disable(logging.WARNING)
    try:
        ta = hta.TraceAnalysis(trace_dir=str(tmp_path))
        tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
        ov = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
        idle, _ = ta.get_idle_time_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    assert sorted(tb.index) == list(range(8))
    for rm in m.per_rank:
        prog = res.programs.ops[rm.rank]
        n_events = len(prog)
        tol_us = 2.0 * n_events               # HTA floors ts and dur of each event to whole microseconds
        row = tb.loc[rm.rank]
        start = float(np.nanmin(res.start_s[rm.rank]))
        span_us = (rm.end_s - start) * 1e6
        assert row["kernel_time(us)"] == pytest.approx(span_us, abs=tol_us)
        assert row["compute_time(us)"] == pytest.approx(rm.compute_s * 1e6, abs=tol_us)
        assert row["non_compute_time(us)"] == pytest.approx(rm.exposed_comm_s * 1e6, abs=tol_us)
        # the step-level figures: HTA's idle is the simulator's bubble when the rank spans the step
        if start == 0 and rm.end_s == pytest.approx(m.step_time_s):
            assert row["idle_time(us)"] == pytest.approx(rm.idle_s * 1e6, abs=tol_us)
        assert ov.loc[rm.rank, "comp_comm_overlap_pctg"] == pytest.approx(100 * rm.overlap_s / rm.comm_s, abs=0.5)
    # idle time per stream: the gaps between consecutive kernels of each stream
    r0 = res.programs.ops[0]
    by_stream: dict = {}
    for i, op in enumerate(r0):
        by_stream.setdefault(op.stream, []).append((res.start_s[0][i], res.end_s[0][i]))
    sid = {s: 7 + k for k, s in enumerate(dict.fromkeys(op.stream for op in r0))}
    got = idle[idle["rank"] == 0].groupby("stream")["idle_time"].sum()
    for stream, iv in by_stream.items():
        s, e = merge_intervals([a for a, _ in iv], [b for _, b in iv])
        gaps_us = float(np.sum(s[1:] - e[:-1])) * 1e6
        assert got.get(sid[stream], 0.0) == pytest.approx(gaps_us, abs=2.0 * len(iv))


def test_simulate_out_writes_a_trace_folder(tmp_path):
    from clustersim.cli import main
    assert main(["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--model", "tiny", "--tp", "2", "--pp", "2",
                 "--out", str(tmp_path)]) == 0
    files = sorted((tmp_path / "traces").glob("rank-*.json"))
    assert files
    first = json.loads(files[0].read_text())
    assert first["distributedInfo"]["world_size"] == 8 and '"rank": ' in files[0].read_text()
