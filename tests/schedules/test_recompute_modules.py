"""Megatron-Core's fine-grained selective recomputation (``--recompute-modules``) against closed forms: which
forward kernels each module re-runs before backward, which saved tensors it frees, the MoE module's repeated
all-to-alls, and that the default (core_attn) is the selective recomputation it always was."""
import json

import pytest

from clustersim import validate as V
from clustersim.cli import main
from clustersim.experiment import experiment_from_dict
from schedules import build_programs, get_model
from schedules import memory as mem
from schedules.kernels import phase_kernels, recompute_kernels
from schedules.plan import ParallelPlan, pass_times
from simulator.errors import ClusterSimError, PlanError
from simulator.kernels import ATTENTION, GEMM

LLAMA = get_model("llama3-8b")      # h 4096, 32 heads, 8 KV heads of 128, SwiGLU 14336
DSV3 = get_model("deepseek-v3")     # MLA (q_lora 1536, kv_lora 512, 128 + 64 rope, v 128), 256 experts, 1 shared


def _sel(model, mods, **kw):
    base = dict(seq=4096, recompute="selective", recompute_modules=tuple(mods))
    if model.is_moe:
        base.update(tp=2, sp=True, ep=8, dp=8, etp=1)
    return ParallelPlan(**{**base, **kw}).validate(model)


def test_default_is_megatrons_selective_recomputation():
    """core_attn alone (the default) re-runs the attention core only; naming it changes nothing."""
    p = ParallelPlan(seq=4096, recompute="selective")
    assert p.recompute_modules == ("core_attn",)
    rec = recompute_kernels(LLAMA, p, 0)
    assert [k.kind for k in rec] == [ATTENTION]
    assert rec.kernels == recompute_kernels(LLAMA, _sel(LLAMA, ["core_attn"]), 0).kernels
    # pass times and per-op FLOPs: the core only
    assert pass_times(LLAMA, p) == pass_times(LLAMA, _sel(LLAMA, ["core_attn"]))


def test_mla_up_proj_reruns_the_up_projections_and_rotary():
    p = _sel(DSV3, ["mla_up_proj"])
    rec = recompute_kernels(DSV3, p, 5, "attention")
    T, heads = 4096, DSV3.heads / 2
    assert [k.name for k in rec if k.kind == GEMM] == ["q up", "kv up"]
    assert rec.flops == pytest.approx(2 * T * heads * (DSV3.d_head + DSV3.qk_rope_dim) * DSV3.q_lora_rank
                                      + 2 * T * heads * (DSV3.d_head + DSV3.v_head_dim) * DSV3.kv_lora_rank)
    assert any(k.name.startswith("rotary") for k in rec)
    assert not any(k.kind == ATTENTION for k in rec)        # the core is not re-run
    assert not recompute_kernels(DSV3, p, 5, "experts").kernels
    # memory: the rotated q and the k, v the core keeps are discarded (CheckpointWithoutOutput)
    sel = {x.name: x for x in mem.saved_tensors(DSV3, p, 5)}
    drop = sum(mem._per_rank(sel[n], p) for n in ("q (rotated)", "k, v"))
    none = mem.layer_activation_bytes(DSV3, p, 5, recompute="none")
    assert mem.layer_activation_bytes(DSV3, p, 5) == pytest.approx(none - drop)
    assert mem.recompute_transient_bytes(DSV3, p, 5) == pytest.approx(drop)


def test_dense_mlp_module_reruns_the_mlp_and_frees_its_tensors():
    p = _sel(LLAMA, ["mlp"], tp=2, sp=True)
    rec = recompute_kernels(LLAMA, p, 0)
    fwd = phase_kernels(LLAMA, p, 0, "forward")
    assert [k.name for k in rec if k.kind == GEMM] == [k.name for k in fwd if k.kind == GEMM and
                                                       k.name.startswith("mlp")]
    T, H, F = 4096, LLAMA.hidden, LLAMA.ffn
    assert rec.flops == pytest.approx(3 * 2 * T * H * F / 2)          # gate+up and down, TP-sharded
    none = mem.layer_activation_bytes(LLAMA, p, 0, recompute="none")
    # fc1 output (gate and up) and the activation output, sharded over TP
    assert mem.layer_activation_bytes(LLAMA, p, 0) == pytest.approx(none - 2 * T * (2 * F + F) / 2)
    # hardware FLOPs: the backward op carries the MLP's forward GEMMs on top
    def back_flops(plan):
        return next(op.flops for op in build_programs(LLAMA, plan, symmetric=True).ops[0]
                    if op.kind == "compute" and op.phase == "backward" and op.layer == 0)
    base = ParallelPlan(seq=4096, tp=2, sp=True, recompute="selective", dp=1)
    assert back_flops(_sel(LLAMA, ["core_attn", "mlp"], tp=2, sp=True, dp=1)) - back_flops(base) == \
        pytest.approx(rec.flops)


