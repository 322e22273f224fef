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
from itertools import compress

import numpy as np

from simulator.program import COMPUTE, no_gc

AXES = ("tp", "cp", "ep", "pp", "dp", "other")
# process-group family (schedules.generate, traces.replay) -> parallel axis; "embed" (tied embedding
# gradients between the first and last pipeline stage) exists because of the pipeline
AXIS_OF_FAMILY = {"tp": "tp", "cp": "cp", "ep": "ep", "etp": "ep", "pp": "pp", "embed": "pp", "dp": "dp", "edp": "dp",
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
    return float((run_max[last] - s[new]).sum())     # np.sum's reduction without its wrapper


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


def _structure(result, rank: int, axis_codes: np.ndarray | None, shared: dict | None):
    """What rank_metrics reads from a rank's ops, whatever their times: (compute-op mask, each op's axis code,
    FLOPs of its compute ops, its memory events' ops and bytes (``_memory_structure``)). Ranks of one template
    (``Programs.templates``: alike but for their groups and peers) share it through ``shared``."""
    p = result.programs
    key = p.templates.get(rank) if shared is not None and p.templates else None
    hit = shared.get(key) if key is not None else None
    if hit is not None and hit[0] == len(p.ops[rank]):
        return hit[1]
    prog = p.ops[rank]
    kinds = [op.kind == COMPUTE for op in prog]
    is_compute = np.frombuffer(bytes(kinds), dtype=np.bool_) if kinds else np.zeros(0, dtype=bool)
    codes = _axis_codes(p) if axis_codes is None else axis_codes
    other = len(codes) - 1                  # axis_of: "other" for no group or an unknown one
    g = np.array([-1 if op.group is None else op.group for op in prog], dtype=np.int64)
    axes = codes[np.where((g >= 0) & (g < other), g, other)]
    flops = float(sum([op.flops for op in prog if op.kind == COMPUTE]))
    out = (is_compute, axes, flops, _memory_structure(prog))
    if key is not None:
        shared[key] = (len(prog), out)
    return out


def rank_metrics(result, rank: int, step_time_s: float, axis_codes: np.ndarray | None = None,
                 shared: dict | None = None) -> RankMetrics:
    """One rank's metrics. ``shared``: a dict kept across the ranks of one result (what ranks of one template
    share is read from their ops once)."""
    start = np.asarray(result.start_s[rank], dtype=float)
    end = np.asarray(result.end_s[rank], dtype=float)
    is_compute, axes, flops, memory = _structure(result, rank, axis_codes, shared)
    done = ~np.isnan(end)
    # the ops that ran for some time (a comparison with NaN is False), in start order (stable): every
    # union below is of these, selected with masks
    ok = np.flatnonzero(end > start)
    order = ok[np.argsort(start[ok], kind="stable")]
    S, E = start[order], end[order]
    cS = is_compute[order]
    mS = ~cS
    comp = _sorted_union(S[cS], E[cS])
    comm = _sorted_union(S[mS], E[mS])
    both = _sorted_union(S, E)
    overlap = comp + comm - both
    by_axis = {}
    m = np.flatnonzero(done & ~is_compute)         # communication that ended
    if len(m):
        axes_sorted = axes[order]
        # the axes of some communication that ended, in AXES order (asking for an index keeps numpy.ma unimported)
        for k in np.unique(axes[m], return_index=True)[0].tolist():
            sel = mS & (axes_sorted == k)
            total = _sorted_union(S[sel], E[sel])
            sel |= cS
            with_comp = _sorted_union(S[sel], E[sel])     # the axis's communication or compute
            by_axis[AXES[k]] = (total, with_comp - comp)
    cost = result.cost_model
    return RankMetrics(
        rank=rank, represents=result.programs.multiplicity(rank),
        end_s=float(np.nanmax(end)) if done.any() else 0.0,
        compute_s=comp, comm_s=comm, exposed_comm_s=comm - overlap, overlap_s=overlap,
        idle_s=max(0.0, step_time_s - both), executed_flops=flops,
        peak_memory_bytes=_peak(result, rank, memory),
        memory_capacity_bytes=float(cost.memory_capacity_bytes(rank)),
        comm_by_axis=by_axis,
    )


def _memory_structure(prog) -> tuple:
    """(op index of each alloc, its bytes, op index of each free, its bytes, the ops with allocs, the ops with
    frees) of a program: what its memory events are, whatever their times."""
    allocs = [op.alloc for op in prog]
    frees = [op.free for op in prog]
    n = len(prog)
    ops_a = list(compress(range(n), allocs))           # the ops with memory events (most have none)
    ops_f = list(compress(range(n), frees))
    ai = np.asarray([i for i in ops_a for _ in allocs[i]], dtype=np.int64)     # op index, bytes of each event
    ab = np.asarray([b for i in ops_a for _, b in allocs[i]], dtype=float)
    fi = np.asarray([i for i in ops_f for _ in frees[i]], dtype=np.int64)
    fb = np.asarray([b for i in ops_f for _, b in frees[i]], dtype=float)
    return ai, ab, fi, fb, ops_a, ops_f


def _memory_events(result, rank: int, categories: bool, structure: tuple | None = None):
    """``memory_events`` (categories: None unless asked); ``structure``: the rank's ``_memory_structure``."""
    prog = result.programs.ops[rank]
    ai, ab, fi, fb, ops_a, ops_f = _memory_structure(prog) if structure is None else structure
    if not len(ai) and not len(fi):
        return np.zeros(0), np.zeros(0), []
    st = np.asarray(result.start_s[rank], dtype=float)[ai]
    en = np.asarray(result.end_s[rank], dtype=float)[fi]
    ok_a, ok_f = ~np.isnan(st), ~np.isnan(en)              # ops that started / ended
    times = np.concatenate((st[ok_a], en[ok_f]))
    if not len(times):
        return np.zeros(0), np.zeros(0), []
    deltas = np.concatenate((ab[ok_a], -fb[ok_f]))
    n_a = int(np.count_nonzero(ok_a))
    order = np.zeros(len(times), dtype=np.int64)
    order[:n_a] = 1
    # stable: events of one kind at one instant keep program order, as when they were listed op by op
    idx = np.lexsort((order, times))
    if not categories:
        return times[idx], deltas[idx], None
    cats = list(compress([c for i in ops_a for c, _ in prog[i].alloc], ok_a.tolist())) + \
        list(compress([c for i in ops_f for c, _ in prog[i].free], ok_f.tolist()))
    return times[idx], deltas[idx], list(map(cats.__getitem__, idx.tolist()))


def memory_events(result, rank: int):
    """(times_s, deltas_bytes, categories) of one rank's alloc (at op start) and free (at op end) events,
    sorted by time with frees before allocs at the same instant."""
    return _memory_events(result, rank, True)


def peak_memory(result, rank: int) -> float:
    """Static memory plus the highest level reached by the rank's alloc/free events (bytes)."""
    return _peak(result, rank, None)


def _peak(result, rank: int, structure: tuple | None) -> float:
    static = sum(result.programs.static_memory.get(rank, {}).values())
    _, deltas, _ = _memory_events(result, rank, False, structure)
    if len(deltas) == 0:
        return float(static)
    return float(static + max(0.0, np.max(np.cumsum(deltas))))


def compute_metrics(result, per_rank: bool = True) -> Metrics:
    """Metrics of a SimResult (see module docstring)."""
    p = result.programs
    T = result.step_time_s
    ranks = sorted(p.ops)
    codes = _axis_codes(p)
    # once for every rank: NaN times of ops that never ran; the cyclic collector paused (the per-rank
    # arrays and lists make no cycles, and at 16k ranks its collections walk the millions of ops again)
    with np.errstate(invalid="ignore"), no_gc():
        shared: dict = {}
        rms = [rank_metrics(result, r, T, codes, shared) for r in ranks]
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
        exp = min(exp, tot)           # each rank's exposed <= its total; the weighted sums may round apart
        d = {"total_s": tot, "exposed_s": exp, "overlapped_s": tot - exp}
        d.update({k.replace("_s", "_fraction"): (v / T if T > 0 else 0.0) for k, v in list(d.items())})
        out[ax] = d
    return out
