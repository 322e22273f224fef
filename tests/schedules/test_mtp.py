"""Multi-token prediction (DeepSeek-V3's MTP module): parameters against the publisher's figures, FLOPs and
programs against the model's own per-layer formulas, the pipeline split and Megatron-Bridge's layout."""
import dataclasses

import pytest

from schedules import build_programs, get_model
from schedules.kernels import phase_kernels
from schedules.memory import head_unit_params, rank_params, stage_chunks
from schedules.models import model_flops_per_step, model_from_hf_config
from schedules.plan import ParallelPlan
from simulator.costs import IdealCostModel
from simulator.engine import run
from simulator.program import FORWARD
from tests.schedules.test_hf_config import DEEPSEEK_V3

SEQ = 128
MOE = get_model("tiny-moe")
MTP = dataclasses.replace(MOE, mtp_layers=1)


def test_deepseek_v3_mtp_module_matches_the_published_total():
    """DeepSeek-V3's README: 685 B on Hugging Face = 671 B main model + 14 B MTP module (its layer, eh_proj,
    norms, and its own copies of the embedding and the output head)."""
    m = get_model("deepseek-v3")
    assert m.mtp_layers == 1
    copies = m.embedding_params() + m.head_params()
    assert m.param_count() + m.mtp_param_count() + copies == pytest.approx(685e9, rel=1e-3)
    assert m.mtp_param_count() + copies == pytest.approx(14e9, rel=0.05)


def test_hf_config_reads_num_nextn_predict_layers():
    assert model_from_hf_config(DEEPSEEK_V3).mtp_layers == 0
    assert model_from_hf_config({**DEEPSEEK_V3, "num_nextn_predict_layers": 1}).mtp_layers == 1


def test_model_flops_count_the_mtp_module():
    """Per sequence: the MTP layer's forward + backward (3x forward) and 3x its projection and head pass."""
    t = SEQ
    h, v = MTP.hidden, MTP.vocab
    mtp = MTP.layer_flops(MTP.layers - 1, SEQ, 1).total + 3 * (2 * t * 2 * h * h + 2 * t * v * h)
    assert model_flops_per_step(MTP, SEQ, 4) == pytest.approx(model_flops_per_step(MOE, SEQ, 4) + 4 * mtp,
                                                              rel=1e-12)


def test_mtp_layer_runs_on_the_last_piece_and_balances_the_split():
    plan = ParallelPlan(pp=4, dp=1, seq=SEQ)
    assert plan.piece_layers(MTP)[-1][-1] == MTP.layers          # index layers: the MTP module's layer
    assert sum(len(p) for p in plan.piece_layers(MTP)) == MTP.layers + 1
    # DeepSeek-V3 on PP16: the balanced split is Megatron-Bridge's layout (1 decoder layer beside the MTP
    # module and the loss on the last stage, 4 elsewhere)
    ds = get_model("deepseek-v3")
    p16 = ParallelPlan(pp=16, dp=1, seq=4096)
    assert p16.piece_layer_counts(ds) == [4] * 15 + [1]


def test_last_stage_holds_the_mtp_parameters():
    plan = ParallelPlan(pp=2, dp=2, ep=2, seq=SEQ)
    with_mtp, without = rank_params(MTP, plan, 1), rank_params(MOE, plan, 1)
    layer_dense = (MTP.layer_params(MTP.layers) - MTP.layer_expert_params(MTP.layers)) / plan.tp
    layer_expert = MTP.layer_expert_params(MTP.layers) / plan.ep
    extras = 2 * MTP.hidden ** 2 + 3 * MTP.hidden + MTP.embedding_params()     # + the embedding copy (PP)
    # the balanced split may move a decoder layer off the last stage: compare what the last piece holds
    dec = [l for l in stage_chunks(MTP, plan, 1)[0] if l < MTP.layers]
    dec0 = stage_chunks(MOE, plan, 1)[0]
    per_dense = (MOE.layer_params(1) - MOE.layer_expert_params(1)) / plan.tp
    per_expert = MOE.layer_expert_params(1) / plan.ep
    shift = len(dec) - len(dec0)
    assert with_mtp[0] == pytest.approx(without[0] + layer_dense + extras + shift * per_dense)
    assert with_mtp[1] == pytest.approx(without[1] + layer_expert + shift * per_expert)
    assert head_unit_params(MTP, plan, 0) == 0.0


def test_head_kernels_add_the_mtp_projection_and_head_pass():
    plan = ParallelPlan(seq=SEQ)
    names = [k.name for k in phase_kernels(MTP, plan, None, FORWARD, part="head").kernels]
    assert {"mtp 1 eh_proj", "mtp 1 lm head", "mtp 1 enorm", "mtp 1 hnorm"} <= set(names)
    base = sum(k.flops for k in phase_kernels(MOE, plan, None, FORWARD, part="head").kernels)
    more = sum(k.flops for k in phase_kernels(MTP, plan, None, FORWARD, part="head").kernels)
    assert more - base == pytest.approx(MTP.mtp_extra_flops(SEQ, 1), rel=1e-9)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_programs_execute_the_model_flops_with_mtp(recompute):
    plan = ParallelPlan(tp=2, pp=2, dp=2, ep=2, seq=SEQ, global_batch=8, recompute=recompute)
    progs = build_programs(MTP, plan, symmetric=False)
    executed = sum(op.flops for prog in progs.ops.values() for op in prog
                   if op.kind == "compute" and op.phase != "optimizer")
    extra = 0.0
    if recompute == "full":
        for l in range(MTP.layers + 1):
            extra += MTP.layer_flops(l, SEQ, 1).forward * plan.num_microbatches * plan.dp
    assert executed == pytest.approx(progs.model_flops_per_step + extra, rel=1e-9)
    last = [r for r in progs.ops if any(op.name.endswith("MTP1") for op in progs.ops[r])]
    assert last == [r for r in progs.ops if plan.stage_of(r) == plan.pp - 1]
    # the MTP layer's experts exchange tokens like any MoE layer's: dispatch + combine, forward + backward, and
    # again in the recomputed forward
    r = last[0]
    a2a = [op for op in progs.ops[r] if op.collective == "all_to_all" and op.layer == MTP.layers]
    assert len(a2a) == (6 if recompute == "full" else 4) * plan.num_microbatches


def test_mtp_slows_the_step_and_symmetric_equals_full():
    plan = ParallelPlan(pp=2, dp=2, ep=2, seq=SEQ, global_batch=8)
    cost = IdealCostModel()
    t0 = run(build_programs(MOE, plan), cost).step_time_s
    sym = run(build_programs(MTP, plan), cost).step_time_s
    full = run(build_programs(MTP, plan, symmetric=False), cost).step_time_s
    assert sym == pytest.approx(full, rel=1e-12)
    assert sym > t0
