"""Program generators run in the engine: closed forms for bubbles, communication volume and memory; a
property test over a grid of plans (no deadlock, matched p2p, symmetric == full)."""
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules import build_programs, comm_volume, custom_model, get_model, memory_per_rank
from schedules.kernels import phase_kernels
from schedules.memory import head_activation_bytes, head_transient_bytes, rank_params, stage_layer_params
from schedules.plan import ParallelPlan
from simulator.costs import IdealCostModel, SimpleCostModel
from simulator.errors import PlanError
from simulator.engine import run
from simulator.metrics import peak_memory
from simulator.program import validate

TINY = get_model("tiny")
MOE = get_model("tiny-moe")
SEQ = 128


class LayersOnly(IdealCostModel):
    """Ideal network; only transformer layers take time (embedding, LM head and optimizer are free), so every
    pipeline stage is equally loaded, as the bubble closed forms assume."""

    def compute_time_s(self, rank, op):
        if op.layer is None:
            return 0.0
        return op.flops / self.flops_per_s


def _step(model, plan, cost=None, symmetric=True):
    progs = build_programs(model, plan, symmetric=symmetric)
    return progs, run(progs, cost or LayersOnly())


def _stage_busy(progs, rank, cost):
    return sum(cost.compute_time_s(rank, op) for op in progs.ops[rank] if op.kind == "compute")


def _bubble(schedule, p, m, v=1, model=None):
    model = model or custom_model(layers=16, hidden=256, heads=8, vocab=64)
    plan = ParallelPlan(pp=p, schedule=schedule, virtual_stages=v, global_batch=m, seq=SEQ)
    cost = LayersOnly()
    progs, res = _step(model, plan, cost)
    busy = _stage_busy(progs, 0, cost)
    return res.step_time_s, res.step_time_s - busy, progs, cost


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8), (8, 16)])
def test_bubble_fraction_in_engine(schedule, p, m):
    step, bubble, _, _ = _bubble(schedule, p, m)
    assert bubble / step == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (4, 4, 2)])
def test_interleaved_bubble_is_one_vth_in_engine(p, m, v):
    b1 = _bubble("1f1b", p, m)[1]
    assert _bubble("interleaved", p, m, v)[1] == pytest.approx(b1 / v, rel=1e-9)


@pytest.mark.parametrize("p, m", [(4, 8), (4, 12), (8, 16)])
def test_zb_h1_bubble_in_engine(p, m):
    b1 = _bubble("1f1b", p, m)[1]
    _, bz, progs, cost = _bubble("zb", p, m)
    # per micro-batch and stage durations of F, B (input) and W
    ops = [op for op in progs.ops[0] if op.kind == "compute" and op.microbatch == 0 and op.layer is not None]
    t = {ph: sum(cost.compute_time_s(0, o) for o in ops if o.phase == ph)
         for ph in ("forward", "backward_input", "backward_weight")}
    tf, tb, tw = t["forward"], t["backward_input"], t["backward_weight"]
    # Qi et al. 2024: 1F1B's bubble is (p-1)(T_F+T_B+T_W), ZB-H1's (p-1)(T_F+T_B-T_W): about a third
    assert b1 == pytest.approx((p - 1) * (tf + tb + tw), rel=1e-9)
    assert bz == pytest.approx((p - 1) * (tf + tb - tw), rel=1e-9)
    assert 0.3 < bz / b1 < 0.4


def test_1f1b_holds_p_microbatches_on_stage0():
    p, m = 4, 12
    model = custom_model(layers=8, hidden=256, heads=8, vocab=64)
    plan = ParallelPlan(pp=p, global_batch=m, seq=SEQ)
    progs, res = _step(model, plan)
    per_mb = sum(b for op in progs.ops[0] if op.microbatch == 0 and op.phase == "forward" for _, b in op.alloc)
    peak = peak_memory(res, 0) - sum(progs.static_memory[0].values())
    assert peak == pytest.approx(p * per_mb)
    # and the engine's peak agrees with memory_per_rank on every stage
    # (LayersOnly runs the LM head in zero time: its activations and the logits beside them are allocated and
    # freed at one instant)
    mem = memory_per_rank(model, plan)
    head = head_activation_bytes(model, plan)[0] + max(head_transient_bytes(model, plan),
                                                       head_transient_bytes(model, plan, backward=True))
    assert head > 0
    for rep in progs.ops:
        s = plan.stage_of(rep)
        assert peak_memory(res, rep) == pytest.approx(mem[f"stage{s}"]["total"] - (head if s == p - 1 else 0.0))


def _dp_bytes(plan, model=TINY):
    v = comm_volume(build_programs(model, plan))["by_family"]
    return sum(v.get("dp", {}).values())


def test_zero_communication_volume_closed_forms():
    base = dict(dp=4, seq=SEQ, bucket_bytes=1e5)
    ddp = _dp_bytes(ParallelPlan(**base))
    assert ddp > 0
    assert _dp_bytes(ParallelPlan(zero=1, **base)) == pytest.approx(ddp)
    assert _dp_bytes(ParallelPlan(zero=2, **base)) == pytest.approx(ddp)
    assert _dp_bytes(ParallelPlan(zero=3, **base)) == pytest.approx(1.5 * ddp)
    assert _dp_bytes(ParallelPlan(fsdp=True, **base)) == pytest.approx(1.5 * ddp)
    # DDP's all-reduce moves 2(n-1)/n of the gradient bytes
    grads = memory_per_rank(TINY, ParallelPlan(**base))["stage0"]["gradients"]
    assert ddp == pytest.approx(2 * 3 / 4 * grads)


def test_zero1_volume_independent_of_microbatches():
    a = _dp_bytes(ParallelPlan(dp=2, seq=SEQ, global_batch=2))
    b = _dp_bytes(ParallelPlan(dp=2, seq=SEQ, global_batch=8, zero=1))
    assert a == pytest.approx(b)


def _count(progs, rank, **match):
    return sum(1 for op in progs.ops[rank] if all(getattr(op, k) == v for k, v in match.items()))


def test_tensor_parallel_collectives_per_layer():
    m = 2
    for sp, kinds in [(False, {"all_reduce": 4}), (True, {"all_gather": 4, "reduce_scatter": 4})]:
        progs = build_programs(TINY, ParallelPlan(tp=2, sp=sp, seq=SEQ, global_batch=m))
        for kind, n in kinds.items():
            per_layer = _count(progs, 0, collective=kind, layer=1, strategy="tp")
            assert per_layer == n * m


