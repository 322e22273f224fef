"""Llama 4's layers: chunked attention (against a brute-force pair count and as causal kernels over the chunks) and
MoE in every n-th layer (parameters against the model card, programs, Hugging Face configs)."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import build_programs
from schedules.kernels import phase_kernels
from schedules.models import causal_chunk_fraction, get_model, model_from_hf_config
from schedules.plan import ParallelPlan
from simulator.errors import ConfigError, PlanError
from simulator.kernels import ATTENTION
from simulator.program import COLLECTIVE

MAVERICK_TEXT = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                 "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 128,
                 "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 8192,
                 "tie_word_embeddings": False}


def _chunk_pairs(seq: int, chunk: int) -> int:
    """Brute force: the (query i, key j) pairs with j <= i in the same chunk."""
    return sum(1 for i in range(seq) for j in range(i + 1) if i // chunk == j // chunk)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 90), st.integers(1, 120))
def test_chunk_fraction_is_the_share_of_causal_pairs_kept(seq, chunk):
    assert causal_chunk_fraction(seq, chunk) * _chunk_pairs(seq, seq) == pytest.approx(_chunk_pairs(seq, chunk),
                                                                                        rel=1e-12)


def test_maverick_matches_the_model_card_and_its_layer_pattern():
    m = get_model("llama4-maverick")
    # Meta's model card: 400 B total, 17 B active parameters
    assert m.param_count() == pytest.approx(400e9, rel=5e-3)
    assert m.active_param_count() == pytest.approx(17e9, rel=0.02)
    assert [m.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]
    assert [m.local_attention(i)[0] for i in range(8)] == ["chunked"] * 3 + [""] + ["chunked"] * 3 + [""]
    assert m.layer_params(0) - m.attention_params() - 2 * m.hidden == 3 * 5120 * 16384     # the dense MLP
    assert model_from_hf_config({"model_type": "llama4", "text_config": MAVERICK_TEXT}) == \
        dataclasses.replace(m, name="llama4_text")
    with pytest.raises(ConfigError, match="moe_layers"):
        model_from_hf_config({**MAVERICK_TEXT, "moe_layers": [0, 2]})
    with pytest.raises(ConfigError, match="text_config"):
        model_from_hf_config({"model_type": "llama4"})
    with pytest.raises(ConfigError, match="local"):
        dataclasses.replace(m, sliding_window=128)          # one kind of local attention


def test_chunked_layers_run_causal_kernels_over_their_chunks():
    m = get_model("llama4-maverick")
    att = lambda layer, seq, ph="forward": [k for k in phase_kernels(m, ParallelPlan(tp=8, sp=True, seq=seq), layer, ph,
                                                                     part="attention") if k.kind == ATTENTION]
    # within one chunk, chunked attention is causal attention
    assert [(k.flops, k.seq_kv) for k in att(0, 8192)] == [(k.flops, k.seq_kv) for k in att(3, 8192)]
    for ph in ("forward", "backward"):
        (local,), (glob,) = att(0, 32768, ph), att(3, 32768, ph)
        assert (local.batch, local.seq_q, local.seq_kv, glob.seq_kv) == (4, 8192, 8192, 32768)
        # (kernels count a causal square as s²/2 pairs, the fraction s(s+1)/2: equal to 1e-4 at these lengths)
        assert local.flops == pytest.approx(glob.flops * causal_chunk_fraction(32768, 8192), rel=1e-4)
    short = att(0, 20000)                                   # two chunks of 8192 and the last one of 3616
    assert [(k.batch, k.seq_kv) for k in short] == [(2, 8192), (1, 3616)]
    assert m.layer_flops(0, 32768, 1).attn_core == pytest.approx(
        m.layer_flops(3, 32768, 1).attn_core * causal_chunk_fraction(32768, 8192))
    with pytest.raises(PlanError, match="chunked"):
        ParallelPlan(cp=2, dp=1, seq=16384).validate(m, 2)


def test_moe_every_other_layer_runs_expert_all_to_alls_in_those_layers_only():
    every = dataclasses.replace(get_model("tiny-moe"), layers=4)
    other = dataclasses.replace(every, moe_layer_every=2)
    plan = ParallelPlan(dp=2, ep=2, seq=256, global_batch=2)

    def all_to_alls(model):
        progs = build_programs(model, plan, 2, symmetric=False)
        return sum(1 for op in progs.ops[0] if op.kind == COLLECTIVE and op.collective == "all_to_all")
    assert all_to_alls(other) * 2 == all_to_alls(every) > 0
    assert other.param_count() == every.param_count() - 2 * (every.layer_params(1) - other.layer_params(0))
    qwen = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
            "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936, "num_experts": 60,
            "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "decoder_sparse_step": 2}
    assert model_from_hf_config(qwen).moe_layer_every == 2
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        model_from_hf_config({**qwen, "mlp_only_layers": [3]})


@pytest.mark.parametrize("network", ["analytical", "flow"])
def test_mixed_layer_kinds_agree_between_symmetric_and_full_mode(network, capsys):
    """Stages that mix layer kinds (chunked and global attention, MoE and dense layers) run the same step
    whether one representative per class is simulated or every rank."""
    import json
    from clustersim.cli import main
    base = ["simulate", "--cluster", "dgx-h100", "--gpus", "16", "--layers", "8", "--hidden", "512", "--heads", "8",
            "--experts", "4", "--top-k", "1", "--moe-layer-every", "2", "--attention-chunk", "256",
            "--global-attention-every", "4", "--seq", "1024", "--pp", "2", "--ep", "2", "--global-batch", "32",
            "--network", network, "--json"]
    steps = []
    for mode in ("symmetric", "full"):
        assert main(base + ["--mode", mode]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["mode"] == mode
        steps.append(out["step_time_s"])
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)
