"""Activation recomputation modes against closed forms: torchtitan's per-op checkpointing (recompute op) and
full checkpointing of every N-th layer (recompute full + recompute_every, torchtitan's "selective layer")."""
import json

import pytest

from clustersim.cli import main
from clustersim.experiment import experiment_from_dict
from schedules import build_programs, get_model
from schedules import memory as mem
from schedules.kernels import phase_kernels, recompute_kernels
from schedules.plan import ParallelPlan, pass_times
from simulator.errors import ClusterSimError, PlanError
from simulator.kernels import ATTENTION, GEMM

M = get_model("llama3-8b")          # h 4096, 32 heads, 8 KV heads of 128, SwiGLU 14336
T, H, A, KV, D, F = 4096, 4096, 32, 8, 128, 14336


def _plan(**kw):
    return ParallelPlan(**{"seq": T, "stack": "torchtitan", "recompute": "op", **kw})


def test_op_recomputes_every_other_matmul_and_the_pointwise_ops():
    """torchtitan's policy counts the block's aten.mm in launch order (wq, wk, wv, wo, w1, w3, w2), saves the
    odd ones and the SDPA output, recomputes the rest; early stop skips the last residual add."""
    p = _plan()
    fwd = phase_kernels(M, p, 0, "forward")
    assert [k.name for k in fwd if k.kind == GEMM] == ["wq", "wk", "wv", "attention proj", "mlp w1 (gate)",
                                                       "mlp w3 (up)", "mlp fc2"]
    rec = recompute_kernels(M, p, 0)
    saved = {"wq", "wv", "flash attention fwd", "mlp w1 (gate)", "mlp fc2", "mlp residual add"}
    assert [k.name for k in rec] == [k.name for k in fwd if k.name not in saved]
    assert [k.name for k in rec if k.kind == GEMM] == ["wk", "attention proj", "mlp w3 (up)"]
    assert not any(k.kind == ATTENTION for k in rec)
    assert rec.flops == pytest.approx(2 * T * H * (KV * D) + 2 * T * (A * D) * H + 2 * T * H * F)
    # the recomputation is prepended to backward (and backward_input), nothing else changes
    for ph in ("backward", "backward_input"):
        bwd = phase_kernels(M, p, 0, ph)
        assert bwd.kernels == rec.kernels + phase_kernels(M, p, 0, ph, recompute=False).kernels
    assert phase_kernels(M, p, 0, "backward_weight").kernels == \
        phase_kernels(M, p, 0, "backward_weight", recompute=False).kernels
    # a stack with a fused QKV and gate/up GEMM: qkv (1st) and fc1 (3rd) saved, projection and fc2 recomputed
    mg = recompute_kernels(M, _plan(stack="megatron"), 0)
    assert [k.name for k in mg if k.kind == GEMM] == ["attention proj", "mlp fc2"]


def test_op_memory_keeps_what_the_policy_saves():
    """Per token: the block input, wq, wv, the attention output (+ fp32 LSE), w1 and w2 outputs."""
    per_token = 2 * (H + A * D + KV * D + A * D + F + H) + 4 * A
    assert mem.layer_activation_bytes(M, _plan(), 0) == pytest.approx(T * per_token)
    none = mem.layer_activation_bytes(M, _plan(recompute="none"), 0)
    assert mem.recompute_transient_bytes(M, _plan(), 0) == pytest.approx(none - T * per_token)
    # TP 2 with SP: norms' rows and the two saved reduce-scatter outputs split, w2's partial sum per rank whole
    tp = mem.layer_activation_bytes(M, _plan(tp=2, sp=True), 0)
    assert tp == pytest.approx(T * (2 * (H / 2 + A * D / 2 + KV * D / 2 + A * D / 2 + F / 2 + H + 2 * H / 2)
                                    + 4 * A / 2))


def test_recompute_every_checkpoints_every_nth_layer():
    p = ParallelPlan(seq=T, stack="torchtitan", recompute="full", recompute_every=2)
    assert [p.layer_recompute(l) for l in range(6)] == ["none", "full"] * 3
    assert p.layer_recompute(None) == "none"
    none, full = (ParallelPlan(seq=T, stack="torchtitan", recompute=r) for r in ("none", "full"))
    for l, ref in ((0, none), (1, full)):
        assert phase_kernels(M, p, l, "backward").kernels == phase_kernels(M, ref, l, "backward").kernels
        assert mem.layer_activation_bytes(M, p, l) == mem.layer_activation_bytes(M, ref, l)
        assert mem.recompute_transient_bytes(M, p, l) == mem.recompute_transient_bytes(M, ref, l)
    assert mem.layer_activation_bytes(M, p, 1) == 2 * T * H           # the checkpointed layer keeps its input
    # backward passes recompute half the layers: relative backward time halfway between none and full
    assert pass_times(M, p)[1] == pytest.approx((pass_times(M, none)[1] + pass_times(M, full)[1]) / 2, abs=0.01)


