"""Plan search: rules of thumb rediscovered, bounds that really bound, cache, Dask."""
import dataclasses
import json

import pytest

from clustersim.experiment import Experiment, load_cluster_for
from clustersim.search import SearchSpace, describe, run_search
from simulator.errors import ClusterSimError

SMALL = SearchSpace(micro_batches=(1,), schedules=("1f1b", "interleaved", "zb"), virtual_stages=(2,),
                    recompute=("selective",), zero=(0, 1, 3), cp=(1,))


@pytest.fixture(scope="module")
def dense_search():
    base = Experiment(cluster="dgx-h100", gpus=32, model="llama3-70b", global_batch=64, seq=4096,
                      network="analytical", mode="symmetric")
    return base, run_search(base, top_k=5, space=SMALL, workers=1)


def test_dense_tp_inside_nvswitch_pp_across_nodes(dense_search):
    base, out = dense_search
    cluster = load_cluster_for(base)
    assert out["top"], out["stats"]
    best = out["top"][0]["plan"]
    # TP stays inside one NVSwitch node ...
    assert all(r["plan"]["tp"] <= cluster.gpus_per_node for r in out["top"]), [describe(r) for r in out["top"]]
    # plans with TP across nodes were candidates (they lost on the bound or in simulation)
    assert out["stats"]["candidates"] > len(out["evaluated"])
    # ... PP goes across nodes: the stages of one pipeline sit on different nodes ...
    if best["pp"] > 1:
        stride = best["tp"] * best["cp"] * best["dp"]
        nodes = {cluster.node_of(s * stride) for s in range(best["pp"])}
        assert len(nodes) == best["pp"]
    # ... and DP takes the rest.
    assert best["tp"] * best["pp"] * best["dp"] * best["cp"] == 32


def test_lower_bound_never_exceeds_the_simulated_step(dense_search):
    _, out = dense_search
    assert out["evaluated"]
    for r in out["evaluated"]:
        assert r["lower_bound_s"] <= r["step_time_s"] * (1 + 1e-9), describe(r)


def test_moe_prefers_expert_over_tensor_parallelism():
    moe = dict(layers=16, hidden=4096, heads=32, kv_heads=8, ffn=14336, experts=16, top_k=2, vocab=32000)
    base = Experiment(cluster="dgx-h100", gpus=16, model=moe, global_batch=64, seq=4096, network="analytical",
                      mode="symmetric")
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), recompute=("selective",), zero=(1,), cp=(1,))
    out = run_search(base, top_k=3, space=space, workers=1)
    best = out["top"][0]
    assert best["plan"]["ep"] > 1, describe(best)
    # the best plan without EP (simulated here, not pruned) needs TP or PP to fit, and loses
    no_ep_space = SearchSpace(**{**space.__dict__, "ep": (1,)})
    no_ep = run_search(base, top_k=1, space=no_ep_space, workers=1)["top"][0]
    assert no_ep["plan"]["ep"] == 1 and no_ep["plan"]["tp"] * no_ep["plan"]["pp"] > 1, describe(no_ep)
    assert no_ep["step_time_s"] > best["step_time_s"]
    assert best["plan"]["tp"] < no_ep["plan"]["tp"] or best["plan"]["pp"] < no_ep["plan"]["pp"]


def test_cache_makes_a_rerun_instant(tmp_path):
    base = Experiment(cluster="dgx-h100", gpus=16, model="llama3-8b", global_batch=32, seq=2048,
                      network="analytical", mode="symmetric")
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), recompute=("selective",), zero=(0, 1), cp=(1,))
    cache = tmp_path / "cache.jsonl"
    first = run_search(base, top_k=3, space=space, workers=1, cache_path=cache)
    again = run_search(base, top_k=3, space=space, workers=1, cache_path=cache)
    assert first["stats"]["simulated"] > 0
    assert again["stats"]["simulated"] == 0 and again["stats"]["cached"] == first["stats"]["simulated"]
    assert [r["step_time_s"] for r in again["top"]] == [r["step_time_s"] for r in first["top"]]


