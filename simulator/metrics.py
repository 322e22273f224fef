"""Metrics of one simulated step, computed from the engine's per-op times (no DataFrame needed, so
they stay cheap for 16,384-rank full runs).

Per rank r with step time T (the job's step time):
- compute busy      |union of compute-op intervals|
- comm busy         |union of communication intervals| (collective / send / recv, from start to end:
                    waiting for peers is not communication)
- exposed comm      |comm busy minus compute busy|: communication no compute hides
- overlap fraction  sum_r |comm ∩ compute| / sum_r |comm busy|
- bubble            T - |compute ∪ comm|: the rank does nothing (pipeline bubble, waiting for peers)
Fractions of the job are means over ranks (weighted by the ranks a representative stands for).
Communication by parallel axis (``comm_by_axis``): the same three figures per axis (``AXIS_OF_FAMILY`` maps
process-group families to tp, cp, ep, pp, dp; dp includes FSDP / ZeRO and expert-data-parallel traffic):
total = |union of the axis's communication|, exposed = |that minus compute busy|, overlapped = total -
exposed; seconds are means over ranks, fractions are of the step time. Axes can overlap one another, so
their exposed times may add up to more than the job's exposed communication.
MFU = model FLOPs per step / (T · world size · peak FLOP/s of the device); TFLOP/s per GPU uses the same
model FLOPs; ``hardware_tflops_per_gpu`` counts the FLOPs actually executed (recomputation included).
Units: seconds, bytes, FLOP/s.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from simulator.program import COMPUTE

AXES = ("tp", "cp", "ep", "pp", "dp", "other")
# process-group family (schedules.generate, traces.replay) -> parallel axis; "embed" (tied embedding
# gradients between the first and last pipeline stage) exists because of the pipeline
AXIS_OF_FAMILY = {"tp": "tp", "cp": "cp", "ep": "ep", "pp": "pp", "embed": "pp", "dp": "dp", "edp": "dp",
                  "dp_cp": "dp", "fsdp": "dp"}


def axis_of(programs, op) -> str:
    """The parallel axis of a communication op ("other" for groups of no known family)."""
    if op.group is None or not (0 <= op.group < len(programs.groups)):
        return "other"
    return AXIS_OF_FAMILY.get(programs.groups[op.group].family, "other")


def merge_intervals(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the union of [starts[i], ends[i]] (empty and NaN ones dropped)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    ok = ~(np.isnan(s) | np.isnan(e)) & (e > s)
    s, e = s[ok], e[ok]
    if len(s) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_max = np.maximum.accumulate(e)
    # a new merged segment begins where the start lies beyond every earlier end
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    seg = np.cumsum(new) - 1
    out_e = np.zeros(seg[-1] + 1)
    np.maximum.at(out_e, seg, e)
    return s[new], out_e


def _sorted_union(s: np.ndarray, e: np.ndarray) -> float:
    """``union_length`` of intervals already in start order (stable), none empty or NaN: the same segments,
    summed in the same order (a segment ends at the running maximum of its last interval)."""
    if not len(s):
        return 0.0
    run_max = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    last = np.empty(len(s), dtype=bool)
    last[:-1] = new[1:]
    last[-1] = True
    return float(np.sum(run_max[last] - s[new]))


def union_length(starts, ends) -> float:
    """Total length covered by intervals [starts[i], ends[i]] (seconds)."""
    s, e = merge_intervals(starts, ends)
    return float(np.sum(e - s))


@dataclass
class RankMetrics:
    rank: int
    represents: int
    end_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    overlap_s: float
    idle_s: float
    executed_flops: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    comm_by_axis: dict = field(default_factory=dict)    # axis -> (total_s, exposed_s)


@dataclass
class Metrics:
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    exposed_comm_fraction: float
    overlap_fraction: float
    compute_fraction: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    fits_in_memory: bool
    world_size: int
    events_simulated: int
    represented_ops: int
    wall_time_s: float
    mode: str
    per_rank: list[RankMetrics] = field(default_factory=list, repr=False)
    comm_by_axis: dict = field(default_factory=dict)   # axis -> {total_s, exposed_s, overlapped_s, *_fraction}

    def to_dict(self, per_rank: bool = False) -> dict:
        d = asdict(self)
        if not per_rank:
            d.pop("per_rank")
        return d


def _axis_codes(programs) -> np.ndarray:
    """Index into AXES of every process group's axis, with one more entry (the last) for "other"."""
    return np.array([AXES.index(AXIS_OF_FAMILY.get(g.family, "other")) for g in programs.groups]
                    + [AXES.index("other")], dtype=np.int64)


