"""Hybrid Mamba-2 models (Nemotron-H, Nemotron 3 Nano): layer patterns, parameters against the published sizes and a
module-by-module count, the SSD scan's FLOPs against its kernels, per-kind kernels, saved tensors and collectives,
plan refusals, Hugging Face configs, and symmetric against full mode."""
import dataclasses
import json

import pytest

from schedules import build_programs
from schedules.kernels import phase_kernels
from schedules.memory import layer_activation_bytes, saved_tensors
from schedules.models import get_model, model_from_hf_config
from schedules.plan import ParallelPlan
from simulator.errors import ConfigError, PlanError
from simulator.kernels import ATTENTION, GEMM
from simulator.program import COLLECTIVE

SMALL = dataclasses.replace(get_model("nemotron-h-8b"), name="small-hybrid", layers=6, hybrid_pattern="M-*-ME",
                            hidden=512, ffn=1024, heads=8, kv_heads=4, vocab=1024, mamba_heads=16, mamba_groups=4,
                            mamba_state=32, experts=4, top_k=2, moe_ffn=256)


def _mamba_params_by_module(h, heads, head_dim, state, groups, conv):
    """Megatron-Core's MambaMixer, module by module: in_proj (z, x, B, C, dt), conv1d weight and bias over x, B,
    C, dt_bias, A_log, D, the gated norm's weight, out_proj; the layer's pre-norm."""
    d_inner = heads * head_dim
    in_proj = h * (d_inner + d_inner + groups * state + groups * state + heads)
    conv_ch = d_inner + 2 * groups * state
    return in_proj + conv_ch * conv + conv_ch + heads + heads + heads + d_inner + d_inner * h + h


def test_presets_match_the_published_sizes_and_a_module_count():
    # Nemotron-H paper (arXiv 2504.03624) and model cards: 8B, 47B, 56B; Nemotron 3 Nano 30B-A3B: 31.6 B total,
    # 3.6 B active with embeddings (NVIDIA's model card: "31.6B total parameters, approximately 3.6B active")
    sizes = {"nemotron-h-8b": 8.1e9, "nemotron-h-47b": 46.8e9, "nemotron-h-56b": 56.3e9}
    for name, n in sizes.items():
        m = get_model(name)
        assert m.param_count() == pytest.approx(n, rel=5e-3)
        assert len(m.hybrid_pattern) == m.layers
        assert m.layer_params(0) == _mamba_params_by_module(m.hidden, m.mamba_heads, 64, m.mamba_state, 8, 4)
    nano = get_model("nemotron-3-nano")
    assert nano.param_count() == pytest.approx(31.6e9, rel=5e-3)
    assert nano.active_param_count() == pytest.approx(3.6e9, rel=0.01)
    assert [nano.layer_kind(i) for i in range(6)] == list("MEMEM*")
    assert [nano.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, False]


def test_layer_flops_per_kind():
    m, t = SMALL, 256.0
    f = [m.layer_flops(i, 256, 1) for i in range(6)]
    assert f[0].attn_linear == 2 * t * m.mamba_linear_params() and f[0].attn_core == m.ssd_flops(256, 1)
    assert f[0].mlp == f[0].experts == 0
    assert f[1].mlp == 2 * t * 2 * m.hidden * m.ffn and f[1].attn_linear == f[1].attn_core == 0
    assert f[2].attn_linear == 2 * t * m.attention_params() and f[2].mlp == f[2].experts == 0
    assert f[5].experts == 2 * t * m.top_k * m.expert_params() and f[5].attn_linear == f[5].attn_core == 0
    # the SSD scan's FLOPs are the sum of its chunked matmuls (Dao & Gu 2024, sec. 6), by hand for one chunk size
    q, n, p, hh, g = 128, m.mamba_state, 64, m.mamba_heads, m.mamba_groups
    assert m.ssd_flops(256, 1) == 2 * 256 * (q * n * g + hh * n * p + hh * q * p + hh * n * p)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_kind_runs_its_own_kernels(tp):
    plan = ParallelPlan(tp=tp, sp=tp > 1, seq=512)
    names = lambda layer, ph="forward": [k.name for k in phase_kernels(SMALL, plan, layer, ph)]
    mamba = phase_kernels(SMALL, plan, 0, "forward")
    assert "in_proj" in names(0) and "out_proj" in names(0) and not any(k.kind == ATTENTION for k in mamba)
    ssd = sum(k.flops for k in mamba if k.kind == GEMM and k.name.startswith("ssd"))
    assert ssd == pytest.approx(SMALL.ssd_flops(512, 1) / tp, rel=1e-12)       # the kernels are the scan's matmuls
    assert not any("mlp" in n or "attention" in n for n in names(0))
    assert any(n.startswith("mlp fc1") for n in names(1)) and not any(k.kind == ATTENTION for k in
                                                                      phase_kernels(SMALL, plan, 1, "forward"))
    assert any(k.kind == ATTENTION for k in phase_kernels(SMALL, plan, 2, "forward"))
    assert not any(n.startswith("mlp") for n in names(2))
    assert "router" in [k.name for k in phase_kernels(SMALL, plan, 5, "forward", part="attention")]
    assert not any(k.kind == ATTENTION for k in phase_kernels(SMALL, plan, 5, "forward", part="attention"))
    # backward: two gradient matmuls per forward one, and the recomputed C·Bᵀ and chunk states
    back = [k for k in phase_kernels(SMALL, plan, 0, "backward") if k.kind == GEMM and k.name.startswith("ssd")]
    assert sum(k.flops for k in back) == pytest.approx(2 * ssd + sum(
        k.flops for k in mamba if k.name in ("ssd C·Bᵀ", "ssd chunk states")), rel=1e-12)