def test_dask_local_cluster_gives_the_same_answer():
    distributed = pytest.importorskip("distributed")
    base = Experiment(cluster="dgx-h100", gpus=16, model="llama3-8b", global_batch=32, seq=2048,
                      network="analytical", mode="symmetric")
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), recompute=("selective",), zero=(0, 1), cp=(1,))
    local = run_search(base, top_k=3, space=space, workers=1)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc:
        remote = run_search(base, top_k=3, space=space, scheduler=lc.scheduler_address)
    assert [describe(r) for r in remote["top"]] == [describe(r) for r in local["top"]]
    assert [r["step_time_s"] for r in remote["top"]] == pytest.approx([r["step_time_s"] for r in local["top"]],
                                                                      rel=1e-12)


def test_search_cli_json_and_pareto(tmp_path, capsys):
    from clustersim.cli import main
    png = tmp_path / "pareto.png"
    rc = main(["search", "--gpus", "16", "--model", "llama3-8b", "--global-batch", "32", "--seq", "2048",
               "--micro-batches", "1", "--schedules", "1f1b", "--recompute", "selective", "--zero", "0,1",
               "--cp", "1", "--workers", "1", "--no-cache", "--top-k", "2", "--pareto", str(png), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["top"]) == 2 and out["stats"]["candidates"] >= 2
    assert png.stat().st_size > 0
    assert main(["search", "--gpus", "16", "--model", "nope", "--global-batch", "32"]) == 2


def test_cache_key_changes_with_the_simulators_code(monkeypatch):
    """A result cached by another version of the code is never reused."""
    from clustersim import search
    exp = Experiment(model="llama3-8b", cluster="dgx-h100", gpus=8)
    k1 = search.plan_key(exp)
    assert search.plan_key(exp) == k1                    # deterministic
    monkeypatch.setattr(search, "code_fingerprint", lambda: "another-version")
    assert search.plan_key(exp) != k1


def test_lower_bound_rate_covers_a_layer_fit_faster_than_the_gemm_fit():
    """The bound must use the fastest rate the cost model grants any op, layer ops included."""
    import topologies
    from simulator.calibration import Calibration, ComputeFit, LayerFit
    from clustersim.search import best_flops_per_s
    from topologies.cost import ClusterCostModel
    cluster = topologies.load_cluster("dgx-h100", 8)
    dev = cluster.device(0).name
    slow_gemm = Calibration([ComputeFit(dev, 3e14)], layers=[LayerFit(dev, "backward", 6e14)])
    assert best_flops_per_s(ClusterCostModel(cluster, calibration=slow_gemm, gpu_variation=0)) == pytest.approx(6e14)
    plain = Calibration([ComputeFit(dev, 5e14)])
    assert best_flops_per_s(ClusterCostModel(cluster, calibration=plain, gpu_variation=0)) == pytest.approx(5e14)


def test_cache_key_follows_the_calibration_files_content(tmp_path):
    from clustersim import search
    from simulator.calibration import Calibration, ComputeFit
    path = tmp_path / "cal.json"
    Calibration([ComputeFit("H100", 5e14)]).save(path)
    exp = Experiment(model="llama3-8b", cluster="dgx-h100", gpus=8, calibration=str(path))
    k1 = search.plan_key(exp)
    Calibration([ComputeFit("H100", 6e14)]).save(path)          # same name, new content
    assert search.plan_key(exp) != k1


def test_search_prices_torchtitan_per_op_checkpointing():
    """`--recompute op` (torchtitan's per-op checkpointing) is a search choice; its bound counts the GEMMs the
    policy recomputes and never exceeds the simulated step."""
    base = Experiment(cluster="dgx-h100", gpus=16, model="llama3-8b", global_batch=32, seq=2048,
                      network="analytical", mode="symmetric", stack="torchtitan")
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), virtual_stages=(2,), recompute=("op", "none"),
                        zero=(3,), cp=(1,), pp=(1,))
    out = run_search(base, top_k=4, space=space, workers=1)
    assert {r["plan"]["recompute"] for r in out["evaluated"]} >= {"op"}
    for r in out["evaluated"]:
        assert r["lower_bound_s"] <= r["step_time_s"] * (1 + 1e-9), describe(r)


