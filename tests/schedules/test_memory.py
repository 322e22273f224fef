"""Memory per rank: the ZeRO paper's example, Korthikanti's activation formulas, schedule in-flight counts."""
import pytest

from schedules.memory import layer_activation_bytes, memory_per_rank
from schedules.models import custom_model, get_model, model_from_params
from schedules.plan import ParallelPlan

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
    plan = ParallelPlan(tp=tp, sp=sp, recompute=rc, seq=S, micro_batch=Bm)
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
    assert _act("1f1b", p, m, stage=p - 1) == pytest.approx(1 * stage_layers * per_layer)
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