def test_expert_parallel_all_to_all_around_experts():
    progs = build_programs(MOE, ParallelPlan(dp=4, ep=4, seq=SEQ))
    assert _count(progs, 0, collective="all_to_all", layer=0) == 4    # dispatch + combine, forward + backward
    fam = {progs.groups[op.group].family for op in progs.ops[0] if op.collective == "all_to_all"}
    assert fam == {"ep"}


def test_context_parallel_ring_passes_kv_blocks():
    cp = 4
    progs = build_programs(TINY, ParallelPlan(cp=cp, seq=SEQ))
    assert _count(progs, 0, kind="send", strategy="cp", layer=0) == 2 * (cp - 1)
    assert {op.peer for op in progs.ops[0] if op.kind == "send" and op.strategy == "cp"} == {1}


@pytest.mark.parametrize("stack, heads", [("megatron", 2), ("torchtitan", 8), ("torchtitan-compile", 8)])
def test_context_parallel_kv_blocks_are_what_the_attention_kernel_reads(stack, heads):
    """The rank's K and V block is what the attention kernel reads: at the kv heads (Megatron / Transformer
    Engine), at the query heads under torchtitan's repeat_kv. Megatron's ring sends it on each step forward and
    K, V with their gradients backward (twice the bytes); torch's context parallelism all-gathers the cp blocks
    and passes fp32 dK, dV accumulators (twice the bf16 block) backward."""
    gqa = dataclasses.replace(TINY, kv_heads=2)
    cp, tp = 2, 2
    progs = build_programs(gqa, ParallelPlan(cp=cp, tp=tp, seq=SEQ, stack=stack))
    tokens = SEQ // cp
    block = tokens * 2 * (heads / tp) * gqa.d_head * gqa.dtype_bytes
    sizes = sorted({op.size_bytes for op in progs.ops[0] if op.kind == "send" and op.strategy == "cp"})
    gathers = {op.size_bytes for op in progs.ops[0] if op.kind == "collective" and op.strategy == "cp"}
    if stack == "megatron":
        assert sizes == [pytest.approx(block), pytest.approx(2 * block)] and not gathers
    else:
        assert sizes == [pytest.approx(2 * block)] and sorted(gathers) == [pytest.approx(cp * block)]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_torch_context_parallelism_gathers_kv_and_passes_fp32_gradients_on(recompute):
    """torchtitan's context parallelism (torch's, rotate method allgather): per layer and pass one all-gather of
    the K, V blocks on the CP group, which the first other-block attention waits for; forward sends nothing;
    backward sends cp fp32 dK, dV accumulators to the next CP rank (after its own block, then after each other
    block, once the previous rank's has arrived) and receives cp, the last before the layer's backward goes on."""
    cp = 4
    plan = ParallelPlan(cp=cp, seq=SEQ, stack="torchtitan", recompute=recompute)
    progs = build_programs(TINY, plan)
    prog = progs.ops[0]
    layer0 = [(i, op) for i, op in enumerate(prog) if op.layer == 0 and op.strategy == "cp"]
    for phase in ("forward", "backward"):
        ops = [(i, op) for i, op in layer0 if op.phase == phase]
        gathers = [(i, op) for i, op in ops if op.kind == "collective"]
        assert [(op.collective, progs.groups[op.group].family) for _, op in gathers] == [("all_gather", "cp")]
        sends = [op for _, op in ops if op.kind == "send"]
        recvs = [i for i, op in ops if op.kind == "recv"]
        assert len(sends) == len(recvs) == (0 if phase == "forward" else cp)
        assert {op.peer for op in sends} <= {1}
        g = gathers[0][0]
        first_ring = next(i for i, op in enumerate(prog) if op.kind == "compute" and op.layer == 0
                          and op.phase == phase and op.name.endswith("ring"))
        assert prog[first_ring].deps == (g,)
        if phase == "backward":
            wait = next(i for i, op in enumerate(prog) if op.name == "cp dkv wait" and op.layer == 0)
            assert prog[wait].deps == (recvs[-1],) and prog[wait].duration_s == 0.0


@pytest.mark.parametrize("plan", [
    ParallelPlan(cp=4, dp=2, seq=SEQ, global_batch=4, stack="torchtitan", recompute="full"),
    ParallelPlan(cp=2, tp=2, pp=2, dp=2, seq=SEQ, global_batch=8, stack="torchtitan-compile", sp=True,
                 schedule="interleaved", virtual_stages=2),
    ParallelPlan(cp=2, pp=2, dp=2, seq=SEQ, global_batch=8, stack="torchtitan", fsdp=True, schedule="zb-h1")])
def test_torch_context_parallelism_runs_and_symmetric_equals_full(plan):
    topologies = pytest.importorskip("topologies")
    from topologies.cost import ClusterCostModel
    model = dataclasses.replace(TINY, kv_heads=2)
    full = build_programs(model, plan, symmetric=False)
    validate(full)
    assert sum(op.kind == "send" for p in full.ops.values() for op in p) == \
        sum(op.kind == "recv" for p in full.ops.values() for op in p)
    for cost in (SimpleCostModel(link_bytes_per_s=1e11, alpha_s=1e-6),
                 ClusterCostModel(topologies.load_cluster("dgx-h100", plan.world_size), network="flow")):
        t_full = run(full, cost).step_time_s
        assert t_full > 0
        assert run(build_programs(model, plan, symmetric=True), cost).step_time_s == pytest.approx(t_full, rel=1e-9)


@pytest.mark.parametrize("recompute, overlap", [("none", False), ("selective", False), ("full", False),
                                               ("full", True), ("none", True)])
