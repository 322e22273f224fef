"""Replay a trace: turn what each rank did into ``Programs``, simulate them, compare with the measurement.

``build_programs(trace)`` makes one program per rank covering every profiled step:

- the **CPU** (stream ``cpu``; the rank's threads merged, gloo worker threads excluded) is cut into
  compute ops at every point where it issues work (a kernel launch, a collective enqueue) and at step
  boundaries; durations are the measured times. Time not covered by an innermost op (between two ops, or
  inside a parent between its children) and synchronising CUDA calls are gaps: where a collective or
  transfer the CPU waits on directly (gloo, p2p; in a synchronising call also a kernel) ended in a gap of
  20 us or more, the next CPU op depends on it (the wait as observed) and the rest of the gap is CPU
  time; any other gap is CPU time (framework overhead, untraced Python);
- **GPU ops** (``cuda:<stream>``) and **gloo work** (``gloo:<thread>``, p2p on ``p2p:<send|recv>:<peer>``)
  depend on the CPU op that issued them. When one started later than its stream and its issue allowed,
  it depends on the op of another stream that ended last before it started (cross-stream events as
  observed), and any remaining lag (launch latency, thread wake-up) is kept as a measured delay op;
- **collectives** are matched across ranks by process group and sequence number (the k-th of the group
  within profiler step N, so ranks whose profiling windows differ still line up); each takes its measured
  transfer time (min(end) - max(start) over the members: a member's duration includes waiting for the
  others, which the simulation reproduces itself). Collectives whose peers are absent from the trace
  (one file of an 8-rank job) keep the duration measured on the rank that is there. Sends and recvs are
  matched in order per (source, destination).

Zero-length marker ops at each ``ProfilerStep#N`` start and end give the predicted step times (the same
CPU-side boundaries the profiler measures). ``replay()`` simulates the
programs with ``simulator.engine.run`` and reports per rank and overall (medians over ranks and steps):
``measured_step_time_s``, ``predicted_step_time_s``, ``error`` (median of (predicted - measured) /
measured). What-if: ``scale_compute`` divides compute durations (GPU kernels on GPU traces, CPU time on
CPU-only traces), ``scale_bandwidth`` divides communication times, ``cluster`` lets a topology cost model
(``topologies.cost.ClusterCostModel``, with ``calibration`` if given) time the collectives of known size
instead of the measurement; ``calibration`` alone times them with its alpha-beta fits on the trace's own
backend (a check of the fits against a trace).
"""
from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.costs import ScaledCostModel, SimpleCostModel
from simulator.errors import ConfigError, TraceError
from simulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Programs
from traces.parse import Trace, check_one_run, load_trace, take

SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"})
TOL_S = 2e-6          # timestamp slack when deciding that one thing ended "in" a gap or before a start
MIN_DELAY_S = 5e-7    # lags shorter than this are not worth an op
MIN_WAIT_GAP_S = 2e-5  # a CPU gap outside synchronising calls shorter than this is overhead, not a wait
P2P = ("send", "recv")


@dataclass(slots=True)
class _Item:
    """Something the CPU issues: a kernel, a collective, a p2p transfer (times in seconds)."""

    issue: float
    start: float
    end: float
    stream: str
    op: Op
    rid: int = -1
    delay_rid: int = -1
    tail: float = 0.0         # this rank's own completion after the common end of a collective (seconds)
    done_rid: int = -1


class ReplayPlan:
    """Programs built from a trace plus what is needed to read the simulated step times back."""

    def __init__(self, programs: Programs, markers: dict, measured: pd.DataFrame, rank_map: dict, trace: Trace):
        self.programs = programs
        self.markers = markers          # sim rank -> [(step, start marker op index, end marker op index)]
        self.measured = measured        # rank, step, dur
        self.rank_map = rank_map        # trace rank -> sim rank
        self.trace = trace


# --------------------------------------------------------------------------------------------- helpers
def check_shared_clock(trace: Trace, steps: pd.DataFrame) -> None:
    """Refuse ranks whose clocks disagree: replay lines the ranks up by their timestamps. Ranks that communicate
    run each profiled step together; a rank's CPU may run a few steps ahead of another's (asynchronous CUDA),
    but never further than the whole profiled window lasts on some rank. One step's starts further apart than
    that are a clock shifted or based elsewhere: the replay would start the late ranks that far after the
    others (+3e10 % errors)."""
    if steps["rank"].nunique() < 2:
        return
    by_rank = steps.groupby("rank")
    window = float((by_rank["end"].max() - by_rank["ts"].min()).max())
    g = steps.groupby("step")
    spread = g["ts"].max() - g["ts"].min()
    bad = spread > window
    if bad.any():
        n = int(spread[bad].index[0])
        one = steps[steps["step"] == n].sort_values("ts")
        early, late = one.iloc[0], one.iloc[-1]
        raise TraceError(f"{trace.path}: the ranks' clocks disagree: ProfilerStep#{n} starts on rank "
                         f"{int(late['rank'])} {(late['ts'] - early['ts']) * 1e3:.6g} ms after rank "
                         f"{int(early['rank'])}, longer than the whole profiled window lasts on any rank "
                         f"({window * 1e3:.6g} ms); ranks that communicate run a step together: were these traces "
                         f"taken in one run with one clock base?")


