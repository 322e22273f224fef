"""The trace collector: real torchrun runs with gloo on 2 CPU processes, checked against the model's
shape (parameter count, activation sizes, collective counts per layer) and the profiler schedule."""
from __future__ import annotations

import gzip
import importlib.util
import json
import math
from collections import Counter

import pytest

from simulator.calibration import Calibration
from clustersim.cli import main as cli_main
from traces import launch as collect_cli
from traces.launch import CollectError, launch

# the launcher needs no torch; the runs do
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

TINY = ["--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32", "--batch", "4", "--vocab", "128"]
STEPS, ACTIVE = 4, 2


def _collect(tmp_path_factory, strategy: str, *extra: str):
    out = tmp_path_factory.mktemp(strategy)
    launch(2, ["--strategy", strategy, "--steps", str(STEPS), "--active", str(ACTIVE), *TINY, *extra,
               "--out", str(out)], timeout_s=120, quiet=True)
    return out


def _load(out, rank):
    manifest = json.loads((out / "manifest.json").read_text())
    with gzip.open(out / manifest["trace_files"][str(rank)], "rt") as f:
        return manifest, json.load(f)


def _ops(trace, name):
    return [e for e in trace["traceEvents"] if e.get("name") == name and e.get("ph") == "X"]


def _in_step(trace, events, step):
    (s,) = _ops(trace, f"ProfilerStep#{step}")
    return [e for e in events if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One collector run per strategy (each ~3-5 s, mostly process start-up); ddp through the CLI."""
    ddp = tmp_path_factory.mktemp("ddp")
    assert cli_main(["collect", "--strategy", "ddp", "--nproc-per-node", "2", "--steps", str(STEPS), "--active",
                     str(ACTIVE), *TINY, "--out", str(ddp)]) == 0
    extra = {"pp": ["--microbatches", "2"], "zero1": ["--bucket-cap-mb", "0.1"]}   # zero1: several buckets
    return {"ddp": ddp, **{s: _collect(tmp_path_factory, s, *extra.get(s, [])) for s in ("tp", "pp", "fsdp", "zero1", "ep")}}


# ---------------------------------------------------------------------------------------------- manifests
@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("strategy", ["ddp", "tp", "pp", "fsdp"])
def test_manifest_and_files(runs, strategy):
    out = runs[strategy]
    m, trace = _load(out, 0)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "rank0.json.gz", "rank1.json.gz"]
    assert m["strategy"] == strategy and m["mode"] == "train" and m["world_size"] == 2
    assert m["backend"] == "gloo" and m["nccl_version"] is None and m["torch_version"].startswith("2.")
    assert len(m["devices"]) == len(m["hostnames"]) == 2
    assert m["model"]["layers"] == 2 and m["model"]["hidden"] == 64 and m["model"]["ffn"] == 176
    assert m["profiler"]["profiled_steps"] == [2, 3] and m["profiler"]["wait"] == 1
    times = m["step_time_s"]
    assert len(times["per_rank"]) == 2 and all(len(t) == STEPS for t in times["per_rank"])
    assert 0 < times["median_profiled_s"] < 10
    cpu = times["main_thread_cpu_per_rank"]
    assert all(0 <= c <= w * 1.05 + 1e-3 for cs, ws in zip(cpu, times["per_rank"]) for c, w in zip(cs, ws))
    degree = {"ddp": "dp", "fsdp": "dp", "tp": "tp", "pp": "pp"}[strategy]
    assert m["plan"][degree] == 2
    assert (out / "rank1.json.gz").stat().st_size < 2_000_000
    # the trace knows its process group and holds exactly the profiled steps
    assert trace["distributedInfo"]["pg_config"][0]["ranks"] == [0, 1]
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp", "tp", "pp", "ep"])
def test_every_strategy_computes_the_unsharded_models_loss(runs, strategy):
    """Brute force: the step-0 loss each rank reports equals the single-process, unsharded model's loss on
    that rank's batch (same seed-0 weights), so the sharding and the communication compute the model."""
    import torch
    from traces.collect import make_batches
    from traces.models import ModelConfig, Transformer
    m, _ = _load(runs[strategy], 0)
    shape = {k: m["model"][k] for k in ("layers", "hidden", "heads", "seq", "vocab", "ffn", "experts", "top_k",
                                        "capacity_factor")}
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**shape))
    ranks = [1] if strategy == "pp" else [0, 1]          # only the last pipeline stage computes the loss
    for r in ranks:
        tokens, targets = make_batches(shape["vocab"], m["plan"]["batch_per_rank"], shape["seq"],
                                       m["ranks"][r]["data_rank"], 1)[0]
        with torch.no_grad():
            ref = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten()).item()
        assert m["losses"][r][0] == pytest.approx(ref, rel=1e-5), (strategy, r)
        assert ref == pytest.approx(math.log(128), rel=0.1)    # a fresh LM guesses about uniformly


