"""The kernel-level compute model inside ClusterCostModel: sums, calibration precedence, device names."""
from pathlib import Path

import pytest

import topologies
from schedules import build_programs
from schedules.kernels import phase_kernels
from schedules.models import get_model
from schedules.plan import ParallelPlan
from simulator.calibration import Calibration, ComputeFit, LayerFit
from simulator.kernels import ELEMENTWISE, GEMM, Kernel, KernelList
from simulator.program import FORWARD, Op
from topologies.cost import ClusterCostModel
from topologies.kernel_cost import (MEMORY_EFFICIENCY, KernelPricer, kernel_kind_shares, kernel_time_shares,
                                    layer_breakdown, stream_bandwidth)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    return topologies.load_cluster("dgx-h100", 16)


def test_op_time_is_the_sum_of_its_kernels(cluster):
    m = ClusterCostModel(cluster)
    g = Kernel("g", GEMM, 2.0 * 4096 ** 3, m=4096, n=4096, k=4096)
    e = Kernel("e", ELEMENTWISE, bytes=1e9)
    kl = KernelList("x", [g, e])
    op = Op("compute", "x", flops=1.0, kernels=kl)
    t_e = m.kernels.t0_s + 1e9 / 2.935e12          # H100-SXM's BabelStream mean (hbm_stream.csv)
    assert m.kernels.kernel_time_s(e) == pytest.approx(t_e)
    # the job's slowest GPU sets the pace (topologies.variation)
    assert m.compute_time_s(0, op) == pytest.approx((m.kernels.kernel_time_s(g) + t_e) * m.slowest_gpu_factor)
    # an explicit compute efficiency keeps the flat roofline (what-if studies)
    flat = ClusterCostModel(cluster, compute_efficiency=0.5)
    assert flat.compute_time_s(0, op) == pytest.approx(1.0 / (989.4e12 * 0.5))


def test_elementwise_kernels_stream_at_the_measured_babelstream_rate():
    """Elementwise kernels stream at the mean of a device's BabelStream Copy, Mul, Add and Triad (Azure's runs,
    copied by hand into hbm_stream.csv; the expected figures here are the results pages' own numbers), and at the
    datasheet HBM bandwidth x MEMORY_EFFICIENCY where nothing is measured; the source says which."""
    from topologies.specs import A100_40GB, A100_80GB, B200, H100_SXM, H200
    expected = {A100_80GB: (1.61 + 1.61 + 1.70 + 1.70) / 4, H100_SXM: (2.90 + 2.90 + 2.97 + 2.97) / 4,
                H200: (4.01 + 4.00 + 4.15 + 4.15) / 4}
    for acc, tb in expected.items():
        bw, source = stream_bandwidth(acc)
        assert bw == pytest.approx(tb * 1e12, rel=1e-12) and "BabelStream" in source
        assert 0.75 < bw / acc.hbm_bytes_per_s < 0.95       # a streaming kernel reaches most of the datasheet rate
        p = KernelPricer(acc)
        assert p.kernel_time_s(Kernel("e", ELEMENTWISE, bytes=1e9)) == pytest.approx(p.t0_s + 1e9 / bw)
        assert "BabelStream" in p.describe()["elementwise"]
    for acc in (A100_40GB, B200):
        bw, source = stream_bandwidth(acc)
        assert bw == pytest.approx(acc.hbm_bytes_per_s * MEMORY_EFFICIENCY) and "no streaming measurement" in source
    # an explicit fraction still wins (what-if)
    assert KernelPricer(H100_SXM, memory_efficiency=0.5).mem_per_s == pytest.approx(3.35e12 * 0.5)


def test_calibration_overrides_kernel_by_kernel(cluster):
    """A collector's GEMM fit prices GEMM kernels; attention and elementwise kernels keep their curves;
    a layer fit still prices the whole layer op (the closed loop's calibrated path)."""
    fit = ComputeFit("NVIDIA H100 80GB HBM3", 5e14, 1e9)          # torch's device name, not the spec's
    cal = Calibration(compute=[fit])
    m = ClusterCostModel(cluster, calibration=cal)
    g = Kernel("g", GEMM, 1e12, m=1, n=1, k=1)
    e = Kernel("e", ELEMENTWISE, bytes=1e9)
    assert m.kernels.kernel_time_s(g) == pytest.approx(1e12 / fit.achieved_flops_per_s(1e12))
    assert m.kernels.kernel_time_s(e) == ClusterCostModel(cluster).kernels.kernel_time_s(e)
    lf = LayerFit("H100-SXM", "forward", 4e14, 0.0)
    ml = ClusterCostModel(cluster, calibration=Calibration(compute=[fit], layers=[lf]), gpu_variation=0)
    op = Op("compute", "F L0", flops=4e11, layer=0, phase=FORWARD, kernels=KernelList("x", [g]))
    assert ml.compute_time_s(0, op) == pytest.approx(4e11 / 4e14) and not ml.prices_by_kernels(op)
    assert ml.pricing()["calibration_layer_fits"] == ["forward"]