def _merge(s: np.ndarray, e: np.ndarray) -> tuple[list[float], list[float]]:
    """Union of the intervals [s, e) (empty ones dropped): sorted, disjoint (starts, ends). Vectorised: the
    traces' millions of CPU ops would take ~100 bytes each as a list of [start, end] lists."""
    s, e = np.asarray(s, dtype=float), np.asarray(e, dtype=float)
    keep = ~(e <= s)
    s, e = s[keep], e[keep]
    if not len(s):
        return [], []
    order = np.lexsort((e, s))
    s, e = s[order], e[order]
    # sorted by start, an interval opens a new group when it starts after every earlier one ended
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    first = np.flatnonzero(new)
    return s[first].tolist(), np.maximum.reduceat(e, first).tolist()


def _subtract(bs: list[float], be: list[float], hs: list[float], he: list[float]) -> tuple[list, list]:
    """Sorted disjoint intervals (bs, be) minus the sorted disjoint holes (hs, he), as (starts, ends)."""
    if not hs:
        return bs, be
    out_s, out_e = [], []
    j = 0
    for s, e in zip(bs, be):
        cur = s
        while j < len(hs) and he[j] <= cur:
            j += 1
        k = j
        while k < len(hs) and hs[k] < e:
            if hs[k] > cur:
                out_s.append(cur)
                out_e.append(hs[k])
            cur = max(cur, he[k])
            k += 1
        if cur < e:
            out_s.append(cur)
            out_e.append(e)
    return out_s, out_e


def _pairs(points: np.ndarray, block: int = 1 << 16):
    """Consecutive pairs (a, b) of ``points`` as Python floats, converted a block at a time."""
    for lo in range(0, len(points) - 1, block):
        chunk = points[lo:lo + block + 1].tolist()
        yield from zip(chunk[:-1], chunk[1:])


def _instances(trace: Trace, windows: dict) -> tuple[dict, dict]:
    """Collective instances matched across ranks.

    Returns (row -> (instance key, complete, transfer_s, size_bytes, kind)), and (row -> pair info) for p2p:
    row -> (peer row or -1, transfer_s)."""
    c = trace.collectives
    present = set(trace.ranks)
    info, p2p = {}, {}
    if c.empty:
        return info, p2p
    in_win = pd.Series([windows[r][0] - TOL_S <= t <= windows[r][1] + TOL_S
                        for r, t in zip(c["rank"], _issue_times(trace))], index=c.index)
    coll = c[~c["kind"].isin(P2P)].assign(in_win=in_win)
    coll = coll.assign(g=coll["pg"].fillna("").astype(str) + "|" + coll["group_ranks"].astype(str))
    # the k-th collective of a group within profiler step N on every member (robust to ranks whose
    # profiling windows start at different steps); outside steps, the k-th of the whole trace
    in_step = coll["step"] >= 0
    coll = coll.assign(mseq=np.where(in_step, coll.groupby(["rank", "g", "step"]).cumcount(), coll["seq"]),
                       mstep=np.where(in_step, coll["step"], -1))
    grp = coll.groupby(["g", "mstep", "mseq"], sort=False)
    agg = {"n": grp["rank"].transform("size"), "nuniq": grp["rank"].transform("nunique"),
           "min_end": grp["end"].transform("min"), "max_ts": grp["ts"].transform("max"),
           "min_dur": grp["dur"].transform("min"), "size_max": grp["size_bytes"].transform("max"),
           "all_in": grp["in_win"].transform("all"), "kind0": grp["kind"].transform("first")}
    coll = coll.assign(**agg)
    for row in coll.itertuples():
        members = set(row.group_ranks) if isinstance(row.group_ranks, tuple) else {row.rank}
        complete = (len(members) > 1 and members <= present and row.rank in members and row.n == len(members)
                    and row.nuniq == len(members) and bool(row.all_in))
        tr = row.dur
        if complete:
            tr = row.min_end - row.max_ts if trace.shared_clock else math.nan
            if not tr > 0:
                tr = row.min_dur
        tail = row.end - row.min_end if complete else 0.0
        info[row.Index] = ((row.g, row.mstep, row.mseq), complete, tr, row.size_max, row.kind0, tail)
    s = c[c["kind"] == "send"].assign(src=lambda d: d["rank"], dst=lambda d: d["peer"])
    r = c[c["kind"] == "recv"].assign(src=lambda d: d["peer"], dst=lambda d: d["rank"])
    for df in (s, r):       # k-th transfer src -> dst within each profiler step (as for collectives)
        df["k"] = df.groupby(["src", "dst", "step"]).cumcount()
    m = s.reset_index().merge(r.reset_index(), on=["src", "dst", "step", "k"], suffixes=("_s", "_r"))
    for row in m.to_dict("records"):
        ok = in_win.loc[row["index_s"]] and in_win.loc[row["index_r"]]
        # either side's end bounds the data's arrival; gloo moves data from the c10d op's start on
        t_s, t_r = row["ts_s"], row["ts_r"]
        if row["timing_s"] != "gpu" and math.isfinite(row["issue_ts_s"]) and math.isfinite(row["issue_ts_r"]):
            t_s, t_r = row["issue_ts_s"], row["issue_ts_r"]
        tr = min(row["end_s"], row["end_r"]) - max(t_s, t_r)
        if not (trace.shared_clock and tr > 0):
            tr = min(row["dur_s"], row["dur_r"])
        if ok:
            # the recv's own lag after the data arrived; a send's span ends whenever it is waited for
            p2p[row["index_s"]] = (row["index_r"], tr, 0.0)
            p2p[row["index_r"]] = (row["index_s"], tr, max(row["end_r"] - min(row["end_s"], row["end_r"]), 0.0))
    return info, p2p


