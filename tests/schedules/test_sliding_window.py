"""Sliding-window attention (Mistral, Gemma, GPT-OSS): the layers that slide, the (query, key) pairs a window keeps
(against a brute-force count), the kernels' FLOPs and rate, the plan checks, Hugging Face configs and the CLI."""
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.cli import main
from schedules.kernels import phase_kernels
from schedules.models import causal_window_fraction, get_model, model_flops_per_step, model_from_hf_config
from schedules.plan import ParallelPlan
from simulator.errors import ConfigError, PlanError
from simulator.kernels import ATTENTION, Kernel
from topologies import kernel_curves as kc

GPT_OSS_120B = {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
                "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088, "sliding_window": 128,
                "attention_bias": True, "tie_word_embeddings": False,
                "layer_types": ["sliding_attention", "full_attention"] * 18}


def _pairs(seq: int, window: int) -> int:
    """Brute force: the (query i, key j) pairs with j <= i and i - j < window (window 0: no limit)."""
    return sum(1 for i in range(seq) for j in range(i + 1) if not window or i - j < window)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 90), st.integers(0, 120))
def test_window_fraction_is_the_share_of_causal_pairs_kept(seq, window):
    assert causal_window_fraction(seq, window) * _pairs(seq, 0) == pytest.approx(_pairs(seq, window), rel=1e-12)


def test_which_layers_slide():
    oss = get_model("gpt-oss-120b")
    assert [oss.local_attention(i) for i in range(4)] == [("sliding", 128), ("", 0)] * 2     # sliding first
    gemma = dataclasses.replace(get_model("llama3-8b"), sliding_window=1024, global_attention_every=6)
    assert [i for i in range(12) if not gemma.local_attention(i)[0]] == [5, 11]
    mistral = dataclasses.replace(get_model("llama3-8b"), sliding_window=4096)
    assert {mistral.local_attention(i) for i in range(32)} == {("sliding", 4096)}
    assert get_model("llama3-8b").local_attention(3) == ("", 0)
    with pytest.raises(ConfigError, match="needs a sliding_window"):
        dataclasses.replace(get_model("llama3-8b"), global_attention_every=2)
    with pytest.raises(ConfigError, match="sliding_window"):
        dataclasses.replace(get_model("llama3-8b"), sliding_window=-1)