def test_shipped_h100_defaults_reach_the_dgx_h100_preset(cluster):
    """traces/data/h100.json fits "NVIDIA H100 80GB HBM3"; the preset's device is "H100-SXM"."""
    cal = Calibration.load(ROOT / "traces" / "data" / "h100.json")
    m = ClusterCostModel(cluster, calibration=cal)
    assert m._compute_fit is not None and m.pricing()["calibration_compute_fit"] == "NVIDIA H100 80GB HBM3"


def test_reports_name_the_dominant_kernels(cluster):
    model = get_model("llama3-8b")
    plan = ParallelPlan(dp=2, tp=8, seq=8192, global_batch=4, sp=True)
    progs = build_programs(model, plan, 16, symmetric=True)
    cost = ClusterCostModel(cluster)
    shares = kernel_time_shares(progs, cost)
    assert shares[0]["kernel"].startswith(("mlp fc1", "flash attention", "lm head"))
    assert sum(s["share"] for s in shares) <= 1.0 + 1e-9
    bd = layer_breakdown(progs, cost)
    labels = {p["label"] for p in bd["phases"]}
    assert {"dense layer forward", "dense layer backward", "head forward"} <= labels
    fwd = next(p for p in bd["phases"] if p["label"] == "dense layer forward")
    assert fwd["ops"] == model.layers * plan.num_microbatches
    assert fwd["time_s"] == pytest.approx(sum(k["time_s"] for k in fwd["kernels"]))
    assert fwd["time_s"] == pytest.approx(cost.kernels.time_s(phase_kernels(model, plan, 0, FORWARD)))


def test_kernel_kind_shares_sum_to_one_and_attention_grows_with_the_sequence(cluster):
    """The split of one rank's kernel time by kind: shares of the three kinds summing to 1, equal to the kinds'
    kernel times summed over that rank's ops; attention's share grows with the sequence (its FLOPs per token
    grow with it, the GEMMs' do not)."""
    model = get_model("llama3-8b")
    cost = ClusterCostModel(cluster)
    shares = {}
    for seq in (2048, 8192, 32768):
        plan = ParallelPlan(dp=2, tp=8, seq=seq, global_batch=4, sp=True)
        progs = build_programs(model, plan, 16, symmetric=True)
        sh = kernel_kind_shares(progs, cost)
        assert set(sh) == {"gemm", "attention", "elementwise"} and sum(sh.values()) == pytest.approx(1.0)
        rank = next(iter(progs.ops))
        t = {}
        for op in progs.ops[rank]:
            if op.kind == "compute" and op.kernels is not None and cost.prices_by_kernels(op):
                for k in op.kernels.kernels:
                    t[k.kind] = t.get(k.kind, 0.0) + cost.kernels.kernel_time_s(k)
        assert sh["attention"] == pytest.approx(t["attention"] / sum(t.values()))
        shares[seq] = sh["attention"]
    assert shares[2048] < shares[8192] < shares[32768]
    # a calibration's layer fits price the layers: only the kernel-priced ops (embedding, head) are counted
    fitted = ClusterCostModel(cluster, calibration=Calibration(
        compute=[], layers=[LayerFit("H100-SXM", p, 4e14, 0.0) for p in ("forward", "backward")]))
    sh = kernel_kind_shares(progs, fitted)
    assert "attention" not in sh and sum(sh.values()) == pytest.approx(1.0)


def test_fp8_prices_faster_and_every_device_has_curves():
    model = get_model("llama3-70b")
    c = topologies.load_cluster("dgx-h100", 8)
    m = ClusterCostModel(c)
    t = {dt: m.kernels.time_s(phase_kernels(model, ParallelPlan(tp=8, seq=8192, dtype=dt), 0, FORWARD))
         for dt in ("bf16", "fp8")}
    assert 0.5 * t["bf16"] < t["fp8"] < 0.9 * t["bf16"]
    from topologies.kernel_cost import KernelPricer
    from topologies.specs import ACCELERATORS
    for acc in ACCELERATORS.values():
        p = KernelPricer(acc)
        assert p.time_s(phase_kernels(model, ParallelPlan(tp=8, seq=4096), 0, FORWARD)) > 0
        assert set(p.describe()) >= {"gemm_bf16", "attention", "elementwise"}
