"""Layer-phase kernels: FLOPs agree with the model's FLOP counts, stacks differ as documented, caching."""
import dataclasses

import pytest

from schedules.kernels import phase_kernels
from schedules.models import get_model
from schedules.plan import ParallelPlan
from simulator.errors import PlanError
from simulator.kernels import ATTENTION, ELEMENTWISE, GEMM

PHASES = ("forward", "backward", "backward_input", "backward_weight")


def _flops(kl, kind):
    return sum(k.flops for k in kl if k.kind == kind)


@pytest.mark.parametrize("name", ["llama3-70b", "gpt3-175b", "deepseek-v3"])
@pytest.mark.parametrize("tp,sp", [(1, False), (8, True), (4, False)])
def test_gemm_flops_are_the_model_linear_flops_per_rank(name, tp, sp):
    m = get_model(name)
    p = ParallelPlan(tp=tp, sp=sp, seq=4096, micro_batch=2, ep=1)
    layer = m.layers - 1                          # an MoE layer in DeepSeek-V3
    lf = m.layer_flops(layer, p.seq, p.micro_batch)
    mult = {"forward": 1, "backward": 2, "backward_input": 1, "backward_weight": 1}
    for ph in PHASES:
        if m.is_moe_layer(layer):
            gemm = _flops(phase_kernels(m, p, layer, ph, part="attention"), GEMM) + \
                _flops(phase_kernels(m, p, layer, ph, part="experts"), GEMM)
        else:
            gemm = _flops(phase_kernels(m, p, layer, ph), GEMM)
        # TP shards every linear layer but the MoE router (each rank routes its own tokens: all of them
        # without SP) and MLA's down projections (replicated in Megatron-Core: parallel_mode "duplicated")
        t = p.seq * p.micro_batch
        down = 2.0 * t * m.hidden * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_dim) if m.is_mla else 0.0
        expect = (lf.linear - lf.router - down) / tp + (lf.router / tp if sp else lf.router) + down
        assert gemm == pytest.approx(mult[ph] * expect, rel=2e-3), ph


def test_attention_core_flops_follow_flashattention_conventions():
    m = get_model("llama3-8b")
    p = ParallelPlan(tp=2, seq=8192)
    core = m.layer_flops(0, 8192, 1).attn_core / 2
    fwd = phase_kernels(m, p, 0, "forward")
    assert _flops(fwd, ATTENTION) == pytest.approx(core / 2)              # causal: half the score matrix
    assert _flops(phase_kernels(m, p, 0, "backward"), ATTENTION) == pytest.approx(2.5 * core / 2)
    assert _flops(phase_kernels(m, p, 0, "backward_weight"), ATTENTION) == 0


def test_recomputation_reruns_forward_kernels():
    m = get_model("llama3-8b")
    base = phase_kernels(m, ParallelPlan(seq=4096), 0, "backward")
    full = phase_kernels(m, ParallelPlan(seq=4096, recompute="full"), 0, "backward")
    sel = phase_kernels(m, ParallelPlan(seq=4096, recompute="selective"), 0, "backward")
    fwd = phase_kernels(m, ParallelPlan(seq=4096), 0, "forward")
    assert len(full) == len(base) + len(fwd) and full.flops == pytest.approx(base.flops + fwd.flops)
    assert _flops(sel, ATTENTION) == pytest.approx(_flops(base, ATTENTION) + _flops(fwd, ATTENTION))
    assert _flops(sel, GEMM) == _flops(base, GEMM)


def test_eager_stack_launches_more_and_moves_more_bytes():
    m = get_model("llama3-8b")
    mg = phase_kernels(m, ParallelPlan(seq=4096, stack="megatron"), 0, "forward")
    tt = phase_kernels(m, ParallelPlan(seq=4096, stack="torchtitan"), 0, "forward")
    ew = lambda kl: sum(k.bytes for k in kl if k.kind == ELEMENTWISE)   # noqa: E731
    assert len(tt) > len(mg) and ew(tt) > 1.5 * ew(mg)
    assert _flops(tt, GEMM) == pytest.approx(_flops(mg, GEMM))         # same math, different kernels
    # wq, wk, wv apart (torchtitan's Attention) and w1, w3 apart
    assert sum(k.kind == GEMM for k in tt) == sum(k.kind == GEMM for k in mg) + 3


def test_fp8_runs_block_gemms_in_fp8_and_adds_casts():
    m = get_model("llama3-8b")
    p = ParallelPlan(seq=4096, dtype="fp8")
    fwd = phase_kernels(m, p, 0, "forward")
    assert {k.dtype for k in fwd if k.kind == GEMM} == {"fp8"}
    assert any("cast" in k.name for k in fwd)
    head = phase_kernels(m, p, None, "forward", part="head")
    assert {k.dtype for k in head if k.kind == GEMM} == {"bf16"}        # the LM head stays BF16
    assert not any("cast" in k.name for k in phase_kernels(m, ParallelPlan(seq=4096), 0, "backward"))


