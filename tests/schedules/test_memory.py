"""Memory per rank: the ZeRO paper's example, Korthikanti's activation formulas (eager attention), the
FlashAttention saved-tensor model, schedule in-flight counts, FSDP residency under PP."""
import dataclasses

import pytest

from schedules.memory import head_activation_bytes, layer_activation_bytes, memory_per_rank
from schedules.models import custom_model, get_model, model_from_params
from schedules.plan import ParallelPlan
from simulator.errors import PlanError

GB = 1e9


@pytest.mark.parametrize("stage, expected_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(stage, expected_gb):
    # Rajbhandari et al. 2020, fig. 1: 7.5B parameters, 64 GPUs, K = 12.
    d = memory_per_rank(model_from_params(7.5e9), ParallelPlan(dp=64, zero=stage))["stage0"]
    states = d["parameters"] + d["gradients"] + d["optimizer"]
    assert states / GB == pytest.approx(expected_gb, abs=0.05)


def test_fsdp_is_zero3():
    m = model_from_params(7.5e9)
    a = memory_per_rank(m, ParallelPlan(dp=64, fsdp=True))["stage0"]
    b = memory_per_rank(m, ParallelPlan(dp=64, zero=3))["stage0"]
    assert a == b


GPT = custom_model(layers=8, hidden=1024, heads=16, vocab=51200)
S, Bm, H, A = 1024, 2, 1024, 16


@pytest.mark.parametrize("tp, sp, rc, per_sbh", [
    (1, False, "none", 34 + 5 * A * S / H),
    (4, False, "none", 10 + 24 / 4 + 5 * A * S / (H * 4)),
    (4, True, "none", 34 / 4 + 5 * A * S / (H * 4)),
    (4, True, "selective", 34 / 4),
    (4, False, "selective", 10 + 24 / 4),
    (4, True, "full", 2 / 4),
    (1, False, "full", 2),
])
def test_korthikanti_activation_formulas(tp, sp, rc, per_sbh):
    plan = ParallelPlan(tp=tp, sp=sp, recompute=rc, seq=S, micro_batch=Bm, attention="eager")
    assert layer_activation_bytes(GPT, plan, 0) == pytest.approx(S * Bm * H * per_sbh)


def test_context_parallel_divides_sequence():
    a = layer_activation_bytes(GPT, ParallelPlan(seq=S, cp=2, recompute="selective"), 0)
    b = layer_activation_bytes(GPT, ParallelPlan(seq=S // 2, recompute="selective"), 0)
    assert a == b


def _act(schedule, pp, m, v=1, stage=0):
    plan = ParallelPlan(pp=pp, schedule=schedule, virtual_stages=v, global_batch=m, seq=S, layer_split="even")
    return memory_per_rank(GPT, plan)[f"stage{stage}"]["activations"]


def test_1f1b_holds_p_microbatches_on_stage0_and_gpipe_m():
    per_layer = layer_activation_bytes(GPT, ParallelPlan(seq=S), 0)
    p, m = 4, 16
    stage_layers = GPT.layers // p
    assert _act("1f1b", p, m) == pytest.approx(p * stage_layers * per_layer)
    head = head_activation_bytes(GPT, ParallelPlan(seq=S))[0]     # final norm + fp32 cross-entropy softmax
    assert head == pytest.approx(2 * 2 * S * H + 4 * S * GPT.vocab)
    logits = 2 * S * GPT.vocab       # the bf16 logits live beside them while the (fused) loss runs
    assert _act("1f1b", p, m, stage=p - 1) == pytest.approx(1 * stage_layers * per_layer + head + logits)
    assert _act("gpipe", p, m) == pytest.approx(m * stage_layers * per_layer)
    assert _act("zb", p, m) == pytest.approx(_act("1f1b", p, m))
    # interleaved: p·(1 + (p-1)/(p·v)) stage-equivalents
    assert _act("interleaved", p, m, v=2) == pytest.approx(p * (1 + (p - 1) / (p * 2)) * stage_layers * per_layer)


def test_tensor_and_expert_parallel_shard_parameters():
    m = get_model("mixtral-8x22b")
    one = memory_per_rank(m, ParallelPlan(dp=8, seq=4096))["stage0"]["parameters"]
    tp8 = memory_per_rank(m, ParallelPlan(dp=1, tp=8, seq=4096))["stage0"]["parameters"]
    ep8 = memory_per_rank(m, ParallelPlan(dp=8, ep=8, seq=4096))["stage0"]["parameters"]
    assert tp8 == pytest.approx(one / 8, rel=0.01)
    experts = 56 * 8 * m.expert_params() * 2
    assert one - ep8 == pytest.approx(experts * 7 / 8)


def test_total_is_sum_of_categories():
    d = memory_per_rank(get_model("llama3-8b"), ParallelPlan(dp=8, zero=3, seq=4096))["stage0"]
    assert d["total"] == pytest.approx(sum(d[k] for k in ("parameters", "gradients", "optimizer", "activations",
                                                           "buffers")))
    assert d["buffers"] > 0


@pytest.mark.parametrize("tp, sp, rc", [(1, False, "none"), (4, False, "none"), (4, True, "none"),
                                        (4, True, "selective"), (4, False, "selective")])
def test_flash_is_korthikanti_without_scores_and_dropout(tp, sp, rc):
    """Independent check of the saved-tensor list on a GPT layer (MHA, GeLU, ffn 4h): Korthikanti's count
    without the s×s terms and without the two 1-byte dropout masks (replicated, /t with SP), plus
    FlashAttention's fp32 log-sum-exp (4·a·s·b bytes, dropped by selective recompute)."""
    eager = layer_activation_bytes(GPT, ParallelPlan(tp=tp, sp=sp, recompute="selective", seq=S, micro_batch=Bm,
                                                     attention="eager"), 0)
    flash = layer_activation_bytes(GPT, ParallelPlan(tp=tp, sp=sp, recompute=rc, seq=S, micro_batch=Bm), 0)
    masks = 2 * S * Bm * H / (tp if sp else 1)
    lse = 0.0 if rc == "selective" else 4 * A * S * Bm / tp
    assert flash == pytest.approx(eager - masks + lse)


def test_flash_activations_linear_in_sequence():
    m = get_model("llama3-8b")
    a = layer_activation_bytes(m, ParallelPlan(seq=4096), 0)
    b = layer_activation_bytes(m, ParallelPlan(seq=8192), 0)
    assert b == pytest.approx(2 * a)
    eager = layer_activation_bytes(m, ParallelPlan(seq=8192, attention="eager"), 0)
    assert eager > 3 * b          # the 5·a·s²·b scores dominate eager attention at 8k


def test_llama3_405b_tp8_pp16_fsdp_interleaved_activations_fit_80gb():
    """Issue 12 acceptance: Llama 3 405B at TP8 PP16, seq 8192, FSDP, SP, interleaved keeps its activations
    within 80 GB with the batch per DP group of Meta's 16,384-GPU run (Llama 3 paper, table 4: 16M tokens over
    DP 128, i.e. m = 16 micro-batches of 1; the activations per rank do not depend on dp); eager attention's
    s×s scores would need ~11x more. (Meta's 8,192-GPU run, DP 64, had 32 per group: 96 GB under Megatron's
    interleaved warm-up at v = 2, README.)"""
    plan = ParallelPlan(tp=8, pp=16, dp=64, seq=8192, fsdp=True, sp=True, schedule="interleaved", virtual_stages=2,
                        global_batch=64 * 16)
    mem = memory_per_rank(get_model("llama3-405b"), plan)
    worst = max(d["activations"] for d in mem.values())
    assert worst < 80 * GB
    eager = memory_per_rank(get_model("llama3-405b"), dataclasses.replace(plan, attention="eager"))
    assert max(d["activations"] for d in eager.values()) > 10 * worst


def test_fsdp_under_pp_keeps_stage_parameters_and_gradients_unsharded():
    """FSDP with PP (reshard_after_forward off): the whole stage's parameters stay gathered and its
    gradients accumulate unsharded, so the buffers are the stage's parameters at 2 + 2 bytes each."""
    from schedules.memory import rank_params
    m = dataclasses.replace(get_model("llama3-8b"), layers=8)
    plan = ParallelPlan(dp=4, pp=2, fsdp=True, seq=1024, global_batch=32)
    d = memory_per_rank(m, plan)["stage0"]
    dense, _ = rank_params(m, plan, 0)
    assert d["buffers"] == pytest.approx(dense * (m.dtype_bytes + plan.grad_bytes_per_param))
    # without PP at most the unit in use and the prefetched one are gathered, and one unit's gradients wait
    from schedules.memory import max_layer_params
    nopp_plan = ParallelPlan(dp=8, fsdp=True, seq=1024)
    nopp = memory_per_rank(m, nopp_plan)["stage0"]["buffers"]
    unit = max_layer_params(m, nopp_plan, 0)
    assert nopp <= 1.001 * unit * (2 * m.dtype_bytes + nopp_plan.grad_bytes_per_param)   # (+ final norm)


def test_fsdp_residency_rules():
    from schedules.memory import fsdp_residency
    uses = [("a", "F"), ("a", "F"), ("a", "B"), ("a", "B")]
    pp = ParallelPlan(pp=2, dp=2, fsdp=True)
    assert fsdp_residency(pp, uses) == [(True, False), (False, False), (False, False), (False, True)]
    raf = dataclasses.replace(pp, fsdp_reshard_after_forward="true")
    assert fsdp_residency(raf, uses) == [(True, True), (True, True), (True, False), (False, True)]
    nopp = ParallelPlan(dp=2, fsdp=True)
    assert fsdp_residency(nopp, uses) == [(True, True), (True, True), (True, True), (True, True)]
    keep = dataclasses.replace(nopp, fsdp_reshard_after_forward="false")
    assert fsdp_residency(keep, uses) == [(True, False), (False, False), (False, True), (True, True)]


def test_fp8_recipe_memory_closed_form():
    """FP8 (Transformer Engine): the four block-GEMM inputs saved for wgrad are FP8 (1 byte) and the projection
    input gets an FP8 copy beside FlashAttention's BF16 output; the weights gain 2 bytes per block parameter
    (row- and column-wise FP8 copies) except under FSDP."""
    from schedules.memory import layer_activation_bytes, model_state_bytes
    m = get_model("llama3-8b")
    kw = dict(tp=2, sp=True, seq=4096, micro_batch=1, zero=1, dp=4)
    bf, f8 = ParallelPlan(**kw), ParallelPlan(**kw, dtype="fp8")
    tok, h, ffn, t = 4096, m.hidden, m.ffn, 2
    saved_less = (2 * tok * h) / t + (tok * ffn) / t              # norm outputs (sp) + fc2 input, 1 byte less
    proj_copy = tok * m.heads * m.d_head / t                       # + 1 byte
    assert layer_activation_bytes(m, f8, 0) == pytest.approx(layer_activation_bytes(m, bf, 0) - saved_less
                                                              + proj_copy)
    blocks = m.layers * (m.layer_params(0)) / t
    extra = model_state_bytes(m, f8, 0)["parameters"] - model_state_bytes(m, bf, 0)["parameters"]
    assert extra == pytest.approx(2 * blocks)
    fs = dict(kw, zero=3)
    assert model_state_bytes(m, ParallelPlan(**fs, dtype="fp8"), 0) == model_state_bytes(m, ParallelPlan(**fs), 0)


def test_fp8_param_gather_keeps_block_weights_in_fp8_only():
    """Megatron-Core --fp8-param-gather: the block weights lose their BF16 bytes (2 per block parameter) and
    keep the FP8 row- and column-wise copies; the embedding, head and optimizer state are unchanged; it needs
    fp8, the megatron stack and the distributed optimizer, and is refused with MXFP8."""
    from schedules.memory import model_state_bytes
    m = get_model("llama3-8b")
    kw = dict(tp=2, sp=True, seq=4096, micro_batch=1, zero=1, dp=4, dtype="fp8", fp8_recipe="current")
    base, pg = ParallelPlan(**kw), ParallelPlan(**kw, fp8_param_gather=True)
    blocks = m.layers * m.layer_params(0) / 2
    a, b = model_state_bytes(m, base, 0), model_state_bytes(m, pg, 0)
    assert a["parameters"] - b["parameters"] == pytest.approx(m.dtype_bytes * blocks)
    assert (a["gradients"], a["optimizer"]) == (b["gradients"], b["optimizer"])
    for bad, why in ((dict(dtype="bf16", fp8_recipe="delayed"), "--dtype fp8"), (dict(stack="torchtitan",
                     fp8_recipe="delayed"), "megatron"), (dict(zero=0), "--zero 1 or 2"), (dict(zero=3), "--zero 1 or 2"),
                     (dict(fp8_recipe="mxfp8"), "MXFP8")):
        with pytest.raises(PlanError, match=why):
            ParallelPlan(**{**kw, **bad}, fp8_param_gather=True).validate(m, 8)


@pytest.mark.parametrize("model_name, kw", [
    ("deepseek-v3", dict(tp=2, pp=4, ep=8, recompute="selective")),        # 3 dense layers, then MoE
    ("llama3-8b", dict(tp=2, recompute="full", recompute_every=2)),       # every other layer checkpointed
    ("llama3-8b", dict(tp=1, recompute="op", stack="torchtitan")),        # per-op checkpointing
    ("mixtral-8x22b", dict(tp=4, ep=2, attention="eager", sp=True)),
])
def test_layer_activation_cache_is_exact(model_name, kw):
    """The activation bytes are cached by layer kind (MoE or not, its recomputation): every layer's cached
    answer equals the one computed for that layer itself."""
    from schedules import memory
    model = get_model(model_name)
    plan = ParallelPlan(seq=4096, micro_batch=1, dp=8, **kw)
    memory._SPLIT_CACHE.clear()
    for layer in range(model.layers):
        for rc in ("none", "selective", "op"):
            assert memory._layer_split_bytes(model, plan, layer, rc) == \
                memory._layer_split_bytes_of(model, plan, layer, rc), (layer, rc)


@pytest.mark.parametrize("sp", [False, True])
def test_eager_attention_keeps_an_eager_stacks_pointwise_tensors(sp):
    """Under --attention eager the stack had been ignored: torchtitan's eager RMSNorms (fp32 input copy beyond
    the input and unweighted output: 4 bytes per element, two norms) and SwiGLU (SiLU's output) keep
    8·s·b·h + 2·s·b·ffn more bytes per layer than fused kernels (the norms split over TP with SP only);
    per-op checkpointing recomputes them."""
    m = get_model("llama3-8b")
    t, s, b = 2, 2048, 1
    plans = {st: ParallelPlan(tp=t, sp=sp, seq=s, micro_batch=b, attention="eager", stack=st)
             for st in ("megatron", "torchtitan")}
    extra = layer_activation_bytes(m, plans["torchtitan"], 0) - layer_activation_bytes(m, plans["megatron"], 0)
    norms = 8 * s * b * m.hidden
    assert extra == pytest.approx((norms / t if sp else norms) + 2 * s * b * m.ffn / t, rel=1e-12)
    op = {st: dataclasses.replace(p, recompute="op") for st, p in plans.items()}
    assert layer_activation_bytes(m, op["torchtitan"], 0) == layer_activation_bytes(m, op["megatron"], 0)
