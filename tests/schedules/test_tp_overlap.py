"""Transformer Engine's TP communication overlap (``plan.tp_comm_overlap``, userbuffers): the GEMMs it
chunks or narrows, the collectives it moves beside them, and the timing that follows."""
import dataclasses
import json

import pytest

from clustersim.cli import main
from schedules import build_programs, get_model
from schedules.kernels import phase_kernels
from schedules.plan import ParallelPlan
from simulator.engine import run
from simulator.errors import PlanError
from simulator.kernels import GEMM, Kernel
from simulator.program import COLLECTIVE, COMPUTE
from topologies import load_cluster
from topologies.cost import ClusterCostModel
from topologies.kernel_cost import KernelPricer
from topologies.specs import get_accelerator

M = get_model("llama3-8b")       # SwiGLU: Megatron's fused gate+up GEMM "mlp fc1 (gate+up)"


def _plan(**kw):
    return ParallelPlan(**{"tp": 8, "sp": True, "seq": 4096, "dp": 1, "global_batch": 1, **kw})


# (chunks, SMs left to the communication) per GEMM, from Megatron-Bridge's H100 presets (tp 8: a ring
# exchange runs 8 chunks, a pipeline its 4 splits)
FORWARD = {"bf16": {"qkv": (8, 0), "attention proj": (4, 24), "mlp fc1 (gate+up)": (8, 0), "mlp fc2": (4, 16)},
           "fp8": {"qkv": (8, 0), "attention proj": (8, 1), "mlp fc1 (gate+up)": (8, 0), "mlp fc2": (8, 1)}}
BACKWARD = {"attention proj dgrad": (8, 0), "attention proj wgrad": (1, 0), "qkv dgrad": (1, 4),
            "qkv wgrad": (1, 24), "mlp fc2 dgrad": (8, 0), "mlp fc2 wgrad": (1, 0),
            "mlp fc1 (gate+up) dgrad": (1, 2), "mlp fc1 (gate+up) wgrad": (1, 4)}


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_gemms_run_as_the_userbuffers_presets_say(dtype):
    for phase, want in (("forward", FORWARD[dtype]), ("backward", BACKWARD)):
        off = phase_kernels(M, _plan(dtype=dtype), 0, phase)
        on = phase_kernels(M, _plan(dtype=dtype, tp_comm_overlap=True), 0, phase)
        # the same kernels, shapes and FLOPs; only how the GEMMs run changes
        assert [dataclasses.replace(k, chunks=1, sm_margin=0) for k in on] == list(off)
        assert {k.name: (k.chunks, k.sm_margin) for k in on if k.kind == GEMM} == want
    # full recomputation re-runs the forward GEMMs with their overlap
    rec = phase_kernels(M, _plan(dtype=dtype, tp_comm_overlap=True, recompute="full"), 0, "backward")
    assert {k.name: (k.chunks, k.sm_margin) for k in rec if k.kind == GEMM and k.name in FORWARD[dtype]} == \
        FORWARD[dtype]


