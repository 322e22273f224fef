"""Replay: closed-form timelines of hand-made traces (baseline and what-if), partial traces, the committed
real gloo samples, the real GPU traces, and the CLI."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.cli import main as cli_main
from simulator.program import COLLECTIVE, validate
from clustersim.replay import replay as replay_cmd
from traces.parse import load_trace
from traces.replay import build_programs, replay
from tests.traces import kineto_fixtures as fx

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
SAMPLES = ROOT / "traces" / "samples"
REAL = ROOT / ".." / "shared" / "traces" / "real-gpu"


@pytest.fixture(params=[False, True], ids=["flat", "nested"])
def gloo_job(tmp_path, request):
    """The gloo fixture; "nested" wraps 390-1210 us in a parent op, so the waits happen inside it."""
    for r in range(2):
        tr = fx.gloo_rank(r)
        if request.param:
            main = tr["traceEvents"][0]
            tr["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "nn.Module: Block", "pid": main["pid"],
                                      "tid": main["tid"], "ts": main["ts"] + 390, "dur": 820, "args": {}})
        fx.write(tr, tmp_path / "gloo" / f"rank{r}.json")
    return tmp_path / "gloo"


# The gloo fixture, step of 2000 us on each rank (identical ranks):
#   gap 0-10 | mm 10-310 | gap 310-400 | allreduce enqueue 400-420 | idle 420-700, its gloo work 430-630
#   (the CPU resumes 70 us after it ended) | reduce_scatter enqueue 700-720 | idle 720-1100, work 730-1030
#   (resume 70 us later) | copy_ 1100-1200 | gap 1200-2000 (nothing ended in it: untraced CPU time).
# Replayed, the CPU waits for each collective as observed, the 10 us gloo dispatch lag is kept, and the
# transfers last min(end) - max(start) = 200 and 300 us.
@pytest.mark.parametrize("kw,expected_us", [
    ({}, 2000.0),
    ({"scale_bandwidth": 2.0}, 2000.0 - 100 - 150),
    # CPU time halves (10+300+90+20+70+20+70+100+800 = 1480 -> 740), transfers and lags stay (200+300+10+10)
    ({"scale_compute": 2.0}, 740.0 + 520.0),
])
def test_gloo_closed_form(gloo_job, kw, expected_us):
    res = replay(gloo_job, **kw)
    assert res["measured_step_time_s"] == pytest.approx(2000e-6)
    assert res["predicted_step_time_s"] == pytest.approx(expected_us * 1e-6, rel=1e-9)
    assert [r["rank"] for r in res["per_rank"]] == [0, 1]


def test_calibrated_collectives_closed_form(gloo_job):
    """Collectives timed by a calibration instead of the measurement: 4000 B all_reduce in 100 us (gloo runs
    the reduce_scatter as an all_reduce of the same 4000 B): 2000 - (200 - 100) - (300 - 100) us."""
    from simulator.calibration import Calibration, CollectiveFit
    cal = Calibration(collectives=[CollectiveFit("all_reduce", 2, "intra", alpha_s=0.0, busbw_bytes_per_s=4e7,
                                                 backend="gloo")])
    res = replay(gloo_job, calibration=cal)
    assert res["predicted_step_time_s"] == pytest.approx(1700e-6, rel=1e-9)
    assert "calibration" in res["what_if"]
    with pytest.raises(Exception, match="no fit for all_reduce"):
        replay(gloo_job, calibration=Calibration())


def test_gloo_programs_structure(gloo_job):
    plan = build_programs(load_trace(gloo_job))
    p = plan.programs
    validate(p)
    assert p.world_size == 2 and len(p.groups) == 1 and p.groups[0].ranks == (0, 1)
    prog = p.ops[0]
    colls = [op for op in prog if op.kind == COLLECTIVE]
    assert [op.collective for op in colls] == ["all_reduce", "reduce_scatter"]
    assert [op.duration_s for op in colls] == pytest.approx([200e-6, 300e-6])
    assert {op.stream for op in colls} == {"gloo:300", "gloo:301"}
    waits = [op for op in prog if op.name.startswith("after wait")]
    assert len(waits) == 2 and all(prog[op.deps[-1]].kind == COLLECTIVE for op in waits)
    # every collective depends (through its dispatch lag) on the CPU op that enqueued it
    for i, op in enumerate(prog):
        if op.name == "delay":
            assert prog[op.deps[0]].stream == "cpu"


def test_nccl_fixture_replays_exactly(tmp_path):
    for r in range(2):
        fx.write(fx.nccl_rank(r, skew_us=3.0 * r), tmp_path / "job" / f"rank{r}.json")
    res = replay(tmp_path / "job")
    assert res["ranks_in_trace"] == 2 and res["steps"] == 2
    assert abs(res["error"]) < 1e-9 and res["abs_error_median"] < 1e-9
    plan = build_programs(load_trace(tmp_path / "job"))
    streams = {op.stream for op in plan.programs.ops[0]}
    assert {"cpu", "cuda:7", "cuda:20"} <= streams
    # rank 1 started 3 us later on the shared clock: an offset op keeps that
    assert plan.programs.ops[1][0].name == "start offset"
    assert plan.programs.ops[1][0].duration_s == pytest.approx(3e-6)


def test_ranks_with_different_profiled_steps(tmp_path):
    """Rank 1's trace lacks step 3: its step-4 all_reduce still meets rank 0's step-4 one (matched within the
    step, not by the trace-wide sequence number); rank 0's step-3 all_reduce keeps its measured time."""
    fx.write(fx.nccl_rank(0), tmp_path / "job" / "rank0.json")
    tr = fx.nccl_rank(1)
    first = next(e for e in tr["traceEvents"] if e.get("name") == "ProfilerStep#3")
    lo, hi = first["ts"], first["ts"] + first["dur"]
    tr["traceEvents"] = [e for e in tr["traceEvents"] if not (lo <= e.get("ts", -1) < hi)]
    fx.write(tr, tmp_path / "job" / "rank1.json")
    plan = build_programs(load_trace(tmp_path / "job"))
    assert [op.name for op in plan.programs.ops[0] if op.kind == COLLECTIVE or op.name.startswith("all_reduce")] \
        == ["all_reduce (peers absent)", "c10d::allreduce_"]
    assert sum(op.kind == COLLECTIVE for op in plan.programs.ops[1]) == 1
    res = replay(tmp_path / "job")
    assert abs(res["error"]) < 1e-9 and {r["rank"]: len(r["steps"]) for r in res["per_rank"]} == {0: 2, 1: 1}


