"""Exports of a simulated step: Perfetto / Chrome trace JSON and the timeline as CSV or Parquet.

The trace follows torch.profiler's Kineto conventions so a real and a simulated run open side by side in
Perfetto (ui.perfetto.dev) or chrome://tracing: one process per rank (``pid`` = rank, named "rank N"),
one thread per stream (named after the stream), complete events (``ph: "X"``) with ``ts``/``dur`` in
microseconds, compute ops as ``cat: "kernel"``, communication as NCCL-style kernels
(``ncclDevKernel_AllReduce`` ...) carrying the args real NCCL traces carry ('Collective name',
'In msg nelems', 'Group size', 'dtype', 'Process Group Ranks'), and ``ProfilerStep#0`` spanning the step.
Output is deterministic: the same result gives byte-identical files.
"""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from simulator.atomic import atomic_open, write_text, write_with
from simulator.program import COLLECTIVE, COMPUTE, RECV, SEND

_NCCL_NAMES = {
    "all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all_gather": "ncclDevKernel_AllGather_RING_LL",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "all_to_all": "ncclDevKernel_SendRecv",
    "broadcast": "ncclDevKernel_Broadcast_RING_LL", "reduce": "ncclDevKernel_Reduce_Sum_bf16_RING_LL",
    "barrier": "ncclDevKernel_AllReduce_Sum_u8_RING_LL",
}
_US = 1e6


def _us(t: float) -> float:
    return round(t * _US, 3)


def perfetto_trace(result, ranks=None, max_ranks: int | None = None) -> dict:
    """The Chrome-trace dict of ``result`` (a SimResult) for the given simulated ranks (default all)."""
    p = result.programs
    sel = sorted(p.ops if ranks is None else ranks)
    if max_ranks is not None:
        sel = sel[:max_ranks]
    events = []
    T = result.step_time_s
    for rank in sel:
        prog = p.ops[rank]
        mult = p.multiplicity(rank)
        label = f"rank {rank}" + (f" (represents {mult} ranks)" if mult > 1 else "")
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        tids: dict[str, int] = {}
        for op in prog:
            if op.stream not in tids:
                tids[op.stream] = len(tids) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[op.stream],
                               "args": {"name": op.stream}})
        events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": rank, "tid": 0,
                       "ts": 0.0, "dur": _us(T), "args": {}})
        st, en = result.start_s[rank], result.end_s[rank]
        for i, op in enumerate(prog):
            if math.isnan(st[i]) or math.isnan(en[i]):
                continue
            args = {"op": i}
            for k in ("layer", "microbatch", "phase", "strategy"):
                v = getattr(op, k)
                if v is not None:
                    args[k] = v
            if op.kind == COMPUTE:
                name = op.name
                args["flops"] = op.flops
            else:
                n = 2
                ranks_of = ()
                if op.kind == COLLECTIVE:
                    g = p.groups[op.group]
                    n, ranks_of = g.size, list(g.ranks)
                    name = _NCCL_NAMES.get(op.collective, "ncclDevKernel_" + str(op.collective))
                    args["Collective name"] = op.collective
                    args["Process Group Ranks"] = ranks_of
                else:
                    name = "ncclDevKernel_SendRecv"
                    args["Collective name"] = op.kind
                    args["peer"] = op.peer
                nelems = int(op.size_bytes // 2)
                args.update({"In msg nelems": nelems, "Out msg nelems": nelems, "Group size": n,
                             "dtype": "BFloat16", "label": op.name, "wait_us": _us(st[i] - result.ready_s[rank][i])})
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": rank, "tid": tids[op.stream],
                           "ts": _us(st[i]), "dur": _us(en[i] - st[i]), "args": args})
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "distributedInfo": {"backend": "simulated", "world_size": p.world_size},
        "otherData": {"generator": "clustersim", "mode": result.mode},
        "traceEvents": events,
    }


def write_perfetto(result, path: str | Path, ranks=None, max_ranks: int | None = None) -> Path:
    """Write the Perfetto / Chrome trace JSON (gzip if the name ends in .gz). Returns the path."""
    path = Path(path)
    text = json.dumps(perfetto_trace(result, ranks, max_ranks), sort_keys=True, separators=(",", ":"))
    if path.suffix == ".gz":
        with atomic_open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            f.write(text.encode())                       # mtime=0: byte-identical output
    else:
        write_text(path, text)
    return path


def write_timeline(result, path: str | Path, ranks=None) -> Path:
    """Write the timeline as Parquet (``.parquet``) or CSV (anything else). Returns the path."""
    from simulator.timeline import build_timeline
    path = Path(path)
    df = result.timeline if ranks is None else build_timeline(result, ranks)
    if path.suffix == ".parquet":
        return write_with(path, lambda tmp: df.to_parquet(tmp, index=False))
    return write_with(path, lambda tmp: df.to_csv(tmp, index=False))


def lane_ranks(result, limit: int = 64) -> list[int]:
    """Ranks worth drawing/exporting for a large run: every simulated rank if few, else the pipeline of
    rank 0 (one rank per stage), else the first ``limit``."""
    p = result.programs
    ranks = sorted(p.ops)
    if len(ranks) <= limit:
        return ranks
    first = ranks[0]
    pp = p.group_of(first, "pp")
    if pp is not None:
        return [r for r in p.groups[pp].ranks if r in p.ops][:limit]
    return ranks[:limit]
