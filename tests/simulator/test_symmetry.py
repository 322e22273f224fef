"""Symmetry by cost signature: classes split where placement makes communication cost differ, and one
representative per refined class reproduces the full per-rank simulation (the reference)."""
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from schedules import build_programs
from schedules.models import custom_model
from schedules.plan import ParallelPlan
from simulator.costs import SimpleCostModel
from simulator.errors import TopologyError
from simulator.engine import run
from simulator.program import Programs, collective, compute, validate
from simulator.symmetry import refine_classes, symmetry_problem
from topologies import load_cluster
from topologies.cost import ClusterCostModel

MODEL = custom_model(layers=6, hidden=512, heads=8, vocab=8000)


def _compare(model, plan, cluster, network):
    """(refinement, class-mode step time, full-mode step time) of one plan on one cluster."""
    cost = ClusterCostModel(cluster, network=network)
    ref = refine_classes(build_programs(model, plan, plan.world_size, symmetric=True), cost)
    validate(ref.programs)
    t_class = run(ref.programs, cost).step_time_s
    t_full = run(build_programs(model, plan, plan.world_size, symmetric=False), cost).step_time_s
    return ref, t_class, t_full


@pytest.mark.parametrize("network", ["analytical", "flow"])
def test_stages_across_leaf_switches_split_classes_and_equal_full_mode(network):
    # 9 nodes of 8 GPUs, 4 nodes per leaf: stage 1 straddles leaves 0 and 1, stage 2 leaves 1 and 2
    plan = ParallelPlan(tp=8, pp=3, dp=3, global_batch=6, seq=256, schedule="1f1b", zero=1)
    cluster = load_cluster("dgx-a100", plan.world_size, leaf_down=4)
    ref, t_class, t_full = _compare(MODEL, plan, cluster, network)
    assert 3 < ref.classes < plan.world_size
    assert "placement is uneven" in ref.note()
    assert symmetry_problem(build_programs(MODEL, plan, symmetric=True), ClusterCostModel(cluster)) is not None
    assert t_class == pytest.approx(t_full, rel=1e-9)


def test_even_placement_keeps_the_generator_classes():
    plan = ParallelPlan(tp=8, pp=2, dp=4, global_batch=8, seq=256, zero=1)
    progs = build_programs(MODEL, plan, symmetric=True)
    ref = refine_classes(progs, ClusterCostModel(load_cluster("dgx-h100", 64)))
    assert ref.programs is progs and ref.classes == 2 and ref.note() is None


def test_a_slower_device_gets_a_class_of_its_own():
    class OneSlow(SimpleCostModel):
        def device_key(self, rank):
            return "slow" if rank == 5 else "fast"

    p = Programs(world_size=8, ops={})
    g = p.add_group(range(8), "dp")
    p.ops[0] = [compute("c", flops=1e9), collective("ar", "all_reduce", g, 1e6, deps=(0,))]
    p.classes = {0: tuple(range(8))}
    ref = refine_classes(p, OneSlow())
    assert sorted(ref.programs.classes.values()) == [(0, 1, 2, 3, 4, 6, 7), (5,)]
    assert ref.reasons[0] == "rank 5 runs on different hardware than rank 0"
    validate(ref.programs)


def test_split_members_synchronise_through_their_groups():
    """Classes that share a group meet at one rendezvous: the new representative's collectives and peers
    are its own, and a class-mode run deadlocks nowhere and equals the full run."""
    plan = ParallelPlan(tp=4, pp=4, dp=2, global_batch=8, seq=256, schedule="interleaved", virtual_stages=2)
    cluster = load_cluster("dgx-h100", plan.world_size, gpus_per_node=4, leaf_down=3, rail_optimised=False)
    ref, t_class, t_full = _compare(custom_model(layers=8, hidden=512, heads=8, vocab=8000), plan, cluster,
                                    "analytical")
    for rep, members in ref.programs.classes.items():
        assert rep in members
        for op in ref.programs.ops[rep]:
            if op.group is not None:
                assert rep in ref.programs.groups[op.group].ranks
    assert t_class == pytest.approx(t_full, rel=1e-9)


