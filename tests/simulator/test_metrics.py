"""Metrics helpers against plain per-op references."""
import math
import random
from types import SimpleNamespace

import numpy as np

from simulator.metrics import AXES, axis_of, memory_events, rank_metrics
from simulator.program import Op, Programs


def _reference_memory_events(prog, st, en):
    """The events listed op by op (alloc at start, free at end, skipped where the time is NaN), sorted by
    time with frees first at one instant, ties in program order."""
    rows = []
    for i, op in enumerate(prog):
        for cat, b in op.alloc:
            if not math.isnan(st[i]):
                rows.append((st[i], 1, len(rows), b, cat))
        for cat, b in op.free:
            if not math.isnan(en[i]):
                rows.append((en[i], 0, len(rows), -b, cat))
    rows.sort()
    return [r[0] for r in rows], [float(r[3]) for r in rows], [r[4] for r in rows]


def _random_result(seed: int):
    rng = random.Random(seed)
    p = Programs(world_size=1, ops={})
    fams = ["tp", "dp", "pp", "embed", "weird"]
    for f in fams:
        p.add_group((0, 1 + len(p.groups)), f)
    prog, st, en = [], [], []
    for i in range(60):
        kind = rng.choice(["compute", "collective", "send"])
        mem = lambda: tuple((rng.choice(["activations", "buffers"]), float(rng.randrange(1, 5))) for _ in range(rng.randrange(3)))  # noqa: E731
        group = rng.choice([None, 0, 1, 2, 3, 4, 99]) if kind != "compute" else None
        prog.append(Op(kind, f"op{i}", alloc=mem(), free=mem(), group=group, flops=float(rng.randrange(10)),
                       collective="all_reduce" if kind == "collective" else None))
        s = float(rng.randrange(8))            # few distinct times: ties at one instant
        st.append(math.nan if rng.random() < 0.1 else s)
        en.append(math.nan if rng.random() < 0.2 or math.isnan(st[-1]) else s + rng.randrange(3))
    p.ops[0] = prog
    cost = SimpleNamespace(memory_capacity_bytes=lambda rank: 1.0)
    return SimpleNamespace(programs=p, start_s={0: np.array(st)}, end_s={0: np.array(en)}, cost_model=cost), prog, st, en


def test_memory_events_equal_the_op_by_op_listing():
    for seed in range(30):
        res, prog, st, en = _random_result(seed)
        t, d, c = memory_events(res, 0)
        rt, rd, rc = _reference_memory_events(prog, st, en)
        assert t.tolist() == rt and d.tolist() == rd and c == rc


def test_comm_by_axis_uses_each_op_groups_axis():
    for seed in range(10):
        res, prog, st, en = _random_result(seed)
        got = rank_metrics(res, 0, 10.0).comm_by_axis
        axes = {axis_of(res.programs, op) for op, e in zip(prog, en) if op.kind != "compute" and not math.isnan(e)}
        assert set(got) <= set(AXES) and set(got) == {a for a in axes if a in AXES}


def _reference_unions(prog, st, en):
    """compute, comm, both and per-axis (total, with compute) unions, each subset merged on its own."""
    from simulator.metrics import merge_intervals, union_length
    st, en = np.asarray(st), np.asarray(en)
    comp_mask = np.array([op.kind == "compute" for op in prog]) & ~np.isnan(en)
    comm_mask = np.array([op.kind != "compute" for op in prog]) & ~np.isnan(en)
    done = ~np.isnan(en)
    comp = union_length(st[comp_mask], en[comp_mask])
    out = {"compute": comp, "comm": union_length(st[comm_mask], en[comm_mask]),
           "both": union_length(st[done], en[done])}
    cs, ce = merge_intervals(st[comp_mask], en[comp_mask])
    return out, cs, ce