def test_saved_tensors_follow_the_layer_kind():
    plan = ParallelPlan(tp=2, sp=True, seq=512)
    names = lambda layer: {t.name for t in saved_tensors(SMALL, plan, layer)}
    assert "in_proj output (z, x, B, C, dt)" in names(0) and not any("k, v" in n for n in names(0))
    assert "fc1 output" in names(1) and "norm1 input" not in names(1)
    assert "softmax log-sum-exp" in names(2) and "fc1 output" not in names(2) and "norm2 input" not in names(2)
    assert "router probabilities" in names(5) and "norm1 input" not in names(5)
    tok, e = 512, 2
    mamba = e * tok * (2 * SMALL.hidden) / 2 + e * tok * (SMALL.mamba_in_width() + 3 * SMALL.mamba_inner
                                                          ) / 2 + 4 * tok * SMALL.mamba_groups / 2
    assert layer_activation_bytes(SMALL, plan, 0) == pytest.approx(mamba, rel=1e-12)


def test_collectives_per_kind():
    """A mixer-only or MLP-only layer has one block: one TP all-reduce forward (no SP); an MoE-only one its
    all-to-alls."""
    plan = ParallelPlan(tp=2, dp=2, ep=2, seq=256, global_batch=2)
    progs = build_programs(SMALL, plan, 4, symmetric=False)
    fwd = [op for op in progs.ops[0] if op.kind == COLLECTIVE and op.phase == "forward"]
    per_layer = {}
    for op in fwd:
        per_layer.setdefault(op.layer, []).append(op.collective)
    for layer in range(4):          # M - * -: one all-reduce each (the embedding's has layer None)
        assert per_layer[layer] == ["all_reduce"], (layer, per_layer[layer])
    assert per_layer[5].count("all_to_all") == 2


def test_plans_a_hybrid_model_refuses():
    m = get_model("nemotron-h-8b")
    for plan, why in ((ParallelPlan(tp=2, cp=2, seq=1024), "context parallelism"),
                      (ParallelPlan(tp=2, sp=True, tp_comm_overlap=True, seq=1024), "tp-comm-overlap"),
                      (ParallelPlan(tp=16, seq=1024), "tp"),
                      (ParallelPlan(attention="eager", seq=1024), "attention eager")):
        with pytest.raises(PlanError, match=why):
            plan.validate(m)
    ParallelPlan(tp=8, sp=True, seq=1024).validate(m)


def test_pattern_errors_are_clear():
    base = get_model("nemotron-h-8b")
    for kw, msg in (({"hybrid_pattern": "MX" * 26}, "'X'"), ({"hybrid_pattern": "M-"}, "2 layers"),
                    ({"hybrid_pattern": "ME" * 26}, "experts"), ({"mamba_heads": 0}, "mamba_heads"),
                    ({"mamba_heads": 12}, "mamba_groups")):
        with pytest.raises(ConfigError, match=msg):
            dataclasses.replace(base, **kw)