@st.composite
def uneven_plans(draw):
    tp = draw(st.sampled_from([2, 4, 8]))
    pp = draw(st.integers(1, 5))
    dp = draw(st.sampled_from([d for d in range(1, 7) if tp * pp * d % 8 == 0] or [8 // tp]))
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "zb"] + (["interleaved"] if pp > 1 else [])))
    v = 2 if schedule == "interleaved" else 1
    m = draw(st.integers(1, 3)) * (pp if schedule == "interleaved" else 1)
    overlap = schedule != "zb" and draw(st.booleans())      # TP communication overlap (needs SP)
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, global_batch=m * dp, seq=128, schedule=schedule, virtual_stages=v,
                        zero=draw(st.sampled_from([0, 1, 3])), bucket_bytes=2e6, sp=overlap, tp_comm_overlap=overlap)
    gpn = draw(st.sampled_from([2, 4, 8]))
    cluster = dict(gpus_per_node=gpn, leaf_down=draw(st.sampled_from([3, 5, 6])),
                   rail_optimised=draw(st.sampled_from([False, False, True])),
                   tiers=draw(st.sampled_from([2, 3])))
    layers = pp * v * draw(st.integers(1, 2))
    return custom_model(layers=layers, hidden=256, heads=8, vocab=4000), plan, cluster


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uneven_plans(), st.sampled_from(["analytical", "flow"]))
def test_class_mode_equals_full_mode_on_uneven_placements(case, network):
    model, plan, over = case
    try:
        cluster = load_cluster("dgx-h100", plan.world_size, **over)
    except TopologyError:                          # an impossible fabric for this size: not our question
        assume(False)
    ref, t_class, t_full = _compare(model, plan, cluster, network)
    event(f"classes split: {ref.note() is not None}")
    assert t_full > 0
    assert t_class == pytest.approx(t_full, rel=1e-9)
    assert sum(len(m) for m in ref.programs.classes.values()) == plan.world_size


def test_512_ranks_uneven_class_mode_equals_full_mode():
    # DP 8 x PP 8 x TP 8 on nodes of 8, 12 NICs per leaf: DP groups and PP neighbours cross leaves unevenly
    plan = ParallelPlan(tp=8, pp=8, dp=8, global_batch=16, seq=128, schedule="1f1b", zero=1)
    cluster = load_cluster("dgx-h100", 512, leaf_down=12)
    ref, t_class, t_full = _compare(custom_model(layers=8, hidden=256, heads=8, vocab=4000), plan, cluster,
                                    "analytical")
    assert 8 < ref.classes < 512
    assert t_class == pytest.approx(t_full, rel=1e-9)


def _straggler_runs(model, plan, cluster, network, stragglers):
    """(refinement, class-mode SimResult, full-mode SimResult) with ``stragglers`` (rank -> factor)."""
    from topologies.faults import FaultSpec, apply_faults
    cost, _ = apply_faults(ClusterCostModel(cluster, network=network), cluster, FaultSpec(stragglers=stragglers),
                           plan.world_size)
    ref = refine_classes(build_programs(model, plan, plan.world_size, symmetric=True), cost)
    validate(ref.programs)
    return ref, run(ref.programs, cost), run(build_programs(model, plan, plan.world_size, symmetric=False), cost)


def _same_timing(cls, full):
    """Every member of every class ends every op when the full run's rank does (to 1e-9 of the step)."""
    tol = 1e-9 * full.step_time_s
    assert cls.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    ends, class_ends = full.rank_end_s, cls.rank_end_s
    assert set(class_ends) == set(ends)
    for m, t in ends.items():
        assert abs(class_ends[m] - t) <= tol, m
    for rep, members in cls.programs.classes.items():     # op by op, for every member
        for m in members:
            assert len(cls.end_s[rep]) == len(full.end_s[m])
            assert all(abs(a - b) <= tol for a, b in zip(cls.end_s[rep], full.end_s[m])), (rep, m)


