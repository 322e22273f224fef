"""``--attention eager``: the attention core without FlashAttention is priced as the kernels that move the s×s
scores through HBM (closed forms for their FLOPs and bytes; the priced time against the HBM floor)."""
import pytest

from schedules.kernels import phase_kernels
from schedules.models import get_model
from schedules.plan import ParallelPlan
from simulator.kernels import ATTENTION, ELEMENTWISE, GEMM
from topologies.kernel_cost import KernelPricer
from topologies.specs import get_accelerator

CORE = ("attention scores", "attention values", "softmax", "causal mask", "attention dropout")


def _core(kl):
    return [k for k in kl if any(c in k.name for c in CORE)]


@pytest.mark.parametrize("name,tp", [("gpt3-175b", 8), ("llama3-8b", 1), ("llama3-8b", 4)])
def test_eager_core_gemms_compute_the_whole_score_matrix(name, tp):
    """QK^T and PV are batched GEMMs over b·heads/tp matrices, every one of the s×s positions computed (no causal
    skipping): 2·2·b·(heads/tp)·s²·d forward, twice that backward (dP, dV, dQ, dK)."""
    m, s, b = get_model(name), 2048, 2
    plan = ParallelPlan(tp=tp, sp=tp > 1, seq=s, micro_batch=b, attention="eager")
    fwd = _core(phase_kernels(m, plan, 0, "forward"))
    bwd = _core(phase_kernels(m, plan, 0, "backward_input"))
    expect = 2 * 2.0 * b * (m.heads / tp) * s * s * m.d_head
    assert sum(k.flops for k in fwd if k.kind == GEMM) == pytest.approx(expect)
    assert sum(k.flops for k in bwd if k.kind == GEMM) == pytest.approx(2 * expect)
    assert not any(k.kind == ATTENTION for k in phase_kernels(m, plan, 0, "forward"))
    assert all(k.batch == b * m.heads // tp for k in fwd + bwd if k.kind == GEMM)
    # the weight-gradient pass holds no attention-core kernel (dV is an activation gradient)
    assert not _core(phase_kernels(m, plan, 0, "backward_weight"))


def test_eager_core_elementwise_bytes():
    """Bytes per score element (a = 2-byte activations): Megatron's fused scale-mask-softmax reads and writes
    2a; attention dropout (GPT-style models) reads the probabilities and writes the dropped ones and a 1-byte
    mask, 2a + 1; backward:
    dropout's mask multiply 2a + 1, the softmax backward 3a (read dP and P, write dS). An unfused stack adds the
    causal mask as its own kernel (2a forward and backward); Llama (no dropout) has no dropout kernels."""
    s, b = 1024, 1
    gpt = get_model("gpt3-175b")
    el = b * gpt.heads * s * s
    plan = ParallelPlan(seq=s, micro_batch=b, attention="eager")
    ew = lambda kl: {k.name: k.bytes for k in _core(kl) if k.kind == ELEMENTWISE}     # noqa: E731
    assert ew(phase_kernels(gpt, plan, 0, "forward")) == pytest.approx(
        {"scale-mask-softmax (fused)": el * 4, "attention dropout": el * 5})
    assert ew(phase_kernels(gpt, plan, 0, "backward_input")) == pytest.approx(
        {"attention dropout bwd": el * 5, "softmax bwd": el * 6})
    llama = get_model("llama3-8b")
    el = b * llama.heads * s * s
    unfused = ParallelPlan(seq=s, micro_batch=b, attention="eager", stack="torchtitan")
    assert ew(phase_kernels(llama, unfused, 0, "forward")) == pytest.approx({"causal mask": el * 4, "softmax": el * 4})
    assert ew(phase_kernels(llama, unfused, 0, "backward_input")) == pytest.approx(
        {"softmax bwd": el * 6, "causal mask bwd": el * 4})


def test_selective_recompute_reruns_the_eager_core():
    """Megatron's selective recomputation (Korthikanti et al. 2022) re-runs exactly the attention core."""
    m = get_model("gpt3-175b")
    base = ParallelPlan(tp=8, sp=True, seq=2048, attention="eager")
    sel = ParallelPlan(tp=8, sp=True, seq=2048, attention="eager", recompute="selective")
    core_fwd = _core(phase_kernels(m, base, 0, "forward"))
    plain, again = phase_kernels(m, base, 0, "backward"), phase_kernels(m, sel, 0, "backward")
    assert len(again) == len(plain) + len(core_fwd)
    assert again.flops == pytest.approx(plain.flops + sum(k.flops for k in core_fwd))
    assert [k.name for k in again][:len(core_fwd)] == [k.name for k in core_fwd]


@pytest.mark.parametrize("device", ["A100-80GB", "H100-SXM"])
def test_eager_core_costs_at_least_the_scores_through_hbm(device):
    """Priced on a device, the eager layer is slower than the flash one by at least the time its core's
    elementwise kernels need at the datasheet HBM bandwidth (a floor independent of the GEMM curve)."""
    acc = get_accelerator(device)
    pricer = KernelPricer(acc)
    m = get_model("gpt3-175b")
    for phase in ("forward", "backward"):
        flash = phase_kernels(m, ParallelPlan(tp=8, sp=True, seq=2048), 0, phase)
        eager = phase_kernels(m, ParallelPlan(tp=8, sp=True, seq=2048, attention="eager"), 0, phase)
        floor = sum(k.bytes for k in _core(eager) if k.kind == ELEMENTWISE) / acc.hbm_bytes_per_s
        assert pricer.time_s(eager) - pricer.time_s(flash) > floor, phase


def test_context_parallelism_needs_flash_attention():
    """Ring attention merges its KV blocks with FlashAttention's log-sum-exp: eager attention with cp > 1 is a
    plan no stack runs, reported as such."""
    from simulator.errors import PlanError
    with pytest.raises(PlanError, match="ring attention"):
        ParallelPlan(cp=2, seq=8192, attention="eager").validate(get_model("llama3-8b"), 2)


def test_attention_kernel_choice_is_checked():
    """--attention-kernel names a FlashAttention kernel: an unknown name, or one with eager attention (no
    FlashAttention runs), is a plan error saying what to do."""
    from simulator.errors import PlanError
    m = get_model("llama3-8b")
    with pytest.raises(PlanError, match="attention_kernel must be one of auto, flash2, triton"):
        ParallelPlan(attention_kernel="flash3").validate(m, 1)
    with pytest.raises(PlanError, match="no FlashAttention runs"):
        ParallelPlan(attention="eager", attention_kernel="flash2").validate(m, 1)
    ParallelPlan(attention="eager", attention_kernel="auto").validate(m, 1)
    ParallelPlan(attention_kernel="triton").validate(m, 1)
