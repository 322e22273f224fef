"""LoRA fine-tuning (``ParallelPlan.lora_rank``) and packed documents (``--packed-doc-tokens``): against closed
forms: the frozen model's kernels (no weight gradients), the adapters' GEMMs, FLOPs, model state, saved
activations, the data-parallel reduction and the optimizer step of the adapters alone."""
import dataclasses
import json

import pytest

from clustersim.cli import main
from schedules import build_programs
from schedules.generate import ADAM_FLOPS_PER_PARAM
from schedules.kernels import phase_kernels
from schedules.memory import model_state_bytes, saved_tensors
from schedules.models import get_model, lora_layer_params, model_flops_per_step, packed
from schedules.plan import ParallelPlan
from simulator.errors import ConfigError, PlanError

M = get_model("llama3-8b")
BASE = ParallelPlan(dp=8, tp=2, seq=4096, micro_batch=1, sp=True, zero=1, global_batch=16)
LORA = dataclasses.replace(BASE, lora_rank=16, lora_targets=("qkv", "fc2"))


def _names(plan, phase):
    return [k.name for k in phase_kernels(M, plan, 3, phase).kernels]


def test_adapter_parameters_are_rank_times_in_plus_out_of_each_target():
    h, a, kv, d, f = M.hidden, M.heads, M.kv_heads, M.d_head, M.ffn
    assert lora_layer_params(M, 16, ("qkv",)) == 16 * (h + (a + 2 * kv) * d)
    assert lora_layer_params(M, 8, ("qkv", "proj", "fc1", "fc2")) == 8 * (
        h + (a + 2 * kv) * d + a * d + h + h + 2 * f + f + h)
    assert lora_layer_params(M, 0, ("qkv",)) == 0


def test_frozen_model_runs_no_weight_gradient_and_adapters_only_on_targets():
    full_b, lora_b, lora_f = _names(BASE, "backward"), _names(LORA, "backward"), _names(LORA, "forward")
    assert any(n.endswith(" wgrad") and "lora" not in n for n in full_b)
    assert not any(n.endswith(" wgrad") and "lora" not in n for n in lora_b)
    assert [n for n in lora_f if "lora" in n] == ["qkv lora A", "qkv lora B", "qkv lora scale", "qkv lora add",
                                                  "mlp fc2 lora A", "mlp fc2 lora B", "mlp fc2 lora scale",
                                                  "mlp fc2 lora add"]
    assert {n for n in lora_b if "wgrad" in n} == {"qkv lora A wgrad", "qkv lora B wgrad", "mlp fc2 lora A wgrad",
                                                   "mlp fc2 lora B wgrad"}
    # the split backward: the weight pass holds only the adapters' weight gradients
    zb = dataclasses.replace(LORA, pp=2, dp=4, schedule="zb")
    assert all("lora" in n for n in _names(zb, "backward_weight"))


def test_backward_flops_drop_by_the_weight_gradients_plus_the_adapters():
    """Backward FLOPs of a layer: full = 2·linear + 2·attention core (+ nothing else); LoRA = linear + 2·core +
    the adapters' dgrad and wgrad GEMMs (2 each per adapter FLOP of the forward)."""
    def gemm_flops(plan, phase):
        return sum(k.flops for k in phase_kernels(M, plan, 3, phase).kernels if k.kind == "gemm")
    full, lora = gemm_flops(BASE, "backward"), gemm_flops(LORA, "backward")
    adapters_fwd = gemm_flops(LORA, "forward") - gemm_flops(BASE, "forward")
    tokens = BASE.seq * BASE.micro_batch
    assert adapters_fwd == pytest.approx(2 * tokens * (
        16 * (M.hidden + (M.heads + 2 * M.kv_heads) * M.d_head / 2) + 16 * (M.ffn / 2 + M.hidden)), rel=1e-9)
    assert lora == pytest.approx(full / 2 + 2 * adapters_fwd, rel=1e-9)