def test_executed_flops_equal_model_flops(recompute, overlap):
    """Sum of compute FLOPs over the job == 6N·tokens-style model FLOPs (+ the recomputed forward); a layer cut
    into pieces at its overlapped GEMMs (TP communication overlap) keeps its FLOPs."""
    plan = ParallelPlan(tp=2, pp=2, dp=2, cp=2, seq=SEQ, global_batch=8, recompute=recompute, sp=overlap,
                        tp_comm_overlap=overlap)
    progs = build_programs(MOE, plan, symmetric=False)
    executed = sum(op.flops for prog in progs.ops.values() for op in prog
                   if op.kind == "compute" and op.phase != "optimizer")
    extra = 0.0
    for l in range(MOE.layers):
        lf = MOE.layer_flops(l, plan.seq, plan.micro_batch)
        per = {"none": 0.0, "selective": lf.attn_core, "full": lf.forward}[recompute]
        extra += per * plan.num_microbatches * plan.dp
    assert executed == pytest.approx(progs.model_flops_per_step + extra, rel=1e-9)
    assert progs.tokens_per_step == plan.effective_global_batch * plan.seq


def test_groups_registered_with_families_and_p2p_groups():
    progs = build_programs(TINY, ParallelPlan(tp=2, pp=2, dp=2, seq=SEQ, global_batch=4), symmetric=False)
    fams = {g.family for g in progs.groups}
    assert {"tp", "pp", "dp"} <= fams
    for r, prog in progs.ops.items():
        for op in prog:
            if op.kind in ("send", "recv"):
                g = progs.groups[op.group]
                assert g.family == "pp" and r in g.ranks and op.peer in g.ranks


def test_tied_embeddings_reduce_between_first_and_last_stage():
    m = custom_model(layers=4, hidden=128, heads=4, vocab=64, tied_embeddings=True)
    progs = build_programs(m, ParallelPlan(pp=2, seq=SEQ, global_batch=2))
    fams = [progs.groups[op.group].family for r in progs.ops for op in progs.ops[r] if op.kind == "collective"]
    assert fams.count("embed") == 2


@pytest.mark.parametrize("grid", ["carved", "folded"])
def test_symmetric_classes_cover_the_world(grid):
    base = dict(tp=2, pp=4, dp=4, ep=2, cp=2, seq=SEQ, global_batch=16, sp=grid == "folded", expert_grid=grid)
    plan = ParallelPlan(**base)
    assert plan.folded == (grid == "folded")
    progs = build_programs(MOE, plan)
    assert len(progs.ops) == plan.pp * plan.cp
    assert sorted(r for ms in progs.classes.values() for r in ms) == list(range(plan.world_size))
    skewed = build_programs(MOE, ParallelPlan(skew=0.5, **base))
    # skew: one class per (stage, cp index, expert shard) that occurs; in the folded grid the CP index is the
    # expert shard (ep index = (cp index + cp·dp index) % ep with ep = cp = 2)
    kinds = {(plan.stage_of(r), plan.coords(r)["cp"], plan.ep_index(r)) for r in range(plan.world_size)}
    assert len(skewed.ops) == len(kinds) == plan.pp * plan.cp * (plan.ep if grid == "carved" else 1)
    assert sorted(r for ms in skewed.classes.values() for r in ms) == list(range(plan.world_size))


def test_skew_slows_the_step():
    base = dict(dp=4, ep=4, seq=SEQ)
    cost = SimpleCostModel()
    t0 = run(build_programs(MOE, ParallelPlan(**base)), cost).step_time_s
    t1 = run(build_programs(MOE, ParallelPlan(skew=0.5, **base)), cost).step_time_s
    assert t1 > t0


def test_params_only_model_cannot_build_programs():
    from schedules.models import model_from_params
    from simulator.errors import ConfigError
    with pytest.raises(ConfigError, match="shape"):
        build_programs(model_from_params(1e9), ParallelPlan())


# ------------------------------------------------------------------------------ property test over plans
@st.composite
def plans(draw):
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb", "zb-h2", "zb-v", "zb-auto", "dualpipe",
                                     "dualpipev"]))
    pp = draw(st.sampled_from([1, 2, 4])) if schedule not in ("interleaved", "dualpipe", "dualpipev") else \
        draw(st.sampled_from([2, 4]))
    v = 2 if schedule == "interleaved" and pp == 2 else 1
    moe = draw(st.booleans())
    tp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if dp % e == 0])) if moe else 1
    cp = draw(st.sampled_from([1, 2]))
    mult = draw(st.sampled_from([1, 2, 3]))
    m = pp * mult if schedule == "interleaved" else draw(st.integers(1, 6))
    if schedule in ("dualpipe", "dualpipev"):     # DualPipe needs >= 2·pp micro-batches (even for DualPipe)
        m = 2 * pp * mult
    zero = draw(st.sampled_from([0, 1, 2, 3]))
    grid = draw(st.sampled_from(["folded", "carved"]))
    sp = draw(st.booleans()) and tp > 1
    if ep > 1 and cp > 1 and grid == "folded":
        sp = tp > 1                     # Megatron-Core's expert grid: MoE with TP needs SP
    from schedules.pipeline import SPLIT_BACKWARD
    overlap = sp and schedule not in SPLIT_BACKWARD and draw(st.booleans())    # TP communication overlap
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, zero=zero, sp=sp, expert_grid=grid,
                        tp_comm_overlap=overlap,
                        schedule=schedule, virtual_stages=v, global_batch=m * dp, seq=64,
                        recompute=draw(st.sampled_from(["none", "selective", "full"])),
                        overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()),
                        skew=draw(st.sampled_from([0.0, 0.4])) if ep > 1 else 0.0, bucket_bytes=2e5)
    layers = draw(st.sampled_from([4, 5, 7]))       # uneven splits too (balanced layer distribution)
    layers = max(layers, plan.pieces - 2)           # V layouts hold 2·pp pieces
    return dataclasses.replace(MOE if moe else TINY, layers=layers), plan


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_every_plan_runs_without_deadlock_and_symmetric_equals_full(case):
    model, plan = case
    cost = SimpleCostModel(link_bytes_per_s=1e11, alpha_s=1e-6)
    full = build_programs(model, plan, symmetric=False)
    validate(full)                      # matched collectives and send/recv
    sends = sum(1 for p in full.ops.values() for op in p if op.kind == "send")
    recvs = sum(1 for p in full.ops.values() for op in p if op.kind == "recv")
    assert sends == recvs
    t_full = run(full, cost).step_time_s
    sym = build_programs(model, plan, symmetric=True)
    t_sym = run(sym, cost).step_time_s
    assert t_full > 0
    assert t_sym == pytest.approx(t_full, rel=1e-9)