def _dies_on_b(exp_dict):
    """Stand-in for search.evaluate in a worker: the plan named "b" kills its process as the OS's OOM killer
    would (SIGKILL), the others return at once."""
    import os
    import signal
    if exp_dict["name"] == "b":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"name": exp_dict["name"]}


def test_a_killed_worker_fails_its_plan_not_the_search(monkeypatch):
    """A plan whose worker the OS kills (out of memory) comes back as a failed plan; the other plans of the
    wave, whose futures the broken pool lost, are simulated again; the pool keeps working afterwards."""
    import clustersim.search as search
    monkeypatch.setattr(search, "evaluate", _dies_on_b)
    ex = search._Executor(2, None)
    try:
        got = dict(ex.map([(k, {"name": k}) for k in "abcd"]))
        assert set(got) == set("abcd")
        assert "killed" in got["b"]["error"] and got["b"]["experiment"] == {"name": "b"}
        assert all(got[k] == {"name": k} for k in "acd")
        assert dict(ex.map([("e", {"name": "e"})])) == {"e": {"name": "e"}}
    finally:
        ex.close()


def test_moe_lower_bound_counts_the_expert_all_to_alls_and_still_bounds():
    """The expert all-to-alls serialise with compute on the compute stream: the bound counts them (four per
    MoE layer and micro-batch, on the stage's first rank's EP group) and stays below every simulated step,
    EP inside a node and across nodes, with and without pipeline stages."""
    import dataclasses
    from clustersim.experiment import build_cost_model, resolve_model, resolve_plan, run_experiment
    from clustersim.search import ep_critical_comm_s, lower_bound_s
    moe = dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=4096, experts=32, top_k=4, vocab=32000)
    base = Experiment(cluster="dgx-h100", gpus=32, model=moe, global_batch=64, seq=2048, network="analytical",
                      mode="symmetric", zero=1, recompute="none")
    cluster = load_cluster_for(base)
    model = resolve_model(base)
    across = []
    for ep, pp, mb, sched in ((4, 1, 1, "1f1b"), (16, 1, 2, "1f1b"), (32, 1, 1, "1f1b"), (16, 2, 1, "1f1b"),
                              (8, 2, 2, "zb"), (16, 2, 1, "interleaved")):
        exp = dataclasses.replace(base, ep=ep, pp=pp, tp=1, dp=32 // pp, micro_batch=mb, schedule=sched,
                                  virtual_stages=2 if sched == "interleaved" else 1)
        plan = resolve_plan(dataclasses.replace(exp), model, 32)
        cost = build_cost_model(exp, cluster)
        ep_s = ep_critical_comm_s(model, plan, cost)
        assert all(t > 0 for t in ep_s)
        bound = lower_bound_s(exp, model, plan, cost, 32)
        step = run_experiment(exp, check_budget=False).metrics.step_time_s
        assert bound <= step * (1 + 1e-9), (ep, pp, mb, sched, bound, step)
        if ep > 8:
            across.append(ep_s[0] * plan.num_microbatches * 8 / step)
    # across nodes the all-to-alls are a large part of the step, and now of the bound
    assert max(across) > 0.2, across
    # folded experts (etp 1, ep over tp·dp): the MoE layers keep only their attention's TP collectives
    for tp, ep, pp, sched in ((2, 32, 1, "1f1b"), (2, 16, 2, "1f1b"), (4, 8, 1, "1f1b"), (2, 8, 2, "interleaved")):
        exp = dataclasses.replace(base, ep=ep, etp=1, pp=pp, tp=tp, sp=True, dp=32 // (pp * tp), micro_batch=1,
                                  schedule=sched, virtual_stages=2 if sched == "interleaved" else 1)
        plan = resolve_plan(dataclasses.replace(exp), model, 32)
        assert plan.folded
        cost = build_cost_model(exp, cluster)
        bound = lower_bound_s(exp, model, plan, cost, 32)
        step = run_experiment(exp, check_budget=False).metrics.step_time_s
        assert bound <= step * (1 + 1e-9), (tp, ep, pp, sched, bound, step)
    # Megatron-Core's expert grid with cp > 1 and etp = tp: the experts gather over the TP group
    for tp, ep, pp in ((2, 8, 1), (4, 4, 2)):
        exp = dataclasses.replace(base, ep=ep, pp=pp, tp=tp, cp=2, sp=True, dp=16 // (pp * tp), micro_batch=1,
                                  schedule="1f1b", virtual_stages=1)
        plan = resolve_plan(dataclasses.replace(exp), model, 32)
        assert plan.folded and plan.expert_tp == tp
        cost = build_cost_model(exp, cluster)
        bound = lower_bound_s(exp, model, plan, cost, 32)
        step = run_experiment(exp, check_budget=False).metrics.step_time_s
        assert bound <= step * (1 + 1e-9), (tp, ep, pp, "cp2", bound, step)


