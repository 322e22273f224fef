"""Property tests (hypothesis) of the engine on random, deadlock-free programs.

Programs are generated from one global sequence of events (compute on a rank, a collective on a group,
a send/recv between two ranks); every participant appends its op in that order, so executing the events
in sequence is always possible and the engine must finish.
"""
import math
from collections import defaultdict

from hypothesis import given, settings, strategies as st

from simulator.costs import SimpleCostModel
from simulator.engine import run
from simulator.program import COLLECTIVE, Programs, collective, compute, recv, send

STREAMS = ("compute", "comm", "aux")


@st.composite
def random_programs(draw):
    n = draw(st.integers(1, 5))
    progs = Programs(world_size=n, ops={r: [] for r in range(n)})
    subsets = draw(st.lists(st.sets(st.integers(0, n - 1), min_size=1, max_size=n), min_size=1, max_size=3))
    gids = [progs.add_group(sorted(s), f"g{i}") for i, s in enumerate(subsets)]
    n_events = draw(st.integers(1, 25))
    for e in range(n_events):
        kind = draw(st.sampled_from(["compute", "compute", "collective", "p2p"]))
        dur = draw(st.floats(0.0, 5.0, allow_nan=False))

        def deps_for(rank):
            prog = progs.ops[rank]
            if not prog:
                return ()
            return tuple(sorted(set(draw(st.lists(st.integers(0, len(prog) - 1), max_size=2)))))

        if kind == "compute" or (kind == "p2p" and n < 2):
            r = draw(st.integers(0, n - 1))
            progs.ops[r].append(compute(f"c{e}", 0, stream=draw(st.sampled_from(STREAMS)), deps=deps_for(r),
                                        duration_s=dur))
        elif kind == "collective":
            g = draw(st.sampled_from(gids))
            size = float(draw(st.integers(0, 10**9)))
            ckind = draw(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast"]))
            for r in progs.groups[g].ranks:
                progs.ops[r].append(collective(f"x{e}", ckind, g, size, stream=draw(st.sampled_from(STREAMS)),
                                               deps=deps_for(r)))
        else:
            a, b = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
            size = float(draw(st.integers(0, 10**9)))
            progs.ops[a].append(send(f"s{e}", b, size, stream=draw(st.sampled_from(STREAMS)), deps=deps_for(a)))
            progs.ops[b].append(recv(f"r{e}", a, size, stream=draw(st.sampled_from(STREAMS)), deps=deps_for(b)))
    return progs


COST = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9, alpha_s=1e-5)


@settings(max_examples=150, deadline=None)
@given(random_programs())
def test_no_op_starts_before_its_dependencies_or_stream_predecessor(progs):
    res = run(progs, COST)
    for r, prog in progs.ops.items():
        last = {}
        for i, op in enumerate(prog):
            s, e = res.start_s[r][i], res.end_s[r][i]
            assert s <= e
            for d in op.deps:
                assert s >= res.end_s[r][d] - 1e-12
            if op.stream in last:
                assert s >= res.end_s[r][last[op.stream]] - 1e-12
            last[op.stream] = i


@settings(max_examples=150, deadline=None)
@given(random_programs())
def test_members_of_a_collective_start_and_end_together(progs):
    res = run(progs, COST)
    seen = defaultdict(list)
    count = defaultdict(int)
    for r, prog in progs.ops.items():
        for i, op in enumerate(prog):
            if op.kind == COLLECTIVE:
                k = count[(r, op.group)]
                count[(r, op.group)] += 1
                seen[(op.group, k)].append((res.start_s[r][i], res.end_s[r][i]))
    for spans in seen.values():
        assert len({s for s, _ in spans}) == 1
        assert len({e for _, e in spans}) == 1


@settings(max_examples=100, deadline=None)
@given(random_programs(), st.data())
def test_step_never_longer_when_one_cost_gets_smaller(progs, data):
    base = run(progs, COST).step_time_s
    # shrink the fixed duration of one compute op ...
    candidates = [(r, i) for r, p in progs.ops.items() for i, op in enumerate(p) if op.duration_s]
    if candidates:
        r, i = data.draw(st.sampled_from(candidates))
        op = progs.ops[r][i]
        old = op.duration_s
        op.duration_s = old * data.draw(st.floats(0.0, 1.0))
        assert run(progs, COST).step_time_s <= base + 1e-9 * max(1.0, base)
        op.duration_s = old
    # ... or make the network faster
    faster = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9 * data.draw(st.floats(1.0, 100.0)),
                             alpha_s=1e-5 * data.draw(st.floats(0.0, 1.0)))
    assert run(progs, faster).step_time_s <= base + 1e-9 * max(1.0, base)


@settings(max_examples=60, deadline=None)
@given(random_programs())
def test_timeline_has_every_op_once_and_finite_times(progs):
    res = run(progs, COST)
    df = res.timeline
    assert len(df) == progs.op_count
    assert not df[["start_s", "end_s"]].isna().any().any()
    assert math.isclose(df["end_s"].max() if len(df) else 0.0, res.step_time_s)