def rank_metrics(result, rank: int, step_time_s: float, axis_codes: np.ndarray | None = None) -> RankMetrics:
    prog = result.programs.ops[rank]
    start = np.asarray(result.start_s[rank], dtype=float)
    end = np.asarray(result.end_s[rank], dtype=float)
    is_compute = np.array([op.kind == COMPUTE for op in prog], dtype=bool)
    done = ~np.isnan(end)
    m = ~is_compute & done
    # every union below is of intervals in start order: sort once (stable), then select with masks
    with np.errstate(invalid="ignore"):
        ok = done & ~np.isnan(start) & (end > start)
    order = np.argsort(start, kind="stable")
    S, E = start[order], end[order]
    cS, mS = (is_compute & ok)[order], (m & ok)[order]
    comp = _sorted_union(S[cS], E[cS])
    comm = _sorted_union(S[mS], E[mS])
    both = _sorted_union(S[ok[order]], E[ok[order]])
    overlap = comp + comm - both
    by_axis = {}
    if m.any():
        codes = _axis_codes(result.programs) if axis_codes is None else axis_codes
        other = len(codes) - 1                  # axis_of: "other" for no group or an unknown one
        g = np.array([-1 if op.group is None else op.group for op in prog], dtype=np.int64)
        axes = codes[np.where((g >= 0) & (g < other), g, other)][order]
        m_sorted = m[order]
        for k, ax in enumerate(AXES):
            sel = m_sorted & (axes == k)
            if sel.any():
                sel &= mS
                total = _sorted_union(S[sel], E[sel])
                with_comp = _sorted_union(S[sel | cS], E[sel | cS])     # the axis's communication or compute
                by_axis[ax] = (total, with_comp - comp)
    flops = float(sum([op.flops for op in prog if op.kind == COMPUTE]))
    cost = result.cost_model
    return RankMetrics(
        rank=rank, represents=result.programs.multiplicity(rank),
        end_s=float(np.nanmax(end)) if done.any() else 0.0,
        compute_s=comp, comm_s=comm, exposed_comm_s=comm - overlap, overlap_s=overlap,
        idle_s=max(0.0, step_time_s - both), executed_flops=flops,
        peak_memory_bytes=peak_memory(result, rank),
        memory_capacity_bytes=float(cost.memory_capacity_bytes(rank)),
        comm_by_axis=by_axis,
    )


def memory_events(result, rank: int):
    """(times_s, deltas_bytes, categories) of one rank's alloc (at op start) and free (at op end) events,
    sorted by time with frees before allocs at the same instant."""
    prog = result.programs.ops[rank]
    ai, ab, ac, fi, fb, fc = [], [], [], [], [], []       # op index, bytes, category of allocs / frees
    for i, op in enumerate(prog):
        if op.alloc:
            for cat, b in op.alloc:
                ai.append(i); ab.append(b); ac.append(cat)
        if op.free:
            for cat, b in op.free:
                fi.append(i); fb.append(-b); fc.append(cat)
    if not ai and not fi:
        return np.zeros(0), np.zeros(0), []
    st = np.asarray(result.start_s[rank], dtype=float)[np.asarray(ai, dtype=np.int64)]
    en = np.asarray(result.end_s[rank], dtype=float)[np.asarray(fi, dtype=np.int64)]
    ok_a, ok_f = ~np.isnan(st), ~np.isnan(en)              # ops that started / ended
    times = np.concatenate((st[ok_a], en[ok_f]))
    if not len(times):
        return np.zeros(0), np.zeros(0), []
    deltas = np.concatenate((np.asarray(ab, dtype=float)[ok_a], np.asarray(fb, dtype=float)[ok_f]))
    cats = [c for c, k in zip(ac, ok_a.tolist()) if k] + [c for c, k in zip(fc, ok_f.tolist()) if k]
    order = np.concatenate((np.ones(int(ok_a.sum()), dtype=np.int64), np.zeros(int(ok_f.sum()), dtype=np.int64)))
    # stable: events of one kind at one instant keep program order, as when they were listed op by op
    idx = np.lexsort((order, times))
    return times[idx], deltas[idx], [cats[i] for i in idx]


