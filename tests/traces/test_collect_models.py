"""The collector's model and helpers, in one process (no torchrun)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from traces.bench_collectives import bench_sizes
from traces.collect import UsageError, profiler_schedule  # noqa: E402
from traces.models import MoE, ModelConfig, Transformer, split_layers  # noqa: E402


@pytest.mark.parametrize("experts", [0, 4])
def test_parameter_formula_matches_the_built_model(experts):
    cfg = ModelConfig(layers=3, hidden=48, heads=4, seq=16, vocab=100, experts=experts)
    model = Transformer(cfg)
    assert cfg.params() == sum(p.numel() for p in model.parameters())
    assert cfg.ffn == 128          # 8/3 * 48 = 128, already a multiple of 16


def test_pipeline_stages_hold_the_whole_model_once():
    cfg = ModelConfig(layers=5, hidden=32, heads=2, seq=8, vocab=50)
    bounds = split_layers(5, 3)
    assert bounds == [(0, 2), (2, 4), (4, 5)]
    stages = [Transformer(cfg, a, b) for a, b in bounds]
    assert sum(p.numel() for s in stages for p in s.parameters()) == cfg.params()
    assert stages[0].embed is not None and stages[1].embed is None and stages[2].head is not None
    with pytest.raises(ValueError, match="cannot exceed layers"):
        split_layers(2, 3)


def test_stages_chained_equal_the_whole_model():
    cfg = ModelConfig(layers=4, hidden=32, heads=2, seq=8, vocab=50)
    torch.manual_seed(0)
    whole = Transformer(cfg)
    first, second = Transformer(cfg, 0, 2), Transformer(cfg, 2, 4)
    first.embed.load_state_dict(whole.embed.state_dict())
    for i in range(2):
        first.layers[i].load_state_dict(whole.layers[i].state_dict())
        second.layers[i].load_state_dict(whole.layers[2 + i].state_dict())
    second.norm.load_state_dict(whole.norm.state_dict())
    second.head.load_state_dict(whole.head.state_dict())
    x = torch.randint(50, (2, 8))
    torch.testing.assert_close(second(first(x)), whole(x))


def test_moe_with_ample_capacity_equals_per_token_expert_evaluation():
    """Brute force: each token's output is its routed experts' outputs weighted by the router probability."""
    cfg = ModelConfig(layers=1, hidden=16, heads=2, seq=6, vocab=20, experts=4, top_k=2, capacity_factor=4.0)
    torch.manual_seed(1)
    moe = MoE(cfg)
    x = torch.randn(2, 6, 16)
    y = moe(x)
    tokens = x.reshape(-1, 16)
    probs = torch.softmax(moe.router(tokens), -1)
    w, idx = probs.topk(2, -1)
    expect = torch.stack([sum(w[t, j] * moe.experts[int(idx[t, j])](tokens[t:t + 1])[0] for j in range(2))
                          for t in range(tokens.shape[0])])
    torch.testing.assert_close(y.reshape(-1, 16), expect)


def test_moe_drops_tokens_over_capacity():
    cfg = ModelConfig(layers=1, hidden=8, heads=2, seq=8, vocab=20, experts=2, top_k=1, capacity_factor=1.0)
    moe = MoE(cfg)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0        # with positive inputs every token picks expert 0
    x = torch.rand(1, 8, 8) + 0.1
    y = moe(x)[0]
    assert moe.capacity(8) == 4
    assert torch.count_nonzero(y.abs().sum(-1)) == 4     # the first 4 tokens fit, the rest are dropped


def test_profiler_schedule_records_the_last_steps():
    assert profiler_schedule(5, 2) == {"wait": 2, "warmup": 1, "active": 2, "repeat": 1,
                                       "profiled_steps": [3, 4], "record_shapes": True, "unprofiled_steps": [1]}
    # steps the profiler never touched, the cold first one left out
    assert profiler_schedule(10, 4)["unprofiled_steps"] == [1, 2, 3, 4]
    assert profiler_schedule(4, 2)["unprofiled_steps"] == []
    assert profiler_schedule(5, 0)["profiled_steps"] == [2, 3, 4]     # default: min(3, steps - 2)
    assert profiler_schedule(10, 0)["profiled_steps"] == [7, 8, 9]
    with pytest.raises(UsageError, match="--steps must be >= 3"):
        profiler_schedule(2, 0)
    with pytest.raises(UsageError, match=r"--active must be in 1..steps-2 = 3, got 4"):
        profiler_schedule(5, 4)


def test_benchmark_sizes_follow_nccl_tests():
    assert bench_sizes(1 << 20, 4) == [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20]
    assert bench_sizes(3000, 2) == [1024, 2048]
    with pytest.raises(UsageError):
        bench_sizes(100, 2)


def test_model_config_rejects_impossible_shapes():
    with pytest.raises(ValueError, match=r"hidden \(100\) must be divisible by heads \(3\)"):
        ModelConfig(hidden=100, heads=3)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        ModelConfig(layers=0)
    with pytest.raises(ValueError, match=r"top_k \(3\) must be in 1..experts \(2\)"):
        ModelConfig(experts=2, top_k=3)


# ---------------------------------------------------------------------------------------------- GPU path
def test_backend_is_nccl_on_the_local_gpu_when_cuda_is_there(monkeypatch):
    from traces import collect
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert collect.select_backend("auto") == ("nccl", torch.device("cuda", 3)) and chosen == [3]
    assert collect.select_backend("gloo") == ("gloo", torch.device("cpu"))


def test_backend_falls_back_to_gloo_on_cpu(monkeypatch):
    from traces import collect
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert collect.select_backend("auto") == ("gloo", torch.device("cpu"))
    with pytest.raises(UsageError, match="--backend nccl needs CUDA"):
        collect.select_backend("nccl")


def test_gpu_manifest_fields(monkeypatch):
    from traces import rank_io as collect
    synced = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    gpu = torch.device("cuda", 1)
    assert collect.nccl_version() == "2.21.5"
    assert collect.device_name(gpu) == "NVIDIA H200"
    collect.synchronize(gpu)
    collect.synchronize(torch.device("cpu"))
    assert synced == [gpu]                  # the benchmark and step timers wait for the GPU, never on CPU
    assert collect.device_name(torch.device("cpu")).startswith("CPU")


def test_benchmark_largest_size_follows_free_gpu_memory(monkeypatch):
    from traces.bench_collectives import GiB, MiB, default_max_bytes
    free = {"bytes": 140 * 10**9}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (free["bytes"], 141 * 10**9))
    gpu = torch.device("cuda", 0)
    assert default_max_bytes(gpu) == 8 * GiB                # capped
    free["bytes"] = 10 * GiB
    assert default_max_bytes(gpu) == 1 * GiB                # largest power of two <= free / 8
    assert default_max_bytes(torch.device("cpu")) == 64 * MiB


def test_shards_are_slices_of_the_reference_model():
    from traces.models import load_shard
    cfg = ModelConfig(layers=3, hidden=32, heads=4, seq=8, vocab=50, experts=4)
    torch.manual_seed(0)
    full = Transformer(cfg)
    # pipeline stage [1, 3): blocks map by offset; head and final norm copied
    stage = load_shard(Transformer(cfg, 1, 3), full)
    torch.testing.assert_close(stage.layers[0].attn.wq.weight, full.layers[1].attn.wq.weight)
    torch.testing.assert_close(stage.head.weight, full.head.weight)
    # tensor-parallel rank 1 of 2: second half of the rows of column-parallel, columns of row-parallel
    dense = ModelConfig(layers=1, hidden=32, heads=4, seq=8, vocab=50)
    whole = Transformer(dense)
    tp = load_shard(Transformer(dense, tp=2), whole, tp_rank=1)
    torch.testing.assert_close(tp.layers[0].attn.wq.weight, whole.layers[0].attn.wq.weight[16:])
    torch.testing.assert_close(tp.layers[0].attn.wo.weight, whole.layers[0].attn.wo.weight[:, 16:])
    torch.testing.assert_close(tp.layers[0].mlp.down.weight, whole.layers[0].mlp.down.weight[:, 48:])
    # expert-parallel rank 1 of 2 holds experts 2 and 3; the router is replicated
    ep = load_shard(Transformer(cfg, ep=2), full, ep_rank=1)
    torch.testing.assert_close(ep.layers[2].mlp.experts[0].gate.weight, full.layers[2].mlp.experts[2].gate.weight)
    torch.testing.assert_close(ep.layers[2].mlp.router.weight, full.layers[2].mlp.router.weight)


def test_the_launcher_knows_the_collectors_strategies_and_output_prefix():
    """traces.launch cannot import torch, so it repeats two constants: they must agree."""
    from traces import launch as collect_cli
    from traces import rank_io, strategies
    assert collect_cli.STRATEGIES == strategies.STRATEGIES and collect_cli.SAY == rank_io.SAY