def test_search_offers_folded_expert_parallelism():
    """Where tp > 1 the space holds etp-1 plans whose EP degree exceeds dp (MoE parallel folding)."""
    from clustersim.search import enumerate_candidates
    moe = dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=4096, experts=32, top_k=4, vocab=32000)
    base = Experiment(cluster="dgx-h100", gpus=32, model=moe, global_batch=64, seq=2048)
    from clustersim.experiment import resolve_model
    cands = enumerate_candidates(base, resolve_model(base), 32, SearchSpace(tp=(2,), pp=(1,), cp=(1,)))
    folded = {(c.ep, c.etp) for c in cands if c.etp}
    assert (32, 1) in folded and all(e > 1 for e, _ in folded)
    assert {c.ep for c in cands if not c.etp} == {1, 2, 4, 8, 16}
    none = enumerate_candidates(base, resolve_model(base), 32, SearchSpace(tp=(2,), pp=(1,), cp=(1,), fold=False))
    assert not any(c.etp for c in none)


def test_search_with_tp_comm_overlap_bounds_and_labels(capsys):
    """`search --tp-comm-overlap`: every TP > 1 candidate runs Transformer Engine's userbuffers overlap (the
    split-backward schedules are not tried), its bound leaves the TP collectives out and still never exceeds
    the simulated step, and the overlap is faster than the same plans with TP in line."""
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b", "zb"), virtual_stages=(2,), recompute=("selective",),
                        zero=(1,), cp=(1,), tp=(4, 8), pp=(2, 4))
    base = Experiment(cluster="dgx-h100", gpus=32, model="llama3-70b", global_batch=64, seq=4096,
                      network="analytical", mode="symmetric")
    plain = run_search(base, top_k=3, space=space, workers=1)
    over = run_search(dataclasses.replace(base, tp_comm_overlap=True), top_k=3, space=space, workers=1)
    assert over["evaluated"] and all(r["plan"]["tp_comm_overlap"] for r in over["evaluated"])
    assert all(r["plan"]["schedule"] != "zb" for r in over["evaluated"])
    assert all(describe(r).endswith("tp-overlap") for r in over["evaluated"])
    for r in over["evaluated"]:
        assert r["lower_bound_s"] <= r["step_time_s"] * (1 + 1e-9), describe(r)
    assert over["top"][0]["step_time_s"] < plain["top"][0]["step_time_s"]
    with pytest.raises(ClusterSimError, match="megatron stack"):
        run_search(dataclasses.replace(base, tp_comm_overlap=True, stack="torchtitan"), top_k=1, space=space,
                   workers=1)