def _issue_times(trace: Trace) -> np.ndarray:
    """When each collective was issued by its rank's CPU (launch end for NCCL kernels, enqueue end else)."""
    c = trace.collectives
    out = c["issue_end"].to_numpy(float).copy()
    k = c["kernel"].to_numpy()
    if len(trace.kernels):
        launch = trace.kernels["launch"].to_numpy()
        ends = trace.cpu_ops["end"].to_numpy(float)
        for i in np.flatnonzero(k >= 0):
            lr = launch[k[i]]
            out[i] = ends[lr] if lr >= 0 else c["ts"].iloc[i]
    bad = ~np.isfinite(out)
    out[bad] = c["ts"].to_numpy(float)[bad]
    # work a gloo thread started before its enqueue op returned was enqueued by then; gloo sends and recvs
    # move data from inside c10d::send / recv_ (the op can be preempted long after), so they are issued when
    # the op starts
    cpu = k < 0
    out[cpu] = np.minimum(out[cpu], c["ts"].to_numpy(float)[cpu])
    p2p = cpu & c["kind"].isin(P2P).to_numpy() & np.isfinite(c["issue_ts"].to_numpy(float))
    out[p2p] = c["issue_ts"].to_numpy(float)[p2p]
    return out


# --------------------------------------------------------------------------------------------- build
def build_programs(trace: Trace, *, scale_compute: float = 1.0, scale_bandwidth: float = 1.0,
                   measured_collectives: bool = True, backend_kinds: bool = False) -> ReplayPlan:
    """Programs replaying every profiled step of every rank in ``trace`` (see module doc).

    measured_collectives=False leaves complete collectives of known size to the cost model (what-if);
    backend_kinds=True labels collectives with what the backend ran (gloo: FSDP's reduce_scatter is an
    all_reduce), for a cost model calibrated on that backend."""
    if scale_compute <= 0 or not math.isfinite(scale_compute):
        raise ConfigError(f"--scale-compute must be a positive number, got {scale_compute}")
    if scale_bandwidth <= 0 or not math.isfinite(scale_bandwidth):
        raise ConfigError(f"--scale-bandwidth must be a positive number, got {scale_bandwidth}")
    steps = trace.steps
    if steps.empty:
        raise TraceError(f"{trace.path}: no ProfilerStep#N annotations: replay needs profiled steps "
                         f"(torch.profiler with a schedule and prof.step() each iteration)")
    ranks = [r for r in trace.rank_ids if (steps["rank"] == r).any()]
    rank_map = {r: i for i, r in enumerate(ranks)}
    windows = {}
    for r in trace.rank_ids:
        s = steps[steps["rank"] == r]
        windows[r] = (s["ts"].min(), s["end"].max()) if len(s) else (math.inf, -math.inf)
    check_shared_clock(trace, steps)
    t0_all = min(windows[r][0] for r in ranks)
    info, p2p = _instances(trace, windows)
    issue = _issue_times(trace) if len(trace.collectives) else np.array([])
    programs = Programs(world_size=len(ranks), ops={})
    markers = {}
    gpu_trace = trace.has_gpu
    c_all = trace.collectives
    cpu_ops, kernels = trace.cpu_ops, trace.kernels
    # columns as arrays, sliced per rank below: a boolean-mask copy of the whole frame per rank (object
    # columns included) was the largest transient of a replay
    cpu_rank, cpu_end = cpu_ops["rank"].to_numpy(), cpu_ops["end"].to_numpy(float)
    k_rank = kernels["rank"].to_numpy() if len(kernels) else np.array([], dtype=np.int64)
    # names and categories as codes of their few distinct values (no Python string per row)
    name_code, names = pd.factorize(cpu_ops["name"], use_na_sentinel=False)
    skip_name = np.array([str(n).startswith(("ProfilerStep", "gloo:")) for n in names], dtype=bool)
    sync_name = np.array([n in SYNC_CALLS for n in names], dtype=bool)
    runtime = (cpu_ops["cat"] == "cuda_runtime").to_numpy(dtype=bool, na_value=False)
    texts: dict = {}            # one string object per distinct stream / op name of the programs

    def text(s: str) -> str:
        return texts.setdefault(s, s)

    for r in ranks:
        # the program under construction, one entry per op: sort key, Op, dependencies (record ids)
        rec_key = array("d")
        rec_op: list[Op] = []
        rec_deps: list = []

        def add(key, op, deps=()):
            rec_key.append(key)
            rec_op.append(op)
            rec_deps.append(tuple(deps))
            return len(rec_op) - 1

        w0, w1 = windows[r]
        coll = c_all[c_all["rank"] == r]
        worker_tids = {s.split(":", 1)[1] for s in coll["stream"] if s.startswith("gloo:")}
        # ---------------------------------------------------------------- issued items
        items: list[_Item] = []
        nccl_kernels = set(coll["kernel"][coll["kernel"] >= 0])
        krows = np.flatnonzero(k_rank == r)
        kcols = [kernels.index.to_numpy()[krows].tolist()] + \
            [kernels[c].to_numpy()[krows].tolist() for c in ("launch", "ts", "end", "dur", "cat", "stream", "name")] \
            if len(krows) else []
        for k_index, k_launch, k_ts, k_end, k_dur, k_cat, k_stream, k_name in zip(*kcols):
            if k_index in nccl_kernels:
                continue
            t_issue = cpu_end[k_launch] if k_launch >= 0 else k_ts
            if not (w0 <= t_issue <= w1):
                continue
            dur = k_dur / (scale_compute if k_cat == "kernel" else 1.0)
            stream = text(f"cuda:{k_stream}")
            items.append(_Item(t_issue, k_ts, k_end, stream, Op(COMPUTE, text(k_name[:80]), stream, duration_s=dur)))
        del kcols
        for idx, cr in zip(coll.index, coll.to_dict("records")):
            t_issue = issue[idx]
            if not (w0 - TOL_S <= t_issue <= w1 + TOL_S):
                continue
            kind = cr["kind"]
            if kind in P2P:
                stream = f"p2p:{kind}:{cr['peer']}" if cr["timing"] != "gpu" else cr["stream"]
                pair = p2p.get(idx)
                if pair is not None and trace.collectives.at[pair[0], "rank"] in rank_map:
                    dur = pair[1] / scale_bandwidth
                    size = cr["size_bytes"] if math.isfinite(cr["size_bytes"]) else 0.0
                    op = Op(SEND if kind == "send" else RECV, cr["name"], stream,
                            peer=rank_map[int(cr["peer"])], size_bytes=size,
                            duration_s=dur if (measured_collectives or not size) else None)
                else:
                    op = Op(COMPUTE, f"{kind} (peer {cr['peer']} absent)", stream, duration_s=cr["dur"])
            else:
                stream = cr["stream"]
                key, complete, tr, size, kind0, tail = info[idx]
                if complete:
                    gid = programs.add_group(tuple(rank_map[m] for m in sorted(cr["group_ranks"])),
                                             family=f"pg{cr['pg']}" if cr["pg"] is not None else "pg")
                    sized = math.isfinite(size)
                    ckind = _engine_kind(cr["impl"] if backend_kinds and cr["impl"] else kind0)
                    op = Op(COLLECTIVE, cr["name"], stream, collective=ckind, group=gid,
                            size_bytes=size if sized else 0.0,
                            duration_s=tr / scale_bandwidth if (measured_collectives or not sized) else None)
                else:
                    op = Op(COMPUTE, f"{kind} (peers absent)", stream, duration_s=cr["dur"])
            start = t_issue if (kind in P2P and cr["timing"] != "gpu") else cr["ts"]   # see _issue_times
            items.append(_Item(t_issue, start, cr["end"], stream, op))
            if op.kind != COMPUTE and op.duration_s is not None:
                items[-1].tail = (pair[2] if kind in P2P else tail) / scale_bandwidth
        # ---------------------------------------------------------------- the CPU timeline
        rows = np.flatnonzero(cpu_rank == r)
        o_ts, o_end = cpu_ops["ts"].to_numpy(float)[rows], cpu_end[rows]
        in_win = (o_ts < w1) & (o_end > w0)
        rows, o_ts, o_end = rows[in_win], o_ts[in_win], o_end[in_win]
        o_code = name_code[rows]
        mine = ~skip_name[o_code]
        if worker_tids and len(rows):
            tids = take(cpu_ops["tid"], rows)
            mine &= ~np.fromiter((str(t) in worker_tids for t in tids), dtype=bool, count=len(tids))
        # busy = covered by the innermost ops (leaves); time inside a parent between its children is either
        # framework overhead (CPU time) or a wait (an item of this rank ended in it), decided per gap below
        labels = cpu_ops.index.to_numpy()[rows]
        leaf = mine & ~np.isin(labels, cpu_ops["parent"].to_numpy()[rows[mine]])
        bs, be = _merge(np.maximum(o_ts[leaf], w0), np.minimum(o_end[leaf], w1))
        syncs = sync_name[o_code] & runtime[rows]
        sync_starts, sync_ends = _merge(o_ts[syncs], o_end[syncs])
        bs, be = _subtract(bs, be, sync_starts, sync_ends)
        del rows, o_ts, o_end, o_code, mine, labels, leaf, syncs
        st = steps[steps["rank"] == r].sort_values("ts")
        step_starts = {float(t): int(n) for t, n in zip(st["ts"], st["step"])}
        step_ends = {float(t): int(n) for t, n in zip(st["end"], st["step"])}
        cuts = sorted({it.issue for it in items if w0 <= it.issue <= w1})
        points = np.unique(np.concatenate([[w0, w1], bs, be, cuts, list(step_starts), list(step_ends)]))
        cpu_scale = 1.0 if gpu_trace else scale_compute
        item_ends = np.array([it.end for it in items], dtype=float)
        end_order = np.argsort(item_ends, kind="stable").tolist()      # items by end, then by index
        end_times = item_ends[end_order].tolist()
        del item_ends
        mk: list = []
        mk_end: dict = {}
        last_cpu = None
        pending_deps: list = []
        piece_start, piece_len = None, 0.0
        cut_set = set(cuts)
        cut_rid: dict[float, int] = {}
        if t0_all < w0 and trace.shared_clock:
            last_cpu = add(t0_all, Op(COMPUTE, "start offset", "cpu", duration_s=w0 - t0_all))

        def close_piece(at: float):
            nonlocal piece_start, piece_len, last_cpu, pending_deps
            if piece_start is not None:
                last_cpu = add(piece_start, Op(COMPUTE, "cpu", "cpu", duration_s=piece_len / cpu_scale),
                               pending_deps)
                pending_deps = []
            piece_start, piece_len = None, 0.0

        for a, b in _pairs(points):
            if a in step_ends and a != w1:
                close_piece(a)
                last_cpu = add(a, Op(COMPUTE, f"end of ProfilerStep#{step_ends[a]}", "cpu", duration_s=0.0),
                               pending_deps + ([last_cpu] if last_cpu is not None else []))
                pending_deps = []
                mk_end[step_ends[a]] = last_cpu
            if a in step_starts:
                close_piece(a)
                last_cpu = add(a, Op(COMPUTE, f"ProfilerStep#{step_starts[a]}", "cpu", duration_s=0.0), pending_deps)
                pending_deps = []
                mk.append((step_starts[a], last_cpu))
            if a in cut_set and a not in cut_rid:
                close_piece(a)
                if last_cpu is None:
                    last_cpu = add(a, Op(COMPUTE, "cpu", "cpu", duration_s=0.0))
                cut_rid[a] = last_cpu
            mid = 0.5 * (a + b)
            i = bisect.bisect_right(bs, mid) - 1
            if i >= 0 and bs[i] <= mid < be[i]:
                if piece_start is None:
                    piece_start = a
                piece_len += b - a
                continue
            # a gap [a, b]: did it wait for something of this rank that ended inside it? In a synchronising
            # CUDA call, for anything; elsewhere only for work the CPU waits on directly (gloo, p2p), and only
            # in gaps long enough to be a wait rather than interpreter overhead between two ops
            k = bisect.bisect_right(sync_starts, mid) - 1
            in_sync = k >= 0 and sync_starts[k] <= mid < sync_ends[k]
            cand = []
            if in_sync or b - a >= MIN_WAIT_GAP_S:
                # issued before the gap and ended inside it: the item cannot depend on CPU work after it
                lo = bisect.bisect_left(end_times, a - TOL_S)
                hi = bisect.bisect_right(end_times, b)
                cand = [j for j in end_order[lo:hi] if items[j].issue <= a
                        and (in_sync or not items[j].stream.startswith("cuda:"))]
            if cand:
                close_piece(a)
                j = max(cand, key=lambda j: items[j].end)
                rest = b - max(a, items[j].end)
                last_cpu = add(a, Op(COMPUTE, text(f"after wait ({items[j].op.name[:40]})"), "cpu",
                                     duration_s=max(rest, 0.0) / cpu_scale), pending_deps + [("item", j)])
                pending_deps = []
            else:
                piece_start = a if piece_start is None else piece_start
                piece_len += b - a
        close_piece(w1)
        for c in cuts:
            if c not in cut_rid:
                cut_rid[c] = last_cpu
        end_rid = add(w1, Op(COMPUTE, "end of last step", "cpu", duration_s=0.0),
                      pending_deps + ([last_cpu] if last_cpu is not None else []))
        last_step = max(step_ends.values())
        mk_end[last_step] = end_rid
        # ---------------------------------------------------------------- device / comm items
        by_stream: dict[str, list[int]] = {}
        for j, it in enumerate(items):
            by_stream.setdefault(it.stream, []).append(j)
        for stream, js in by_stream.items():
            js.sort(key=lambda j: (items[j].start, items[j].issue))
            prev_end = -math.inf
            for j in js:
                it = items[j]
                deps = []
                src = cut_rid.get(it.issue)
                if src is not None:
                    deps.append(src)
                ready = max(it.issue, prev_end)
                lag = it.start - ready
                x = None
                if lag > TOL_S:
                    lo = bisect.bisect_left(end_times, ready - TOL_S)
                    hi = bisect.bisect_right(end_times, it.start + TOL_S)
                    cand = [k for k in end_order[lo:hi] if items[k].stream != stream and
                            items[k].start < it.start]
                    if cand:
                        x = max(cand, key=lambda k: items[k].end)
                        deps.append(("item", x))
                        lag = it.start - max(ready, items[x].end)
                key = it.issue if it.op.kind != COMPUTE or stream.startswith("cuda") else it.start
                if lag > MIN_DELAY_S:
                    it.delay_rid = add(key - 1e-12, Op(COMPUTE, "delay", stream, duration_s=lag), deps)
                    deps = []
                it.rid = it.done_rid = add(key, it.op, deps)
                if it.tail > MIN_DELAY_S:
                    it.done_rid = add(key + 1e-12, Op(COMPUTE, "completion", stream, duration_s=it.tail), [it.rid])
                prev_end = max(prev_end, it.end)
        # ---------------------------------------------------------------- resolve and order
        def resolve(d):
            return items[d[1]].done_rid if isinstance(d, tuple) else d
        # program order: by key, then by record id (a stable sort)
        order = np.argsort(np.frombuffer(rec_key, dtype=float), kind="stable")
        pos = np.empty(len(order), dtype=np.int64)
        pos[order] = np.arange(len(order))
        pos = pos.tolist()
        prog = []
        for rid in order.tolist():
            op, deps = rec_op[rid], rec_deps[rid]
            op.deps = tuple(pos[d] for d in sorted({resolve(d) for d in deps} - {rid})) if deps else ()
            prog.append(op)
        programs.ops[rank_map[r]] = prog
        markers[rank_map[r]] = [(s, pos[i], pos[mk_end[s]]) for s, i in mk if s in mk_end]
        del pos, order, end_order, end_times, points
    programs.meta.update({"source": "trace replay", "trace": str(trace.path)})
    measured = steps[steps["rank"].isin(ranks)][["rank", "step", "dur"]].copy()
    return ReplayPlan(programs, markers, measured, rank_map, trace)