def test_a_chunked_gemm_is_its_chunks_and_a_margin_is_a_narrower_device():
    acc = get_accelerator("H100-SXM")
    pricer = KernelPricer(acc)
    g = Kernel("g", GEMM, 2.0 * 4096 * 6144 * 4096, 0.0, 4096, 6144, 4096)
    piece = dataclasses.replace(g, m=4096 // 8, flops=g.flops / 8)
    assert pricer.kernel_time_s(dataclasses.replace(g, chunks=8)) == pytest.approx(8 * pricer.kernel_time_s(piece))
    # 3 rows do not split into 2 equal chunks: ceil(3 / 2) = 2 rows each
    odd = Kernel("o", GEMM, 2.0 * 3 * 512 * 512, 0.0, 3, 512, 512)
    assert pricer.kernel_time_s(dataclasses.replace(odd, chunks=2)) == pytest.approx(
        2 * pricer.kernel_time_s(dataclasses.replace(odd, m=2)))
    narrow = KernelPricer(dataclasses.replace(acc, sm_count=acc.sm_count - 24,
                                              peak_bf16_flops=acc.peak_bf16_flops * (acc.sm_count - 24) / acc.sm_count))
    assert pricer.kernel_time_s(dataclasses.replace(g, sm_margin=24)) == pytest.approx(narrow.kernel_time_s(g))
    assert pricer.kernel_time_s(dataclasses.replace(g, sm_margin=24)) > pricer.kernel_time_s(g)
    rows = pricer.breakdown(phase_kernels(M, _plan(tp_comm_overlap=True), 0, "forward"))
    assert next(r for r in rows if r["kernel"] == "mlp fc2")["shape"].endswith("in 4 chunks, 16 SMs to comm")


def _tp_comm(plan, model=M):
    """{(phase, stream): sorted [(kind, bytes)]} of layer 0's TP collectives on rank 0."""
    out = {}
    for op in build_programs(model, plan, symmetric=True).ops[0]:
        if op.kind == COLLECTIVE and op.strategy == "tp" and op.layer == 0 and op.microbatch == 0:
            out.setdefault(op.phase, []).append((op.collective, op.size_bytes, op.stream))
    return out


@pytest.mark.parametrize("model, extra_ag", [("llama3-8b", 2), ("tiny-moe", 1)])
def test_collectives_move_beside_the_compute_and_keep_their_bytes(model, extra_ag):
    m = get_model(model)
    kw = dict(tp=2, seq=256, ep=1) if model == "tiny-moe" else {}
    off, on = _tp_comm(_plan(**kw), m), _tp_comm(_plan(tp_comm_overlap=True, **kw), m)

    def bytes_by_kind(rows):
        out = {}
        for kind, size, _ in rows:
            out[kind] = out.get(kind, 0.0) + size
        return out

    tp_bytes = max(s for _, s, _ in off["forward"])
    f_off, f_on = bytes_by_kind(off["forward"]), bytes_by_kind(on["forward"])
    assert f_on == pytest.approx(f_off)          # a reduce-scatter split into its body and last chunk
    streams = [stream for _, _, stream in on["forward"]]
    if model == "tiny-moe":     # the experts' token all-gather / reduce-scatter stay in line (no userbuffers)
        assert streams.count("compute") == 2 and streams.count("tp_overlap") == 3    # AG, RS body, RS last chunk
    else:
        assert all(stream == "tp_overlap" for _, _, stream in on["forward"] + on["backward"])
    b_off, b_on = bytes_by_kind(off["backward"]), bytes_by_kind(on["backward"])
    # backward adds the bulk all-gathers of the saved sequence-sharded inputs the wgrad GEMMs need
    assert b_on["all_gather"] == pytest.approx(b_off["all_gather"] + extra_ag * tp_bytes)
    assert b_on["reduce_scatter"] == pytest.approx(b_off["reduce_scatter"])


def test_each_collective_runs_beside_its_gemm_and_the_next_piece_waits_for_it():
    """On the engine: the layer's compute is cut at its overlapped GEMMs; each collective starts with the GEMM
    its userbuffers slot pairs it with, a reduce-scatter's last chunk when that GEMM (and the rest of the
    collective) ends, and the layer's next piece when both the GEMM and the collective are done."""
    plan = _plan(global_batch=2, tp_comm_overlap=True, recompute="full")
    cluster = load_cluster("dgx-h100", plan.world_size)
    progs = build_programs(M, plan, symmetric=True)
    res = run(progs, ClusterCostModel(cluster))
    ops, start, end = progs.ops[0], res.start_s[0], res.end_s[0]
    paired = {phase: 0 for phase in ("forward", "backward")}
    for j, op in enumerate(ops):
        if op.stream != "tp_overlap" or op.kind != COLLECTIVE:
            continue
        tail = op.name.endswith("(last chunk)")
        gemm = j - 2 if tail else j - 1
        slot = ops[gemm].kernels.label.split(" · ")[-1]
        assert slot.split()[0] in ("qkv", "proj", "fc1", "fc2") and len(ops[gemm].kernels) == 1
        if tail:
            assert start[j] == pytest.approx(max(end[gemm], end[j - 1]), rel=1e-12)
        else:
            assert start[j] == pytest.approx(start[gemm], rel=1e-12)
            paired[op.phase] += 1
        last_comm = j + 1 if j + 1 < len(ops) and ops[j + 1].name.endswith("(last chunk)") else j
        nxt = next((k for k in range(last_comm + 1, len(ops)) if ops[k].stream == "compute"), None)
        if nxt is not None and ops[nxt].layer == op.layer and ops[nxt].phase == op.phase:
            assert start[nxt] == pytest.approx(max(end[gemm], end[last_comm]), rel=1e-12)
    # per layer and micro-batch: 4 forward pairs; backward 4 recomputed forward pairs + 6 of its own
    layers_mb = M.layers * plan.num_microbatches
    assert paired == {"forward": 4 * layers_mb, "backward": 10 * layers_mb}
    # at this size the overlap hides more TP time than the chunked GEMMs lose
    plain = run(build_programs(M, dataclasses.replace(plan, tp_comm_overlap=False), symmetric=True),
                ClusterCostModel(cluster))
    assert res.step_time_s < plain.step_time_s


@pytest.mark.parametrize("kw, match", [
    (dict(tp=1, sp=False), "needs --tp > 1"),
    (dict(sp=False), "needs --sp"),
    (dict(stack="torchtitan"), "needs --stack megatron"),
    (dict(pp=2, schedule="zb", global_batch=4), "not modelled"),
])
def test_impossible_overlap_plans_are_refused(kw, match):
    with pytest.raises(PlanError, match=match):
        _plan(tp_comm_overlap=True, **kw).validate(M)


def test_cli_flag_and_json_field(capsys):
    args = ["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--model", "llama3-8b", "--tp", "8", "--sp",
            "--seq", "2048", "--global-batch", "4", "--json"]
    assert main(args + ["--tp-comm-overlap"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    off = json.loads(capsys.readouterr().out)
    assert main(args[:9] + ["--seq", "2048", "--tp-comm-overlap"]) == 2        # no --sp
    assert "--tp-comm-overlap" in capsys.readouterr().err
    assert on["plan"]["tp_comm_overlap"] is True and off["plan"]["tp_comm_overlap"] is False
    assert on["comm_by_axis"]["tp"]["exposed_s"] < off["comm_by_axis"]["tp"]["exposed_s"]


def test_userbuffers_are_resident_memory():
    """Ten userbuffers of [seq · micro-batch / cp, hidden] (Megatron-Bridge's initialize_ub shape), resident all
    step: in the closed-form memory report and in the engine's static memory; none without the overlap."""
    from schedules import memory as mem
    plan = _plan(micro_batch=2, global_batch=2, cp=2, dp=1, tp_comm_overlap=True)
    want = 10 * 4096 * 2 / 2 * M.hidden * 2
    assert mem.userbuffer_bytes(M, plan) == want
    off = dataclasses.replace(plan, tp_comm_overlap=False)
    assert mem.userbuffer_bytes(M, off) == 0.0
    on_mem, off_mem = mem.memory_per_rank(M, plan)["stage0"], mem.memory_per_rank(M, off)["stage0"]
    assert on_mem["buffers"] - off_mem["buffers"] == pytest.approx(want)
    on_p, off_p = build_programs(M, plan, symmetric=True), build_programs(M, off, symmetric=True)
    assert sum(on_p.static_memory[0].values()) - sum(off_p.static_memory[0].values()) == pytest.approx(want)