def test_symmetric_equals_full_under_the_contention_aware_network():
    topologies = pytest.importorskip("topologies")
    from topologies.cost import ClusterCostModel
    for model, plan in [(TINY, ParallelPlan(tp=2, pp=4, dp=8, global_batch=32, seq=256, zero=1)),
                        (MOE, ParallelPlan(tp=2, pp=2, dp=8, ep=4, cp=2, global_batch=16, seq=256, skew=0.5,
                                           expert_grid="carved")),
                        (MOE, ParallelPlan(tp=2, pp=2, dp=8, ep=4, cp=2, global_batch=16, seq=256, skew=0.5,
                                           sp=True))]:
        cost = ClusterCostModel(topologies.load_cluster("dgx-h100", plan.world_size), network="flow")
        a = run(build_programs(model, plan, symmetric=True), cost).step_time_s
        b = run(build_programs(model, plan, symmetric=False), cost).step_time_s
        assert a == pytest.approx(b, rel=1e-9)


@pytest.mark.parametrize("overlap", [True, False])
def test_ddp_buckets_overlap_the_rest_of_backward(overlap):
    plan = ParallelPlan(dp=2, seq=SEQ, bucket_bytes=1e5, overlap_grad_reduce=overlap)
    progs = build_programs(TINY, plan)
    res = run(progs, SimpleCostModel(link_bytes_per_s=1e11))
    prog = progs.ops[0]
    ar = [i for i, op in enumerate(prog) if op.collective == "all_reduce" and op.strategy == "dp"]
    bwd = [i for i, op in enumerate(prog) if op.kind == "compute" and op.phase == "backward"]
    assert len(ar) > 1
    first_ar = min(res.start_s[0][i] for i in ar)
    last_bwd = max(res.end_s[0][i] for i in bwd)
    assert (first_ar < last_bwd) == overlap
    # the optimizer waits for every bucket
    opt = next(i for i, op in enumerate(prog) if op.phase == "optimizer")
    assert res.start_s[0][opt] >= max(res.end_s[0][i] for i in ar)


def test_fsdp_prefetch_overlaps_gathers_with_compute():
    def exposed(prefetch):
        plan = ParallelPlan(dp=4, fsdp=True, fsdp_prefetch=prefetch, seq=SEQ)
        return run(build_programs(TINY, plan), SimpleCostModel(link_bytes_per_s=3e9)).step_time_s
    assert exposed(1) < exposed(0)


def test_fsdp2_copies_gathered_parameters_and_gradients_that_zero3_does_not():
    """FSDP2 (--fsdp): per unit and use, a copy-out of the gathered parameters (after its all-gather, before
    its compute) and, per backward, a copy-in of the gradients (before its reduce-scatter), both read + write
    of their bytes on the compute stream. ZeRO-3's flat buffers have neither; the collectives are the same."""
    plan3 = ParallelPlan(dp=4, zero=3, seq=SEQ)
    fsdp = ParallelPlan(dp=4, fsdp=True, seq=SEQ)
    p3, pf = build_programs(TINY, plan3, symmetric=False), build_programs(TINY, fsdp, symmetric=False)
    coll = lambda prog: [(o.collective, o.size_bytes) for o in prog if o.kind == "collective"]
    assert coll(p3.ops[0]) == coll(pf.ops[0])
    assert not any(o.name.startswith("fsdp copy") for o in p3.ops[0])
    prog = pf.ops[0]
    outs = [i for i, o in enumerate(prog) if o.name.startswith("fsdp copy-out")]
    ins = [i for i, o in enumerate(prog) if o.name.startswith("fsdp copy-in")]
    ags = [i for i, o in enumerate(prog) if o.collective == "all_gather"]
    rss = [i for i, o in enumerate(prog) if o.collective == "reduce_scatter"]
    assert len(outs) == len(ags) and len(ins) == len(rss)
    for i in outs:
        (ag,) = prog[i].deps
        assert prog[ag].collective == "all_gather" and prog[i].stream == "compute" and prog[i].flops == 0
        assert prog[i].mem_bytes == pytest.approx(2 * prog[ag].size_bytes)      # gathered bytes, read + write
        user = next(j for j in range(i + 1, len(prog)) if i in prog[j].deps)
        assert prog[user].kind == "compute" and prog[user].layer == prog[i].layer
    for i in ins:
        rs = next(j for j in rss if i in prog[j].deps)
        assert prog[i].mem_bytes == pytest.approx(2 * prog[rs].size_bytes)
    # the copies cost their memory traffic: with (nearly) free communication the compute stream is the
    # critical path, and FSDP2 is slower than ZeRO-3 by exactly the copies' time
    cost = SimpleCostModel(flops_per_s=1e14, mem_bytes_per_s=1e12, link_bytes_per_s=1e18)
    t3 = run(p3, cost).step_time_s
    tf = run(pf, cost).step_time_s
    copies = sum(prog[i].mem_bytes for i in outs + ins) / 1e12
    assert tf == pytest.approx(t3 + copies, rel=1e-9)


def test_fsdp1_stack_has_no_copy_out_but_divides_its_flat_gradient():
    """llm-foundry's FSDP1 (flat parameters): the all-gather lands in the flat parameter the modules view (no
    copy-out); the flat gradient is divided in place before each reduce-scatter (read + write, FSDP2's copy-in
    bytes). Same collectives as FSDP2."""
    f2 = build_programs(TINY, ParallelPlan(dp=4, fsdp=True, seq=SEQ, stack="torchtitan", grad_reduce_dtype="bf16"),
                        symmetric=False).ops[0]
    f1 = build_programs(TINY, ParallelPlan(dp=4, fsdp=True, seq=SEQ, stack="llm-foundry", grad_reduce_dtype="bf16"),
                        symmetric=False).ops[0]
    coll = lambda prog: [(o.collective, o.size_bytes) for o in prog if o.kind == "collective"]
    assert coll(f1) == coll(f2)
    assert not any(o.name.startswith("fsdp copy") for o in f1)
    div = [o for o in f1 if o.name.startswith("fsdp grad pre-divide")]
    rss = [o for o in f1 if o.collective == "reduce_scatter"]
    assert len(div) == len(rss) > 0
    assert sorted(o.mem_bytes for o in div) == pytest.approx(sorted(2 * o.size_bytes for o in rss))