def _engine_kind(kind: str) -> str:
    return kind if kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce",
                            "barrier") else "all_reduce"


class CalibratedCommModel(SimpleCostModel):
    """Cost model that times communication with a calibration's alpha-beta fits (same backend, the
    nearest group size of the kind); compute keeps its measured durations. For a replay that checks the
    fits against the trace they came from, or another trace of the same machine."""

    def __init__(self, calibration, backend: str, scope: str = "intra", any_backend: bool = False):
        """``any_backend``: fall back on the fits of other backends (``--calibration-scope any``); else a
        calibration without fits of the trace's backend is a ConfigError."""
        super().__init__()
        self.calibration, self.backend, self.scope = calibration, backend, scope
        self.any_backend = any_backend
        backends = sorted({c.backend for c in calibration.collectives})
        if backends and backend not in backends and not any_backend:
            raise ConfigError(f"the calibration's collective fits are for {', '.join(backends)}, the trace ran "
                              f"{backend} (measure on this machine, or give --calibration-scope any to apply "
                              f"them anyway)")

    def comm_time_s(self, request) -> float:
        n = len(request.ranks)
        fit = (self.calibration.collective_fit(request.kind, n, self.scope, self.backend)
               or (self.calibration.collective_fit(request.kind, n, self.scope) if self.any_backend else None))
        if fit is None:
            have = sorted({f"{c.kind}/{c.backend}" for c in self.calibration.collectives})
            raise ConfigError(f"the calibration has no fit for {request.kind} ({self.backend}, {self.scope}); "
                              f"it has: {', '.join(have) or 'no collective fits'}")
        return fit.time_s(request.size_bytes, n)