def test_search_keeps_memory_headroom():
    """A plan is offered only within --max-memory-fraction of device memory (default 0.95, where simulate
    notes a plan as at risk): a limit just under the unrestricted best plan's peak drops it from the top."""
    base = Experiment(cluster="dgx-h100", gpus=16, model="llama3-8b", global_batch=32, seq=4096,
                      network="analytical", mode="symmetric")
    space = SearchSpace(micro_batches=(1, 2, 4), schedules=("1f1b",), virtual_stages=(2,), recompute=("none", "full"),
                        zero=(1,), cp=(1,), tp=(1, 2), pp=(1,))
    free = run_search(base, top_k=2, space=space, workers=1, max_memory_fraction=1.0)
    cap = free["memory_capacity_bytes"]
    best = free["top"][0]
    frac = best["peak_memory_bytes"] / cap * 0.999
    tight = run_search(base, top_k=2, space=space, workers=1, max_memory_fraction=frac)
    assert tight["memory_limit_bytes"] == pytest.approx(cap * frac) and tight["memory_capacity_bytes"] == pytest.approx(cap)
    assert all(r["peak_memory_bytes"] <= cap * frac for r in tight["top"])
    assert describe(best) not in {describe(r) for r in tight["top"]}
    default = run_search(base, top_k=2, space=space, workers=1)
    assert default["memory_limit_bytes"] == pytest.approx(0.95 * cap)
    with pytest.raises(ClusterSimError, match="max-memory-fraction"):
        run_search(base, top_k=1, space=space, workers=1, max_memory_fraction=1.5)


def test_search_with_eager_attention_prices_and_bounds_the_scores(capsys):
    """`search --attention eager`: every candidate runs the eager core (no per-op checkpointing, which assumes
    FlashAttention), its bound still never exceeds the simulated step, the s×s scores make the best plan slower
    than with FlashAttention, and selective recomputation (which drops the scores) is among the ones tried."""
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), virtual_stages=(2,),
                        recompute=("selective", "full", "op"), zero=(0,), cp=(1,), tp=(1, 2), pp=(1,))
    base = Experiment(cluster="dgx-a100", gpus=16, model="megatron-gpt-1.7b", global_batch=32, seq=2048,
                      network="analytical", mode="symmetric")
    flash = run_search(base, top_k=3, space=space, workers=1)
    eager = run_search(dataclasses.replace(base, attention="eager"), top_k=3, space=space, workers=1)
    assert eager["evaluated"] and all(r["plan"]["attention"] == "eager" for r in eager["evaluated"])
    assert not any(r["plan"]["recompute"] == "op" for r in eager["evaluated"])
    assert any(r["plan"]["recompute"] == "op" for r in flash["evaluated"])
    for r in eager["evaluated"]:
        assert r["lower_bound_s"] <= r["step_time_s"] * (1 + 1e-9), describe(r)
    assert eager["top"][0]["step_time_s"] > 1.2 * flash["top"][0]["step_time_s"]


def test_search_attention_kernel_reaches_every_plan(tmp_path):
    """`search --attention-kernel flash2` with llm-foundry's stack: every candidate prices FlashAttention-2, which
    the plan records, and the best plan is faster than with the stack's Triton kernel; with eager attention the
    choice is refused before searching."""
    space = SearchSpace(micro_batches=(2,), schedules=("1f1b",), recompute=("none",), zero=(3,), cp=(1,),
                        tp=(1,), pp=(1,))
    base = Experiment(cluster="dgx-h100", gpus=8, model="mpt-1b", global_batch=16, seq=2048, network="analytical",
                      mode="symmetric", stack="llm-foundry")
    triton = run_search(base, top_k=1, space=space, workers=1)
    flash2 = run_search(dataclasses.replace(base, attention_kernel="flash2"), top_k=1, space=space, workers=1)
    assert flash2["evaluated"] and all(r["plan"]["attention_kernel"] == "flash2" for r in flash2["evaluated"])
    assert flash2["top"][0]["step_time_s"] < triton["top"][0]["step_time_s"]
    from clustersim.cli import main
    code = main(["search", "--gpus", "8", "--model", "mpt-1b", "--global-batch", "16", "--attention", "eager",
                 "--attention-kernel", "flash2", "--no-cache"])
    assert code == 2


