"""Deduplicating MoE dispatchers (Megatron-Core's flex dispatcher with DeepEP / HybridEP): the expected copies
of a token on the wire against brute-force enumeration, and what the programs send and compute."""
import dataclasses
import itertools

import pytest

from schedules import build_programs, get_model
from schedules.generate import ep_destinations, ep_dispatch_bytes, expected_distinct
from schedules.plan import ParallelPlan
from simulator.errors import PlanError

MOE = dataclasses.replace(get_model("tiny-moe"), experts=16, top_k=4)
SEQ = 128


@pytest.mark.parametrize("experts, top_k, units", [(8, 2, 4), (16, 4, 8), (16, 4, 2), (12, 3, 3), (8, 8, 4)])
def test_expected_distinct_matches_enumeration(experts, top_k, units):
    """Every top_k subset of the experts equally likely (uniform routing); experts/units per unit, in order."""
    per = experts // units
    subsets = list(itertools.combinations(range(experts), top_k))
    mean = sum(len({e // per for e in c}) for c in subsets) / len(subsets)
    assert expected_distinct(experts, top_k, units) == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize("experts, top_k, units, groups, group_topk", [
    (16, 3, 2, 4, 2), (16, 3, 4, 4, 2), (16, 3, 8, 4, 2), (16, 4, 4, 8, 3), (24, 2, 3, 6, 2), (16, 2, 16, 4, 1)])
def test_expected_distinct_under_group_limited_routing_matches_enumeration(experts, top_k, units, groups, group_topk):
    """Every choice of group_topk groups equally likely, then every top_k subset of their experts."""
    per_g, per_u = experts // groups, experts // units
    total = count = 0
    for chosen in itertools.combinations(range(groups), group_topk):
        pool = [e for g in chosen for e in range(g * per_g, (g + 1) * per_g)]
        subsets = list(itertools.combinations(pool, top_k))
        total += sum(len({e // per_u for e in c}) for c in subsets) / len(subsets)
        count += 1
    assert expected_distinct(experts, top_k, units, groups, group_topk) == pytest.approx(total / count, rel=1e-12)
    assert expected_distinct(experts, top_k, units, groups, group_topk) <= expected_distinct(experts, top_k, units)


def test_deepseek_v3_routes_within_4_of_8_groups():
    from schedules.models import model_from_hf_config
    from tests.schedules.test_hf_config import DEEPSEEK_V3
    m = get_model("deepseek-v3")
    assert (m.router_groups, m.router_group_topk) == (8, 4)
    hf = model_from_hf_config({**DEEPSEEK_V3, "n_group": 8, "topk_group": 4})
    assert (hf.router_groups, hf.router_group_topk) == (8, 4)
    assert model_from_hf_config(DEEPSEEK_V3).router_groups == 0
    # EP64 over 8 nodes of 32 experts (one group each): a token reaches at most 4 nodes
    plan = ParallelPlan(dp=64, ep=64, seq=SEQ, moe_dispatcher="deepep")
    assert ep_destinations(m, plan, 8) == pytest.approx(expected_distinct(256, 8, 8, 8, 4)) and \
        ep_destinations(m, plan, 8) < 4


def test_destinations_per_dispatcher_and_placement():
    across = ParallelPlan(dp=16, ep=16, seq=SEQ, moe_dispatcher="deepep")     # 16 EP ranks over two 8-GPU nodes
    inside = ParallelPlan(dp=8, ep=8, seq=SEQ, moe_dispatcher="hybridep")
    assert ep_destinations(MOE, dataclasses.replace(across, moe_dispatcher="alltoall"), 8) == MOE.top_k
    assert ep_destinations(MOE, inside, 8) == pytest.approx(expected_distinct(16, 4, 8))       # per GPU
    assert ep_destinations(MOE, across, 8) == pytest.approx(expected_distinct(16, 4, 2))       # per node
    assert ep_destinations(MOE, across, 16) == pytest.approx(expected_distinct(16, 4, 16))     # one domain
    assert ep_destinations(MOE, across, 8) < ep_destinations(MOE, inside, 8) < MOE.top_k


def test_programs_send_fewer_copies_and_compute_the_same():
    base = ParallelPlan(dp=16, ep=16, seq=SEQ, global_batch=16)
    dedup = dataclasses.replace(base, moe_dispatcher="deepep")
    a, b = build_programs(MOE, base, scale_up_domain=8), build_programs(MOE, dedup, scale_up_domain=8)
    r = next(iter(a.ops))
    size = [op.size_bytes for op in a.ops[r] if op.collective == "all_to_all"]
    size_d = [op.size_bytes for op in b.ops[r] if op.collective == "all_to_all"]
    assert len(size) == len(size_d) > 0
    assert size == pytest.approx([ep_dispatch_bytes(MOE, base)] * len(size))
    assert size_d == pytest.approx([ep_dispatch_bytes(MOE, base) * expected_distinct(16, 4, 2) / MOE.top_k]
                                   * len(size))
    flops = [sum(op.flops for op in p.ops[r] if op.kind == "compute") for p in (a, b)]
    assert flops[0] == flops[1]


def test_dedup_never_slows_the_step():
    from topologies import load_cluster
    from topologies.cost import ClusterCostModel
    from simulator.engine import run
    cluster = load_cluster("dgx-h100", 16)
    cost = ClusterCostModel(cluster)
    base = ParallelPlan(dp=16, ep=16, seq=SEQ, global_batch=16)
    t = [run(build_programs(MOE, dataclasses.replace(base, moe_dispatcher=d), scale_up_domain=cluster.domain_size),
             cost).step_time_s for d in ("alltoall", "deepep")]
    assert t[1] < t[0]


def test_unknown_dispatcher_is_refused():
    with pytest.raises(PlanError, match="moe_dispatcher"):
        ParallelPlan(dp=2, ep=2, moe_dispatcher="nccl").validate(MOE, 2)


def test_a_dispatcher_for_a_dense_model_is_refused():
    """A dense model has no experts to dispatch to: asking for DeepEP there is a mistake, refused as --ep is."""
    dense = get_model("llama3-8b")
    ParallelPlan(dp=2).validate(dense, 2)
    with pytest.raises(PlanError, match="dense model"):
        ParallelPlan(dp=2, moe_dispatcher="deepep").validate(dense, 2)


def test_validate_takes_the_recipes_dispatcher():
    from clustersim.validate import stated_moe_dispatcher
    row = {"model": "DeepSeek-V3 671B", "framework": "Megatron-Bridge / Megatron-Core", "hardware": "B200 (DGX-B200)"}
    assert stated_moe_dispatcher({**row, "release": "NeMo 26.04.01"}, 32)[0] == "deepep"
    assert stated_moe_dispatcher({**row, "release": "NeMo 26.02"}, 8)[0] == "hybridep"
    assert stated_moe_dispatcher({**row, "release": "NeMo 25.11"}, 8) is None          # v0.2.x B200: alltoall
    assert stated_moe_dispatcher({**row, "release": "NeMo 25.09"}, 8) is None          # no flex dispatcher yet
    # Blackwell Ultra: HybridEP in every release with a config for it (GB300 from v0.2.0, B300 from v0.3.0)
    gb300, b300 = {**row, "hardware": "GB300 (DGX-GB300)"}, {**row, "hardware": "B300 (DGX-B300)"}
    assert stated_moe_dispatcher({**gb300, "release": "NeMo 25.11"}, 32)[0] == "hybridep"
    assert stated_moe_dispatcher({**b300, "release": "NeMo 26.04.01"}, 8)[0] == "hybridep"
    assert stated_moe_dispatcher({**b300, "release": "NeMo 25.11"}, 8) is None
    from clustersim.validate import stated_recompute_modules
    b300_v2 = {**b300, "release": "NeMo 26.04.01", "pp": "8", "ep": "8"}
    assert stated_recompute_modules(b300_v2)[0] == ("mla_up_proj",)
    assert stated_recompute_modules({**b300_v2, "release": "NeMo 26.06"})[0] == ("mla_up_proj",)  # v0.5.0's V2
    assert stated_recompute_modules({**b300_v2, "release": "NeMo 26.06.01"}) is None   # v0.5.1's V2 is VP2 mbs 1
    auto = {"model": "DeepSeek-V3 671B", "framework": "NeMo AutoModel (PyTorch, FSDP2)", "hardware": "H100-SXM",
            "notes": "kernel optimizations: TE + DeepEP"}
    assert stated_moe_dispatcher(auto, 64)[0] == "deepep"
    assert stated_moe_dispatcher({**auto, "model": "Kimi K2"}, 32)[0] == "deepep"   # any MoE row naming DeepEP
    assert stated_moe_dispatcher({**auto, "model": "Kimi K2"}, 1) is None            # no expert parallelism
    assert stated_moe_dispatcher({**auto, "model": "Kimi K2", "notes": "kernel optimizations: TE"}, 32) is None