def test_layernorm_recomputes_only_norms_that_are_modules_of_their_own():
    """Megatron-Core with Transformer Engine fuses a dense layer's norms into the following linear: nothing to
    recompute there; an MoE layer's pre-MLP norm (read by router and dispatcher) and MLA's input norm are
    TENorm modules of their own. Other stacks keep norms separate."""
    dense = _sel(LLAMA, ["layernorm"])
    assert not recompute_kernels(LLAMA, dense, 0).kernels
    assert mem.layer_activation_bytes(LLAMA, dense, 0) == mem.layer_activation_bytes(LLAMA, dense, 0, "none")
    tt = _sel(LLAMA, ["layernorm"], stack="torchtitan")
    names = [k.name for k in recompute_kernels(LLAMA, tt, 0)]
    assert names and all("norm" in n for n in names)
    assert mem.layer_activation_bytes(LLAMA, tt, 0) < mem.layer_activation_bytes(LLAMA, tt, 0, "none")
    moe = _sel(DSV3, ["layernorm"])
    names = [k.name for k in recompute_kernels(DSV3, moe, 5, "attention")]
    assert names[0].startswith("input norm") and any(n.startswith("post-attention norm") for n in names)
    freed = {x.name for x in mem.saved_tensors(DSV3, moe, 5)
             if mem.recomputed_modules(DSV3, moe, 5).intersection(x.freed_by)}
    assert freed == {"norm1 output (QKV input)", "norm2 output (MLP input)"}


def test_moe_modules_free_expert_tensors():
    act = _sel(DSV3, ["moe_act"])
    assert [k.kind for k in recompute_kernels(DSV3, act, 5, "experts")] == ["elementwise"]
    free = lambda p: {x.name for x in mem.saved_tensors(DSV3, p, 5)      # noqa: E731
                      if mem.recomputed_modules(DSV3, p, 5).intersection(x.freed_by)}
    assert free(act) == {"expert activation output (fc2 input)"}
    assert free(_sel(DSV3, ["shared_experts"])) == {"shared expert fc1 output",
                                                      "shared expert activation output (fc2 input)"}
    whole = _sel(DSV3, ["moe"])
    assert free(whole) == {"router probabilities", "permuted tokens (expert input)", "expert fc1 output",
                           "expert activation output (fc2 input)", "expert outputs (combine input)",
                           "shared expert fc1 output", "shared expert activation output (fc2 input)"}
    # the whole experts part re-runs: its forward kernels in front of its backward
    assert recompute_kernels(DSV3, whole, 5, "experts").kernels == \
        phase_kernels(DSV3, whole, 5, "forward", part="experts").kernels
    # splitting the shared experts' tensors out changes no total
    none = ParallelPlan(seq=4096, tp=2, sp=True, ep=8, dp=8, etp=1).validate(DSV3)
    total = sum(mem._per_rank(x, none) for x in mem.saved_tensors(DSV3, none, 5))
    assert mem.layer_activation_bytes(DSV3, none, 5) == pytest.approx(total)


def test_moe_module_reruns_the_dispatch_and_combine_all_to_alls():
    """Megatron's moe module checkpoints MoELayer.forward: its all-to-alls run again before its backward, as
    under full recomputation; core_attn and the other modules re-run no communication."""
    m = get_model("tiny-moe")

    def ep_comm(plan):
        return sorted((op.layer, op.collective, op.size_bytes) for op in build_programs(m, plan, symmetric=True).ops[0]
                      if op.kind == "collective" and op.phase == "backward" and op.strategy == "ep")

    base = dict(seq=128, global_batch=8, tp=2, sp=True, ep=2, dp=2)
    full = ep_comm(ParallelPlan(**base, recompute="full"))
    moe = ep_comm(ParallelPlan(**base, recompute="selective", recompute_modules=("moe",)))
    sel = ep_comm(ParallelPlan(**base, recompute="selective"))
    assert moe == full and len(moe) == 2 * len(sel) > 0


