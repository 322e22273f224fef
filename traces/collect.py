"""The trace collector: run under torchrun, one process per rank (imports torch).

    torchrun --nproc-per-node N -m traces.collect --strategy {ddp,zero1,fsdp,tp,pp,ep} --steps K --out DIR
    torchrun --nproc-per-node N -m traces.collect --bench collectives --out DIR [--max-bytes B]
    torchrun --nproc-per-node N -m traces.collect --bench layers --out DIR [--hidden H --heads A --seq S --batch B]

Training mode trains the small Llama-style transformer of ``traces.models`` for K steps with the chosen
strategy under torch.profiler (schedule: wait, 1 warm-up step, ``--active`` recorded steps; shapes
recorded) and writes ``DIR/rank{r}.json.gz`` (Kineto / Chrome trace JSON, gzipped) per rank plus
``DIR/manifest.json``. Benchmark mode times all_reduce, all_gather, reduce_scatter, all_to_all,
broadcast and p2p (ring send/recv) from 1 KiB up to ``--max-bytes`` (traces.bench_collectives) and writes
the table to the manifest. ``--bench layers`` times one decoder block's forward and backward at a grid of
shapes (tensor-parallel shards, micro-batch sizes; traces.bench_layers) for the per-layer compute fit.

Backend ``auto``: NCCL on ``cuda:LOCAL_RANK`` when CUDA is available, else gloo on CPU.
``clustersim collect`` (clustersim.collect) launches this module for you.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import faulthandler
import os
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":     # a rank under torchrun: die with torchrun, from before the slow torch import
    from traces.lifetime import die_with_parent
    die_with_parent()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from traces.launch import schedule_problem  # noqa: E402
from traces.models import ModelConfig  # noqa: E402
from traces.rank_io import (TRACE_SUFFIX, UsageError, base_manifest, rank_info, say, synchronize,  # noqa: E402
                            write_json)
from traces.strategies import STRATEGIES, Context, build  # noqa: E402


# ---------------------------------------------------------------------------------------------- arguments
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m traces.collect", description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    p.add_argument("--steps", type=int, default=5, help="training steps in all (>= 3)")
    p.add_argument("--active", type=int, default=0,
                   help="profiled steps at the end of the run (0: min(3, steps - 2))")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="samples per data-parallel rank per step")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--ffn", type=int, default=0, help="SwiGLU width (0: 8/3 hidden rounded up to 16)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP / ZeRO-1 bucket size (MiB)")
    p.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches per step (pp)")
    p.add_argument("--experts", type=int, default=0, help="experts per MoE layer (ep; 0: 2 x world size)")
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--capacity-factor", type=float, default=1.0)
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--bench", choices=("collectives", "layers"), default=None,
                   help="collectives: the collective benchmark; layers: one block's forward / backward times")
    p.add_argument("--max-bytes", type=int, default=0,
                   help="benchmark: largest size (0: 64 MiB on CPU, what memory allows up to 8 GiB on GPU)")
    p.add_argument("--size-factor", type=int, default=2, help="benchmark: ratio of successive sizes")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout (a hang becomes an error)")
    p.add_argument("--out", required=True, help="output directory")
    return p


# ---------------------------------------------------------------------------------------------- environment
def select_backend(requested: str) -> tuple[str, torch.device]:
    """(backend, device) for this rank: NCCL on cuda:LOCAL_RANK when CUDA is there (or asked), else gloo."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if requested == "nccl" and not cuda:
        raise UsageError("--backend nccl needs CUDA, which this torch does not see")
    backend = requested if requested != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local)
        return backend, torch.device("cuda", local)
    return backend, torch.device("cpu")


# ---------------------------------------------------------------------------------------------- training
def profiler_schedule(steps: int, active: int) -> dict:
    """wait / warmup / active so that the profiler records the last ``active`` steps."""
    problem = schedule_problem(steps, active)
    if problem:
        raise UsageError(problem)
    active = active or min(3, steps - 2)
    wait = steps - 1 - active
    return {"wait": wait, "warmup": 1, "active": active, "repeat": 1,
            "profiled_steps": list(range(steps - active, steps)), "record_shapes": True,
            # steps the profiler did not touch, the first (cold) one left out
            "unprofiled_steps": list(range(1, wait))}


def make_batches(vocab: int, batch: int, seq: int, data_rank: int, steps: int, device=None) -> list[tuple]:
    """Random token batches (inputs, next-token targets) per step, seeded by (data rank, step)."""
    out = []
    for s in range(steps):
        g = torch.Generator().manual_seed(1000 * data_rank + s)
        t = torch.randint(vocab, (batch, seq + 1), generator=g).to(device or "cpu")
        out.append((t[:, :-1], t[:, 1:]))
    return out