def test_hugging_face_nemotron_h_config():
    m = get_model("nemotron-h-56b")
    cfg = {"model_type": "nemotron_h", "num_hidden_layers": 118, "hidden_size": 8192, "intermediate_size": 32768,
           "num_attention_heads": 64, "num_key_value_heads": 8, "attention_head_dim": 128, "vocab_size": 131072,
           "hybrid_override_pattern": m.hybrid_pattern, "mamba_num_heads": 256, "mamba_head_dim": 64,
           "ssm_state_size": 256, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "mlp_hidden_act": "relu2",
           "tie_word_embeddings": False}
    assert model_from_hf_config(cfg, name="x") == dataclasses.replace(m, name="x", head_dim=128)
    nano = get_model("nemotron-3-nano")
    nano_cfg = {**cfg, "num_hidden_layers": 52, "hidden_size": 2688, "intermediate_size": 1856,
                "num_attention_heads": 32, "num_key_value_heads": 2, "hybrid_override_pattern": nano.hybrid_pattern,
                "mamba_num_heads": 64, "ssm_state_size": 128, "n_routed_experts": 128, "num_experts_per_tok": 6,
                "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712}
    assert model_from_hf_config(nano_cfg, name="y") == dataclasses.replace(nano, name="y")
    with pytest.raises(ConfigError, match="relu2"):
        model_from_hf_config({**cfg, "mlp_hidden_act": "silu"})


@pytest.mark.parametrize("network", ["analytical", "flow"])
def test_hybrid_stages_agree_between_symmetric_and_full_mode(network, capsys):
    from clustersim.cli import main
    base = ["simulate", "--cluster", "dgx-h100", "--gpus", "16", "--layers", "8", "--hidden", "512", "--heads", "8",
            "--hybrid-pattern", "M-*-M-M-", "--mamba-heads", "16", "--mamba-groups", "4", "--tp", "2", "--sp",
            "--pp", "2", "--seq", "1024", "--global-batch", "16", "--network", network, "--json"]
    steps = []
    for mode in ("symmetric", "full"):
        assert main(base + ["--mode", mode]) == 0
        out = json.loads(capsys.readouterr().out)
        steps.append(out["step_time_s"])
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)
    # --layers defaults to the pattern's length
    assert main(base[:5] + base[7:] + ["--mode", "symmetric"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == steps[0]


def test_validate_maps_the_nemotron_rows():
    from clustersim.validate import load_runs, row_experiment
    rows = {r["id"]: r for r in load_runs()}
    kw, notes = row_experiment(rows["684"])
    assert kw["model"] == "nemotron-h-56b" and kw["recompute"] == "none" and kw["fp8_param_gather"]
    assert kw["tp"] == 8 and kw["sp"] and "tp_comm_overlap" not in kw
    kw, notes = row_experiment(rows["657"])
    assert kw["model"] == "nemotron-3-nano" and kw["moe_dispatcher"] == "hybridep"
    assert kw["recompute_modules"] == ("moe", "layernorm", "core_attn") and kw["fp8_recipe"] == "current"


def test_search_bound_stays_below_the_simulated_step_for_hybrids():
    """The search's step-time bound prices each layer by its own kind and one TP collective pair per hybrid
    block: it never exceeds the simulated step (a bound above it would prune plans that can win)."""
    from clustersim.experiment import (Experiment, build_cost_model, load_cluster_for, resolve_model, resolve_plan,
                                       run_experiment)
    from clustersim.search import lower_bound_s
    shape = dict(layers=8, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=32000, hybrid_pattern="M-M*-E-M",
                 mamba_heads=32, experts=8, top_k=2)
    for tp, pp, ep, sp in ((2, 1, 1, True), (4, 2, 1, False), (2, 2, 2, True), (8, 1, 1, True)):
        exp = Experiment(cluster="dgx-h100", gpus=16, model=dict(shape), global_batch=32, seq=2048,
                         network="analytical", mode="symmetric", zero=1, tp=tp, pp=pp, ep=ep, sp=sp,
                         dp=16 // (tp * pp))
        model = resolve_model(exp)
        plan = resolve_plan(exp, model, 16)
        bound = lower_bound_s(exp, model, plan, build_cost_model(exp, load_cluster_for(exp)), 16)
        step = run_experiment(exp, check_budget=False).metrics.step_time_s
        assert 0 < bound <= step * (1 + 1e-9), (tp, pp, ep, bound, step)


def test_model_file_takes_its_layers_from_the_pattern(tmp_path):
    from schedules.models import load_model_file
    f = tmp_path / "hybrid.yaml"
    f.write_text('preset: nemotron-h-8b\nhybrid_pattern: "M-M*-M-"\n')
    m = load_model_file(f)
    assert (m.layers, m.layer_kind(3), m.mamba_heads) == (7, "*", 128)
    f.write_text('hybrid_pattern: "M*-"\nmamba_heads: 16\nhidden: 512\nheads: 8\n')
    assert load_model_file(f).layers == 3
    f.write_text('hybrid_pattern: "M*-"\nlayers: 4\nmamba_heads: 16\nhidden: 512\nheads: 8\n')
    with pytest.raises(ConfigError, match="3 layers, layers is 4"):
        load_model_file(f)
