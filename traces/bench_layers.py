"""The layer benchmark of the collector (``--bench layers``; imports torch).

Times the forward and the backward of one decoder block of ``traces.models`` (RMSNorm, attention with
rotary embeddings, SwiGLU MLP, residuals: every kernel a training step runs per layer, not only its GEMMs)
at a grid of shapes: the model shape of the command line, each tensor-parallel shard of it (``tp`` in 1, 2,
4, 8 where heads and ffn divide; a shard runs no collective) and micro-batches of 1, 2, 4, ... up to
``--batch`` sequences of ``--seq`` tokens. These are the per-layer compute ops the simulator's programs
hold, so ``traces.calibrate`` fits achieved FLOP/s at that granularity (FLOPs from ``schedules.models``).

Method per shape: every rank builds the block, warms up, then times ``reps`` iterations of (forward with
autograd recording, synchronize; backward with a random output gradient, synchronize), parameters'
gradients reset to None each time as ``zero_grad(set_to_none=True)`` does. All ranks run concurrently (a
barrier starts each shape), so each sees the same sharing of the machine as in a training run;
``forward_s`` / ``backward_s`` are the medians over iterations on the slowest rank. Units: seconds.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from traces.rank_io import UsageError, say, synchronize, write_bench_manifest
from traces.models import Block, ModelConfig, rotary_tables

TP_DEGREES = (1, 2, 4, 8)


def layer_shapes(cfg: ModelConfig, batch: int) -> list[tuple[int, int]]:
    """(tp, micro_batch) pairs of the grid: shards that divide heads and ffn; batches 1, 2, 4, ..., batch."""
    batches = sorted({b for b in (1 << i for i in range(batch.bit_length())) if b <= batch} | {batch})
    tps = [t for t in TP_DEGREES if cfg.heads % t == 0 and cfg.ffn % t == 0]
    return [(t, b) for t in tps for b in batches]


def time_block(cfg: ModelConfig, tp: int, batch: int, device: torch.device, dtype: torch.dtype,
               target_s: float) -> tuple[float, float, int]:
    """(median forward s, median backward s, iterations) of one block shard on this rank."""
    torch.manual_seed(0)
    block = Block(cfg, tp=tp, tp_group=None).to(device=device, dtype=dtype)
    cos, sin = (t.to(device, dtype) for t in rotary_tables(cfg.seq, cfg.head_dim))
    x = torch.randn(batch, cfg.seq, cfg.hidden, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(batch, cfg.seq, cfg.hidden, device=device, dtype=dtype)

    def once() -> tuple[float, float]:
        for p in block.parameters():
            p.grad = None
        x.grad = None
        synchronize(device)
        t0 = time.perf_counter()
        y = block(x, cos, sin)
        synchronize(device)
        t1 = time.perf_counter()
        y.backward(grad)
        synchronize(device)
        return t1 - t0, time.perf_counter() - t1

    for _ in range(2):
        once()
    f, b = once()
    reps = int(min(30, max(3, target_s / max(f + b, 1e-6))))
    fs, bs = zip(*(once() for _ in range(reps)))
    return statistics.median(fs), statistics.median(bs), reps


def run_bench_layers(args, backend: str, device: torch.device, out: Path) -> None:
    """Time every shape of ``layer_shapes``; rank 0 prints the table and writes the manifest."""
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        args.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        cfg = ModelConfig(layers=1, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab,
                          ffn=args.ffn)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    rank = dist.get_rank()
    target_s = 0.3 if device.type == "cpu" else 0.05          # timed work per shape
    rows = []
    for tp, batch in layer_shapes(cfg, args.batch):
        dist.barrier()
        f, b, reps = time_block(cfg, tp, batch, device, dtype, target_s)
        t = torch.tensor([f, b], dtype=torch.float64)
        if device.type == "cuda":
            t = t.to(device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        f, b = (float(v) for v in t.tolist())
        rows.append({"hidden": cfg.hidden, "heads": cfg.heads, "ffn": cfg.ffn, "seq": cfg.seq, "batch": batch,
                     "tp": tp, "dtype": str(dtype).replace("torch.", ""), "reps": reps,
                     "forward_s": f, "backward_s": b})
        if rank == 0:
            say(f"layer h={cfg.hidden} ffn={cfg.ffn} heads={cfg.heads} seq={cfg.seq} batch={batch:>3} tp={tp}: "
                f"forward {f * 1e3:9.3f} ms  backward {b * 1e3:9.3f} ms")
    path = write_bench_manifest(args, backend, device, out, {
        "bench": "layers", "model": cfg.to_dict(), "dtype": str(dtype).replace("torch.", ""),
        "method": "per shape: build one decoder block (tp > 1: one rank's shard, no collective), 2 warm-up "
                  "iterations, then 'reps' iterations of (forward with autograd, synchronize, backward "
                  "with a random output gradient, synchronize); forward_s / backward_s = median over "
                  "iterations on the slowest rank; all ranks run each shape concurrently.",
        "results": rows,
    })
    if path is not None:
        say(f"layer benchmark of {len(rows)} shapes written to {path}")