def _peer_notes(plan: ReplayPlan, trace: Trace, comm_what_if: bool) -> list[str]:
    """What a communication what-if cannot change: collectives and transfers whose peers are not in the
    trace replay as their measured times (they are compute ops named "... absent)")."""
    ops = [op for prog in plan.programs.ops.values() for op in prog]
    peerless = sum(1 for op in ops if op.kind == COMPUTE and op.name.endswith("absent)"))
    linked = sum(1 for op in ops if op.kind != COMPUTE)
    notes = []
    if peerless:
        notes.append(f"{peerless} communication op(s) have no peers in the trace ({len(trace.ranks)} of "
                     f"{trace.world_size} ranks recorded): replayed with their measured times"
                     + ("; the communication what-if does not change them" if comm_what_if else ""))
    if comm_what_if and not linked:
        notes.append("the communication what-if changes nothing: no collective or transfer of the trace has its "
                     "peers in it (record every rank)")
    bad = {info.path.name: info.negative_durations for info in trace.ranks.values() if info.negative_durations}
    if bad:
        notes.append(f"{sum(bad.values()):,} event(s) with a negative or unreadable duration read as 0 s ("
                     + ", ".join(f"{name}: {n:,}" for name, n in sorted(bad.items())[:4])
                     + (", ..." if len(bad) > 4 else "") + "): a profiler clock glitch or an edited file; "
                     "measured and replayed times that hold them are not to be trusted")
    return notes


