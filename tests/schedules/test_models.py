"""Models: parameter counts against published sizes, FLOPs against closed forms."""
import pytest

from schedules.models import (ModelSpec, custom_model, get_model, list_models, load_model_file, model_flops_per_step,
                              model_from_params)
from simulator.errors import ConfigError, UnknownPresetError

# Published totals: GPT-3 175B (Brown et al. 2020), Llama 3 (Llama Team 2024: 8.03B, 70.6B, 405.9B from the
# released checkpoints), Mixtral 8x22B (141B total, 39B active, Mistral AI), DeepSeek-V3 (671B, 37B active
# without the MTP module; DeepSeek-AI 2024), Qwen3 MoE (the model cards: 30.5B with 3.3B active, 235B with 22B
# active), Qwen2.5 (the model cards: 7.61B, 14.7B, 32.5B, 72.7B).
PUBLISHED = {"gpt3-175b": 175e9, "llama3-8b": 8.03e9, "llama3-70b": 70.6e9, "llama3-405b": 405.9e9,
             "mixtral-8x22b": 141e9, "deepseek-v3": 671e9, "qwen3-30b-a3b": 30.5e9, "qwen3-235b-a22b": 235e9,
             "qwen2.5-7b": 7.61e9, "qwen2.5-14b": 14.7e9, "qwen2.5-32b": 32.5e9, "qwen2.5-72b": 72.7e9}
ACTIVE = {"mixtral-8x22b": 39e9, "deepseek-v3": 37e9, "qwen3-30b-a3b": 3.3e9, "qwen3-235b-a22b": 22e9}
# Sizes published to one or two digits only (Kimi K2's card: 1 T total, 32 B active; NeMo's names: GPT 5B / 20B,
# Nemotron-3 8B / 22B): totals within 8% (Nemotron-3 8B counts 8.5 B, 2.1 B of them its 256k-entry embedding and
# head), active counts within 5%.
ROUNDED = {"kimi-k2": (1e12, 32e9), "gpt3-5b": (5e9, None), "gpt3-20b": (20e9, None), "nemotron3-8b": (8e9, None),
           "nemotron3-22b": (22e9, None)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    m = get_model(name)
    assert m.param_count() == pytest.approx(PUBLISHED[name], rel=0.01)
    if name in ACTIVE:
        assert m.active_param_count() == pytest.approx(ACTIVE[name], rel=0.03)


@pytest.mark.parametrize("name", sorted(ROUNDED))
def test_param_counts_match_rounded_published_sizes(name):
    total, active = ROUNDED[name]
    m = get_model(name)
    assert m.param_count() == pytest.approx(total, rel=0.08)
    if active:
        assert m.active_param_count() == pytest.approx(active, rel=0.05)


def test_presets_listed_and_unknown_names_list_them():
    names = list_models()
    for n in PUBLISHED:
        assert n in names
    assert "tiny" in names
    with pytest.raises(UnknownPresetError) as e:
        get_model("gpt5")
    assert "llama3-8b" in str(e.value)


def test_llama3_405b_flops_per_step_is_6N_tokens_plus_attention():
    # Independent form: 6·N·tokens + 12·L·h·s·tokens (attention scores, PaLM app. B / Megatron eq. 3).
    m = get_model("llama3-405b")
    seq, gb = 8192, 2048
    ref = 6 * m.param_count() * seq * gb + 12 * m.layers * m.hidden * seq * seq * gb
    assert model_flops_per_step(m, seq, gb) == pytest.approx(ref, rel=0.01)


def test_gpt_layer_flops_closed_form():
    # Megatron (Narayanan et al. 2021): one GPT layer forward = 24·b·s·h² + 4·b·s²·h
    m = custom_model(layers=2, hidden=1024, heads=16)
    b, s, h = 3, 512, 1024
    lf = m.layer_flops(0, s, b)
    assert lf.forward == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=1e-9)
    # backward = 2x forward overall; W only has the weight part
    assert lf.backward_input + lf.backward_weight == pytest.approx(2 * lf.forward)
    assert lf.backward_weight == pytest.approx(24 * b * s * h * h)


def test_gqa_reduces_attention_params():
    mha = custom_model(layers=1, hidden=1024, heads=16)
    gqa = custom_model(layers=1, hidden=1024, heads=16, kv_heads=4)
    assert mha.attention_params() - gqa.attention_params() == 2 * 1024 * (16 - 4) * 64


