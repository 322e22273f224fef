"""ParallelPlan: validation messages, mesh, groups, layer distribution."""
import pytest

from schedules.models import custom_model, get_model
from schedules.plan import ParallelPlan
from simulator.errors import PlanError


def test_world_size_and_microbatches():
    p = ParallelPlan(dp=4, tp=2, pp=2, cp=2, micro_batch=2, global_batch=64)
    assert p.world_size == 32 and p.num_microbatches == 8 and p.tokens_per_step == 64 * p.seq


@pytest.mark.parametrize("plan, model, gpus, match", [
    (ParallelPlan(dp=2, tp=4, pp=2), "llama3-8b", 32, r"dp\(2\) × tp\(4\) × pp\(2\) × cp\(1\) = 16 != 32.*--dp 4"),
    (ParallelPlan(tp=16, dp=1), "llama3-8b", 16, "kv heads"),
    (ParallelPlan(pp=3, layer_split="even", dp=1), "llama3-8b", 3, "not divisible"),
    (ParallelPlan(pp=64), "llama3-8b", 64, "model pieces"),
    (ParallelPlan(dp=4, ep=3), "mixtral-8x22b", 4, "must divide dp"),
    (ParallelPlan(dp=6, ep=6), "mixtral-8x22b", 6, "divide the 8 experts"),
    (ParallelPlan(dp=2, ep=2), "llama3-8b", 2, "dense model"),
    (ParallelPlan(schedule="pipedream"), "tiny", 1, "unknown pipeline schedule"),
    (ParallelPlan(zero=4), "tiny", 1, "ZeRO stage"),
    (ParallelPlan(virtual_stages=2, pp=2), "tiny", 2, "interleaved"),
    (ParallelPlan(dp=2, global_batch=3), "tiny", 2, "not a multiple"),
    (ParallelPlan(axis_order="tp-dp"), "tiny", 1, "axis_order"),
])
def test_validation_messages(plan, model, gpus, match):
    with pytest.raises(PlanError, match=match):
        plan.validate(get_model(model), gpus)


def test_valid_plans_pass():
    ParallelPlan(tp=8, pp=16, dp=128, schedule="interleaved", virtual_stages=2, global_batch=2048).validate(
        get_model("llama3-405b"), 16384)
    ParallelPlan(tp=2, dp=8, ep=8).validate(get_model("mixtral-8x22b"), 16)


def test_megatron_default_mesh_tp_innermost():
    p = ParallelPlan(tp=2, cp=2, dp=2, pp=2)
    assert p.groups("tp")[:2] == [(0, 1), (2, 3)]
    assert p.groups("cp")[0] == (0, 2)
    assert p.groups("dp")[0] == (0, 4)
    assert p.groups("pp")[0] == (0, 8)
    assert p.groups("dp_cp")[0] == (0, 2, 4, 6)
    assert p.coords(13) == {"tp": 1, "cp": 0, "ep": 0, "dp": 1, "dpo": 1, "pp": 1}
    assert p.rank_of(tp=1, dp=1, pp=1) == 13
    assert p.groups("embed")[0] == (0, 8)


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-dp-pp-cp", "pp-dp-cp-tp", "dp-tp-cp-pp"])
def test_groups_partition_the_world(order):
    p = ParallelPlan(tp=2, cp=2, dp=4, pp=2, ep=2, axis_order=order, expert_grid="carved")
    for fam, size in [("tp", 2), ("cp", 2), ("dp", 4), ("pp", 2), ("ep", 2), ("edp", 4), ("dp_cp", 8)]:
        gs = p.groups(fam)
        assert all(len(g) == size for g in gs)
        assert sorted(r for g in gs for r in g) == list(range(32))
    # each rank's coordinates round-trip
    for r in range(32):
        c = p.coords(r)
        assert p.rank_of(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=c["pp"]) == r
    # ep groups are contiguous parts of dp groups
    dp_of = {r: g for g in p.groups("dp") for r in g}
    for g in p.groups("ep"):
        assert set(g) <= set(dp_of[g[0]])


def test_balanced_split_llama3_405b_style():
    # Llama 3 405B: 126 layers on 16 stages, one layer fewer on the first and the last stage (Dubey et al.
    # 2024, sec. 3.3.2); with two chunks per stage the first and last pieces give up the layer
    model = get_model("llama3-405b")
    sizes = ParallelPlan(pp=16).piece_layer_counts(model)
    assert sizes[0] == sizes[-1] == 7 and set(sizes[1:-1]) == {8}
    plan = ParallelPlan(pp=16, schedule="interleaved", virtual_stages=2)
    pieces = plan.piece_layers(model)
    assert [len(c) for c in pieces] == [3] + [4] * 30 + [3]
    assert [l for c in pieces for l in c] == list(range(126))