def test_programs_follow_the_per_layer_recompute():
    """Backward ops of checkpointed layers carry the forward's kernels in front, the others do not."""
    tiny = get_model("tiny")
    p = ParallelPlan(seq=128, stack="torchtitan", recompute="full", recompute_every=2, dp=1)
    progs = build_programs(tiny, p, symmetric=True)
    back = {op.layer: op for op in progs.ops[0] if op.kind == "compute" and op.phase == "backward"
            and op.layer is not None}
    for l, op in back.items():
        ref = phase_kernels(tiny, p, l, "backward")
        assert op.kernels.kernels == ref.kernels
        assert (len(op.kernels) > len(phase_kernels(tiny, p, l, "backward", recompute=False))) == (l % 2 == 1)
    assert len(back) == tiny.layers
    f = {l: op.flops for l, op in back.items()}
    fwd = {op.layer: op.flops for op in progs.ops[0] if op.kind == "compute" and op.phase == "forward"
           and op.layer is not None}
    assert f[1] - f[0] == pytest.approx(fwd[1])
    op_plan = ParallelPlan(seq=128, stack="torchtitan", recompute="op")
    op_back = next(op for op in build_programs(tiny, op_plan, symmetric=True).ops[0]
                   if op.kind == "compute" and op.phase == "backward" and op.layer == 0)
    none_back = next(op for op in build_programs(tiny, ParallelPlan(seq=128, stack="torchtitan"), symmetric=True
                                                 ).ops[0] if op.kind == "compute" and op.phase == "backward"
                     and op.layer == 0)
    assert op_back.flops - none_back.flops == pytest.approx(recompute_kernels(tiny, op_plan, 0).flops)


@pytest.mark.parametrize("kw, match", [
    (dict(recompute="selective", recompute_every=2), "needs --recompute full"),
    (dict(recompute="full", recompute_every=0), "recompute_every must be a positive integer"),
    (dict(recompute="op", attention="eager"), "per-op"),
])
def test_bad_recompute_options(kw, match):
    with pytest.raises(PlanError, match=match):
        ParallelPlan(seq=T, **kw).validate(M)
    with pytest.raises(PlanError, match="per-op"):
        ParallelPlan(seq=T, recompute="op").validate(get_model("tiny-moe"))
    with pytest.raises(ClusterSimError, match="recompute_every"):
        experiment_from_dict({"recompute_every": "two"})


def test_cli_accepts_the_options_and_refuses_bad_values(capsys):
    assert main(["plan", "-m", "llama3-8b", "--gpus", "8", "--seq", "4096", "--recompute", "op", "--json"]) == 0
    op = json.loads(capsys.readouterr().out)
    assert main(["plan", "-m", "llama3-8b", "--gpus", "8", "--seq", "4096", "--recompute", "full",
                 "--recompute-every", "2", "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert (op["plan"]["recompute"], every["plan"]["recompute_every"]) == ("op", 2)
    assert every["memory_bytes"]["stage0"]["activations"] > 0
    assert main(["plan", "-m", "llama3-8b", "--gpus", "8", "--recompute", "selective", "--recompute-every", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "recompute full" in err
    assert main(["plan", "-m", "tiny-moe", "--gpus", "8", "--recompute", "op"]) == 2
    assert "per-op" in capsys.readouterr().err


@pytest.mark.parametrize("model, kw", [
    ("tiny", dict(tp=2, sp=True)),                 # AG / RS pairs
    ("tiny", dict(tp=2)),                          # all-reduces
    ("tiny-moe", dict(tp=2, sp=True, ep=2, dp=2)),  # plus the dispatch / combine all-to-alls
])
def test_full_recompute_reruns_the_forward_communication(model, kw):
    """Full recomputation re-runs the layer's forward in backward, its TP collectives and expert all-to-alls
    too (Megatron's CheckpointFunction calls the layer's forward again): a checkpointed layer's backward
    carries its forward's communication on top of the backward's own, same kinds and bytes."""
    m = get_model(model)

    def comm(plan, phase):
        out = {}
        for op in build_programs(m, plan, symmetric=True).ops[0]:
            if op.kind == "collective" and op.phase == phase and op.layer is not None and op.strategy in ("tp", "ep"):
                out.setdefault(op.layer, []).append((op.collective, op.size_bytes))
        return out

    base = dict(seq=128, global_batch=8, **kw)
    none, full = ParallelPlan(**base), ParallelPlan(**base, recompute="full")
    fwd, back_none, back_full = comm(none, "forward"), comm(none, "backward"), comm(full, "backward")
    assert fwd and set(fwd) == set(back_full)
    for layer in fwd:
        assert sorted(back_full[layer]) == sorted(fwd[layer] + back_none[layer])
    assert comm(full, "forward") == fwd