# ---------------------------------------------------------------------------------------------- collectives
@pytest.mark.slow
@needs_torch
def test_ddp_all_reduces_every_gradient_once(runs):
    """One 25 MiB bucket holds the whole tiny model: one all_reduce per step of exactly `params` floats."""
    m, trace = _load(runs["ddp"], 1)
    for step in (2, 3):
        ops = _in_step(trace, _ops(trace, "c10d::allreduce_"), step)
        assert len(ops) == 1
        dims = ops[0]["args"]["Input Dims"][0][0]
        assert math.prod(dims) == m["model"]["params"]
    gloo = _ops(trace, "gloo:all_reduce")
    assert len(gloo) == 2 and all(e["cat"] == "user_annotation" for e in gloo)


@pytest.mark.slow
@needs_torch
def test_tp_all_reduces_activations_twice_per_block_each_way(runs):
    """Megatron TP: 2 all_reduces of the (batch, seq, hidden) activation per block forward, 2 backward."""
    m, trace = _load(runs["tp"], 0)
    for step in (2, 3):
        ops = _in_step(trace, _ops(trace, "c10d::allreduce_"), step)
        assert len(ops) == 4 * m["model"]["layers"]
        assert all(e["args"]["Input Dims"][0][0] == [4, 32, 64] for e in ops)
    assert len(_ops(trace, "gloo:all_reduce")) == 2 * 4 * m["model"]["layers"]
    assert m["losses"][0] == m["losses"][1]        # both ranks compute the same loss on the same batch


@pytest.mark.slow
@needs_torch
def test_pp_sends_one_activation_and_one_gradient_per_microbatch(runs):
    m, t0 = _load(runs["pp"], 0)
    _, t1 = _load(runs["pp"], 1)
    mb = m["plan"]["microbatches"]
    assert mb == 2 and m["plan"]["micro_batch"] == 2 and m["plan"]["stage_layers"] == [[0, 1], [1, 2]]
    for step in (2, 3):
        # stage 0 sends activations and receives gradients, stage 1 the reverse
        for trace in (t0, t1):
            sends = _in_step(trace, _ops(trace, "c10d::send"), step)
            recvs = _in_step(trace, _ops(trace, "c10d::recv_"), step)
            assert len(sends) == len(recvs) == mb
            assert all(e["args"]["Input Dims"][0][0] == [2, 32, 64] for e in sends + recvs)


@pytest.mark.slow
@needs_torch
def test_fsdp_gathers_parameters_and_reduce_scatters_gradients(runs):
    m, trace = _load(runs["fsdp"], 0)
    counts = Counter(e["name"] for e in _in_step(trace, [e for e in trace["traceEvents"] if e.get("ph") == "X"], 3))
    units = m["model"]["layers"] + 1        # one FSDP unit per block plus the root
    assert counts["c10d::_allgather_base_"] == units + m["model"]["layers"]   # root stays gathered for backward
    assert counts["c10d::_reduce_scatter_base_"] == units