def test_partial_trace_keeps_measured_collectives(tmp_path):
    """One rank of a 2-rank job: the all_reduce peers are absent, so it takes its measured 120 us."""
    p = fx.write(fx.nccl_rank(1), tmp_path / "rank1.json")
    plan = build_programs(load_trace(p))
    assert plan.programs.world_size == 1 and not plan.programs.groups
    absent = [op for op in plan.programs.ops[0] if op.name == "all_reduce (peers absent)"]
    assert len(absent) == 2 and all(op.duration_s == pytest.approx(fx.NCCL_KERNEL_US * 1e-6) for op in absent)
    res = replay(p, scale_bandwidth=4.0)          # measured collectives of absent peers do not scale
    assert abs(res["error"]) < 1e-9


@pytest.mark.parametrize("folder", [DATA / "torch213_gloo_ddp", DATA / "torch213_gloo_fsdp",
                                    SAMPLES / "cpu-gloo-ddp", SAMPLES / "cpu-gloo-tp", SAMPLES / "cpu-gloo-pp"])
def test_real_gloo_traces(folder):
    if not folder.exists():
        pytest.skip(f"{folder} not present")
    res = replay(folder)
    assert abs(res["error"]) < 0.10 and res["abs_error_median"] < 0.10
    for row in res["per_rank"]:
        assert row["measured_step_time_s"] > 0 and row["predicted_step_time_s"] > 0
    faster = replay(folder, scale_compute=2.0)
    slower = replay(folder, scale_bandwidth=0.25)
    assert faster["predicted_step_time_s"] < res["predicted_step_time_s"] <= slower["predicted_step_time_s"]