def test_moe_flops_use_top_k_and_shared_experts():
    m = custom_model(layers=2, hidden=256, heads=4, experts=8, top_k=2, shared_experts=1)
    dense = custom_model(layers=2, hidden=256, heads=4)
    lf, ld = m.layer_flops(0, 128, 1), dense.layer_flops(0, 128, 1)
    t = 128
    assert lf.experts == pytest.approx(2 * ld.mlp)        # two experts of the dense MLP's size per token
    assert lf.shared == pytest.approx(ld.mlp)
    assert lf.router == pytest.approx(2 * t * 256 * 8)
    assert m.param_count() > dense.param_count()


def test_custom_defaults_are_gpt_style():
    m = custom_model(layers=4, hidden=512, heads=8)
    assert (m.ffn, m.kv_heads, m.vocab, m.gated_mlp) == (2048, 8, 51200, False)


def test_bad_shapes_raise_config_error():
    with pytest.raises(ConfigError, match="divisible"):
        custom_model(layers=2, hidden=100, heads=3)
    with pytest.raises(ConfigError, match="top_k"):
        custom_model(layers=2, hidden=64, heads=4, experts=4, top_k=5)
    with pytest.raises(ConfigError, match="parameter count"):
        model_from_params(-1)
    with pytest.raises(ConfigError, match="shape"):
        model_from_params(7.5e9).layer_flops(0, 128, 1)
    # latent-attention fields without kv_lora_rank were ignored; with it, zero widths were accepted
    with pytest.raises(ConfigError, match="shape multi-head latent attention, which kv_lora_rank > 0 turns on"):
        custom_model(layers=2, hidden=256, heads=4, v_head_dim=7, q_lora_rank=99)
    with pytest.raises(ConfigError, match="needs v_head_dim and qk_rope_dim > 0"):
        custom_model(layers=2, hidden=256, heads=4, kv_lora_rank=64)
    with pytest.raises(ConfigError, match="name must be a non-empty string"):     # a blank table title
        custom_model(layers=2, hidden=256, heads=4, name=" ")


def test_load_model_file(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("layers: 4\nhidden: 256\nheads: 4\nexperts: 4\n")
    m = load_model_file(p)
    assert (m.name, m.ffn, m.top_k) == ("m", 1024, 2)
    p.write_text("preset: llama3-8b\nlayers: 16\n")
    assert load_model_file(p).layers == 16 and load_model_file(p).hidden == 4096
    p.write_text("layers: 4\nwidth: 3\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_model_file(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_model_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize("field, value", [("layers", True), ("hidden", 1.5), ("experts", -1), ("top_k", 0),
                                          ("capacity_factor", float("nan")), ("moe_ffn", "8"), ("dtype_bytes", 0)])
def test_model_fields_are_type_checked(field, value):
    kw = dict(name="m", layers=2, hidden=64, ffn=256, heads=4, kv_heads=4, vocab=128)
    kw[field] = value
    with pytest.raises(ConfigError, match=field):
        ModelSpec(**kw)


@pytest.mark.parametrize("size", ["1.7b", "18.4b", "145.6b", "529.6b", "1t"])
def test_megatron_lm_2021_gpt_presets_follow_the_papers_parameter_formula(size):
    """Narayanan et al. 2021, eq. 2: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), V = 51,200, s = 2,048;
    the size in the preset's name is the paper's table 1 figure rounded to 0.1 B (1.0 T)."""
    m = get_model(f"megatron-gpt-{size}")
    l, h, V, s = m.layers, m.hidden, 51200, 2048
    eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert m.param_count() == pytest.approx(eq2, rel=5e-3)
    named = 1e12 if size == "1t" else float(size[:-1]) * 1e9
    assert eq2 == pytest.approx(named, abs=0.05e9 if size != "1t" else 0.01e12)


def test_qwen2_5_layers_hold_their_checkpoints_tensors():
    """Qwen2.5-7B's released tensors per decoder layer (config.json shapes): q 3584x3584, k and v 512x3584, o
    3584x3584 (29,360,128 weights) and the q, k, v biases (3584 + 2 x 512); gate, up 18944x3584 and down:
    203,685,888."""
    m = get_model("qwen2.5-7b")
    assert m.attention_params() == 29_360_128 + 4_608 and m.attention_bias and not m.tied_embeddings
    assert m.layer_params(0) == 29_360_128 + 4_608 + 203_685_888 + 2 * 3584     # + the two RMSNorm weights