@pytest.mark.parametrize("network", ["analytical", "flow"])
def test_stragglers_get_classes_of_their_own_and_equal_full_mode(network):
    # one slow GPU in a TP group of stage 1, one mildly slow GPU in another replica's stage 0
    plan = ParallelPlan(tp=4, pp=2, dp=4, global_batch=8, seq=256, schedule="1f1b", zero=1)
    cluster = load_cluster("dgx-h100", plan.world_size)
    ref, cls, full = _straggler_runs(MODEL, plan, cluster, network, {5: 1.3, 18: 1.05})
    slow_free = run(build_programs(MODEL, plan, plan.world_size, symmetric=True),
                    ClusterCostModel(cluster, network=network))
    assert 2 < ref.classes < plan.world_size
    assert "straggler" in ref.note() and "rank 5 is a straggler (compute x1.3" in ref.note()
    assert cls.step_time_s > slow_free.step_time_s
    _same_timing(cls, full)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uneven_plans(), st.sampled_from(["analytical", "flow"]), st.data())
def test_class_mode_with_stragglers_equals_full_mode(case, network, data):
    model, plan, over = case
    try:
        cluster = load_cluster("dgx-h100", plan.world_size, **over)
    except TopologyError:
        assume(False)
    ranks = data.draw(st.sets(st.integers(0, plan.world_size - 1), min_size=1, max_size=3))
    stragglers = {r: data.draw(st.sampled_from([1.05, 1.2, 2.0])) for r in ranks}
    ref, cls, full = _straggler_runs(model, plan, cluster, network, stragglers)
    event(f"classes / ranks: {ref.classes / plan.world_size:.1f}")
    assert sum(len(m) for m in ref.programs.classes.values()) == plan.world_size
    for r in stragglers:                          # a straggler shares its class only with equally slow ranks
        rep = next(k for k, m in ref.programs.classes.items() if r in m)
        assert all(stragglers.get(m) == stragglers[r] for m in ref.programs.classes[rep])
    _same_timing(cls, full)


def test_a_new_representative_that_cannot_find_its_peer_is_a_program_error():
    """A class splits (rank 3 runs on other hardware), so rank 3 re-resolves the representative's send,
    whose peer is outside the group it names: a ProgramError, not a KeyError."""
    from simulator.errors import ProgramError
    from simulator.program import send

    class OneSlow(SimpleCostModel):
        def device_key(self, rank):
            return "slow" if rank == 3 else "fast"

    p = Programs(world_size=4, ops={})
    g = p.add_group((0, 3), "pp")
    p.add_group((1, 2), "pp")
    p.ops[0] = [compute("c", flops=1e9), send("tx", 2, 1e6, deps=(0,))]
    p.ops[0][1].group = g
    p.classes = {0: (0, 3), 1: (1, 2)}
    p.ops[1] = [compute("c", flops=1e9)]
    with pytest.raises(ProgramError, match="peer 2 is not in its group"):
        refine_classes(p, OneSlow())


def test_group_table_is_group_of_for_every_rank():
    """The family -> rank -> group table (whole families at once) answers as Programs.group_of, also when a
    rank is in two groups of one family (the first one)."""
    from simulator.symmetry import _Signatures

    p = Programs(world_size=6, ops={})
    for ranks, fam in [((0, 1), "dp"), ((2, 3), "dp"), ((0, 2, 4), "tp"), ((1, 3, 5), "tp"), ((3, 4), "tp"),
                       ((5,), "pp")]:
        p.add_group(ranks, fam)
    p.ops[0] = [compute("c", flops=1.0)]
    p.classes = {0: tuple(range(6))}
    table = _Signatures(p, SimpleCostModel())._group_table({"dp", "tp", "pp", "cp"})
    for fam, col in table.items():
        want = [p.group_of(r, fam) for r in range(6)]
        assert col.tolist() == [-1 if g is None else g for g in want]