def test_search_tries_megatron_recompute_modules_and_bounds_them(capsys):
    """`--recompute selective:m1+m2` tries selective recomputation of those Megatron modules: the candidates
    carry them, the bound (their recomputed FLOPs counted) stays below every simulated step, plans are labelled
    with them, and a bad module is a one-line error."""
    from clustersim.cli import main
    from clustersim.search import split_recompute
    assert split_recompute("selective:mla_up_proj+moe_act") == ("selective", ("mla_up_proj", "moe_act"))
    assert split_recompute("full") == ("full", None)
    moe = dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=4096, experts=16, top_k=2, vocab=32000)
    base = Experiment(cluster="dgx-h100", gpus=16, model=moe, global_batch=32, seq=2048, network="analytical",
                      mode="symmetric")
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), zero=(1,), cp=(1,), pp=(1, 2),
                        recompute=("selective", "selective:moe", "selective:core_attn+moe_act+layernorm"))
    out = run_search(base, top_k=20, space=space, workers=1, max_memory_fraction=1.0)
    mods = {tuple(r["plan"]["recompute_modules"]) for r in out["evaluated"]}
    assert {("core_attn",), ("moe",), ("core_attn", "moe_act", "layernorm")} <= mods
    for r in out["evaluated"]:
        assert r["lower_bound_s"] <= r["step_time_s"] * (1 + 1e-9), describe(r)
    assert any("rc:selective(moe)" in describe(r) for r in out["evaluated"])
    assert main(["search", "--cluster", "dgx-h100", "--gpus", "8", "--model", "llama3-8b", "--global-batch", "8",
                 "--recompute", "selective:attn", "--no-cache"]) == 2
    assert "'attn'" in capsys.readouterr().err


def test_search_for_lora_bounds_its_frozen_plans():
    """`search --lora-rank`: every candidate fine-tunes (the plan carries the rank), and the bound, which leaves
    out the frozen weights' gradients, stays below every simulated step; LoRA's memory fits plans that full
    training does not."""
    base = Experiment(cluster="dgx-h100", gpus=16, model="llama3-70b", global_batch=32, seq=4096,
                      network="analytical", mode="symmetric")
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), recompute=("none",), zero=(1,), cp=(1,))
    lora = run_search(dataclasses.replace(base, lora_rank=16, lora_targets=("qkv",)), top_k=5, space=space,
                      workers=1)
    assert lora["evaluated"] and all(r["plan"]["lora_rank"] == 16 for r in lora["evaluated"])
    for r in lora["evaluated"]:
        assert r["lower_bound_s"] <= r["step_time_s"] * (1 + 1e-9), describe(r)
    with pytest.raises(ClusterSimError, match="do not fit"):        # full training of 70B on 16 GPUs
        run_search(base, top_k=5, space=space, workers=1)


def test_lower_bound_holds_for_an_interleaved_pipeline_with_a_heavy_first_stage():
    """Interleaved 1F1B, stage 0 holding 6 + 6 layers against stage 1's 4 + 4: its first stage idles less than
    (p-1) chunks; the bound (m·T_s plus the first chunks of the stages before s) stays below the step (the
    ideal-bubble term gave 0.360 s against a 0.357 s step)."""
    from clustersim.experiment import build_cost_model, resolve_model, resolve_plan
    from clustersim.search import lower_bound_s
    exp = Experiment(cluster="dgx-h100", gpus=8, model=dict(layers=20, hidden=4096, heads=32, kv_heads=8,
                     ffn=14336, vocab=32000), global_batch=32, seq=2048, network="ideal", mode="symmetric", zero=1,
                     tp=1, dp=4, pp=2, micro_batch=2, schedule="interleaved", virtual_stages=2, stage_layers="6,4,6,4")
    from clustersim.experiment import run_experiment
    step = run_experiment(dataclasses.replace(exp)).metrics.step_time_s
    cluster = load_cluster_for(exp)
    model = resolve_model(exp)
    exp.stack = "megatron"
    plan = resolve_plan(exp, model, 8)
    assert lower_bound_s(exp, model, plan, build_cost_model(exp, cluster), 8) <= step * (1 + 1e-9)