@pytest.mark.slow
@needs_torch
def test_zero1_all_reduces_gradients_and_broadcasts_each_owners_parameters(runs):
    """With 0.1 MiB buckets DDP all-reduces the gradients in several buckets that together hold every one."""
    m, trace = _load(runs["zero1"], 0)
    assert m["plan"]["zero_stage"] == 1 and m["plan"]["dp"] == 2 and m["plan"]["bucket_cap_mb"] == 0.1
    for step in (2, 3):
        names = Counter(e["name"] for e in _in_step(trace, [e for e in trace["traceEvents"] if e.get("ph") == "X"],
                                                     step))
        buckets = _in_step(trace, _ops(trace, "c10d::allreduce_"), step)
        assert len(buckets) >= 4     # 117,056 floats = 457 KiB; a bucket closes after the tensor crossing 100 KiB
        assert sum(math.prod(e["args"]["Input Dims"][0][0]) for e in buckets) == m["model"]["params"]
        assert names["c10d::broadcast_"] == 2       # one per owner rank


@pytest.mark.slow
@needs_torch
def test_ep_exchanges_tokens_with_all_to_all(runs):
    """Per MoE block: dispatch and combine all_to_alls forward, their transposes backward, each of a rank's
    whole (experts x capacity, hidden) buffer: 4 experts (2 x world) x capacity ceil(4*32/4) = 32 slots."""
    m, trace = _load(runs["ep"], 1)
    assert m["plan"]["ep"] == 2 and m["model"]["experts"] == 4
    for step in (2, 3):
        ops = _in_step(trace, _ops(trace, "c10d::alltoall_base_"), step)
        assert len(ops) == 4 * m["model"]["layers"]
        assert all(e["args"]["Input Dims"][:2] == [[4 * 32, 64]] * 2 for e in ops)   # (output, input)
        assert len(_in_step(trace, _ops(trace, "c10d::allreduce_"), step)) == 1    # the dense gradients


# ---------------------------------------------------------------------------------------------- benchmark
@pytest.mark.slow
@needs_torch
def test_collective_benchmark(tmp_path):
    proc = launch(2, ["--bench", "collectives", "--max-bytes", "4096", "--size-factor", "4", "--out", str(tmp_path)],
                  timeout_s=120, quiet=True)
    m = json.loads((tmp_path / "manifest.json").read_text())
    # nccl-tests-style printing (issue 18 item 9): header, min/avg/max time, algbw/busbw, avg bus bandwidth
    assert proc.stdout.count("time min   time avg   time max") == 6
    assert proc.stdout.count("# Avg bus bandwidth    : ") == 6
    assert m["mode"] == "bench" and m["world_size"] == 2 and m["backend"] == "gloo"
    rows = m["results"]
    kinds = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p"]
    assert sorted({r["kind"] for r in rows}) == sorted(kinds)
    assert sorted({r["size_bytes"] for r in rows}) == [1024, 4096]
    factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5,
              "broadcast": 1.0, "p2p": 1.0}      # nccl-tests' bus factors for n = 2
    for r in rows:
        assert 0 < r["time_min_s"] <= r["time_s"] <= r["time_max_s"] and r["time_min_s"] <= r["time_avg_s"]
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_avg_s"] / 1e9)     # nccl-tests: avg
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor[r["kind"]])


