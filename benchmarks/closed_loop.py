"""The loop closed on this machine (CPU, gloo): collect, calibrate, simulate from model + plan, replay.

    python benchmarks/closed_loop.py [--strategies ddp,fsdp,tp,pp] [--repeats 3] [--out DIR]

1. collect: each strategy trained with 2 processes on a small Llama-style model (traces.collect under
   torchrun), ``--repeats`` runs each, plus one collective benchmark (``--bench collectives``) and one layer
   benchmark of the same model shape (``--bench layers``: one decoder block's forward / backward at its TP
   shards and micro-batch sizes);
2. calibrate: one Calibration from all those traces and benchmarks (traces.calibrate);
3. simulate: each strategy's programs built from the *model and plan* in its manifest (schedules.build_programs,
   not the trace's ops) on a 2-rank CPU "cluster" whose cost model is the calibration (topologies
   ClusterCostModel: the compute fit by device name, the collective fits by kind / group size / scope),
   twice: with the GEMM fit alone (every FLOP at GEMM speed), and with the layer fits pricing the per-layer
   ops (everything else, e.g. the LM head, still at GEMM speed). When the ranks' threads fill every core,
   communication cannot overlap compute (``comm_can_overlap``) and the plan says so. No constant is fitted
   to a step time;
   CPU memory bandwidth for memory-bound ops (optimizer, norms) is measured here with a large numpy copy;
4. replay: each trace re-simulated from its own ops (traces.replay).

Prints one row per strategy: the measured step (median over the unprofiled steps of all runs, the first
left out; the profiled steps' median beside it), both model
predictions and their errors, the replay error (median over ranks and steps, then over runs), the load per core
when the runs ended and the main thread's CPU time per step (busiest rank): on a machine shared with other
work the wall-clock step is longer than the machine's by about the load, and the CPU time shows how much
of the step the rank actually computed.
Imports no torch itself (the collector runs in subprocesses).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedules.generate import build_programs  # noqa: E402
from schedules.models import custom_model  # noqa: E402
from schedules.plan import ParallelPlan  # noqa: E402
from simulator.calibration import Calibration  # noqa: E402
from simulator.engine import run  # noqa: E402
from topologies.cluster import Cluster, DomainSpec  # noqa: E402
from topologies.cost import DEFAULT_MEMORY_EFFICIENCY, ClusterCostModel  # noqa: E402
from topologies.specs import AcceleratorSpec  # noqa: E402
from traces.calibrate import calibrate  # noqa: E402
from traces.capture import shape_args  # noqa: E402
from traces.launch import launch  # noqa: E402
from traces.replay import replay  # noqa: E402

# Big enough that matrix multiplies, not per-op overhead, dominate a CPU step (~0.1 s); small enough that a
# run takes seconds. Per data-parallel rank: 4 sequences of 128 tokens.
SHAPE = {"layers": 2, "hidden": 256, "heads": 4, "seq": 128, "batch": 4, "vocab": 512}
STRATEGIES = ("ddp", "fsdp", "tp", "pp")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def collect_all(out: Path, strategies, repeats: int, steps: int, bench_max_bytes: int, shape=SHAPE) -> dict:
    """{strategy: [run folders]} plus "bench": [collective benchmark folder] and "layers": [layer benchmark
    folder of the same model shape]; every run under ``out``."""
    args = shape_args(shape, tuple(shape))
    runs: dict[str, list[Path]] = {}
    for s in strategies:
        for r in range(repeats):
            d = out / f"{s}-{r}"
            extra = ["--microbatches", "2"] if s == "pp" else []
            launch(2, ["--strategy", s, "--steps", str(steps), "--active", str(min(4, steps - 2)), *args, *extra,
                       "--out", str(d)], timeout_s=600, quiet=True)
            runs.setdefault(s, []).append(d)
    d = out / "bench"
    launch(2, ["--bench", "collectives", "--max-bytes", str(bench_max_bytes), "--size-factor", "4",
               "--out", str(d)], timeout_s=600, quiet=True)
    runs["bench"] = [d]
    d = out / "layers"
    launch(2, ["--bench", "layers", *shape_args(shape, ("hidden", "heads", "seq", "batch")), "--out", str(d)],
           timeout_s=600, quiet=True)
    runs["layers"] = [d]
    return runs


def memory_bandwidth_bytes_per_s(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Achieved copy bandwidth of one process (bytes read + written per second, best of ``repeats``)."""
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def model_and_plan(manifest: dict):
    """(ModelSpec, ParallelPlan) of a collector manifest: the shape and parallel plan it trained."""
    m, p = manifest["model"], manifest["plan"]
    dtype_bytes = DTYPE_BYTES[manifest["dtype"]]
    model = custom_model(layers=m["layers"], hidden=m["hidden"], heads=m["heads"], ffn=m["ffn"], vocab=m["vocab"],
                         experts=m["experts"], top_k=m["top_k"], gated_mlp=True, dtype_bytes=dtype_bytes,
                         name=f"collector-{m['params']}",
                         **({"capacity_factor": m["capacity_factor"]} if m["experts"] else {}))
    overlap = comm_can_overlap(manifest)
    plan = ParallelPlan(
        dp=p["dp"], tp=p["tp"], pp=p["pp"], ep=p["ep"], zero=0 if p["fsdp"] else p["zero_stage"], fsdp=p["fsdp"],
        micro_batch=p["micro_batch"], global_batch=p["global_batch"], seq=m["seq"], schedule="1f1b",
        bucket_bytes=p.get("bucket_cap_mb", 25) * 2**20, grad_bytes_per_param=dtype_bytes,
        overlap_grad_reduce=overlap, fsdp_prefetch=1 if overlap or not p["fsdp"] else 0,
        stack="torchtitan")          # the collector trains in eager PyTorch: unfused kernels
    return model, plan