def test_grad_reduce_dtype_defaults_per_stack():
    """auto: fp32 under torchtitan (mixed_precision_reduce) and llm-foundry (Composer DEFAULT), bf16 under
    megatron (NeMo's performance recipes); an explicit choice wins."""
    for stack, want in (("megatron", 2.0), ("torchtitan", 4.0), ("torchtitan-compile", 4.0), ("llm-foundry", 4.0)):
        assert ParallelPlan(stack=stack).grad_reduce_bytes == want
        assert ParallelPlan(stack=stack, grad_reduce_dtype="bf16").grad_reduce_bytes == 2.0
        assert ParallelPlan(stack=stack, grad_reduce_dtype="fp32").grad_reduce_bytes == 4.0
    # auto under megatron reduces in the gradients' own precision: fp32 when the model trains in fp32
    assert ParallelPlan(grad_bytes_per_param=4.0).grad_reduce_bytes == 4.0
    assert ParallelPlan(grad_bytes_per_param=4.0, grad_reduce_dtype="bf16").grad_reduce_bytes == 2.0
    with pytest.raises(PlanError, match="gradient reduction dtype"):
        ParallelPlan(grad_reduce_dtype="fp16").validate(TINY, 1)


@pytest.mark.parametrize("stack", ["torchtitan", "llm-foundry"])
def test_fp32_gradient_reduction_doubles_reduce_bytes_and_casts(stack):
    """fp32 reduction: every data-parallel gradient collective moves twice the bytes of bf16; the parameter
    all-gathers do not change. Before each reduce-scatter FSDP2's copy-in reads the bf16 gradients and writes
    the fp32 input (2 + 4 bytes per element); FSDP1 casts (2 + 4) and pre-divides in fp32 (4 + 4)."""
    def prog(reduce, **kw):
        return build_programs(TINY, ParallelPlan(dp=4, seq=SEQ, stack=stack, grad_reduce_dtype=reduce, **kw),
                              symmetric=False).ops[0]
    for kw in ({"fsdp": True}, {"zero": 0}, {"zero": 2}):
        b16, f32 = prog("bf16", **kw), prog("fp32", **kw)
        grads = lambda p: [o.size_bytes for o in p if o.kind == "collective" and o.collective != "all_gather"]
        gathers = lambda p: [o.size_bytes for o in p if o.collective == "all_gather"]
        assert grads(b16) and grads(f32) == pytest.approx([2 * x for x in grads(b16)])
        assert gathers(f32) == gathers(b16)
    f32 = prog("fp32", fsdp=True)
    rss = [o for o in f32 if o.collective == "reduce_scatter"]
    prep = [o for o in f32 if o.name.startswith(("fsdp copy-in", "fsdp grad pre-divide"))]
    per_element = (2 + 4 + 4 + 4) if stack == "llm-foundry" else (2 + 4)
    assert len(prep) == len(rss) > 0
    assert sorted(o.mem_bytes for o in prep) == pytest.approx(sorted(o.size_bytes / 4 * per_element for o in rss))


@pytest.mark.parametrize("overlap", [True, False])
def test_fp8_param_gather_gathers_one_byte_per_block_weight(overlap):
    """--fp8-param-gather: the distributed optimizer's parameter all-gathers carry 1 byte per transformer-layer
    weight and the model's 2 bytes for the rest (embedding, head); gradient reductions are unchanged; the
    engine's memory peak is memory_per_rank's (ZeRO-1), the block weights' BF16 bytes gone."""
    model = dataclasses.replace(get_model("llama3-8b"), layers=4)
    kw = dict(dp=4, zero=1, seq=512, pp=2, global_batch=16, stage_layers=(2, 2), dtype="fp8",
              fp8_recipe="current", overlap_param_gather=overlap)
    base, pg = ParallelPlan(**kw), ParallelPlan(**kw, fp8_param_gather=True)
    pa, pb = build_programs(model, base), build_programs(model, pg)
    gathers = lambda prog: sum(o.size_bytes for o in prog if o.collective == "all_gather")
    grads = lambda prog: [o.size_bytes for o in prog if o.kind == "collective" and o.collective != "all_gather"]
    assert sorted(pa.ops) == sorted(pb.ops)
    for rep in pa.ops:
        blocks = sum(stage_layer_params(model, base, base.stage_of(rep)))     # the stage's layer weights
        assert gathers(pa.ops[rep]) > gathers(pb.ops[rep]) > 0
        assert gathers(pa.ops[rep]) - gathers(pb.ops[rep]) == pytest.approx(blocks * (2 - 1))
        assert grads(pa.ops[rep]) == grads(pb.ops[rep])
    progs = build_programs(model, pg)
    res = run(progs, SimpleCostModel(flops_per_s=1e14, link_bytes_per_s=5e10))
    mem = memory_per_rank(model, pg)
    for rep in progs.ops:
        assert peak_memory(res, rep) == pytest.approx(mem[f"stage{pg.stage_of(rep)}"]["total"])


@pytest.mark.parametrize("zero, reduce", [(0, "bf16"), (1, "bf16"), (2, "bf16"), (3, "bf16"), (2, "fp32"),
                                          (3, "fp32")])