@pytest.mark.slow
@needs_torch
def test_layer_benchmark_times_each_shard_and_batch_and_calibrates(tmp_path):
    """--bench layers: one row per (tp shard, micro-batch) with positive forward / backward times; the
    calibration fits both phases from it, with FLOPs of the programs' own per-layer ops."""
    from traces.calibrate import calibrate

    assert cli_main(["collect", "--bench", "layers", "--nproc-per-node", "2", "--hidden", "64", "--heads", "2",
                     "--seq", "32", "--batch", "4", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["mode"] == "bench" and m["bench"] == "layers" and m["world_size"] == 2
    assert m["environment"]["MALLOC_MMAP_THRESHOLD_"] == str(1 << 30)     # set by the launcher
    rows = m["results"]
    assert sorted((r["tp"], r["batch"]) for r in rows) == [(t, b) for t in (1, 2) for b in (1, 2, 4)]
    for r in rows:
        assert r["forward_s"] > 0 and r["backward_s"] > 0 and r["reps"] >= 3
        assert (r["hidden"], r["heads"], r["ffn"], r["seq"]) == (64, 2, 176, 32)
    cal = calibrate(tmp_path)
    assert sorted(f.phase for f in cal.layers) == ["backward", "forward"]
    # (tp 2, batch 2b) has the FLOPs of (tp 1, batch b): 4 distinct sizes of 6 shapes
    assert all(f.device == m["devices"][0] and len(f.points) == 4 for f in cal.layers)
    assert not cal.compute and not cal.collectives


@pytest.mark.slow
@needs_torch
def test_prepared_capture_script_runs_end_to_end_on_cpu(tmp_path):
    """traces.capture --quick (the GPU capture, shrunk): layer benchmarks, single-rank and 2-rank runs of
    every strategy, one calibration with GEMM, layer and collective fits, a summary."""
    from traces.capture import main as capture_main
    assert capture_main(["--out", str(tmp_path), "--quick", "--sustained", "0.4"]) == 0
    cal = Calibration.load(tmp_path / "calibration.json")
    assert cal.compute and {f.phase for f in cal.layers} == {"forward", "backward"}
    assert {c.kind for c in cal.collectives} >= {"all_reduce", "all_gather", "p2p"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    names = [r["name"] for r in summary["runs"]]
    assert names == ["layers-tiny", "layers-mid", "train-tiny", "train-mid", "bench-collectives",
                     "ddp-2", "fsdp-2", "tp-2", "pp-2"]
    assert all(r["median_profiled_step_s"] > 0 for r in summary["runs"] if r["name"].startswith(("train", "ddp")))
    assert (tmp_path / "calibration.png").stat().st_size > 10_000
    sus = summary["sustained"]
    assert sus["shape"] == [128, 128, 128] and sus["steady_flops_per_s"] > 0 and sus["steady_over_first"] > 0
    assert (tmp_path / "sustained.json").exists()
    assert capture_main(["--out", str(tmp_path), "--sustained", "0"]) == 2


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.slow
@needs_torch
def test_collector_reports_an_impossible_plan(tmp_path):
    with pytest.raises(CollectError, match=r"heads \(3\) must be divisible by tp \(2\)") as err:
        launch(2, ["--strategy", "tp", "--heads", "3", "--hidden", "48", "--steps", "3", "--out", str(tmp_path)],
               timeout_s=120, quiet=True)
    assert f"full output in {tmp_path / 'collect.log'}" in str(err.value)
    assert "must be divisible by tp" in (tmp_path / "collect.log").read_text()


def test_collect_without_torch_is_a_clear_error(monkeypatch, capsys, tmp_path):
    real = collect_cli.importlib.util.find_spec
    monkeypatch.setattr(collect_cli.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert cli_main(["collect", "--strategy", "ddp", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "needs PyTorch" in err and "Traceback" not in err


def test_torchrun_command_uses_the_given_port():
    cmd = collect_cli.torchrun_command(3, ["--strategy", "pp"], port=12345)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[cmd.index("--master-port") + 1] == "12345" and cmd[cmd.index("--nproc-per-node") + 1] == "3"
    assert cmd[-4:] == ["-m", "traces.collect", "--strategy", "pp"]


@needs_torch
def test_multi_rank_shape_gives_a_stage_per_rank_and_tp_only_where_it_divides():
    from traces.capture import QUICK_TINY, TINY, multi_rank_shape
    shape, tp = multi_rank_shape(QUICK_TINY, 4)
    assert (shape["layers"], shape["heads"], tp) == (4, 4, True)          # 64 / 4 = 16-wide heads; ffn 176
    shape, tp = multi_rank_shape(QUICK_TINY, 3)
    assert (shape["layers"], shape["heads"], tp) == (3, 2, False)         # 64 does not split into 3 heads
    shape, tp = multi_rank_shape(TINY, 8)
    assert (shape["layers"], shape["heads"], tp) == (8, 8, True)          # ffn 688 = 8 x 86
    assert multi_rank_shape(TINY, 2) == (TINY, True)