def test_balanced_split_minimises_the_slowest_stage_brute_force():
    # against every composition of the layers into pp stages: no split has a cheaper slowest stage
    import itertools
    model = custom_model(layers=11, hidden=256, heads=8, vocab=50000)
    from schedules.plan import _extra_cost
    emb, head = _extra_cost(model, 2048)
    for pp in (2, 3, 4):
        got = ParallelPlan(pp=pp).piece_layer_counts(model)
        def worst(c):
            t = list(map(float, c))
            t[0] += emb
            t[-1] += head
            return max(t)
        best = min(worst(c) for c in itertools.product(range(1, 12), repeat=pp) if sum(c) == 11)
        assert sum(got) == 11 and worst(got) == pytest.approx(best)


def test_every_layer_count_at_least_pp_is_accepted():
    # the first and last model piece may hold only the embedding / LM head: 62 layers interleave on 32 stages
    for layers in range(4, 40):
        model = custom_model(layers=layers, hidden=256, heads=8, vocab=64)
        for sched, v in (("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("zb-v", 1), ("dualpipe", 1)):
            plan = ParallelPlan(pp=4, schedule=sched, virtual_stages=v, global_batch=16)
            if layers < plan.pieces - 2:
                with pytest.raises(PlanError):
                    plan.validate(model)
                continue
            plan.validate(model)
            counts = plan.piece_layer_counts(model)
            assert sum(counts) == layers and min(counts[1:-1]) >= 1
            assert min(counts) >= (1 if layers >= plan.pieces else 0)
    counts = ParallelPlan(pp=32, schedule="interleaved", virtual_stages=2).piece_layer_counts(
        custom_model(layers=62, hidden=256, heads=8, vocab=64))
    assert counts[0] == 0 and counts[-1] == 0 and set(counts[1:-1]) == {1}


def test_user_stage_layers():
    model = custom_model(layers=30, hidden=256, heads=8, vocab=64)
    assert ParallelPlan(pp=4, stage_layers=(7, 8, 8, 7)).piece_layer_counts(model) == [7, 8, 8, 7]
    plan = ParallelPlan(pp=4, schedule="interleaved", virtual_stages=2, stage_layers=(7, 8, 8, 7))
    counts = plan.piece_layer_counts(model)
    assert [counts[s] + counts[s + 4] for s in range(4)] == [7, 8, 8, 7]
    counts = ParallelPlan(pp=4, first_stage_layers=6, last_stage_layers=6).piece_layer_counts(model)
    assert counts[0] == counts[-1] == 6 and sum(counts) == 30
    for bad in (dict(stage_layers=(7, 8, 8, 8)), dict(stage_layers=(7, 8, 15)),
                dict(first_stage_layers=29, last_stage_layers=1), dict(stage_layers=(10, 20), first_stage_layers=2)):
        with pytest.raises(PlanError):
            ParallelPlan(pp=4 if "stage_layers" not in bad or len(bad["stage_layers"]) != 2 else 2,
                         **bad).validate(model)


def test_to_dict_round_trip_keys():
    d = ParallelPlan(dp=2, zero=2).to_dict()
    assert d["zero_stage"] == 2 and d["world_size"] == 2 and "bucket_bytes" in d


@pytest.mark.parametrize("changes, match", [
    ({"bucket_bytes": float("nan")}, "bucket_bytes"),
    ({"bucket_bytes": float("inf")}, "bucket_bytes"),
    ({"grad_bytes_per_param": float("nan")}, "grad_bytes_per_param"),
    ({"fsdp_prefetch": float("nan")}, "fsdp_prefetch"),
    ({"sp": "yes"}, "sp must be true or false"),
    ({"skew": "0"}, "skew"),
    ({"global_batch": "8"}, "global_batch"),
    ({"axis_order": 5}, "axis_order"),
    ({"tp": True}, "tp must be a positive integer"),
    ({"zero": -1}, "zero"),
])
def test_wrong_types_and_non_finite_values_are_plan_errors(changes, match):
    kw = dict(dp=2, tp=2, pp=2, micro_batch=1, global_batch=16, seq=2048)
    with pytest.raises(PlanError, match=match):
        ParallelPlan(**{**kw, **changes}).validate(get_model("llama3-8b"), 8)