def test_engine_memory_peak_vs_memory_per_rank(zero, reduce):
    """Without transient buffers (DDP, ZeRO-1) the engine's peak equals memory_per_rank; with them
    (ZeRO-2/3) memory_per_rank's buffer estimate bounds it from above while communication keeps pace with
    compute (fp32 reduction: the bf16 gradients and their fp32 copy, twice the bytes to reduce, on a link
    fast enough that reductions do not pile up)."""
    model = dataclasses.replace(get_model("llama3-8b"), layers=4)
    plan = ParallelPlan(dp=4, zero=zero, seq=512, pp=2, global_batch=16, stage_layers=(2, 2),
                        grad_reduce_dtype=reduce)
    progs = build_programs(model, plan)
    res = run(progs, SimpleCostModel(flops_per_s=1e14, link_bytes_per_s=5e10 if reduce == "bf16" else 2e11))
    mem = memory_per_rank(model, plan)
    for rep in progs.ops:
        expected = mem[f"stage{plan.stage_of(rep)}"]
        if zero < 2:
            assert peak_memory(res, rep) == pytest.approx(expected["total"])
        else:
            assert expected["total"] - expected["buffers"] < peak_memory(res, rep) <= expected["total"]


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("gpipe", 1)])
@pytest.mark.parametrize("stack, tp", [("megatron", 2), ("torchtitan", 1), ("llm-foundry", 2)])
def test_memory_per_rank_is_the_engines_peak_on_the_head_stage_under_full_recomputation(schedule, v, stack, tp):
    """A chunk's backward runs the LM head first and frees its saved tensors (under a B / W split, all but what
    its weight gradient reads) before the layers rebuild theirs: memory_per_rank's peak is the engine's on
    every stage, the LM head's included (it used to add the head's saved tensors to the rebuilt layer's)."""
    for model in (TINY, get_model("tiny-moe")):
        plan = ParallelPlan(pp=2, tp=tp, seq=SEQ, global_batch=16, recompute="full", stack=stack,
                            schedule=schedule, virtual_stages=v)
        progs = build_programs(model, plan)
        res = run(progs, SimpleCostModel(flops_per_s=1e14, link_bytes_per_s=5e10))
        mem = memory_per_rank(model, plan)
        for rep in progs.ops:
            assert peak_memory(res, rep) == pytest.approx(mem[f"stage{plan.stage_of(rep)}"]["total"], rel=1e-12)


@pytest.mark.parametrize("schedule, p, m, v", [("zb-h2", 4, 8, 1), ("zb-v", 4, 8, 1), ("zb-auto", 4, 8, 1),
                                               ("dualpipe", 4, 8, 1), ("dualpipev", 4, 8, 1),
                                               ("interleaved", 4, 10, 2), ("interleaved", 3, 7, 3)])
def test_new_schedules_symmetric_equals_full(schedule, p, m, v):
    model = custom_model(layers=13, hidden=256, heads=8, vocab=64)
    plan = ParallelPlan(pp=p, dp=2, schedule=schedule, virtual_stages=v, global_batch=2 * m, seq=SEQ)
    cost = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e10)
    sym = run(build_programs(model, plan), cost)
    full = run(build_programs(model, plan, symmetric=False), cost)
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    # the engine's activation peak per stage is what memory_per_rank predicts from the same order
    mem = memory_per_rank(model, plan)
    progs = build_programs(model, plan)
    for rep in progs.ops:
        assert peak_memory(sym, rep) == pytest.approx(mem[f"stage{plan.stage_of(rep)}"]["total"])


def test_v_layout_keeps_embedding_and_head_on_stage_0():
    model = custom_model(layers=16, hidden=256, heads=8, vocab=64)
    plan = ParallelPlan(pp=4, schedule="zb-v", global_batch=8, seq=SEQ)
    progs = build_programs(model, plan, symmetric=False)
    names = {r: {op.name for op in progs.ops[r]} for r in progs.ops}
    assert "embedding" in names[0] and "lm_head" in names[0]
    assert all("embedding" not in names[r] and "lm_head" not in names[r] for r in (1, 2, 3))
    # the V turns on the last stage without a message: stage 3 sends nothing to itself
    assert all(op.peer != 3 for op in progs.ops[3] if op.kind in ("send", "recv"))


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev"])
def test_dualpipe_overlaps_forward_and_backward_across_the_ep_all_to_all(schedule, monkeypatch):
    # DeepSeek-V3 sec. 3.2.1: in an F&B chunk one micro-batch's all-to-all hides behind the other's compute
    import schedules.generate as gen
    model = custom_model(layers=8, hidden=256, heads=8, vocab=64, experts=8, top_k=2)
    plan = ParallelPlan(pp=4, dp=4, ep=4, schedule=schedule, global_batch=128, seq=256)
    cost = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9)
    progs = build_programs(model, plan)
    validate(progs)
    prog = next(iter(progs.ops.values()))
    assert any(op.stream == "ep_overlap" for op in prog)
    overlapped = run(progs, cost).step_time_s
    assert run(build_programs(model, plan, symmetric=False), cost).step_time_s == pytest.approx(overlapped,
                                                                                                 rel=1e-12)
    monkeypatch.setattr(gen, "overlapped_pairs", lambda *a: frozenset())
    serial = run(build_programs(model, plan), cost).step_time_s
    assert overlapped < 0.9 * serial


def test_dualpipe_holds_two_copies_of_its_pieces_and_sums_their_gradients():
    # DeepSeek-V3 report, table 2: DualPipe keeps 2x the parameters of 1F1B per device
    model = custom_model(layers=16, hidden=256, heads=8, vocab=64)
    one = memory_per_rank(model, ParallelPlan(pp=4, dp=2, global_batch=16, seq=SEQ, layer_split="even"))
    two = memory_per_rank(model, ParallelPlan(pp=4, dp=2, global_batch=16, seq=SEQ, layer_split="even",
                                              schedule="dualpipe"))
    for s in (1, 2):        # middle stages (no embedding / head)
        assert two[f"stage{s}"]["parameters"] == pytest.approx(2 * one[f"stage{s}"]["parameters"])
    progs = build_programs(model, ParallelPlan(pp=4, dp=2, global_batch=16, seq=SEQ, schedule="dualpipe"),
                           symmetric=False)
    validate(progs)
    mirror = [g for g in progs.groups if g.family == "mirror"]
    assert sorted(tuple(g.ranks) for g in mirror) == sorted(
        (r, ParallelPlan(pp=4, dp=2).peer(r, "pp", 3 - ParallelPlan(pp=4, dp=2).stage_of(r)))
        for r in range(8) if ParallelPlan(pp=4, dp=2).stage_of(r) < 2)


def test_pieces_with_only_the_embedding_or_the_head():
    # 6 layers on 4 stages x 2 chunks: the first piece holds only the embedding, the last only the LM head
    model = custom_model(layers=6, hidden=256, heads=8, vocab=64)
    plan = ParallelPlan(pp=4, schedule="interleaved", virtual_stages=2, global_batch=8, seq=SEQ)
    assert plan.piece_layer_counts(model) == [0, 1, 1, 1, 1, 1, 1, 0]
    cost = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e10)
    sym = run(build_programs(model, plan), cost)
    full = build_programs(model, plan, symmetric=False)
    validate(full)
    assert run(full, cost).step_time_s == pytest.approx(sym.step_time_s, rel=1e-12)