def run_training(args, backend: str, device: torch.device, out: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        args.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)
    experts = 0
    if args.strategy == "ep":
        experts = args.experts or 2 * world
    cfg = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab,
                      ffn=args.ffn, experts=experts, top_k=args.top_k, capacity_factor=args.capacity_factor)
    ctx = Context(rank=rank, world=world, device=device, dtype=dtype, cfg=cfg, batch=args.batch,
                  bucket_cap_mb=args.bucket_cap_mb, microbatches=args.microbatches)
    strategy = build(args.strategy, ctx)
    sched = profiler_schedule(args.steps, args.active)
    batches = make_batches(cfg.vocab, ctx.batch, cfg.seq, strategy.data_rank, args.steps, device)
    trace_path = out / f"rank{rank}{TRACE_SUFFIX}"

    from torch.profiler import ProfilerActivity, profile, schedule
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    times, cpu, losses = [], [], []
    dist.barrier()
    with profile(activities=activities, record_shapes=True,
                 schedule=schedule(wait=sched["wait"], warmup=1, active=sched["active"], repeat=1),
                 on_trace_ready=lambda p: _export_atomically(p, trace_path)) as prof:
        for tokens, targets in batches:
            t0, c0 = time.perf_counter(), time.thread_time()
            losses.append(strategy.step(tokens, targets))
            synchronize(device)
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            prof.step()
    dist.barrier()

    gathered: list = [None] * world
    info = {**rank_info(device), "data_rank": strategy.data_rank}
    dist.all_gather_object(gathered, {"info": info, "times": times, "cpu": cpu, "losses": losses})
    if rank != 0:
        return
    infos = [g["info"] for g in gathered]
    per_rank = [g["times"] for g in gathered]
    job = [max(ts) for ts in zip(*per_rank)]     # a step ends when its slowest rank ends
    prof_steps = sched["profiled_steps"]
    manifest = base_manifest(args, backend, device, infos)
    manifest.update({
        "mode": "train", "strategy": args.strategy, "plan": strategy.plan, "model": cfg.to_dict(),
        "dtype": str(dtype).replace("torch.", ""), "steps": args.steps, "profiler": sched,
        "trace_format": "kineto-chrome-json.gz",
        "trace_files": {str(r): f"rank{r}{TRACE_SUFFIX}" for r in range(world)},
        "tokens_per_step": strategy.plan["global_batch"] * cfg.seq,
        "step_time_s": {
            "per_rank": per_rank,
            "job": job,
            "median_profiled_s": statistics.median(job[s] for s in prof_steps),
            "median_s": statistics.median(job[1:]),
            # without the profiler's own cost (a few microseconds per recorded op): what a model predicts
            "median_unprofiled_s": statistics.median(job[s] for s in sched["unprofiled_steps"])
            if sched["unprofiled_steps"] else None,
            "definition": "wall time of one step on a rank (perf_counter around the step, device "
                          "synchronised); job = max over ranks; medians over the profiled steps / all "
                          "steps but the first / the unprofiled steps but the first",
            # CPU time of the main thread in each step: on a CPU backend, wall minus this is time spent
            # waiting (for peers, or for a core shared with other work)
            "main_thread_cpu_per_rank": [g["cpu"] for g in gathered],
        },
        "losses": [g["losses"] for g in gathered],
    })
    write_json(out / "manifest.json", manifest)
    say(f"{args.strategy} on {world} x {infos[0]['device']} ({backend}): median step "
        f"{manifest['step_time_s']['median_profiled_s'] * 1e3:.2f} ms; wrote {out}")


# ---------------------------------------------------------------------------------------------- main
def _export_atomically(prof, path: Path) -> None:
    """Export the trace to a hidden temporary name, then rename: a killed run leaves no torn trace."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{TRACE_SUFFIX}")
    prof.export_chrome_trace(str(tmp))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    faulthandler.enable()         # a crash or abort prints every thread's Python stack
    if "RANK" not in os.environ:
        raise SystemExit("traces.collect must run under torchrun (or use `clustersim collect`)")
    try:
        backend, device = select_backend(args.backend)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        kw = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=_dt.timedelta(seconds=args.timeout_s), **kw)
        if args.bench == "collectives":
            from traces.bench_collectives import run_bench
            run_bench(args, backend, device, out)
        elif args.bench == "layers":
            from traces.bench_layers import run_bench_layers
            run_bench_layers(args, backend, device, out)
        else:
            run_training(args, backend, device, out)
    except (UsageError, ValueError) as e:     # bad arguments, a model / plan that cannot be built
        if os.environ["RANK"] == "0":         # every rank fails alike: one message is enough
            print(f"traces.collect: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    dist.barrier()                # nobody tears the group down while a peer still uses it
    dist.destroy_process_group()
    # Everything is written and closed. Leave without the interpreter's and C++ teardown: on a loaded
    # 2-core machine about one run in ten aborted while exiting ("terminate called without an active
    # exception", SIGABRT) after a complete run, which torchrun then reports as a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # run the importable module's main, so that traces.bench_collectives shares its classes and helpers
    from traces.collect import main as _main
    sys.exit(_main())