@pytest.mark.parametrize("model, kw, match", [
    (LLAMA, dict(recompute="selective", recompute_modules=("attention",)), "unknown recompute module"),
    (LLAMA, dict(recompute="full", recompute_modules=("mlp",)), "needs --recompute selective"),
    (LLAMA, dict(recompute="selective", recompute_modules=()), "non-empty"),
    (LLAMA, dict(recompute="selective", recompute_modules=("mlp", "mlp")), "twice"),
    (LLAMA, dict(recompute="selective", recompute_modules=("mla_up_proj",)), "no multi-head latent"),
    (LLAMA, dict(recompute="selective", recompute_modules=("moe_act",)), "dense"),
    (LLAMA, dict(recompute="selective", recompute_modules=("mlp",), attention="eager"), "attention flash"),
    (DSV3, dict(recompute="selective", recompute_modules=("moe", "moe_act"), ep=8, dp=8), "name one"),
    (get_model("mixtral-8x22b"), dict(recompute="selective", recompute_modules=("shared_experts",), ep=8, dp=8),
     "no shared experts"),
])
def test_bad_recompute_modules(model, kw, match):
    with pytest.raises(PlanError, match=match):
        ParallelPlan(seq=4096, **kw).validate(model)


def test_cli_and_yaml(capsys):
    assert main(["plan", "-m", "deepseek-v3", "--gpus", "512", "--tp", "2", "--pp", "8", "--ep", "64", "--etp", "1",
                 "--sp", "--seq", "4096", "--recompute", "selective", "--recompute-modules", "mla_up_proj,moe_act",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["recompute_modules"] == ["mla_up_proj", "moe_act"]
    assert main(["plan", "-m", "llama3-8b", "--gpus", "8", "--recompute", "selective", "--recompute-modules",
                 "mlp,attn"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "'attn'" in err and "core_attn" in err
    assert experiment_from_dict({"recompute_modules": ["core_attn", "mlp"]}).recompute_modules == ("core_attn", "mlp")
    with pytest.raises(ClusterSimError, match="module names"):
        experiment_from_dict({"recompute_modules": 3})


def test_validate_takes_the_launch_scripts_modules():
    rows = {r["id"]: r for r in V.load_runs()}
    kw, notes = V.row_experiment(rows["289"])           # dgxc-benchmarking v25.05.04, H100: RM='mla_up_proj'
    assert (kw["recompute"], kw["recompute_modules"]) == ("selective", ("mla_up_proj",))
    assert any("--recompute_modules" in n for n in notes)
    kw, _ = V.row_experiment(rows["621"])               # v25.05, GB200: RM='core_attn'
    assert kw["recompute_modules"] == ("core_attn",)
    # Megatron-Bridge's performance configs, where the row's parallelism names the config
    assert V.row_experiment(rows["581"])[0]["recompute_modules"] == ("mla_up_proj",)        # GB200 PP4 EP64
    assert V.row_experiment(rows["572"])[0]["recompute_modules"] == ("mla_up_proj", "mlp")  # B200 PP8 EP32
    assert V.row_experiment(rows["601"])[0]["recompute_modules"] == ("mlp",)     # GB200 PP4 EP64, 26.04: v0.4.0
    assert "recompute_modules" not in V.row_experiment(rows["582"])[0]    # PP8 EP32 on GB200: no such config


def test_unstated_rows_try_the_light_modules_before_full_recomputation():
    """The least recomputation that fits: core_attn, then (Megatron-Core, MoE or MLA models) the output-discarding
    modules NVIDIA's MoE recipes use, then full."""
    assert V.recompute_ladder({"model": "llama3-70b", "stack": "megatron"}) == [
        {"recompute": "selective"}, {"recompute": "full"}]
    assert V.recompute_ladder({"model": "deepseek-v3", "stack": "megatron"})[1] == {
        "recompute": "selective", "recompute_modules": ("core_attn", "layernorm", "mla_up_proj", "moe_act")}
    assert V.recompute_ladder({"model": {"base": "grok1-314b", "layers": 2}, "stack": "megatron"})[1][
        "recompute_modules"] == ("core_attn", "layernorm", "moe_act")
    assert len(V.recompute_ladder({"model": "deepseek-v3", "stack": "megatron"}, "NeMo AutoModel (PyTorch)")) == 2
    rows = {r["id"]: r for r in V.load_runs()}
    res = V.validate_rows([rows["582"]])[0]        # GB200 FP8-MX, 25.11, PP8 EP32: no such config was found
    assert tuple(res[0]["experiment"]["recompute_modules"]) == ("core_attn", "layernorm", "mla_up_proj", "moe_act")
    assert "--recompute-modules" in res[0]["notes"][-1]