@pytest.mark.parametrize("tp, sp", [(1, False), (2, True)])
def test_fp8_current_scaling_reads_each_amax_before_its_cast(tp, sp):
    """Transformer Engine's current scaling: every standalone cast of n elements is preceded by an amax read of
    its 2-byte input (2n bytes); the norms feeding FP8 GEMMs write BF16 (2 + 2 bytes per element instead of
    2 + 1) and are quantized by a cast whose amax the norm computed (no read); the weights' per-step cast reads
    their amax too. GEMMs and every other kernel are unchanged; other stacks refuse the recipe."""
    m = get_model("llama3-8b")
    delayed = ParallelPlan(tp=tp, sp=sp, seq=4096, dtype="fp8", global_batch=4)
    current = dataclasses.replace(delayed, fp8_recipe="current")
    rows = 4096 / (tp if sp else 1)
    for ph in ("forward", "backward"):
        d = {k.name: k for k in phase_kernels(m, delayed, 0, ph)}
        c = {k.name: k for k in phase_kernels(m, current, 0, ph)}
        assert {n: k for n, k in c.items() if k.kind == GEMM} == {n: k for n, k in d.items() if k.kind == GEMM}
        casts = [n for n in d if n.endswith("fp8 cast")]
        assert casts
        for n in casts:
            assert c[f"{n}: amax"].bytes == pytest.approx(d[n].bytes / 4 * 2)      # n elements: (2 + 2) n -> 2 n
        added = set(c) - set(d) - {f"{n}: amax" for n in casts}
        if ph == "forward":
            assert added == {"input norm fp8 cast", "post-attention norm fp8 cast",
                             "fp8 weight amax (per step / micro-batches)"}
            for norm in ("input norm", "post-attention norm"):
                assert d[norm].bytes == pytest.approx(rows * m.hidden * 3)
                assert c[norm].bytes == pytest.approx(rows * m.hidden * 4)
                assert c[f"{norm} fp8 cast"].bytes == pytest.approx(rows * m.hidden * 4)
            weights = d["fp8 weight cast (per step / micro-batches)"].bytes
            assert c["fp8 weight amax (per step / micro-batches)"].bytes == pytest.approx(weights / 2)
        else:
            assert not added
        assert all(c[n].bytes == d[n].bytes for n in d if "norm" not in n or n.endswith("bwd"))
    with pytest.raises(PlanError, match="megatron"):
        ParallelPlan(stack="torchtitan", dtype="fp8", fp8_recipe="current").validate(m, 1)
    with pytest.raises(PlanError, match="FP8 recipe"):
        ParallelPlan(dtype="fp8", fp8_recipe="mx").validate(m, 1)


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_fp8_param_gather_casts_the_optimizer_shard_and_transposes_the_weight(recipe):
    """--fp8-param-gather: the per-step weight cast becomes the optimizer's cast of its fp32 shard (4 + 1 bytes
    per shard element, plus a 4-byte amax read under current scaling) and a transpose of the gathered FP8
    weight (1 + 1 bytes per element); every other kernel is unchanged."""
    from schedules.kernels import FP32 as MAIN_PARAM_BYTES         # the optimizer's fp32 main weights
    m = get_model("llama3-8b")
    kw = dict(tp=2, sp=True, seq=4096, dtype="fp8", fp8_recipe=recipe, zero=1, dp=4, cp=2, global_batch=16)
    base, pg = ParallelPlan(**kw), ParallelPlan(**kw, fp8_param_gather=True)
    n_mb = base.num_microbatches
    params = (m.attention_params() + m._mlp_params(m.ffn)) / 2      # the layer's GEMM weights on a TP rank
    shard = params / (4 * 2)                                          # the optimizer's shard: dp x cp
    for ph in ("forward", "backward"):
        a = {k.name: k for k in phase_kernels(m, base, 0, ph)}
        b = {k.name: k for k in phase_kernels(m, pg, 0, ph)}
        weights = {n for n in a if n.startswith("fp8 weight")}
        new = {n for n in b if n.startswith(("fp8 param", "fp8 weight"))}
        assert {n: k for n, k in a.items() if n not in weights} == {n: k for n, k in b.items() if n not in new}
        if ph == "forward":
            assert b["fp8 param shard cast (per step / micro-batches)"].bytes == pytest.approx(
                shard * (MAIN_PARAM_BYTES + 1) / n_mb)
            assert b["fp8 weight transpose (per step / micro-batches)"].bytes == pytest.approx(params * 2 / n_mb)
            amax = b.get("fp8 param shard amax (per step / micro-batches)")
            assert (amax is not None) == (recipe == "current")
            if amax is not None:
                assert amax.bytes == pytest.approx(shard * MAIN_PARAM_BYTES / n_mb)
        else:
            assert not weights and not new


