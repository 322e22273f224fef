"""MoE parallel folding (Megatron-Core's expert grid, schedules.plan): expert groups, FLOPs, memory and
programs of plans whose experts fold over tp·cp·dp with their own tensor-parallel degree (etp)."""
import pytest

from schedules import build_programs, get_model, memory_per_rank
from schedules.memory import layer_param_split, shard_degrees
from schedules.plan import ParallelPlan
from simulator.costs import SimpleCostModel
from simulator.engine import run
from simulator.errors import PlanError
from simulator.program import validate

MOE = get_model("tiny-moe").__class__(**{**get_model("tiny-moe").__dict__, "experts": 16})
SEQ = 128


def megatron_expert_grid(plan, rank):
    """(etp, ep, edp) index of ``rank`` by Megatron-Core's expert RankGenerator (order tp-ep-dp-pp with
    tp = etp, cp = 1): written out from the rank formula, independently of schedules.plan."""
    per_stage = plan.tp * plan.cp * plan.dp
    local = rank % per_stage                 # the default order keeps pp outermost
    e = plan.expert_tp
    return local % e, (local // e) % plan.ep, local // (e * plan.ep)


@pytest.mark.parametrize("tp,cp,dp,pp,ep,etp", [(2, 1, 32, 2, 64, 1), (2, 1, 8, 2, 16, 1), (4, 1, 4, 2, 8, 2),
                                                (2, 2, 4, 1, 8, 1), (4, 1, 4, 1, 4, 2)])
def test_folded_groups_are_megatrons_expert_grid(tp, cp, dp, pp, ep, etp):
    plan = ParallelPlan(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, sp=True, seq=SEQ)
    assert plan.folded and plan.edp == tp * cp * dp // (ep * etp)
    for family, size, fixed in (("ep", ep, (0, 2)), ("etp", etp, (1, 2)), ("edp", plan.edp, (0, 1))):
        groups = plan.groups(family)
        assert sorted(r for g in groups for r in g) == list(range(plan.world_size))     # a partition
        for g in groups:
            assert len(g) == size and list(g) == sorted(g)
            idx = [megatron_expert_grid(plan, r) for r in g]
            assert len({plan.stage_of(r) for r in g}) == 1
            assert len({tuple(i[k] for k in fixed) for i in idx}) == 1            # fixed coordinates
            if family == "ep":
                assert [i[1] for i in idx] == list(range(ep))
                assert g == plan.ep_group(g[0]) and plan.ep_index(g[3 % ep]) == 3 % ep


def test_deepseek_v3_recipe_ep64_over_tp2_dp32_is_64_consecutive_ranks():
    """NVIDIA's DeepSeek-V3 recipe: TP2 PP16 EP64 ETP1 on 1,024 GPUs (dp 32 < ep 64)."""
    plan = ParallelPlan(tp=2, pp=16, dp=32, ep=64, etp=1, sp=True, seq=4096)
    plan.validate(get_model("deepseek-v3"), 1024)
    assert plan.ep_group(0) == tuple(range(64)) and plan.ep_group(64) == tuple(range(64, 128))
    assert plan.edp == 1 and plan.groups("dp")[0] == tuple(range(0, 64, 2))          # dense DP unchanged


def test_unfolded_plans_keep_their_groups():
    """etp = tp with ep dividing dp is the carved-out grid: groups as without etp."""
    a = ParallelPlan(tp=2, dp=8, ep=4, sp=True, seq=SEQ)
    b = ParallelPlan(tp=2, dp=8, ep=4, etp=2, sp=True, seq=SEQ)
    assert not b.folded
    for fam in ("ep", "edp", "dp", "tp"):
        assert a.groups(fam) == b.groups(fam)
    assert a.groups("etp") == a.groups("tp")


@pytest.mark.parametrize("tp,cp,dp,pp,ep", [(2, 2, 4, 2, 4), (4, 2, 8, 1, 8), (1, 4, 4, 2, 4), (2, 2, 4, 1, 2)])
def test_megatron_0_10_expert_grid_takes_cp_peers_first(tp, cp, dp, pp, ep):
    """Megatron-Core >= 0.10 builds the expert grid also with etp = tp: with cp > 1 an EP group holds a rank's
    CP peers before its DP peers (the default, ``expert_grid="folded"``); ``"carved"`` (<= 0.9) keeps EP inside
    data parallelism, a stride of tp·cp ranks. With cp = 1 the two grids are one (nothing folds)."""
    new = ParallelPlan(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, sp=tp > 1, seq=SEQ)
    old = ParallelPlan(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, sp=tp > 1, seq=SEQ, expert_grid="carved")
    assert new.folded and new.expert_tp == tp and new.edp == cp * dp // ep
    for r in range(new.world_size):
        t, e, d = megatron_expert_grid(new, r)
        assert new.ep_index(r) == e
        local = r % (tp * cp * dp)
        c, k = (local // tp) % cp, local // (tp * cp)           # the rank's cp and dp coordinates
        assert e == (c + cp * k) % ep                           # CP peers first
        g = new.ep_group(r)
        assert len(g) == ep and {megatron_expert_grid(new, x)[0] for x in g} == {t}
        assert {(x % (tp * cp)) // tp for x in g} == set(range(min(cp, ep)))
        # the carved grid: EP among the DP peers with the same cp index, ranks tp·cp apart
        assert old.ep_group(r) == tuple(sorted(old.ep_group(r)))
        assert {(x % (tp * cp)) // tp for x in old.ep_group(r)} == {c}
        assert len({x // (tp * cp) for x in old.ep_group(r)}) == ep
    assert sorted(new.groups("etp")) == sorted(new.groups("tp"))
    flat = ParallelPlan(tp=tp, cp=1, dp=cp * dp, pp=pp, ep=ep, sp=tp > 1, seq=SEQ)
    flat_old = ParallelPlan(tp=tp, cp=1, dp=cp * dp, pp=pp, ep=ep, sp=tp > 1, seq=SEQ, expert_grid="carved")
    assert not flat.folded and flat.groups("ep") == flat_old.groups("ep")


def test_the_expert_grid_of_megatron_0_10_with_tp_needs_sp():
    with pytest.raises(PlanError, match="Megatron-Core >= 0.10 with cp > 1.*--expert-grid carved.*add --sp"):
        ParallelPlan(tp=2, cp=2, dp=4, ep=4, seq=SEQ).validate()
    ParallelPlan(tp=2, cp=2, dp=4, ep=4, seq=SEQ, expert_grid="carved").validate()
    with pytest.raises(PlanError, match="expert_grid must be one of folded, carved"):
        ParallelPlan(tp=2, cp=2, dp=4, ep=4, seq=SEQ, expert_grid="megatron").validate()


def test_folded_experts_keep_flops_and_shard_weights_by_ep_etp():
    """Per rank the experts compute the same FLOPs folded or not (tokens / tp · etp, width / etp) and hold
    experts / ep · expert params / etp, sharded over edp by the distributed optimizer."""
    base = dict(tp=2, pp=1, seq=SEQ, sp=True, global_batch=16, zero=1)
    unf = ParallelPlan(dp=8, ep=4, **base)
    fold = ParallelPlan(dp=8, ep=8, etp=1, **base)

    def total(plan):
        return sum(op.flops for prog in build_programs(MOE, plan, symmetric=False).ops.values()
                   for op in prog if op.kind == "compute" and op.phase != "optimizer")

    assert total(fold) == pytest.approx(total(unf), rel=1e-12)
    layer = next(l for l in range(MOE.layers) if MOE.is_moe_layer(l))
    e = MOE.layer_expert_params(layer)
    assert layer_param_split(MOE, fold, layer)[1] == pytest.approx(e / 8)
    assert layer_param_split(MOE, unf, layer)[1] == pytest.approx(e / (2 * 4))
    assert shard_degrees(fold) == (8, 2) and shard_degrees(unf) == (8, 2)
    assert memory_per_rank(MOE, fold)["stage0"]["total"] > 0


def test_folded_moe_block_runs_etp_collectives_and_ep_all_to_alls():
    plan = ParallelPlan(tp=4, dp=4, ep=8, etp=2, sp=True, seq=SEQ, global_batch=4)     # one micro-batch
    progs = build_programs(MOE, plan)
    fams = {}
    for op in progs.ops[0]:
        if op.kind == "collective" and op.layer == 0:
            fams.setdefault(progs.groups[op.group].family, []).append(op.collective)
    assert sorted(fams["ep"]) == ["all_to_all"] * 4
    assert sorted(fams["etp"]) == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    one = build_programs(MOE, ParallelPlan(tp=4, dp=4, ep=16, etp=1, sp=True, seq=SEQ, global_batch=8))
    assert not any(one.groups[op.group].family == "etp" for op in one.ops[0] if op.kind == "collective")


@pytest.mark.parametrize("kw", [dict(tp=2, pp=2, dp=8, ep=16, etp=1), dict(tp=4, pp=2, dp=4, ep=8, etp=2, skew=0.3),
                                dict(tp=2, pp=2, cp=2, dp=4, ep=16, etp=1, schedule="interleaved",
                                     virtual_stages=2)])
def test_folded_symmetric_equals_full(kw):
    plan = ParallelPlan(sp=True, seq=SEQ, global_batch=32, micro_batch=1, **kw)
    cost = SimpleCostModel()
    full = build_programs(MOE, plan, symmetric=False)
    validate(full)
    sym = build_programs(MOE, plan)
    assert run(sym, cost).step_time_s == pytest.approx(run(full, cost).step_time_s, rel=1e-12)


@pytest.mark.parametrize("kw,msg", [(dict(tp=2, dp=4, ep=16, etp=1, sp=True), "must divide tp·cp·dp = 8"),
                                    (dict(tp=2, dp=4, ep=8, etp=1), "needs sequence parallelism"),
                                    (dict(tp=2, dp=4, etp=1, sp=True), "with ep 1"),
                                    (dict(tp=1, dp=12, ep=4, etp=3), "etp(3) must divide the expert MLP")])
def test_impossible_folds_are_reported(kw, msg):
    with pytest.raises(PlanError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        ParallelPlan(seq=SEQ, **kw).validate(MOE)


def test_every_family_of_a_folded_program_has_a_parallel_axis():
    """comm_by_axis files the expert-TP gathers under EP (the dispatcher), nothing under "other"."""
    from simulator.metrics import AXIS_OF_FAMILY
    progs = build_programs(MOE, ParallelPlan(tp=4, dp=4, ep=8, etp=2, sp=True, seq=SEQ, global_batch=4))
    assert {g.family for g in progs.groups} <= set(AXIS_OF_FAMILY) | {"mirror"}
    assert AXIS_OF_FAMILY["etp"] == "ep"


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-pp-cp-dp", "pp-tp-cp-dp"])
def test_ep_group_and_index_agree_with_the_groups_for_any_axis_order(order):
    plan = ParallelPlan(tp=2, cp=1, dp=8, pp=2, ep=16, etp=1, sp=True, seq=SEQ, axis_order=order)
    groups = plan.groups("ep")
    assert sorted(r for g in groups for r in g) == list(range(plan.world_size))
    for g in groups:
        assert len({plan.stage_of(r) for r in g}) == 1
        for k, r in enumerate(g):
            assert plan.ep_group(r) == g and plan.ep_index(r) == k == plan.ep_indices()[r]


@pytest.mark.parametrize("kw", [dict(tp=2, dp=8, ep=4), dict(tp=4, dp=4, ep=4),            # carved, TP experts
                                dict(tp=2, dp=8, ep=16, etp=1), dict(tp=4, dp=4, ep=8, etp=2),  # folded
                                dict(tp=2, cp=2, dp=4, ep=4), dict(tp=1, dp=8, ep=8)])      # Megatron's grid
def test_saved_expert_inputs_are_the_rows_the_expert_gemms_run(kw):
    """The memory model keeps, per rank, the routed tokens the expert GEMMs run on: after the dispatcher's
    gather over the experts' TP group each rank holds its group's tokens at full hidden width (carved plans
    gather over tp as folded ones over etp); before, carved TP plans counted a tp-th of them."""
    from schedules.kernels import phase_kernels
    from schedules.memory import _per_rank, saved_tensors
    plan = ParallelPlan(sp=kw.get("tp", 1) > 1, seq=SEQ, micro_batch=2, **kw)
    layer = next(l for l in range(MOE.layers) if MOE.is_moe_layer(l))
    saved = {t.name: _per_rank(t, plan) for t in saved_tensors(MOE, plan, layer)}
    fc1 = next(k for k in phase_kernels(MOE, plan, layer, "forward", part="experts").kernels if " fc1" in k.name)
    rows = fc1.m * fc1.batch                           # expert GEMM rows on this rank (uniform routing)
    assert saved["permuted tokens (expert input)"] == pytest.approx(rows * MOE.hidden * MOE.dtype_bytes, rel=1e-12)
    assert saved["expert outputs (combine input)"] == pytest.approx(rows * MOE.hidden * MOE.dtype_bytes, rel=1e-12)
    assert saved["expert fc1 output"] == pytest.approx(rows * fc1.n * MOE.dtype_bytes, rel=1e-12)