def test_model_flops_count_forward_input_gradients_attention_and_adapters():
    seq, gb = 4096, 16
    lf = [M.layer_flops(i, seq, 1) for i in range(M.layers)]
    expect = gb * (sum(2 * f.linear + 3 * f.attn_core for f in lf) + 2 * M.head_flops(seq, 1)
                   + 6 * seq * M.layers * lora_layer_params(M, 16, ("qkv", "fc2")))
    assert model_flops_per_step(M, seq, gb, 16, ("qkv", "fc2")) == pytest.approx(expect, rel=1e-12)
    # the weights' share drops to 2/3, attention's stays whole
    assert 2 / 3 < model_flops_per_step(M, seq, gb, 16, ("qkv",)) / model_flops_per_step(M, seq, gb) < 0.75


def test_gradients_and_optimizer_state_are_the_adapters_alone():
    full, lora = model_state_bytes(M, BASE, 0), model_state_bytes(M, LORA, 0)
    adapters = M.layers * lora_layer_params(M, 16, ("qkv", "fc2")) / BASE.tp
    assert lora["gradients"] == pytest.approx(BASE.grad_bytes_per_param * adapters)
    assert lora["optimizer"] == pytest.approx(BASE.optimizer_bytes_per_param * adapters / (BASE.dp * BASE.cp))
    assert lora["parameters"] == pytest.approx(full["parameters"] + M.dtype_bytes * adapters)


def test_saved_activations_keep_only_what_backward_and_the_adapters_read():
    full = {t.name: t for t in saved_tensors(M, BASE, 3)}
    lora = {t.name: t for t in saved_tensors(M, LORA, 3)}
    assert "norm1 output (QKV input)" in lora and "activation output (fc2 input)" in lora     # adapters' inputs
    assert "norm2 output (MLP input)" not in lora            # a frozen fc1 without adapter keeps no input
    assert lora["attention output (projection input)"].reader == "B"     # FlashAttention's backward reads it
    assert set(lora) < set(full)
    fp8 = {t.name: t for t in saved_tensors(M, dataclasses.replace(LORA, dtype="fp8"), 3)}
    full8 = {t.name: t for t in saved_tensors(M, dataclasses.replace(BASE, dtype="fp8"), 3)}
    # the adapter keeps its BF16 input where the FP8 recipe kept an FP8 copy for the frozen weight's gradient
    assert fp8["norm1 output (QKV input)"].nbytes == 2 * full8["norm1 output (QKV input)"].nbytes
    assert "attention output fp8 copy (projection input)" not in fp8


def test_data_parallel_reduction_and_optimizer_step_cover_the_adapters():
    plan = dataclasses.replace(LORA, zero=0, global_batch=8)
    progs = build_programs(M, plan, 16, symmetric=True)
    ops = progs.ops[0]
    reduced = sum(op.size_bytes for op in ops if op.kind == "collective" and op.name.startswith("dp grad"))
    adapters = M.layers * lora_layer_params(M, 16, ("qkv", "fc2")) / plan.tp
    assert reduced == pytest.approx(adapters * plan.grad_reduce_bytes)
    step = next(op for op in ops if op.name == "optimizer step")
    assert step.flops == pytest.approx(ADAM_FLOPS_PER_PARAM * adapters)      # zero 0: every adapter, on each rank


def test_packed_documents_are_causal_attention_within_each():
    seq, d = 4096, 206
    p = packed(M, d, seq)
    assert p.local_attention(0) == ("chunked", d)
    full, rest = divmod(seq, d)
    pairs = full * d * (d + 1) / 2 + rest * (rest + 1) / 2
    core = M.layer_flops(0, seq, 1).attn_core
    assert p.layer_flops(0, seq, 1).attn_core == pytest.approx(core * pairs / (seq * (seq + 1) / 2), rel=1e-9)
    assert packed(M, seq, seq) is M
    with pytest.raises(ConfigError, match="already attends locally"):
        packed(get_model("gpt-oss-20b"), d, seq)