def test_mxfp8_unfuses_the_norms_and_writes_block_scales():
    """MXFP8 (megatron stack): no amax read; every cast writes an E8M0 scale per 32 elements row- and
    column-wise (2/32 bytes per element more than delayed); the norms feeding FP8 GEMMs write BF16 and are
    quantized by a cast of their own, as under current scaling."""
    m = get_model("llama3-8b")
    delayed = ParallelPlan(seq=4096, dtype="fp8", global_batch=4)
    mx = dataclasses.replace(delayed, fp8_recipe="mxfp8")
    rows = 4096
    for ph in ("forward", "backward"):
        d = {k.name: k for k in phase_kernels(m, delayed, 0, ph)}
        x = {k.name: k for k in phase_kernels(m, mx, 0, ph)}
        assert not any("amax" in n for n in x if n != "fp8 amax/scale update")
        for n in d:
            if n.endswith("fp8 cast") or n.startswith("fp8 weight cast"):
                assert x[n].bytes == pytest.approx(d[n].bytes * (4 + 2 / 32) / 4)
        if ph == "forward":
            for norm in ("input norm", "post-attention norm"):
                assert x[norm].bytes == pytest.approx(rows * m.hidden * 4)
                assert x[f"{norm} fp8 cast"].bytes == pytest.approx(rows * m.hidden * (4 + 2 / 32))


@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-compile", "torchtitan-compile-loss", "llm-foundry"])
def test_torchao_dynamic_scaling_reads_each_amax_before_its_cast(stack):
    """torchtitan's float8 is torchao's tensorwise dynamic scaling: every cast (inputs, gradients, the weights)
    reads its tensor's amax first, 2 bytes per element; llm-foundry's FP8 is Transformer Engine's delayed
    scaling (no amax read); BF16 has neither."""
    m = get_model("llama3-8b")
    p = ParallelPlan(seq=4096, dtype="fp8", stack=stack, global_batch=4)
    for ph in ("forward", "backward"):
        ks = {k.name: k for k in phase_kernels(m, p, 0, ph)}
        casts = [n for n in ks if n.endswith("fp8 cast") or n.startswith("fp8 weight cast")]
        assert casts
        for n in casts:
            weights = n.startswith("fp8 weight")
            amax = ks.get(n.replace("fp8 weight cast", "fp8 weight amax") if weights else f"{n}: amax")
            if stack == "llm-foundry":
                assert amax is None
            else:
                assert amax.bytes == pytest.approx(ks[n].bytes / 4 * 2)
        bf16 = phase_kernels(m, dataclasses.replace(p, dtype="bf16"), 0, ph)
        assert not any("amax" in k.name or "fp8" in k.name for k in bf16)