def comm_can_overlap(manifest: dict) -> bool:
    """Whether the run could overlap communication with compute. On a GPU a collective runs on its own
    stream while the host queues compute ahead. On a CPU backend, gloo's transfers run on CPU threads: when
    the ranks' compute threads occupy every core of the host (2 ranks x 1 thread on 2 cores here), a
    transfer takes the core from the compute it would overlap, so the model issues gradient reductions
    after the backward and gathers FSDP parameters just in time (no prefetch)."""
    if manifest.get("device_type") != "cpu":
        return True
    ranks = manifest.get("ranks") or []
    per_host: dict = {}
    for r in ranks:
        per_host[r.get("hostname")] = per_host.get(r.get("hostname"), 0) + int(r.get("threads") or 1)
    cores = min((int(r.get("cpu_count") or 0) for r in ranks), default=0)
    return bool(ranks) and cores > max(per_host.values())


def cpu_cluster(manifest: dict, cal: Calibration, mem_bytes_per_s: float) -> Cluster:
    """The machine the manifest ran on as a one-box cluster whose device is named as in the calibration."""
    device = manifest["devices"][0]
    fit = cal.compute_fit(device)
    if fit is None:
        raise SystemExit(f"closed_loop: the calibration has no compute fit for {device!r}")
    world = manifest["world_size"]
    # Link figures matter only where no collective fit exists; take the all_reduce fit's busbw.
    ar = cal.collective_fit("all_reduce", world, "intra")
    link = ar.busbw_bytes_per_s if ar else 1e9
    acc = AcceleratorSpec(name=device, peak_bf16_flops=fit.peak_flops_per_s, peak_fp8_flops=None,
                          hbm_bytes=64e9, hbm_bytes_per_s=mem_bytes_per_s / DEFAULT_MEMORY_EFFICIENCY,
                          scale_up_bytes_per_s=link, nic_bytes_per_s=link, scale_up_link="pcie", vendor="cpu",
                          source="calibration fit; measured copy bandwidth")
    return Cluster(f"{world}x-cpu-gloo", acc, gpus=world, gpus_per_node=world, domain=DomainSpec("pcie", world, link))


def predict_step_s(manifest: dict, cal: Calibration, mem_bytes_per_s: float) -> float:
    """Simulated step time of the manifest's model and plan with the calibrated cost model."""
    return _simulate(manifest, cal, mem_bytes_per_s).step_time_s


def _simulate(manifest: dict, cal: Calibration, mem_bytes_per_s: float):
    model, plan = model_and_plan(manifest)
    cost = ClusterCostModel(cpu_cluster(manifest, cal, mem_bytes_per_s), calibration=cal)
    return run(build_programs(model, plan, manifest["world_size"], symmetric=False), cost)


def measured_step_s(manifests: list[dict], profiled: bool = False) -> float:
    """Median of the job's step time (slowest rank) over the unprofiled (or the profiled) steps of all runs
    pooled: robust to a run whose steps met other work on the shared cores. The model predicts a step
    without the profiler, whose own cost is a few microseconds per recorded op (~8% of a CPU step here);
    manifests without unprofiled steps fall back to the profiled ones."""
    key = "profiled_steps" if profiled else "unprofiled_steps"
    steps = [m["step_time_s"]["job"][s] for m in manifests for s in m["profiler"].get(key) or []]
    return statistics.median(steps) if steps else measured_step_s(manifests, True)


def without_layers(cal: Calibration) -> Calibration:
    """The calibration without its layer fits: GEMM fit and collectives only."""
    return Calibration(cal.compute, cal.collectives, cal.source)