def test_what_if_cluster(gloo_job):
    """On an H100 node the 4 kB collectives take microseconds instead of 200-300 us."""
    base = replay(gloo_job)
    res = replay(gloo_job, cluster="dgx-h100", gpus=8, calibration=ROOT / "traces" / "data" / "h100.json")
    assert "dgx-h100" in res["what_if"]
    assert res["predicted_step_time_s"] < base["predicted_step_time_s"] - 400e-6


@pytest.mark.slow
def test_real_gpu_trace(tmp_path):
    src = REAL / "a100_cnn_ddp_rank0_of2.json.gz"
    if not src.exists():
        pytest.skip(f"{src} absent (the CI checkout has ../shared beside the repo)")
    shutil.copy(src, tmp_path / src.name)
    res = replay(tmp_path / src.name)
    assert res["ranks_in_trace"] == 1 and res["world_size"] == 2 and res["steps"] == 3
    assert abs(res["error"]) < 0.01
    # the CPU runs ahead of the GPU there (no synchronisation in the step): faster kernels cannot shorten it
    assert replay(tmp_path / src.name, scale_compute=2.0)["predicted_step_time_s"] <= res["predicted_step_time_s"]


def test_cli(gloo_job):
    r = CliRunner().invoke(replay_cmd, [str(gloo_job), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    for key in ("measured_step_time_s", "predicted_step_time_s", "error", "per_rank"):
        assert key in data
    r = CliRunner().invoke(replay_cmd, [str(gloo_job), "--scale-bandwidth", "2"])
    assert r.exit_code == 0 and "communication" in r.output and "all" in r.output
    assert cli_main(["replay", str(gloo_job / "missing")]) == 2
    assert cli_main(["replay", str(gloo_job), "--gpus", "8"]) == 2
    assert cli_main(["replay", str(gloo_job), "--scale-compute", "0"]) == 2


def test_trace_without_steps(tmp_path):
    tr = fx.gloo_rank(0)
    tr["traceEvents"] = [e for e in tr["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    p = fx.write(tr, tmp_path / "rank0.json")
    assert cli_main(["replay", str(p)]) == 2


VALUES = [None, [], {}, "x", -1, 0, 1.5, float("nan"), 10 ** 30, True, [1, 2], {"a": 1}, "ProfilerStep#x",
          "c10d::allreduce_", "nccl:all_reduce", "gloo:send", "[0, 1]", "[0, 'a']", -1e9]


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 3), st.booleans(),
       st.lists(st.tuples(st.integers(0, 10 ** 6), st.sampled_from(["ts", "dur", "name", "cat", "pid", "tid", "ph",
                                                                    "args", "arg"]),
                          st.integers(0, 10 ** 6), st.integers(0, len(VALUES))), min_size=1, max_size=6))
def test_damaged_traces_replay_or_raise_clear_errors(tmp_path_factory, which, both, edits):
    """Damaged events (wrong types, missing fields) never crash parse, replay or calibrate with anything but
    a ClusterSimError."""
    import copy
    from simulator.errors import ClusterSimError
    from traces.calibrate import calibrate
    make = [fx.nccl_rank, fx.nccl_rank, fx.gloo_rank, fx.gloo_rank][which]
    tr = make(which % 2)
    ev = tr["traceEvents"]
    for pos, key, argpos, vpos in edits:
        e = ev[pos % len(ev)]
        value = VALUES[vpos] if vpos < len(VALUES) else "<delete>"
        if key == "arg":
            if not isinstance(e.get("args"), dict) or not e["args"]:
                continue
            key = sorted(e["args"])[argpos % len(e["args"])]
            target = e["args"]
        else:
            target = e
        if value == "<delete>":
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)
    folder = tmp_path_factory.mktemp("damaged")
    fx.write(tr, folder / f"rank{which % 2}.json")
    if both:
        fx.write(make(1 - which % 2), folder / f"rank{1 - which % 2}.json")
    for fn in (load_trace, replay, calibrate):
        try:
            fn(folder)
        except ClusterSimError:
            pass