def test_gpt_oss_parameter_counts_match_the_model_card():
    # OpenAI's gpt-oss model card (arXiv 2508.10925, table 1): 116.83 B / 20.91 B total; 5.13 B / 3.61 B active,
    # counted without the input embedding (a lookup): our active count includes it
    for name, total, active in (("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9)):
        m = get_model(name)
        assert m.param_count() == pytest.approx(total, rel=2e-3)
        assert m.active_param_count() - m.embedding_params() == pytest.approx(active, rel=5e-3)
    assert model_from_hf_config(GPT_OSS_120B) == dataclasses.replace(get_model("gpt-oss-120b"), name="gpt_oss")


def test_layer_flops_and_mfu_numerator_count_the_window_share():
    oss = get_model("gpt-oss-120b")
    full = dataclasses.replace(oss, sliding_window=0, global_attention_every=0)
    seq = 8192
    slide, glob = oss.layer_flops(0, seq, 1), oss.layer_flops(1, seq, 1)
    assert glob == full.layer_flops(1, seq, 1)
    assert slide.attn_core == pytest.approx(glob.attn_core * _pairs(seq // 64, 2) / _pairs(seq // 64, 0), rel=0.02)
    assert slide.linear == glob.linear
    # the whole step: half the layers keep (w·s - w(w-1)/2) / (s(s+1)/2) of their attention core
    saved = oss.layers / 2 * 3 * glob.attn_core * (1 - causal_window_fraction(seq, 128))
    assert model_flops_per_step(full, seq, 4) - model_flops_per_step(oss, seq, 4) == pytest.approx(4 * saved)
    # a window as long as the sequence changes nothing
    assert oss.layer_flops(0, 128, 1) == oss.layer_flops(1, 128, 1)


@pytest.mark.parametrize("stack", ["megatron", "torchtitan", "llm-foundry"])
def test_window_kernels_run_the_kept_pairs_and_eager_attention_all_of_them(stack):
    oss = get_model("gpt-oss-20b")
    p = ParallelPlan(seq=4096, micro_batch=2, ep=1, stack=stack)
    att = lambda layer, ph, plan=p: sum(k.flops for k in phase_kernels(oss, plan, layer, ph) if k.kind == ATTENTION)
    keep = causal_window_fraction(4096, 128)
    for ph in ("forward", "backward"):
        assert att(0, ph) == pytest.approx(att(1, ph) * keep, rel=1e-12)
    windows = {k.window for k in phase_kernels(oss, p, 0, "forward") if k.kind == ATTENTION}
    assert windows == {128}
    assert "sliding-window (128)" in phase_kernels(oss, p, 0, "forward").label
    # the routed experts' kernels do not depend on the attention: one list for both layer kinds
    assert phase_kernels(oss, p, 0, "forward", part="experts") is phase_kernels(oss, p, 1, "forward", part="experts")
    # full recomputation re-runs the layer's own (windowed) forward
    rc = dataclasses.replace(p, recompute="full")
    assert att(0, "backward", rc) == pytest.approx(att(0, "backward") + att(0, "forward"), rel=1e-12)
    # eager attention computes every score and masks: the window saves nothing
    eager = dataclasses.replace(p, attention="eager")
    assert phase_kernels(oss, eager, 0, "forward").flops == pytest.approx(phase_kernels(oss, eager, 1, "forward").flops)


def test_window_kernel_is_priced_at_the_causal_rate_of_twice_its_window():
    curve = kc.attention_curve("H100-SXM")
    for pass_, mult in (("fwd", 1.0), ("bwd", 2.5)):
        def kern(seq, window=0, batch=1):
            f = mult * 2.0 * batch * seq * seq * 64 * 128 * 0.5 * causal_window_fraction(seq, window)
            return Kernel("a", ATTENTION, f, pass_=pass_, seq_q=seq, seq_kv=seq, head_dim=64, heads=64, causal=True,
                          impl="te", batch=batch, window=window)
        w = kern(8192, 1024)
        rate = w.flops / curve.time_s(w)
        assert rate == pytest.approx(kern(2048).flops / curve.time_s(kern(2048)), rel=1e-12)
        assert curve.time_s(w) < curve.time_s(kern(8192))          # fewer pairs, at a lower rate
        assert rate < kern(8192).flops / curve.time_s(kern(8192))
        assert kc.rate_seq(kern(8192, 16384)) == 8192               # a window past the sequence: causal


def test_context_parallelism_with_a_window_is_refused():
    oss = get_model("gpt-oss-20b")
    with pytest.raises(PlanError, match="sliding-window"):
        ParallelPlan(cp=2, dp=1, seq=4096).validate(oss, 2)
    ParallelPlan(cp=2, dp=1, seq=128).validate(oss, 2)                  # the window spans each sequence


def test_hf_configs_with_windows():
    mistral = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
               "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000, "sliding_window": 4096}
    m = model_from_hf_config(mistral)
    assert (m.sliding_window, m.global_attention_every) == (4096, 0)
    assert model_from_hf_config({**mistral, "sliding_window": None}).sliding_window == 0
    qwen = {**mistral, "model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False,
            "max_window_layers": 28}
    assert model_from_hf_config(qwen).sliding_window == 0               # Qwen's window is off unless enabled
    with pytest.raises(ConfigError, match="max_window_layers"):
        model_from_hf_config({**qwen, "use_sliding_window": True})
    assert model_from_hf_config({**qwen, "use_sliding_window": True, "max_window_layers": 0}).sliding_window == 32768
    irregular = {**GPT_OSS_120B, "layer_types": ["sliding_attention"] * 35 + ["full_attention"]}
    assert model_from_hf_config(irregular).global_attention_every == 36
    irregular["layer_types"] = ["full_attention", "sliding_attention"] * 18
    with pytest.raises(ConfigError, match="every n-th layer"):
        model_from_hf_config(irregular)
    with pytest.raises(ConfigError, match="layer_types"):
        model_from_hf_config({**GPT_OSS_120B, "layer_types": ["sliding_attention"] * 3})


def test_cli_window_flags_reach_the_model_and_shorten_the_step(capsys):
    base = ["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--layers", "4", "--hidden", "2048", "--heads", "16",
            "--seq", "16384", "--global-batch", "8", "--json"]
    assert main(base) == 0
    full = json.loads(capsys.readouterr().out)
    assert main(base + ["--sliding-window", "1024", "--global-attention-every", "2"]) == 0
    slid = json.loads(capsys.readouterr().out)
    assert slid["step_time_s"] < full["step_time_s"]
    assert slid["tflops_per_gpu"] * slid["step_time_s"] < full["tflops_per_gpu"] * full["step_time_s"]
    assert main(["plan", "--layers", "4", "--hidden", "2048", "--heads", "16", "--seq", "16384", "--sliding-window",
                 "1024", "--cp", "2", "--gpus", "2"]) == 2
    assert "sliding-window" in capsys.readouterr().err


def test_breakdown_names_the_window():
    from topologies.kernel_cost import KernelPricer
    from topologies.specs import get_accelerator
    oss = get_model("gpt-oss-20b")
    rows = KernelPricer(get_accelerator("H100-SXM")).breakdown(phase_kernels(oss, ParallelPlan(seq=4096), 0, "forward"))
    assert [r["shape"] for r in rows if r["kind"] == ATTENTION] == ["b1 s4096x4096 h64 d64 causal window 128"]