def test_rank_unions_equal_each_subset_merged_alone():
    for seed in range(40):
        res, prog, st, en = _random_result(seed)
        rm = rank_metrics(res, 0, 20.0)
        ref, cs, ce = _reference_unions(prog, st, en)
        assert rm.compute_s == ref["compute"] and rm.comm_s == ref["comm"]
        assert rm.overlap_s == ref["compute"] + ref["comm"] - ref["both"]
        from simulator.metrics import union_length
        s, e = np.asarray(st), np.asarray(en)
        for ax, (total, exposed) in rm.comm_by_axis.items():
            sel = np.array([op.kind != "compute" and axis_of(res.programs, op) == ax for op in prog]) & ~np.isnan(e)
            assert total == union_length(s[sel], e[sel])
            assert exposed == union_length(np.concatenate([s[sel], cs]), np.concatenate([e[sel], ce])) - ref["compute"]


def _reference_rank_metrics(result, rank, T, codes):
    """rank_metrics as it read op by op (list comprehensions per op, np.sum), before the C-level passes."""
    from simulator.metrics import COMPUTE, RankMetrics, _sorted_union
    prog = result.programs.ops[rank]
    start, end = np.asarray(result.start_s[rank], dtype=float), np.asarray(result.end_s[rank], dtype=float)
    is_compute = np.array([op.kind == COMPUTE for op in prog], dtype=bool)
    done = ~np.isnan(end)
    m = ~is_compute & done
    with np.errstate(invalid="ignore"):
        ok = done & ~np.isnan(start) & (end > start)
    order = np.argsort(start, kind="stable")
    S, E = start[order], end[order]
    cS, mS = (is_compute & ok)[order], (m & ok)[order]
    comp, comm = _sorted_union(S[cS], E[cS]), _sorted_union(S[mS], E[mS])
    both = _sorted_union(S[ok[order]], E[ok[order]])
    by_axis = {}
    if m.any():
        other = len(codes) - 1
        g = np.array([-1 if op.group is None else op.group for op in prog], dtype=np.int64)
        axes = codes[np.where((g >= 0) & (g < other), g, other)][order]
        for k, ax in enumerate(AXES):
            sel = m[order] & (axes == k)
            if sel.any():
                sel &= mS
                by_axis[ax] = (_sorted_union(S[sel], E[sel]), _sorted_union(S[sel | cS], E[sel | cS]) - comp)
    rt, rd, rc = _reference_memory_events(prog, result.start_s[rank], result.end_s[rank])
    peak = sum(result.programs.static_memory.get(rank, {}).values())
    if rd:
        peak = peak + max(0.0, float(np.max(np.cumsum(np.array(rd, dtype=float)))))
    return RankMetrics(rank=rank, represents=result.programs.multiplicity(rank),
                       end_s=float(np.nanmax(end)) if done.any() else 0.0, compute_s=comp, comm_s=comm,
                       exposed_comm_s=comm - (comp + comm - both), overlap_s=comp + comm - both,
                       idle_s=max(0.0, T - both), executed_flops=float(sum([op.flops for op in prog if op.kind == COMPUTE])),
                       peak_memory_bytes=float(peak), memory_capacity_bytes=1.0, comm_by_axis=by_axis)


def test_rank_metrics_equal_the_op_by_op_reference_to_the_bit():
    """The C-level passes (attrgetter maps, compress, np.fromiter) give every figure of the per-op reference
    exactly, on random programs with NaN times, ties, unknown groups and memory events."""
    from simulator.metrics import _axis_codes
    for seed in range(40):
        res, prog, st, en = _random_result(seed)
        codes = _axis_codes(res.programs)
        for T in (5.0, 20.0):
            got = rank_metrics(res, 0, T, codes)
            ref = _reference_rank_metrics(res, 0, T, codes)
            assert got == ref
            assert [x.hex() if isinstance(x, float) else x for x in vars(got).values() if not isinstance(x, dict)] == \
                [x.hex() if isinstance(x, float) else x for x in vars(ref).values() if not isinstance(x, dict)]


def test_compute_metrics_pauses_the_collector_and_restores_it():
    import gc
    from simulator.metrics import compute_metrics
    res, *_ = _random_result(3)
    res.step_time_s, res.events_simulated, res.wall_time_s, res.mode = 10.0, 1, 0.0, "full"
    res.cost_model.peak_flops = lambda rank: 1e15
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert compute_metrics(res).step_time_s == 10.0 and gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