def test_plan_refuses_what_is_not_modelled():
    with pytest.raises(PlanError, match="lora_targets"):
        dataclasses.replace(BASE, lora_rank=8, lora_targets=("wq",)).validate(M, 16)
    with pytest.raises(PlanError, match="modelled for dense attention models"):
        dataclasses.replace(BASE, lora_rank=8, dp=16, tp=1, sp=False, global_batch=16).validate(
            get_model("deepseek-v3"), 16)


def _run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_runs_lora_and_says_so(capsys):
    base = ["simulate", "-m", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--seq", "4096", "--json"]
    code, out, err = _run(capsys, *base)
    full = json.loads(out)
    code, out, err = _run(capsys, *base, "--lora-rank", "16", "--lora-targets", "qkv", "--packed-doc-tokens", "206")
    assert code == 0, err
    lora = json.loads(out)
    assert lora["step_time_s"] < 0.75 * full["step_time_s"]
    assert lora["peak_memory_bytes"] < 0.5 * full["peak_memory_bytes"]
    assert any("LoRA rank 16 on qkv" in n for n in lora["notes"])
    assert any("documents of 206 tokens" in n for n in lora["notes"])
    assert lora["plan"]["lora_rank"] == 16 and lora["plan"]["lora_targets"] == ["qkv"]
    code, out, err = _run(capsys, *base, "--lora-targets", "qkv")
    assert code == 2 and "give --lora-rank" in err
    code, out, err = _run(capsys, *base, "--lora-rank", "8", "--lora-targets", "qkv,gate")
    assert code == 2 and "unknown LoRA target(s) 'gate'; choose from qkv, proj, fc1, fc2" in err
    code, out, err = _run(capsys, *base, "--lora-rank", "8", "--lora-targets", "")
    assert code == 2 and "--lora-targets: no LoRA target named" in err


def test_plan_and_search_take_the_lora_options(capsys):
    args = ["plan", "-m", "llama3-70b", "--gpus", "8", "--tp", "2", "--pp", "4", "--seq", "4096", "--global-batch",
            "32", "--cluster", "dgx-h100", "--sp", "--zero", "1", "--json"]
    code, out, err = _run(capsys, *args)
    full = json.loads(out)
    code, out, err = _run(capsys, *args, "--lora-rank", "16", "--lora-targets", "qkv")
    assert code == 0, err
    lora = json.loads(out)
    assert not full["fits_in_memory"] and lora["fits_in_memory"]
    assert lora["peak_memory_bytes"] < full["peak_memory_bytes"] / 3
    code, out, err = _run(capsys, "search", "--gpus", "16", "-m", "llama3-70b", "--global-batch", "32", "--seq",
                          "4096", "--lora-rank", "16", "--lora-targets", "qkv", "--packed-doc-tokens", "206",
                          "--no-cache", "--micro-batches", "1", "--recompute", "none", "--schedules", "1f1b",
                          "--top-k", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["top"][0]["plan"]["lora_rank"] == 16


def test_fsdp_gradient_buffers_hold_the_adapters_alone():
    """ZeRO-3 / FSDP under PP holds a stage's unsharded gradients until the step's reduce-scatter: under LoRA
    only the adapters' (the gathered-parameter part is the same)."""
    from schedules.memory import fsdp_buffer_bytes, fsdp_units
    full = dataclasses.replace(BASE, zero=0, fsdp=True, pp=2, dp=4, tp=2)
    lora = dataclasses.replace(full, lora_rank=16, lora_targets=("qkv", "fc2"))
    params = sum(d + e for units in fsdp_units(M, full, 0) for _, d, e in units)
    layers = sum(1 for units in fsdp_units(M, full, 0) for n, _, _ in units if n not in ("embedding", "lm_head"))
    adapters = layers * lora_layer_params(M, 16, ("qkv", "fc2")) / full.tp
    assert fsdp_buffer_bytes(M, full, 0) - fsdp_buffer_bytes(M, lora, 0) == pytest.approx(
        (params - adapters) * full.grad_buffer_bytes_per_param, rel=1e-9)


def test_column_parallel_adapters_keep_the_gathered_norm_output_under_sp():
    """Megatron-Bridge hands a qkv / fc1 adapter the norm output its base linear gathered over the sequence
    (return_layernorm_output_gathered): whole on every TP rank, where the fused norm's own copy is sharded."""
    saved = {t.name: t for t in saved_tensors(M, dataclasses.replace(LORA, lora_targets=("qkv", "proj")), 3)}
    assert saved["norm1 output (QKV input)"].shard == "none"
    assert saved["attention output (projection input)"].shard == "tp"


def test_unfused_linears_take_an_adapter_each():
    """torchtitan runs wq, wk, wv (and SwiGLU's w1, w3) as linears of their own: one A each, the B's as wide as
    the fused one's."""
    h = M.hidden
    assert lora_layer_params(M, 8, ("qkv",), "torchtitan") - lora_layer_params(M, 8, ("qkv",)) == 8 * 2 * h
    assert lora_layer_params(M, 8, ("fc1",), "torchtitan") - lora_layer_params(M, 8, ("fc1",)) == 8 * h
    tt = dataclasses.replace(LORA, stack="torchtitan", lora_targets=("qkv",))
    assert sum(1 for n in _names(tt, "forward") if n.endswith("lora A")) == 3


def test_frozen_fp8_parameters_are_not_recast_every_step_and_tp_overlap_is_refused():
    fp8 = dataclasses.replace(LORA, dtype="fp8", fp8_param_gather=True)
    assert not any("fp8 param shard" in n or "fp8 weight transpose" in n for n in _names(fp8, "forward"))
    full = dataclasses.replace(fp8, lora_rank=0)
    assert any("fp8 param shard cast" in n for n in _names(full, "forward"))
    with pytest.raises(PlanError, match="tp-comm-overlap with LoRA"):
        dataclasses.replace(LORA, tp_comm_overlap=True).validate(M, 16)


def test_megatron_adapters_run_tp_collectives_of_their_own():
    """Megatron-Bridge's ParallelLinearAdapter under TP (per layer and micro-batch, beside the layer's own 2 + 2
    SP collectives each way): a row-parallel target (proj, fc2) gathers its m×h output in forward and, under
    SP, all-gathers in backward; without SP a column-parallel target (qkv, fc1) all-reduces its input gradient
    in backward; under SP a column-parallel adapter adds nothing; DTensor's LoRA styles add nothing priced."""
    from collections import Counter

    def tp(plan):
        ops = build_programs(M, plan, plan.world_size, symmetric=True).ops[0]
        return Counter((op.collective, op.phase) for op in ops if op.kind == "collective" and op.strategy == "tp"
                       and op.layer == 3 and op.microbatch == 0)
    sp = dataclasses.replace(BASE, dp=4, global_batch=8)
    base = tp(sp)
    assert tp(dataclasses.replace(sp, lora_rank=16, lora_targets=("qkv", "fc1"))) == base
    rows = tp(dataclasses.replace(sp, lora_rank=16, lora_targets=("proj", "fc2")))
    assert rows - base == Counter({("all_gather", "forward"): 2, ("all_gather", "backward"): 2})
    no_sp = dataclasses.replace(sp, sp=False)
    cols = tp(dataclasses.replace(no_sp, lora_rank=16, lora_targets=("qkv", "fc1")))
    assert cols - tp(no_sp) == Counter({("all_reduce", "backward"): 2})
    assert tp(dataclasses.replace(sp, lora_rank=16, lora_style="dtensor")) == base
    # full recomputation re-runs the forward before backward, the adapters' output gathers included
    full = dataclasses.replace(sp, recompute="full")
    rows_full = tp(dataclasses.replace(full, lora_rank=16, lora_targets=("proj", "fc2")))
    assert rows_full - tp(full) == Counter({("all_gather", "forward"): 2, ("all_gather", "backward"): 4})
    full_no_sp = dataclasses.replace(no_sp, recompute="full")
    cols_full = tp(dataclasses.replace(full_no_sp, lora_rank=16, lora_targets=("qkv", "fc1")))
    assert cols_full - tp(full_no_sp) == Counter({("all_reduce", "backward"): 2})