# --------------------------------------------------------------------------------------------- replay
def replay(trace_path, *, cluster: str | None = None, gpus: int | None = None, scale_bandwidth: float = 1.0,
           scale_compute: float = 1.0, network: str = "analytical", calibration=None,
           allow_mixed: bool = False, calibration_scope: str = "matching") -> dict:
    """Replay a trace (path or ``Trace``) and compare predicted with measured step times (see module doc).
    ``calibration_scope`` "any" applies a calibration's fits measured on other hardware or another backend
    (``simulator.calibration.CALIBRATION_SCOPES``)."""
    from simulator.calibration import check_scope
    from simulator.engine import run

    check_scope(calibration_scope, calibration)

    for name, v in (("--scale-compute", scale_compute), ("--scale-bandwidth", scale_bandwidth)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 1e-6 <= v <= 1e6):
            raise ConfigError(f"{name} must be a factor from 1e-6 to 1e6, got {v}")
    trace = trace_path if isinstance(trace_path, Trace) else check_one_run(load_trace(trace_path), allow_mixed)
    what_if = []
    cost = SimpleCostModel()
    if cluster is not None:
        from simulator.calibration import Calibration
        from topologies import load_cluster
        from topologies.cost import ClusterCostModel
        cal = calibration if (calibration is None or isinstance(calibration, Calibration)) \
            else Calibration.load(calibration)
        cl = load_cluster(cluster, gpus)          # gpus None: the preset's default size
        n = cl.world_size
        if n < trace.world_size:
            raise ConfigError(f"cluster {cluster!r} with {n} GPUs is smaller than the trace's world size "
                              f"{trace.world_size}; pass --gpus")
        cost = ClusterCostModel(cl, network=network, calibration=cal, calibration_scope=calibration_scope)
        what_if.append(f"collectives timed on {cluster} ({n} GPUs, {network} network"
                       f"{', calibrated' if cal is not None else ''}); trace ranks on its first GPUs")
    elif calibration is not None:
        from simulator.calibration import Calibration
        cal = calibration if isinstance(calibration, Calibration) else Calibration.load(calibration)
        forced = calibration_scope == "any"
        cost = CalibratedCommModel(cal, trace.backend, "intra" if trace.shared_clock else "inter", any_backend=forced)
        what_if.append(f"collectives timed by the calibration's alpha-beta fits ({trace.backend}"
                       + (", other backends' where it has none: --calibration-scope any" if forced else "") + ")")
    if gpus is not None and cluster is None:
        raise ConfigError("--gpus applies to a what-if --cluster; give --cluster too")
    if network != "analytical" and cluster is None:
        raise ConfigError(f"--network {network} models a what-if --cluster's network; give --cluster too")
    if scale_compute != 1.0:
        what_if.append(f"compute x{1 / scale_compute:.3g} time")
    if scale_bandwidth != 1.0:
        what_if.append(f"communication x{1 / scale_bandwidth:.3g} time")
    plan = build_programs(trace, scale_compute=scale_compute, scale_bandwidth=scale_bandwidth,
                          measured_collectives=cluster is None and calibration is None,
                          backend_kinds=cluster is None and calibration is not None)
    if (cluster is not None or calibration is not None) and scale_bandwidth != 1.0:
        cost = ScaledCostModel(cost, comm_scale=1.0 / scale_bandwidth)
    notes = _peer_notes(plan, trace, what_if and (scale_bandwidth != 1.0 or cluster is not None
                                                  or calibration is not None))
    result = run(plan.programs, cost)
    rows = []
    inv = {v: k for k, v in plan.rank_map.items()}
    for sim_rank, marks in plan.markers.items():
        starts = result.start_s[sim_rank]
        for step, i_start, i_end in marks:
            rows.append({"rank": inv[sim_rank], "step": step, "predicted": starts[i_end] - starts[i_start]})
    pred = pd.DataFrame(rows, columns=["rank", "step", "predicted"])
    if pred.empty:
        raise TraceError(f"{trace.path}: no complete profiled step to replay")
    df = plan.measured.rename(columns={"dur": "measured"}).merge(pred, on=["rank", "step"])
    df["error"] = (df["predicted"] - df["measured"]) / df["measured"]
    per_rank = []
    for r, g in df.groupby("rank"):
        per_rank.append({"rank": int(r), "measured_step_time_s": float(g["measured"].median()),
                         "predicted_step_time_s": float(g["predicted"].median()),
                         "error": float(g["error"].median()),
                         "steps": {int(s): {"measured_s": float(m), "predicted_s": float(p)}
                                   for s, m, p in zip(g["step"], g["measured"], g["predicted"])}})
    per_step = [{"step": int(s), "measured_s": float(g["measured"].max()), "predicted_s": float(g["predicted"].max())}
                for s, g in df.groupby("step")]
    unstepped = sorted(set(int(r) for r in trace.ranks) - set(int(r) for r in df["rank"]))
    if unstepped:       # (they were replayed as the others' peers, but have no step of their own to compare)
        notes.append(f"rank(s) {', '.join(map(str, unstepped[:8]))} have no complete profiled step "
                     f"(ProfilerStep#N) shared with the replay: left out of the per-rank table and the error")
    # (without a cluster or calibration what-if the replay without the factor is the measured step itself)
    if scale_compute > 1.0 and trace.has_gpu and cluster is None and calibration is None \
            and abs(float(df["error"].median())) < 0.005:
        notes.append(f"GPU kernels ran {scale_compute:g}x faster, yet the replayed step moved by less than 0.5% "
                     f"from the measured one: it is bound by the CPU (kernel launches and framework time, replayed "
                     f"as measured) or by waits on other ranks, which faster kernels do not shorten")
    return {
        "trace": str(trace.path), "world_size": trace.world_size, "ranks_in_trace": len(trace.ranks),
        "backend": trace.backend, "steps": int(df["step"].nunique()), "ops": plan.programs.op_count,
        "measured_step_time_s": float(df["measured"].median()),
        "predicted_step_time_s": float(df["predicted"].median()),
        "error": float(df["error"].median()), "abs_error_median": float(df["error"].abs().median()),
        "per_rank": per_rank, "per_step": per_step, "what_if": "; ".join(what_if) or None, "notes": notes,
        "simulated_wall_s": float(result.wall_time_s),
    }