def _fsdp_ops(progs, rank, kind):
    return [op for op in progs.ops[rank] if op.strategy == "fsdp" and op.collective == kind]


@pytest.mark.parametrize("reshard, gathers_per_unit", [("auto", 1), ("false", 1), ("true", None)])
def test_fsdp_under_pp_gathers_once_and_reduce_scatters_once_per_step(reshard, gathers_per_unit):
    """FSDP under PP (torch.distributed.pipelining): gradients are reduce-scattered once per step per unit;
    with reshard_after_forward off (auto under PP) each unit is all-gathered once per step; with it on,
    every forward re-gathers (backward finds the unit still gathered after the previous backward)."""
    m = 8
    model = custom_model(layers=4, hidden=256, heads=8, vocab=64)
    plan = ParallelPlan(dp=2, pp=2, fsdp=True, seq=SEQ, global_batch=2 * m, fsdp_reshard_after_forward=reshard)
    progs, res = _step(model, plan)
    units = {op.name.split()[-1] for op in _fsdp_ops(progs, 0, "all_gather")}
    assert len(units) == 3                      # embedding, L0, L1
    rs = _fsdp_ops(progs, 0, "reduce_scatter")
    assert len(rs) == len(units)
    ag = _fsdp_ops(progs, 0, "all_gather")
    if gathers_per_unit:
        assert len(ag) == gathers_per_unit * len(units)
    else:
        assert len(ag) > m * len(units) // 2
    # the engine's buffer peak stays within the analytical estimate
    mem = memory_per_rank(model, plan)["stage0"]
    assert mem["total"] - mem["buffers"] < peak_memory(res, 0) <= mem["total"] + 1e-6


def test_fsdp_without_pp_reduce_scatters_every_microbatch():
    model = custom_model(layers=2, hidden=256, heads=8, vocab=64)
    plan = ParallelPlan(dp=2, fsdp=True, seq=SEQ, global_batch=8)
    progs = build_programs(model, plan)
    units = 4                                     # embedding, 2 layers, head
    assert len(_fsdp_ops(progs, 0, "reduce_scatter")) == 4 * units
    assert len(_fsdp_ops(progs, 0, "all_gather")) == 2 * 4 * units
    keep = build_programs(model, dataclasses.replace(plan, fsdp_reshard_after_forward="false"))
    assert len(_fsdp_ops(keep, 0, "all_gather")) == 4 * units


def test_torchtitans_loss_parallel_holds_its_decomposed_log_softmax():
    """Under TP torchtitan's eager loss is loss_parallel: DTensor runs log_softmax as amax, x - max, exp, sum,
    - logsumexp on each vocabulary shard (8 fp32 passes instead of 2) and one nll_loss + log_softmax backward,
    (zeros + exp(logp)) * grad (8 passes instead of 1 + 3). Memory beyond the saved fp32 output: forward the
    logits, their fp32 copy and x - max beside its exp (2 + 8 bytes per logit), backward the zeroed gradient,
    the exp and their sum (12); a fused loss and TP 1 are unchanged. The engine's memory timeline agrees."""
    model = custom_model(layers=2, hidden=256, heads=8, vocab=50_000)
    local = SEQ * model.vocab / 2
    plan = ParallelPlan(seq=SEQ, tp=2, stack="torchtitan")
    assert head_transient_bytes(model, plan) == pytest.approx(10 * local)
    assert head_transient_bytes(model, plan, backward=True) == pytest.approx(12 * local)
    for stack in ("megatron", "torchtitan-compile-loss"):
        p = dataclasses.replace(plan, stack=stack)
        assert head_transient_bytes(model, p) == head_transient_bytes(model, p, backward=True) == pytest.approx(2 * local)
    ks = {ph: {k.name: k.bytes for k in phase_kernels(model, plan, None, ph, part="head")}
          for ph in ("forward", "backward")}
    assert ks["forward"]["log_softmax (loss parallel: amax, x - max, exp, sum, - logsumexp)"] == pytest.approx(32 * local)
    assert ks["backward"]["nll_loss + log_softmax bwd (loss parallel: zeros, exp, add, mul)"] == pytest.approx(32 * local)
    plain = {k.name for k in phase_kernels(model, dataclasses.replace(plan, tp=1), None, "backward", part="head")}
    assert {"nll_loss grad (zeros)", "log_softmax bwd"} <= plain
    progs, res = _step(model, plan, cost=SimpleCostModel())
    assert peak_memory(res, 0) == pytest.approx(memory_per_rank(model, plan)["stage0"]["total"])


def test_logits_are_live_beside_the_head_while_the_loss_runs():
    """The LM head's logits (activation dtype) and, under torchtitan's eager cross-entropy, their fp32 copy are
    live beside the saved fp32 softmax: closed form, and the engine's memory timeline reaches it."""
    model = custom_model(layers=2, hidden=256, heads=8, vocab=50_000)
    tok = SEQ
    for stack, per in (("megatron", 2), ("llm-foundry", 2), ("torchtitan", 6), ("torchtitan-compile", 6),
                       ("torchtitan-compile-loss", 2)):
        plan = ParallelPlan(seq=SEQ, stack=stack)
        # the memory and the kernels agree on which stacks copy the logits to fp32 for the loss
        cast = [k for k in phase_kernels(model, plan, None, "forward", part="head") if k.name == "logits float cast"]
        assert bool(cast) == (per == 6)
        assert head_transient_bytes(model, plan) == pytest.approx(per * tok * model.vocab)
        # backward: the eager loss's two fp32 gradients (nll_loss's, log_softmax's) beside its saved output,
        # the logits already freed; a fused loss writes the logits' gradient in their dtype
        assert head_transient_bytes(model, plan, backward=True) == pytest.approx(
            (8 if per == 6 else 2) * tok * model.vocab)
        progs, res = _step(model, plan, cost=SimpleCostModel())
        mem = memory_per_rank(model, plan)["stage0"]["total"]
        assert peak_memory(res, 0) == pytest.approx(mem)


