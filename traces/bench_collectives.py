"""The collective benchmark of the collector (``--bench collectives``; imports torch).

nccl-tests' method and conventions: for each kind and size (1 KiB, then x ``--size-factor`` up to
``--max-bytes``), warm up, then time repetitions of (synchronize, barrier, start clock, ``iters`` ops,
synchronize, stop clock, barrier); ``time_s`` is the median over repetitions of the slowest rank's time per
op. Sizes follow nccl-tests (all_reduce / broadcast: the buffer, all_gather: the gathered output,
reduce_scatter: the input, all_to_all: a rank's send buffer, p2p: one message of a ring sendrecv);
algbw = size / time and busbw = algbw x bus factor (simulator.calibration.bus_factor). Buffers are float32.
"""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from traces import bench_format
from traces.bench_format import BENCH_KINDS
from traces.rank_io import UsageError, say, synchronize, write_bench_manifest

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def bench_sizes(max_bytes: int, factor: int) -> list[int]:
    """1 KiB, factor KiB, ... up to max_bytes (nccl-tests' -b 1K -e MAX -f factor)."""
    if factor < 2:
        raise UsageError(f"--size-factor must be >= 2, got {factor}")
    if max_bytes < KiB:
        raise UsageError(f"--max-bytes must be >= 1024, got {max_bytes}")
    sizes, s = [], KiB
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def default_max_bytes(device: torch.device) -> int:
    """64 MiB on CPU (gloo takes ~0.1 s per op there); on a GPU the largest power of two whose buffers
    (input + output, about 2x the size) fit in a quarter of the free memory, capped at 8 GiB."""
    if device.type != "cuda":
        return 64 * MiB
    free, _ = torch.cuda.mem_get_info(device)
    return min(8 * GiB, 1 << int(math.log2(max(free // 8, KiB))))


def _collective(kind: str, size_bytes: int, world: int, rank: int, device: torch.device):
    """(op, actual size in bytes) for one collective of nccl-tests' ``size`` on float32 buffers."""
    elems = max(world, size_bytes // 4 // world * world)
    nbytes = elems * 4
    full = torch.ones(elems, device=device)
    part = torch.ones(elems // world, device=device)
    if kind == "all_reduce":
        return (lambda: dist.all_reduce(full)), nbytes
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return (lambda: gather(full, part)), nbytes
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return (lambda: scatter(part, full)), nbytes
    if kind == "all_to_all":
        recv = torch.empty_like(full)
        return (lambda: dist.all_to_all_single(recv, full)), nbytes
    if kind == "broadcast":
        return (lambda: dist.broadcast(full, 0)), nbytes
    if kind == "p2p":   # ring: send to rank + 1, receive from rank - 1 (nccl-tests' sendrecv), in one group
        recv = torch.empty_like(full)

        def sendrecv():
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, full, (rank + 1) % world),
                                             dist.P2POp(dist.irecv, recv, (rank - 1) % world)]):
                w.wait()
        return sendrecv, nbytes
    raise ValueError(kind)


def time_collective(op, device: torch.device, iters: int) -> float:
    """Seconds per op on the slowest rank: barrier, time ``iters`` ops, synchronize, then barrier."""
    synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.barrier()
    return _max_over_ranks(elapsed, device)


def _max_over_ranks(t: torch.Tensor, device: torch.device) -> float:
    t = t.to(device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run_bench(args, backend: str, device: torch.device, out: Path) -> None:
    """Benchmark every kind of BENCH_KINDS at every size; rank 0 prints the table and writes the manifest."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise UsageError("--bench collectives needs at least 2 processes")
    max_bytes = args.max_bytes or default_max_bytes(device)
    target_s = 0.02 if device.type == "cpu" else 0.005     # timed work per repetition
    reps, warmup = 3, 2
    rows = []
    if rank == 0:
        say(f"# clustersim collective benchmark: {world} ranks, backend {backend}, device {device.type}")
    for kind in BENCH_KINDS:
        if rank == 0:
            for line in bench_format.header(kind, world, backend):
                say(line)
        first = len(rows)
        for size in bench_sizes(max_bytes, args.size_factor):
            op, nbytes = _collective(kind, size, world, rank, device)
            for _ in range(warmup):
                op()
            one = time_collective(op, device, 1)
            iters = int(min(100, max(1, math.ceil(target_s / max(one, 1e-7)))))
            times = [time_collective(op, device, iters) for _ in range(reps)]
            t = statistics.median(times)
            row = {"kind": kind, "size_bytes": nbytes, "dtype": "float32", "group_size": world,
                   "iters": iters, "reps": reps, "time_s": t, "time_min_s": min(times),
                   "time_avg_s": statistics.fmean(times), "time_max_s": max(times)}
            algbw, busbw = bench_format.bandwidths(row, world)
            rows.append({**row, "algbw_GBps": algbw, "busbw_GBps": busbw})
            del op
            if rank == 0:
                say(bench_format.row_line(rows[-1], world))
        if rank == 0:
            say(bench_format.avg_bus_bandwidth(rows[first:], world))
            say("#")
    path = write_bench_manifest(args, backend, device, out, {
        "bench": "collectives",
        "method": f"per size: {warmup} warm-up ops; then {reps} repetitions of (synchronize, barrier, time "
                  f"'iters' ops, synchronize, stop clock, barrier); time_s = median over repetitions of "
                  f"the slowest rank's time per op (time_min_s / time_avg_s / time_max_s: over the "
                  f"repetitions). Sizes in nccl-tests' convention (all_gather: output, "
                  f"reduce_scatter: input, all_to_all: send buffer, p2p: one message of a ring sendrecv); "
                  f"algbw = size / time_avg_s (nccl-tests' convention), busbw = algbw * bus factor (2(n-1)/n all_reduce, (n-1)/n "
                  f"all_gather/reduce_scatter/all_to_all, 1 broadcast/p2p).",
        "results": rows,
    })
    if path is not None:
        say(f"benchmark of {len(rows)} points written to {out / 'manifest.json'}")