def evaluate(runs: dict, cal: Calibration, mem_bytes_per_s: float) -> list[dict]:
    """One row per strategy: measured, model with the GEMM fit only (FLOPs at GEMM speed, collectives),
    model with the layer fits of the layer benchmark when the calibration has them, and replay."""
    rows = []
    gemm_only = without_layers(cal)
    for s, dirs in runs.items():
        if s in ("bench", "layers"):
            continue
        manifests = [json.loads((d / "manifest.json").read_text()) for d in dirs]
        measured = measured_step_s(manifests)
        predicted = predict_step_s(manifests[0], gemm_only, mem_bytes_per_s)
        predicted_layers = predict_step_s(manifests[0], cal, mem_bytes_per_s) if cal.layers else float("nan")
        reps = [replay(d) for d in dirs]
        rows.append({
            "strategy": s, "runs": len(dirs), "measured_step_s": measured,
            "measured_profiled_step_s": measured_step_s(manifests, profiled=True), "model_step_s": predicted,
            "model_error": (predicted - measured) / measured,
            "model_layers_step_s": predicted_layers, "model_layers_error": (predicted_layers - measured) / measured,
            "replay_measured_s": statistics.median(r["measured_step_time_s"] for r in reps),
            "replay_predicted_s": statistics.median(r["predicted_step_time_s"] for r in reps),
            "replay_error": statistics.median(r["error"] for r in reps),
            "load_per_core": max((m.get("load_average") or [0])[0] for m in manifests),
            "main_thread_cpu_s": statistics.median(_main_thread_cpu_s(m) for m in manifests),
        })
    return rows


def _main_thread_cpu_s(manifest: dict) -> float:
    """Median over profiled steps of the busiest rank's main-thread CPU time (NaN for older manifests)."""
    per_rank = manifest["step_time_s"].get("main_thread_cpu_per_rank")
    if not per_rank:
        return float("nan")
    return statistics.median(max(c[s] for c in per_rank) for s in manifest["profiler"]["profiled_steps"])


def print_table(rows: list[dict]) -> None:
    print(f"{'strategy':>8} {'runs':>4} {'measured ms':>12} {'(profiled)':>10} {'gemm ms':>8} {'gemm err':>9} {'layers ms':>9} "
          f"{'layers err':>10} {'replay meas ms':>14} {'replay pred ms':>14} {'replay err':>10} {'load/core':>9} "
          f"{'cpu ms':>7}")
    for r in rows:
        print(f"{r['strategy']:>8} {r['runs']:>4} {r['measured_step_s'] * 1e3:>12.2f} "
              f"{r['measured_profiled_step_s'] * 1e3:>10.2f} {r['model_step_s'] * 1e3:>8.2f} "
              f"{r['model_error']:>+9.1%} {r['model_layers_step_s'] * 1e3:>9.2f} {r['model_layers_error']:>+10.1%} "
              f"{r['replay_measured_s'] * 1e3:>14.2f} "
              f"{r['replay_predicted_s'] * 1e3:>14.2f} {r['replay_error']:>+10.1%} {r['load_per_core']:>9.2f} "
              f"{r['main_thread_cpu_s'] * 1e3:>7.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10,
                    help="steps per run: the last 4 profiled, one profiler warm-up before them, the rest unprofiled")
    ap.add_argument("--bench-max-bytes", type=int, default=16 << 20)
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        t0 = time.perf_counter()
        runs = collect_all(out, a.strategies.split(","), a.repeats, a.steps, a.bench_max_bytes)
        t_collect = time.perf_counter() - t0
        cal = calibrate([d for ds in runs.values() for d in ds])
        cal.save(out / "calibration.json")
        bw = memory_bandwidth_bytes_per_s()
        rows = evaluate(runs, cal, bw)
        fit = cal.compute_fit(json.loads((runs[a.strategies.split(",")[0]][0] / "manifest.json").read_text())
                              ["devices"][0])
        print(f"closed loop on {os.cpu_count()} CPUs, 2 gloo ranks, model {SHAPE}; collection {t_collect:.0f} s")
        print(f"calibration: compute peak {fit.peak_flops_per_s / 1e9:.1f} GFLOP/s, half-saturation "
              f"{fit.half_saturation_flops:.3g} FLOPs; {len(cal.collectives)} collective fits; "
              f"measured copy bandwidth {bw / 1e9:.1f} GB/s")
        print_table(rows)
        for lf in cal.layers:
            print(f"layer fit {lf.phase}: peak {lf.peak_flops_per_s / 1e9:.1f} GFLOP/s, half-saturation "
                  f"{lf.half_saturation_flops:.3g} FLOPs (whole decoder block, layer benchmark)")
        if a.json:
            print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
