"""The loop closed (issue 5, part 5) on CPU with gloo: collect DDP and TP traces with 2 processes, calibrate,
simulate each strategy from model + plan with that calibration (GEMM fit alone, then with the layer
benchmark's per-layer fits), replay each trace.

Replay must reproduce the measured step within 10 % (median over ranks and steps). The model-based
prediction error is printed, not asserted: on 2 shared cores the measured step moves by several times
with the machine's load (benchmarks/closed_loop.py prints the full table)."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _closed_loop():
    spec = importlib.util.spec_from_file_location("closed_loop", ROOT / "benchmarks" / "closed_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_collect_calibrate_simulate_replay(tmp_path, capsys):
    pytest.importorskip("torch")
    loop = _closed_loop()
    runs = loop.collect_all(tmp_path, ["ddp", "tp"], repeats=1, steps=5, bench_max_bytes=1 << 20)
    cal = loop.calibrate([d for ds in runs.values() for d in ds])
    device = json.loads((runs["ddp"][0] / "manifest.json").read_text())["devices"][0]
    fit = cal.compute_fit(device)
    assert fit is not None and fit.peak_flops_per_s > 1e9          # any CPU core does > 1 GFLOP/s
    assert {c.kind for c in cal.collectives} >= {"all_reduce", "all_gather", "p2p"}
    assert sorted(f.phase for f in cal.layers) == ["backward", "forward"]         # the layer benchmark
    rows = loop.evaluate(runs, cal, loop.memory_bandwidth_bytes_per_s(64 << 20, 3))
    with capsys.disabled():
        print()
        loop.print_table(rows)
    assert [r["strategy"] for r in rows] == ["ddp", "tp"]
    for r in rows:
        assert abs(r["replay_error"]) < 0.10, r
        assert r["model_step_s"] > 0 and math.isfinite(r["model_error"])
        # whole-layer times include what GEMM speed leaves out (norms, attention, elementwise, dispatch), so
        # the layer fits usually predict a longer step; but the GEMM sweep and the layer benchmark are two
        # measurements on 2 shared cores, and one taken under more load than the other has put the layer-fit
        # step 11% under the GEMM-only one (suite run, sixth session). Asserted: the fits apply (the step
        # changes) and agree with the GEMM fit to within that noise
        assert r["model_layers_step_s"] != r["model_step_s"] and math.isfinite(r["model_layers_error"])
        assert 0.75 * r["model_step_s"] < r["model_layers_step_s"] < 5 * r["model_step_s"], r


def test_manifest_maps_to_the_model_and_plan_it_trained():
    """The sample manifests (traces/samples) become the schedules' model and plan with the same shape."""
    loop = _closed_loop()
    for strategy, degrees in (("ddp", (2, 1, 1)), ("tp", (1, 2, 1)), ("pp", (1, 1, 2))):
        m = json.loads((ROOT / "traces" / "samples" / f"cpu-gloo-{strategy}" / "manifest.json").read_text())
        model, plan = loop.model_and_plan(m)
        assert (plan.dp, plan.tp, plan.pp) == degrees
        assert plan.effective_global_batch == m["plan"]["global_batch"]
        assert plan.num_microbatches == m["plan"]["microbatches"]
        assert (model.layers, model.hidden, model.ffn, model.vocab) == (2, 64, 176, 128)
        assert model.dtype_bytes == 4 and plan.seq == 32
        assert model.param_count() == m["model"]["params"]     # two independent counts of the same model


def test_communication_overlaps_only_with_a_spare_core_or_a_gpu():
    loop = _closed_loop()
    cpu = lambda cores, threads=1: {"device_type": "cpu", "ranks": [
        {"hostname": "h", "threads": threads, "cpu_count": cores} for _ in range(2)]}
    assert not loop.comm_can_overlap(cpu(2))           # 2 ranks x 1 thread fill both cores: gloo takes them
    assert loop.comm_can_overlap(cpu(8))
    assert not loop.comm_can_overlap(cpu(8, threads=4))
    assert loop.comm_can_overlap({"device_type": "cuda", "ranks": []})
    m = json.loads((ROOT / "traces" / "samples" / "cpu-gloo-ddp" / "manifest.json").read_text())
    m["ranks"] = [dict(r, cpu_count=2, threads=1) for r in m["ranks"]]
    model, plan = loop.model_and_plan(m)
    # (prefetch is FSDP's: a DDP plan keeps the default, which --fsdp-prefetch may not change without FSDP)
    assert not plan.overlap_grad_reduce and plan.fsdp_prefetch == (0 if plan.fsdp else 1)
