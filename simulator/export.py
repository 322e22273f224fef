"""Exports of a simulated step: Perfetto / Chrome trace JSON and the timeline as CSV or Parquet.

The trace follows torch.profiler's Kineto conventions so a real and a simulated run open side by side in
Perfetto (ui.perfetto.dev), chrome://tracing and Holistic Trace Analysis: named and sorted processes and
threads, one thread per stream (tid = a Kineto-style stream id), complete events (``ph: "X"``) whose start
and end are integer nanoseconds written as microseconds (so events of a stream never overlap), compute ops as
``cat: "kernel"`` with ``args.stream`` / ``args.device`` / ``correlation``, communication as NCCL-style
kernels (``ncclDevKernel_AllReduce`` ...) carrying the args real NCCL traces carry ('Collective name',
'In msg nelems', 'Group size', 'dtype', 'Process Group Ranks'), and ``ProfilerStep#0`` spanning the step.
``write_perfetto`` writes every rank in one file; ``write_rank_traces`` one file per rank (per class in
symmetric mode) with ``distributedInfo`` (rank, world size, backend) and host-side kernel launches, the
folder layout HTA reads. Output is deterministic: the same result gives byte-identical files.
"""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from simulator.atomic import atomic_open, write_text, write_with
from simulator.program import COLLECTIVE, COMPUTE

_NCCL_NAMES = {
    "all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all_gather": "ncclDevKernel_AllGather_RING_LL",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "all_to_all": "ncclDevKernel_SendRecv",
    "broadcast": "ncclDevKernel_Broadcast_RING_LL", "reduce": "ncclDevKernel_Reduce_Sum_bf16_RING_LL",
    "barrier": "ncclDevKernel_AllReduce_Sum_u8_RING_LL",
}
_NS = 1e9
#: CUDA stream ids as Kineto numbers them (the default stream is 7); simulated streams take 7, 8, ... in order
FIRST_STREAM_ID = 7
#: backend written into ``distributedInfo`` (the collectives are NCCL-named kernels)
TRACE_BACKEND = "nccl"
#: first correlation id of a rank's kernels. Real CUPTI ids are large 32-bit counters; HTA downcasts its
#: correlation column to the smallest integer type that holds it and then stores row indices in a column of
#: that type, which fails (pandas >= 3) when the ids fit in int8 / int16 but the row count does not.
CORRELATION_BASE = 1 << 20


def _ns(t: float) -> int:
    """Seconds -> integer nanoseconds: every event's start and end are rounded once, so ops that follow each
    other on a stream never overlap after rounding and ts + dur is exactly the next op's ts."""
    return int(round(t * _NS))


def _us(ns: int) -> float:
    """Integer nanoseconds as Kineto's microseconds (exact to the nanosecond)."""
    return ns / 1000


def _device(result, rank: int) -> int:
    """The rank's local CUDA device index (rank modulo GPUs per node when the cost model knows the cluster)."""
    cluster = getattr(result.cost_model, "cluster", None)
    per_node = getattr(cluster, "gpus_per_node", None)
    return rank % per_node if isinstance(per_node, int) and per_node > 0 else 0


