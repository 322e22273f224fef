"""Issue 18 item 2: models from Hugging Face config.json and from dimensions, checked against the parameter
counts the model publishers report (model cards / papers), not against our own formulas."""
import json

import pytest

from schedules.models import get_model, model_from_hf_config
from clustersim.cli import main
from simulator.errors import ConfigError

LLAMA31_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, "tie_word_embeddings": False,
              "hidden_act": "silu"}
MISTRAL_7B = {**LLAMA31_8B, "model_type": "mistral", "vocab_size": 32000}
MIXTRAL_8X7B = {**MISTRAL_7B, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
             "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False}
QWEN15_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
              "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936, "num_experts": 60,
              "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "decoder_sparse_step": 1, "mlp_only_layers": []}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
               "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "first_k_dense_replace": 3, "moe_layer_freq": 1, "vocab_size": 129280}


@pytest.mark.parametrize("cfg, published, rel", [
    (LLAMA31_8B, 8_030_261_248, 0),        # meta-llama/Llama-3.1-8B safetensors total
    (MISTRAL_7B, 7_241_732_096, 0),        # mistralai/Mistral-7B-v0.1 safetensors total
    (MIXTRAL_8X7B, 46_702_792_704, 0),     # mistralai/Mixtral-8x7B-v0.1 safetensors total
    (QWEN25_7B, 7_615_616_512, 0),         # Qwen/Qwen2.5-7B safetensors total (QKV biases included)
    (QWEN15_MOE, 14.3e9, 5e-3),            # Qwen1.5-MoE-A2.7B model card: 14.3 B total
    (DEEPSEEK_V3, 671e9, 1e-3),            # DeepSeek-V3 report: 671 B total (MTP module excluded)
])
def test_hf_config_parameter_counts_match_published(cfg, published, rel):
    m = model_from_hf_config(cfg)
    assert m.param_count() == pytest.approx(published, rel=rel, abs=0)


def test_hf_moe_shapes():
    ds = model_from_hf_config(DEEPSEEK_V3)
    assert ds.is_mla and ds.first_dense_layers == 3 and ds.shared_experts == 1 and ds.experts == 256
    assert ds.param_count() == get_model("deepseek-v3").param_count()
    assert ds.active_param_count() == pytest.approx(37e9, rel=0.02)      # report: 37 B activated
    q = model_from_hf_config(QWEN15_MOE)
    assert q.shared_experts == 4 and q.active_param_count() == pytest.approx(2.7e9, rel=0.03)  # "A2.7B"
    mx = model_from_hf_config(MIXTRAL_8X7B)
    assert mx.active_param_count() == pytest.approx(12.9e9, rel=0.01)    # Mixtral paper: 12.9 B active


def test_hf_config_null_dense_layers_read_as_none():
    """first_k_dense_replace: null reads as 0 (as before the count became strict)."""
    assert model_from_hf_config({**DEEPSEEK_V3, "first_k_dense_replace": None}).first_dense_layers == 0


@pytest.mark.parametrize("cfg, match", [
    ({"model_type": "gpt_neox"}, "not supported"),
    ({**LLAMA31_8B, "hidden_size": None}, "missing 'hidden_size'"),
    ({**QWEN15_MOE, "mlp_only_layers": [5]}, "not modelled"),
    ({**QWEN15_MOE, "shared_expert_intermediate_size": 1000}, "not a multiple"),
    # zeros had been read as unset: the query heads' count, or a dense model with no note
    ({**LLAMA31_8B, "num_key_value_heads": 0}, "num_key_value_heads: must be >= 1, got 0"),
    ({**MIXTRAL_8X7B, "num_local_experts": 0}, "num_local_experts: must be >= 1, got 0"),
    ({**QWEN15_MOE, "num_experts": 0}, "num_experts: must be >= 1, got 0"),
    ({**DEEPSEEK_V3, "n_routed_experts": 0}, "n_routed_experts: must be >= 1, got 0"),
    ({**DEEPSEEK_V3, "first_k_dense_replace": 61}, "first_k_dense_replace 61 leaves none of the 61 layers an MoE"),
])
def test_hf_config_bad_input(cfg, match):
    with pytest.raises(ConfigError, match=match):
        model_from_hf_config(cfg)


def _json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_model_config_gated_mlp_and_param_count(tmp_path, capsys):
    base = ["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "8"]
    dims = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--ffn", "14336",
            "--vocab", "128256"]
    preset = _json(capsys, base + ["--model", "llama3-8b"])
    gpt = _json(capsys, base + dims)
    swiglu = _json(capsys, base + dims + ["--gated-mlp"])
    assert preset["model_params"] == swiglu["model_params"] == 8_030_261_248
    assert gpt["model_params"] == pytest.approx(6.15e9, rel=1e-3)
    assert any("--gated-mlp" in n for n in gpt["notes"])
    assert swiglu["step_time_s"] == pytest.approx(preset["step_time_s"], rel=1e-12)
    tied = _json(capsys, base + dims + ["--gated-mlp", "--tied-embeddings"])
    assert tied["model_params"] == 8_030_261_248 - 128256 * 4096
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA31_8B))
    hf = _json(capsys, base + ["--model-config", str(p)])
    assert hf["model_params"] == 8_030_261_248 and hf["step_time_s"] == pytest.approx(preset["step_time_s"])
    assert main(base + ["--model", "llama3-8b", "--model-config", str(p)]) == 2
    assert "not both" in capsys.readouterr().err
    p.write_text(json.dumps({"model_type": "bert"}))
    assert main(base + ["--model-config", str(p)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert main(base + ["--model", "tiny"]) == 0
    assert "parameters" in capsys.readouterr().out