def test_experts_follow_routed_tokens_and_load():
    m = get_model("deepseek-v3")
    p = ParallelPlan(dp=8, ep=8, seq=4096)
    layer = m.layers - 1
    one = phase_kernels(m, p, layer, "forward", part="experts")
    skew = phase_kernels(m, p, layer, "forward", part="experts", load=1.5)
    assert _flops(one, GEMM) == pytest.approx(m.layer_flops(layer, 4096, 1).experts, rel=1e-3)
    assert _flops(skew, GEMM) == pytest.approx(1.5 * _flops(one, GEMM), rel=1e-3)
    assert {k.batch for k in one if k.kind == GEMM} == {m.experts // 8}   # grouped GEMM over local experts


def test_fp8_experts_quantize_their_permuted_input_and_folding_keeps_gemm_flops():
    """FP8: the experts' grouped GEMM quantizes the permuted tokens (routed x hidden, row- and column-wise
    copies: 2 + 2 bytes per element), there being no norm to fuse the cast into. Folded (etp 1 over tp 4) a
    rank's expert GEMMs take tokens / tp at the full expert width: the same FLOPs as the TP-sharded experts."""
    m = get_model("deepseek-v3")
    layer = m.layers - 1
    p = ParallelPlan(dp=8, ep=8, seq=4096, dtype="fp8")
    kl = phase_kernels(m, p, layer, "forward", part="experts")
    cast = [k for k in kl if k.name == "experts fc1 input fp8 cast"]
    assert len(cast) == 1 and cast[0].bytes == pytest.approx(4096 * m.top_k * m.hidden * 4)
    assert not [k for k in phase_kernels(m, ParallelPlan(dp=8, ep=8, seq=4096), layer, "forward", part="experts")
                if "fp8" in k.name]
    unf = ParallelPlan(tp=4, dp=8, ep=8, sp=True, seq=4096)
    fold = ParallelPlan(tp=4, dp=8, ep=32, etp=1, sp=True, seq=4096)
    a = phase_kernels(m, unf, layer, "forward", part="experts")
    b = phase_kernels(m, fold, layer, "forward", part="experts")
    assert _flops(b, GEMM) == pytest.approx(_flops(a, GEMM), rel=1e-9)
    assert {k.n for k in b if k.kind == GEMM and "fc1" in k.name} == {2 * m.expert_ffn}


def test_lists_are_shared_and_bad_choices_rejected():
    m = get_model("llama3-8b")
    p = ParallelPlan(seq=4096)
    assert phase_kernels(m, p, 0, "forward") is phase_kernels(m, p, 3, "forward")
    with pytest.raises(PlanError, match="stack"):
        ParallelPlan(stack="jax").validate()
    with pytest.raises(PlanError, match="dtype"):
        ParallelPlan(dtype="fp4").validate()


def test_position_embedding_and_dropout_follow_the_model():
    """Rotary kernels only for RoPE models; a learned table adds one add at the embedding; MPT has no dropout."""
    plan = ParallelPlan(seq=2048, stack="torchtitan")
    names = lambda kl: {k.name for k in kl}                              # noqa: E731
    llama = names(phase_kernels(get_model("llama3-8b"), plan, 0, "forward"))
    mpt = phase_kernels(get_model("mpt-7b"), plan, 0, "forward")
    gpt = names(phase_kernels(get_model("gpt3-175b"), plan, 0, "forward"))
    assert any("rotary" in n for n in llama)
    assert not any("rotary" in n for n in names(mpt)) and not any("rotary" in n for n in gpt)
    assert not any("dropout" in n for n in names(mpt)) and any("dropout" in n for n in gpt)
    # Nemotron-4: a 2-matrix (squared-ReLU) MLP trained without dropout (tech report: "dropout rate of zero")
    for name in ("nemotron4-15b", "nemotron4-340b"):
        for phase in ("forward", "backward"):
            assert not any("dropout" in n for n in names(phase_kernels(get_model(name), plan, 0, phase)))
    assert "position embedding add" in names(phase_kernels(get_model("gpt3-175b"), plan, None, "forward",
                                                           part="embedding"))
    with pytest.raises(Exception, match="position_embedding"):
        get_model("llama3-8b").__class__(**{**get_model("llama3-8b").to_dict(), "position_embedding": "sinus"})


def test_llm_foundry_stack_runs_triton_attention():
    """llm-foundry = the eager kernels of torchtitan with the Triton FlashAttention core (attn_impl: triton); its
    norm is one F.layer_norm kernel where torchtitan runs its eager RMSNorm chain."""
    from topologies.kernel_cost import KernelPricer
    from topologies.specs import get_accelerator

    m = get_model("mpt-7b")
    lf = phase_kernels(m, ParallelPlan(seq=8192, stack="llm-foundry"), 0, "backward")
    tt = phase_kernels(m, ParallelPlan(seq=8192, stack="torchtitan"), 0, "backward")
    qkv = ("qkv", "wq", "wk", "wv")     # MPT's fused Wqkv; torchtitan's Attention has wq, wk, wv apart
    assert [k.name for k in lf if "norm" not in k.name and not k.name.startswith(qkv)] == \
        [k.name for k in tt if "norm" not in k.name and not k.name.startswith(qkv)]
    assert [k.name for k in tt if k.name.startswith(qkv)] == ["wq dgrad", "wq wgrad", "wk dgrad", "wk wgrad",
                                                              "wv dgrad", "wv wgrad"]
    assert [k.name for k in lf if k.name.startswith(qkv)] == ["qkv dgrad", "qkv wgrad"]
    att_lf = next(k for k in lf if k.kind == ATTENTION)
    att_tt = next(k for k in tt if k.kind == ATTENTION)
    assert (att_lf.impl, att_tt.impl) == ("triton", "flash2") and att_lf.flops == att_tt.flops
    # a plan may ask for another FlashAttention kernel than its stack's (llm-foundry launched with attn_impl: flash)
    for kernel, impl in (("flash2", "flash2"), ("triton", "triton"), ("auto", "triton")):
        ks = phase_kernels(m, ParallelPlan(seq=8192, stack="llm-foundry", attention_kernel=kernel), 0, "backward")
        assert {k.impl for k in ks if k.kind == ATTENTION} == {impl}
    assert {k.impl for k in phase_kernels(m, ParallelPlan(seq=8192, stack="torchtitan", attention_kernel="triton"),
                                          0, "forward") if k.kind == ATTENTION} == {"triton"}
    # llm-foundry's default loss_fn is flash-attn's fused cross-entropy: one read of the bf16 logits
    head = lambda stack: [k.name for k in phase_kernels(m, ParallelPlan(seq=8192, stack=stack), None, "forward",
                                                          part="head")]
    assert "cross-entropy (fused)" in head("llm-foundry") and "log_softmax" in head("torchtitan")
    # Composer computes MPT's two train metrics (LanguageCrossEntropy, LanguagePerplexity) on every micro-batch
    assert sum("train metric" in n for n in head("llm-foundry")) == 4 and not any("train metric" in n for n in
                                                                                 head("torchtitan"))
    # one loss per stack: fused (megatron, llm-foundry) or eager (torchtitan), never both
    for stack in ("megatron", "llm-foundry", "torchtitan"):
        names = head(stack)
        assert ("cross-entropy (fused)" in names) != ("log_softmax" in names), stack
    pricer = KernelPricer(get_accelerator("A100-80GB"))
    # llm-foundry's Triton kernel runs at FlashAttention v1's rate (its docstring: "slightly slower" than the
    # CUDA v1 overall). A100 chart, hdim 128 causal, fwd+bwd at 8k: FlashAttention 80, FlashAttention-2 182 TFLOP/s
    ratio = pricer.kernel_time_s(att_lf) / pricer.kernel_time_s(att_tt)
    assert ratio == pytest.approx(182 / 80, rel=0.15)


def test_llm_foundry_flash_path_unpads_around_the_varlen_kernel():
    """llm-foundry's attn_impl: flash (flash_attn_fn) gathers Q, K, V into unpadded rows (read + write each) and
    scatters the output back into a zeroed tensor (3 passes); backward gathers the output gradient (2 passes)
    and scatters each of dQ, dK, dV into a zeroed gradient (3 passes). Its Triton path, and flash2 under other
    stacks, take the padded layout: none of these kernels. The varlen kernel keeps its unpadded output beside
    the padded one the projection saves."""
    from schedules.memory import saved_tensors

    m = get_model("mpt-7b")
    b, s = 2, 4096
    plan = ParallelPlan(seq=s, micro_batch=b, stack="llm-foundry", attention_kernel="flash2")
    el = b * s * m.heads * m.d_head             # elements of Q (MHA: K, V and the output alike)
    names = lambda p, ph: {k.name: k.bytes for k in phase_kernels(m, p, 0, ph)
                           if k.name.startswith(("unpad", "pad "))}
    assert names(plan, "forward") == {"unpad q, k, v (flash-attn varlen)": 2 * 2 * 3 * el,
                                      "pad attention output": 3 * 2 * el}
    assert names(plan, "backward") == {"pad attention output bwd": 2 * 2 * el, "unpad q, k, v bwd": 3 * 2 * 3 * el}
    fwd = [k.name for k in phase_kernels(m, plan, 0, "forward")]
    i = fwd.index("flash attention fwd")
    assert fwd[i - 1] == "unpad q, k, v (flash-attn varlen)" and fwd[i + 1] == "pad attention output"
    for other in (dataclasses.replace(plan, attention_kernel="auto"), dataclasses.replace(plan, attention_kernel="triton"),
                  dataclasses.replace(plan, stack="torchtitan"), dataclasses.replace(plan, stack="megatron")):
        assert not names(other, "forward") and not names(other, "backward")
    # the attention kernel itself is the padded one's: same FLOPs, same curve
    att = lambda p: next((k.flops, k.impl) for k in phase_kernels(m, p, 0, "backward") if k.kind == ATTENTION)
    assert att(plan) == att(dataclasses.replace(plan, stack="torchtitan"))
    # GQA: K and V are kv_heads wide
    g = get_model("llama3-8b")
    q, kv = b * s * g.heads * g.d_head, b * s * g.kv_heads * g.d_head
    assert {k.name: k.bytes for k in phase_kernels(g, plan, 0, "forward")}["unpad q, k, v (flash-attn varlen)"] == \
        2 * 2 * (q + 2 * kv)
    extra = {t.name: t.nbytes for t in saved_tensors(m, plan, 0)}
    assert extra["attention output, unpadded (flash-attn varlen)"] == 2 * el
    assert "attention output, unpadded (flash-attn varlen)" not in {
        t.name for t in saved_tensors(m, dataclasses.replace(plan, attention_kernel="triton"), 0)}


def test_torchtitan_eager_rmsnorm_is_its_chain_of_ops():
    """torchtitan's norms.py RMSNorm runs one kernel per eager op: 28 + 4a bytes per element forward (x.float(),
    pow, mean, x*r, type_as, *weight; the row statistics are negligible), 60 + 8a backward; under
    torch.compile (and in llm-foundry, Megatron) the norm is one kernel."""
    m = get_model("llama3-8b")
    plan = ParallelPlan(seq=4096, stack="torchtitan")
    n = 4096 * m.hidden
    for phase, per_elt in (("forward", 28 + 4 * 2), ("backward", 60 + 8 * 2)):
        ks = [k for k in phase_kernels(m, plan, 0, phase) if k.name.startswith("input norm")]
        assert len(ks) == (8 if phase == "forward" else 9)
        assert sum(k.bytes for k in ks) == pytest.approx(n * per_elt, rel=1e-3)
    compiled = [k for k in phase_kernels(m, ParallelPlan(seq=4096, stack="torchtitan-compile"), 0, "forward")
                if "norm" in k.name or "rotary" in k.name or "swiglu" in k.name or k.name in ("silu", "mul")]
    assert [k.name for k in compiled] == ["input norm", "rotary (fused)", "post-attention norm", "swiglu (fused)"]


def test_compiled_loss_is_one_kernel_over_the_bf16_logits():
    """torchtitan from 2025-04 compiles the loss: the head's forward and backward are torchtitan-compile's but
    for the cross-entropy, one kernel reading the bf16 logits (no fp32 cast / log_softmax passes)."""
    m = get_model("llama3-8b")
    names = lambda stack, ph: [k.name for k in phase_kernels(m, ParallelPlan(seq=4096, stack=stack), None, ph,
                                                              part="head")]
    assert "logits float cast" in names("torchtitan-compile", "forward")
    assert "logits float cast" not in names("torchtitan-compile-loss", "forward")
    assert names("torchtitan-compile-loss", "forward") == names("megatron", "forward")
    layer = lambda stack: [(k.name, k.bytes) for k in phase_kernels(m, ParallelPlan(seq=4096, stack=stack), 0, "forward")]
    assert layer("torchtitan-compile-loss") == layer("torchtitan-compile")


def test_eager_stack_saves_what_its_eager_ops_keep():
    """Memory follows the kernels: torchtitan's eager RMSNorm keeps an fp32 copy of its input and its unweighted
    output, eager SwiGLU keeps SiLU's output; fused stacks keep the bf16 norm input only."""
    from schedules.memory import saved_tensors
    m = get_model("llama3-8b")
    tok = 4096
    fused = sum(t.nbytes for t in saved_tensors(m, ParallelPlan(seq=4096, stack="megatron"), 0))
    eager = sum(t.nbytes for t in saved_tensors(m, ParallelPlan(seq=4096, stack="torchtitan"), 0))
    compiled = sum(t.nbytes for t in saved_tensors(m, ParallelPlan(seq=4096, stack="torchtitan-compile"), 0))
    # torchtitan (eager and compiled) saves K and V expanded to the query heads by repeat_kv
    expanded = 2 * tok * (m.heads - m.kv_heads) * m.d_head * 2
    assert eager - fused == pytest.approx(2 * tok * m.hidden * (4 - 2 + 2) + tok * m.ffn * 2 + expanded)
    assert compiled == fused + expanded
    # Megatron's selective recomputation re-runs only the attention core: the eager pointwise saves stay (its
    # per-op checkpointing, recompute op, keeps none of them: tests/schedules/test_recompute.py)
    sel = dict(seq=4096, recompute="selective")
    kept = lambda stack: sum(t.nbytes for t in saved_tensors(m, ParallelPlan(stack=stack, **sel), 0) if not t.core)
    assert kept("torchtitan") - kept("megatron") == pytest.approx(eager - fused)


@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-compile", "torchtitan-compile-loss"])
@pytest.mark.parametrize("tp", [1, 8])
def test_torchtitan_repeats_kv_heads_before_the_attention_kernel(stack, tp):
    """torchtitan's Llama (before #2259) expands K and V to the query heads (repeat_kv: a copy) before SDPA:
    forward reads K, V at the kv heads and writes them at the query heads, the backward sums the repeats back
    (the same bytes); per rank under TP (70B on TP8: 8 query heads, 1 kv head). Other stacks, MHA models and
    MLA have no such kernel."""
    m = get_model("llama3-70b")
    plan = ParallelPlan(tp=tp, sp=tp > 1, seq=4096, micro_batch=2, stack=stack)
    tok, heads, kv = 4096 * 2, m.heads / tp, m.kv_heads / tp
    expect = 2 * 2 * tok * m.d_head * (kv + heads)      # K and V, 2-byte activations
    for phase, name in (("forward", "repeat_kv (k, v to the query heads)"),
                        ("backward", "repeat_kv bwd (sum of the repeats)"),
                        ("backward_input", "repeat_kv bwd (sum of the repeats)")):
        ks = [k for k in phase_kernels(m, plan, 0, phase, recompute=False) if k.name.startswith("repeat_kv")]
        assert [(k.name, k.kind) for k in ks] == [(name, ELEMENTWISE)]
        assert ks[0].bytes == pytest.approx(expect)
    assert not [k for k in phase_kernels(m, plan, 0, "backward_weight") if k.name.startswith("repeat_kv")]
    # full recomputation re-runs the forward's copy before the backward's sum
    full = dataclasses.replace(plan, recompute="full")
    assert [k.name for k in phase_kernels(m, full, 0, "backward") if k.name.startswith("repeat_kv")] == \
        ["repeat_kv (k, v to the query heads)", "repeat_kv bwd (sum of the repeats)"]
    for other_model, other_stack in (("llama3-70b", "megatron"), ("llama3-70b", "llm-foundry"),
                                     ("llama2-13b", stack), ("deepseek-v3", stack)):
        om = get_model(other_model)
        op = ParallelPlan(tp=tp, sp=tp > 1, seq=4096, stack=other_stack, ep=1)
        assert not [k for ph in PHASES for k in phase_kernels(om, op, 0, ph) if k.name.startswith("repeat_kv")]


@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-compile"])
def test_torch_context_parallel_attention_passes(stack):
    """torch's context-parallel attention (torchtitan) adds elementwise passes around the attention kernels:
    on the rank's own block once per layer and pass, on each other block per ring step (averaged over the CP
    ranks: half the blocks cover all the rank's queries, half the second half). Eager: K, V .contiguous(), the
    K, V cat before each exchange, fp32 merges of the output (cast + 32 bytes) and fp32 dQ, dK, dV accumulators
    (zeros, adds, cats, casts); compiled: each chain one fused pass (the all-gather's K, V copy, accumulations
    read and write once). Closed forms per rank; Megatron's ring (Transformer Engine) has none; per-op
    checkpointing keeps them (they run inside the attention op)."""
    from schedules.kernels import op_policy
    m = get_model("llama3-8b")
    cp, seq = 4, 16384
    plan = ParallelPlan(cp=cp, seq=seq, stack=stack)
    a, f = 2, 4
    T = seq / cp
    q, kv = T * m.heads * m.d_head, T * m.heads * 2 * m.d_head       # K, V expanded by repeat_kv
    add = 2 * f + a
    cp_bytes = lambda kl: sum(k.bytes for k in kl if k.name.startswith("cp: "))
    own_f = cp_bytes(phase_kernels(m, plan, 0, "forward"))
    own_b = cp_bytes(phase_kernels(m, plan, 0, "backward", recompute=False))
    step_f = cp_bytes(phase_kernels(m, plan, 0, "forward", part="ring"))
    step_b = cp_bytes(phase_kernels(m, plan, 0, "backward", part="ring"))
    if stack == "torchtitan":
        assert own_f == pytest.approx(2 * a * kv + 2 * (a + f) * q)
        assert own_b == pytest.approx(2 * a * kv + (2 * f + add + a) * (q + kv) + 2 * f * kv)
        assert step_f == pytest.approx(2 * a * kv + (a + 9 * f) * 0.75 * q + f * q)
        assert step_b == pytest.approx(2 * a * kv + add * 0.75 * (q + kv) + f * (q + kv) + 2 * f * kv)
    else:
        assert own_f == pytest.approx(2 * a * kv + 2 * (a + f) * q)
        assert own_b == pytest.approx(2 * a * kv + 2 * (a + f) * (q + kv))
        assert step_f == pytest.approx(add * 0.75 * q + 0.5 * f * q)
        assert step_b == pytest.approx(add * 0.75 * (q + kv) + 0.5 * f * (q + kv))
    assert cp_bytes(phase_kernels(m, ParallelPlan(seq=seq, stack=stack), 0, "forward")) == 0      # no CP
    saved, recomputed = op_policy(m, phase_kernels(m, plan, 0, "forward"))
    assert cp_bytes(saved) == pytest.approx(own_f) and cp_bytes(recomputed) == 0


def test_transformer_engine_context_parallel_attention_passes():
    """Megatron-Core's context parallelism is Transformer Engine's P2P ring (AttnFuncWithCPAndKVP2P): on the
    rank's own block, the K, V concatenation into the send buffer, the first block's output scaled into the
    output and the softmax statistics cloned (forward), K, V copied into the ring buffer and the first block's
    dQ, dK, dV copied into their accumulators (backward); on each other block (averaged over the ranks: 0.75
    of a tensor) the statistics corrected, the output scaled and added, dQ, dK, dV added. GQA keeps K, V at
    the kv heads (no repeat_kv). Closed forms per rank; llm-foundry (no CP of its own) has none."""
    m = get_model("llama3-70b")
    cp, seq, tp = 2, 8192, 4
    plan = ParallelPlan(tp=tp, sp=True, cp=cp, seq=seq, stack="megatron")
    a, f = 2, 4
    T = seq / cp
    heads, kv_heads = m.heads / tp, m.kv_heads / tp
    q, kv, rows = T * heads * m.d_head, T * kv_heads * 2 * m.d_head, T * heads
    cp_bytes = lambda kl: sum(k.bytes for k in kl if k.name.startswith("cp: "))
    own_f = cp_bytes(phase_kernels(m, plan, 0, "forward"))
    own_b = cp_bytes(phase_kernels(m, plan, 0, "backward", recompute=False))
    step_f = cp_bytes(phase_kernels(m, plan, 0, "forward", part="ring"))
    step_b = cp_bytes(phase_kernels(m, plan, 0, "backward", part="ring"))
    assert own_f == pytest.approx(2 * a * kv + 2 * f * rows + 2 * a * q + 2 * f * rows)
    assert step_f == pytest.approx(0.75 * (3 * f * rows + 3 * a * q + 2 * f * rows))
    assert own_b == pytest.approx(2 * a * kv + 2 * a * q + 2 * a * kv)
    assert step_b == pytest.approx(0.75 * 3 * a * (q + kv))
    # one kernel per accumulator (dq, dk, dv), as TE's copy_ / add_ calls
    assert [k.name for k in phase_kernels(m, plan, 0, "backward", part="ring") if k.name.startswith("cp: ")] == \
        ["cp: dq add", "cp: dk add", "cp: dv add"]
    # over a layer the accumulators see each element copied once and added for every further block it is in
    total_b = own_b + (cp - 1) * step_b
    assert total_b == pytest.approx(2 * a * kv + 2 * a * (q + kv) + 3 * a * 0.75 * (cp - 1) * (q + kv))
    # MLA: dQ is as wide as the query-key heads (d_qk), the merged output as the value heads (d_v)
    ds = get_model("deepseek-v3")
    mla = ParallelPlan(tp=8, sp=True, cp=cp, seq=seq, stack="megatron", ep=1)
    d_qk, d_v = ds.d_head + ds.qk_rope_dim, ds.v_head_dim
    hs = ds.heads / 8
    adds = {k.name: k.bytes for k in phase_kernels(ds, mla, 0, "backward", part="ring") if k.name.startswith("cp: ")}
    assert adds["cp: dq add"] == pytest.approx(0.75 * 3 * a * T * hs * d_qk)
    assert adds["cp: dv add"] == pytest.approx(0.75 * 3 * a * T * hs * d_v)
    merge = sum(k.bytes for k in phase_kernels(ds, mla, 0, "forward", part="ring") if "output correction" in k.name)
    assert merge == pytest.approx(0.75 * (3 * a * T * hs * d_v + 2 * f * T * hs))
    # the weight-gradient phase has none; without CP, or on a stack without a CP of its own, none either
    assert cp_bytes(phase_kernels(m, plan, 0, "backward_weight", part="ring")) == 0
    assert cp_bytes(phase_kernels(m, ParallelPlan(tp=tp, sp=True, seq=seq, stack="megatron"), 0, "forward")) == 0
    foundry = ParallelPlan(tp=tp, sp=True, cp=cp, seq=seq, stack="llm-foundry")
    assert cp_bytes(phase_kernels(m, foundry, 0, "forward")) == cp_bytes(
        phase_kernels(m, foundry, 0, "forward", part="ring")) == 0


@pytest.mark.parametrize("stack", ["megatron", "torchtitan"])
def test_ring_block_kernels_run_at_their_own_shapes(stack):
    """An other rank's KV block is, with causal load balancing, either all the rank's s queries over the
    block's first s/2 keys or the rank's last s/2 queries over all s keys, unmasked, half the ring steps each:
    two kernels at half weight whose FLOPs together are half an s x s unmasked block, each priced at its own
    key length (the shorter one at a rate read at s/2 keys)."""
    from topologies.kernel_cost import KernelPricer
    from topologies.specs import get_accelerator
    m = get_model("llama3-8b")
    cp, seq = 4, 16384
    plan = ParallelPlan(cp=cp, seq=seq, stack=stack)
    s = seq / cp
    for phase, pass_ in (("forward", "fwd"), ("backward", "bwd")):
        ks = [k for k in phase_kernels(m, plan, 0, phase, part="ring") if k.kind == ATTENTION]
        assert [(k.seq_q, k.seq_kv, k.causal) for k in ks] == [(s, s / 2, False), (s / 2, s, False)]
        fwd = 2.0 * s * s * m.heads * 2 * m.d_head * 0.5
        assert sum(k.flops for k in ks) == pytest.approx(fwd if pass_ == "fwd" else 2.5 * fwd)
        assert ks[0].flops == pytest.approx(ks[1].flops)
    pricer = KernelPricer(get_accelerator("H100-SXM"))
    for k in phase_kernels(m, plan, 0, "forward", part="ring"):
        if k.kind == ATTENTION:      # half of a whole kernel of its own shape, at that shape's rate
            whole = dataclasses.replace(k, flops=2 * k.flops)
            assert pricer.kernel_time_s(k) == pytest.approx(pricer.kernel_time_s(whole) / 2)
    lower, upper = [k for k in phase_kernels(m, plan, 0, "forward", part="ring") if k.kind == ATTENTION]
    as_square = dataclasses.replace(lower, seq_kv=int(s))      # the rate read at s keys instead of s/2
    assert pricer.kernel_time_s(lower) != pricer.kernel_time_s(as_square)


@pytest.mark.parametrize("stack", ["megatron", "torchtitan"])
def test_qk_norm_normalises_each_query_and_key_head(stack):
    """Qwen3's q_norm / k_norm: an RMSNorm over each head's width, after the QKV GEMM and before rotary; a fused
    norm reads and writes Q and K once forward and moves three passes backward, and keeps its input for it."""
    from schedules.memory import layer_activation_bytes
    qwen = get_model("qwen3-30b-a3b")
    plain = dataclasses.replace(qwen, qk_norm=False)
    assert qwen.param_count() - plain.param_count() == qwen.layers * 2 * 128
    p = ParallelPlan(tp=2, sp=True, seq=4096, micro_batch=1, ep=1, stack=stack)
    T = 4096
    elements = T * (32 + 4) / 2 * 128                     # this rank's Q and K heads (TP 2)
    for ph, passes in (("forward", 2), ("backward", 3)):
        kl = [k for k in phase_kernels(qwen, p, 0, ph, part="attention") if k.name.startswith("q, k norm")]
        extra = sum(k.bytes for k in phase_kernels(qwen, p, 0, ph, part="attention")) - \
            sum(k.bytes for k in phase_kernels(plain, p, 0, ph, part="attention"))
        assert kl and extra == pytest.approx(sum(k.bytes for k in kl))
        if stack == "megatron":
            assert extra == pytest.approx(passes * 2 * elements)
    names = [k.name for k in phase_kernels(qwen, p, 0, "forward", part="attention")]
    first_norm = next(i for i, n in enumerate(names) if n.startswith("q, k norm"))
    assert first_norm < next(i for i, n in enumerate(names) if n.startswith("rotary"))       # before rotary
    saved = layer_activation_bytes(qwen, p, 0) - layer_activation_bytes(plain, p, 0)
    per_element = 2 if stack == "megatron" else 2 + (4 - 2) + 2     # eager: the fp32 copy and unweighted output
    assert saved == pytest.approx(per_element * elements)