def peak_memory(result, rank: int) -> float:
    """Static memory plus the highest level reached by the rank's alloc/free events (bytes)."""
    static = sum(result.programs.static_memory.get(rank, {}).values())
    _, deltas, _ = memory_events(result, rank)
    if len(deltas) == 0:
        return float(static)
    return float(static + max(0.0, np.max(np.cumsum(deltas))))


def compute_metrics(result, per_rank: bool = True) -> Metrics:
    """Metrics of a SimResult (see module docstring)."""
    p = result.programs
    T = result.step_time_s
    ranks = sorted(p.ops)
    codes = _axis_codes(p)
    rms = [rank_metrics(result, r, T, codes) for r in ranks]
    weights = np.array([rm.represents for rm in rms], dtype=float)
    W = weights.sum()
    cost = result.cost_model

    def wmean(vals):
        return float(np.dot(weights, vals) / W) if W else 0.0

    comm_total = float(np.dot(weights, [rm.comm_s for rm in rms]))
    overlap_total = float(np.dot(weights, [rm.overlap_s for rm in rms]))
    world = p.world_size
    peak = float(np.mean([cost.peak_flops(r) for r in ranks])) if ranks else 0.0
    model_flops = p.model_flops_per_step
    executed = float(np.dot(weights, [rm.executed_flops for rm in rms]))
    tflops = model_flops / (T * world) / 1e12 if T > 0 else 0.0
    peak_mem = max((rm.peak_memory_bytes for rm in rms), default=0.0)
    fits = all(rm.peak_memory_bytes <= rm.memory_capacity_bytes for rm in rms)
    cap = min((rm.memory_capacity_bytes for rm in rms), default=0.0)
    return Metrics(
        step_time_s=T,
        tokens_per_s=p.tokens_per_step / T if T > 0 else 0.0,
        tflops_per_gpu=tflops,
        hardware_tflops_per_gpu=executed / (T * world) / 1e12 if T > 0 else 0.0,
        mfu=model_flops / (T * world * peak) if T > 0 and peak > 0 else 0.0,
        bubble_fraction=wmean([rm.idle_s / T if T else 0.0 for rm in rms]),
        exposed_comm_fraction=wmean([rm.exposed_comm_s / T if T else 0.0 for rm in rms]),
        overlap_fraction=overlap_total / comm_total if comm_total > 0 else 0.0,
        compute_fraction=wmean([rm.compute_s / T if T else 0.0 for rm in rms]),
        peak_memory_bytes=peak_mem,
        memory_capacity_bytes=cap,
        fits_in_memory=fits,
        world_size=world,
        events_simulated=result.events_simulated,
        represented_ops=p.represented_op_count,
        wall_time_s=result.wall_time_s,
        mode=result.mode,
        per_rank=rms if per_rank else [],
        comm_by_axis=_by_axis(rms, weights, T),
    )


def _by_axis(rms, weights, T) -> dict:
    """Job-level comm_by_axis: per axis the rank-weighted mean seconds and their fractions of the step."""
    out = {}
    W = weights.sum()
    for ax in AXES:
        if not any(ax in rm.comm_by_axis for rm in rms) or not W:
            continue
        tot = float(np.dot(weights, [rm.comm_by_axis.get(ax, (0.0, 0.0))[0] for rm in rms]) / W)
        exp = float(np.dot(weights, [rm.comm_by_axis.get(ax, (0.0, 0.0))[1] for rm in rms]) / W)
        d = {"total_s": tot, "exposed_s": exp, "overlapped_s": tot - exp}
        d.update({k.replace("_s", "_fraction"): (v / T if T > 0 else 0.0) for k, v in list(d.items())})
        out[ax] = d
    return out