@pytest.mark.parametrize("stack, passes", [("megatron", None), ("torchtitan", 23), ("llm-foundry", 23)])
def test_optimizer_step_moves_the_bytes_its_stack_moves(stack, passes):
    """Adam over this rank's shard (ZeRO-1, dp 4): the fused single pass (read g, p, m, v; write p, m, v; the
    model-weight copy; the clip norm's gradient read) or the eager per-op passes over fp32 states
    (AdamW 20 + clip_grad_norm_ 3), counted by hand."""
    plan = ParallelPlan(dp=4, zero=1, seq=SEQ, stack=stack)
    progs = build_programs(TINY, plan)
    (opt,) = [op for op in progs.ops[0] if op.name == "optimizer step"]
    n = sum(rank_params(TINY, plan, 0)) / 4
    if passes is None:
        expected = n * (2 + 2 + 2 * 12) + n * 2      # bf16 weights / gradients, 12-byte states
    else:
        expected = n * passes * 4.0                   # fp32 master weights, m and v
    assert opt.mem_bytes == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("plan,model", [
    (ParallelPlan(tp=2, pp=2, dp=2, sp=True, global_batch=8, seq=SEQ, schedule="interleaved", virtual_stages=2,
                  recompute="selective"), TINY),
    (ParallelPlan(tp=2, pp=2, dp=2, zero=2, global_batch=8, seq=SEQ, schedule="zb-h1"), TINY),
    (ParallelPlan(dp=2, pp=2, fsdp=True, zero=3, global_batch=8, seq=SEQ, recompute="full"), TINY),
    (ParallelPlan(tp=2, cp=2, pp=2, global_batch=4, seq=SEQ, recompute="full"), TINY),
    (ParallelPlan(pp=2, dp=4, ep=4, global_batch=16, seq=SEQ, skew=0.3, zero=1), MOE),
    (ParallelPlan(pp=4, dp=2, ep=2, global_batch=16, seq=SEQ, schedule="dualpipe"), MOE),
    (ParallelPlan(tp=2, pp=2, dp=2, global_batch=8, seq=SEQ, recompute="op"), TINY),
    (ParallelPlan(dp=4, fsdp=True, zero=3, global_batch=8, seq=SEQ, stack="torchtitan", recompute="op"), TINY),
    (ParallelPlan(dp=4, fsdp=True, zero=3, global_batch=8, seq=SEQ, stack="llm-foundry"), TINY),
])
def test_replayed_unit_ops_equal_written_ones(plan, model, monkeypatch):
    """Layers copied from a recipe (_StageBuilder._unit_ops) are the ops written out one by one."""
    from schedules import generate

    def fields(progs):
        out = {}
        for r, prog in progs.ops.items():
            out[r] = [tuple((f, getattr(op, f)) for f in op.__slots__ if f != "kernels")
                      + ((op.kernels.label, tuple(op.kernels.kernels)) if op.kernels is not None else None,)
                      for op in prog]
        return out

    replayed = build_programs(model, plan, symmetric=False)
    monkeypatch.setattr(generate._StageBuilder, "_unit_ops",
                        lambda self, u, a, deps, released: self._write_unit_ops(u, a, deps, released))
    written = build_programs(model, plan, symmetric=False)
    got, want = fields(replayed), fields(written)
    assert got == want


@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-compile", "megatron"])
def test_torch_context_parallel_buffers_are_live_while_a_layer_backward_runs(stack):
    """torch's context parallelism holds, while a layer's attention backward runs, the cp all-gathered K, V
    blocks (expanded by repeat_kv), the own block's contiguous copy and fp32 dQ, dK, dV accumulators beside
    the dK, dV hop buffer: closed form, and the engine's memory timeline reaches memory_per_rank's peak.
    Transformer Engine's ring (megatron) keeps none of these."""
    from schedules.memory import cp_transient_bytes
    model = dataclasses.replace(TINY, kv_heads=2)
    cp, tp = 2, 2
    plan = ParallelPlan(cp=cp, tp=tp, pp=2, dp=2, seq=SEQ, global_batch=8, stack=stack)
    tokens, heads = SEQ / cp, TINY.heads / tp
    q, kv = tokens * heads * TINY.d_head, tokens * heads * 2 * TINY.d_head      # K, V at the query heads
    expect = 0.0 if stack == "megatron" else 2 * kv * (cp + 1) + 4 * (q + 2 * kv)
    assert cp_transient_bytes(model, plan) == pytest.approx(expect)
    assert cp_transient_bytes(model, dataclasses.replace(plan, cp=1, dp=4)) == 0.0
    full = dataclasses.replace(plan, recompute="full")
    assert cp_transient_bytes(model, full) == pytest.approx(expect)
    # beside full recomputation's rebuilt layer: at the attention backward the MLP block's part is freed
    from schedules.memory import backward_transient_bytes, recompute_transient_bytes
    rebuilt, during = recompute_transient_bytes(model, full, 0), backward_transient_bytes(model, full, 0)
    assert max(rebuilt, expect) <= during <= rebuilt + expect
    assert (during < rebuilt + expect) == (stack != "megatron")
    progs = build_programs(model, plan)
    res = run(progs, SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e11))
    mem = memory_per_rank(model, plan)
    for rep in progs.ops:
        assert peak_memory(res, rep) == pytest.approx(mem[f"stage{plan.stage_of(rep)}"]["total"])


def test_context_parallelism_passes_mla_keys_and_values_at_full_width():
    """MLA under context parallelism: Megatron-Core up-projects K and V per head before Transformer Engine's
    attention, whose ring passes them (not the compressed latent); torch's all-gathers what its attention
    kernel reads: K (nope + rope) and V at every query head, both."""
    m = dataclasses.replace(get_model("deepseek-v3"), layers=4)
    tokens = 4096 // 2
    width = m.heads * (m.d_head + m.qk_rope_dim + m.v_head_dim)
    for stack in ("megatron", "torchtitan"):
        progs = build_programs(m, ParallelPlan(cp=2, ep=1, seq=4096, stack=stack))
        block = tokens * width * m.dtype_bytes
        sends = {op.size_bytes for op in progs.ops[0] if op.kind == "send" and op.strategy == "cp"}
        gathers = {op.size_bytes for op in progs.ops[0] if op.kind == "collective" and op.strategy == "cp"}
        if stack == "megatron":
            assert sorted(sends) == [pytest.approx(block), pytest.approx(2 * block)] and not gathers
        else:
            assert sorted(sends) == [pytest.approx(2 * block)] and sorted(gathers) == [pytest.approx(2 * block)]