def _kernel(result, rank: int, i: int, op) -> tuple[str, dict]:
    """(kernel name, args) of one op, NCCL-style for communication."""
    p = result.programs
    args = {"op": i}
    for k in ("layer", "microbatch", "phase", "strategy"):
        v = getattr(op, k)
        if v is not None:
            args[k] = v
    if op.kind == COMPUTE:
        args["flops"] = op.flops
        return op.name, args
    n = 2
    if op.kind == COLLECTIVE:
        g = p.groups[op.group]
        n = g.size
        name = _NCCL_NAMES.get(op.collective, "ncclDevKernel_" + str(op.collective))
        args["Collective name"] = op.collective
        args["Process Group Ranks"] = list(g.ranks)
        args["Process Group Description"] = g.family
    else:
        name = "ncclDevKernel_SendRecv"
        args["Collective name"] = op.kind
        args["peer"] = op.peer
    nelems = int(op.size_bytes // 2)
    args.update({"In msg nelems": nelems, "Out msg nelems": nelems, "Group size": n, "dtype": "BFloat16",
                 "label": op.name, "wait_us": _us(_ns(result.start_s[rank][i]) - _ns(result.ready_s[rank][i]))})
    return name, args


def rank_events(result, rank: int, *, gpu_pid: int, cpu_pid: int, launches: bool, corr_base: int = 0) -> list:
    """Trace events of one simulated rank in Kineto's layout: a host thread (``cpu_pid``, tid 1) with the
    ``ProfilerStep#0`` span and, with ``launches``, one ``cudaLaunchKernel`` per op at the time the op became
    ready (zero length, linked by ``correlation``); a GPU process (``gpu_pid``) with one thread per stream
    (tid = stream id) holding the ops as kernels with ``args.stream``, ``args.device`` and ``correlation``."""
    p = result.programs
    prog = p.ops[rank]
    mult = p.multiplicity(rank)
    dev = _device(result, rank)
    rep = f" (represents {mult} ranks)" if mult > 1 else ""
    ev = []
    sids: dict[str, int] = {}
    for op in prog:
        sids.setdefault(op.stream, FIRST_STREAM_ID + len(sids))

    def meta(pid, tid, name, value):
        ev.append({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": value})

    if cpu_pid != gpu_pid:
        meta(cpu_pid, 0, "process_name", {"name": f"rank {rank} host"})
        meta(cpu_pid, 0, "process_sort_index", {"sort_index": 2 * rank})
    meta(gpu_pid, 0, "process_name", {"name": f"rank {rank}{rep}" + (f" GPU {dev}" if cpu_pid != gpu_pid else "")})
    meta(gpu_pid, 0, "process_sort_index", {"sort_index": 2 * rank + 1})
    meta(cpu_pid, 1, "thread_name", {"name": "host thread"})
    meta(cpu_pid, 1, "thread_sort_index", {"sort_index": 0})
    for stream, sid in sids.items():
        meta(gpu_pid, sid, "thread_name", {"name": f"stream {sid} {stream}"})
        meta(gpu_pid, sid, "thread_sort_index", {"sort_index": sid})
    T = _ns(result.step_time_s)
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": cpu_pid, "tid": 1,
               "ts": 0.0, "dur": _us(T), "args": {"External id": corr_base}})
    st, en, rd = result.start_s[rank], result.end_s[rank], result.ready_s[rank]
    for i, op in enumerate(prog):
        if math.isnan(st[i]) or math.isnan(en[i]):
            continue
        name, args = _kernel(result, rank, i, op)
        s_ns, e_ns = _ns(st[i]), _ns(en[i])
        corr = corr_base + i + 1
        args.update({"stream": sids[op.stream], "device": dev, "correlation": corr, "External id": corr})
        if launches:
            r_ns = min(_ns(rd[i]) if not math.isnan(rd[i]) else s_ns, s_ns)
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": cpu_pid, "tid": 1,
                       "ts": _us(r_ns), "dur": 0.0, "args": {"correlation": corr, "External id": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": gpu_pid, "tid": sids[op.stream],
                   "ts": _us(s_ns), "dur": _us(e_ns - s_ns), "args": args})
    return ev


def perfetto_trace(result, ranks=None, max_ranks: int | None = None) -> dict:
    """The Chrome-trace dict of ``result`` (a SimResult) for the given simulated ranks (default all), all in
    one file: one process per rank (``pid`` = rank) holding its streams and a host thread with the step."""
    p = result.programs
    sel = sorted(p.ops if ranks is None else ranks)
    if max_ranks is not None:
        sel = sel[:max_ranks]
    events = []
    for rank in sel:
        events += rank_events(result, rank, gpu_pid=rank, cpu_pid=rank, launches=False)
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "distributedInfo": {"backend": TRACE_BACKEND, "world_size": p.world_size},
        "otherData": {"generator": "clustersim", "mode": result.mode},
        "traceEvents": events,
    }


def rank_trace(result, rank: int) -> dict:
    """One rank's trace as torch.profiler writes it (what Holistic Trace Analysis reads): ``distributedInfo``
    with rank, world size and backend; host process with ``ProfilerStep#0`` and kernel launches; GPU process
    with one thread per stream."""
    p = result.programs
    return {
        "schemaVersion": 1,
        "deviceProperties": [],
        "distributedInfo": {"backend": TRACE_BACKEND, "rank": rank, "world_size": p.world_size},
        "displayTimeUnit": "ms",
        "otherData": {"generator": "clustersim", "mode": result.mode, "represents": p.multiplicity(rank)},
        "traceEvents": rank_events(result, rank, gpu_pid=_device(result, rank), cpu_pid=1_000_000 + rank,
                                   launches=True, corr_base=CORRELATION_BASE),
    }


def _write_json(data: dict, path: Path, compact: bool) -> Path:
    seps = (",", ":") if compact else (", ", ": ")     # HTA finds the rank with the regex '"rank":\s+N'
    text = json.dumps(data, sort_keys=True, separators=seps)
    if path.suffix == ".gz":
        with atomic_open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            f.write(text.encode())                       # mtime=0: byte-identical output
    else:
        write_text(path, text)
    return path


def write_perfetto(result, path: str | Path, ranks=None, max_ranks: int | None = None) -> Path:
    """Write the Perfetto / Chrome trace JSON (gzip if the name ends in .gz). Returns the path."""
    return _write_json(perfetto_trace(result, ranks, max_ranks), Path(path), compact=True)


def write_rank_traces(result, folder: str | Path, ranks=None) -> list[Path]:
    """One ``rank-N.json`` per simulated rank (per class in symmetric mode) in ``folder``, as torch.profiler
    writes them: the folder opens in Holistic Trace Analysis and Perfetto like a real run's."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sel = sorted(result.programs.ops if ranks is None else ranks)
    return [_write_json(rank_trace(result, r), folder / f"rank-{r}.json", compact=False) for r in sel]


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
