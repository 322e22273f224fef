"""GEMM and attention curves: held-out microbenchmark points, the stored fit, closed forms, invariants."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.kernels import ATTENTION, Kernel
from topologies import kernel_curves as kc
from topologies.specs import get_accelerator


def _hopper_sweep():
    rows = kc.read_rows(kc.GEMM_CSV)
    return kc._gemm_points(rows, "sm_90", ("BF16",))


def test_gemm_fit_predicts_held_out_points():
    """Fit on 3/4 of the XLA sm_90 BF16 table, predict the other quarter."""
    shapes, times = _hopper_sweep()
    idx = np.arange(len(times))
    test = idx % 4 == 1
    acc = get_accelerator("H100-SXM")
    params = kc.fit_gemm(shapes[~test], times[~test], acc.peak_bf16_flops, acc.sm_count, acc.hbm_bytes_per_s)
    curve = kc.GemmCurve(params, acc.peak_bf16_flops, acc.sm_count, acc.hbm_bytes_per_s)
    pred = np.array([curve.time_s(int(m), int(n), int(k), int(b)) for b, m, n, k in shapes[test]])
    err = np.abs(pred / times[test] - 1)
    assert np.median(err) < 0.08 and np.percentile(err, 90) < 0.25, (np.median(err), np.percentile(err, 90))
    assert 0.7 <= params.eta <= 0.9          # sustained fraction of the datasheet peak, not above it


@pytest.mark.parametrize("dtype, prefix, peak", [("bf16", "BF16", "peak_bf16_flops"), ("fp8", "FP8", "peak_fp8_flops")])
def test_blackwell_gemm_fit_predicts_held_out_points(dtype, prefix, peak):
    """Fit on 3/4 of OpenXLA's sm_100 table (BF16, FP8 with a BF16 output), predict the other quarter."""
    shapes, times = kc._gemm_points(kc.read_rows(kc.GEMM_CSV), "sm_100", (prefix,))
    assert len(times) == 375                   # b 1, 2, 4 x m, n, k in 256 ... 4096
    test = np.arange(len(times)) % 4 == 1
    acc = get_accelerator("B200")
    dbytes = 1.0 if dtype == "fp8" else 2.0
    params = kc.fit_gemm(shapes[~test], times[~test], getattr(acc, peak), acc.sm_count, acc.hbm_bytes_per_s, dbytes)
    assert params.k_half < max(kc.K_HALF_GRID)     # an interior optimum, not the grid's edge
    curve = kc.GemmCurve(params, getattr(acc, peak), acc.sm_count, acc.hbm_bytes_per_s, dbytes)
    pred = np.array([curve.time_s(int(m), int(n), int(k), int(b)) for b, m, n, k in shapes[test]])
    err = np.abs(pred / times[test] - 1)
    assert np.median(err) < 0.08 and np.percentile(err, 90) < 0.25, (np.median(err), np.percentile(err, 90))


def test_sm100_rows_are_integer_nanosecond_timings():
    """OpenXLA's table stores 2·b·m·n·k / t with t a whole number of nanoseconds: every copied value must be one
    (a mistyped digit in the copy would break it)."""
    rows = [r for r in kc.read_rows(kc.GEMM_CSV) if r["hardware"].startswith("sm_100")]
    assert len(rows) == 750
    for r in rows:
        work = 2 * int(r["batch"]) * int(r["m"]) * int(r["n"]) * int(r["k"])
        ns = round(work * 1e9 / int(r["flops_per_s"]))
        assert work * 10**9 // ns == int(r["flops_per_s"]) or abs(work * 10**9 / ns - int(r["flops_per_s"])) < 1.5


def test_blackwell_devices_take_the_sm100_shape_parameters():
    """B200 and GB200 price GEMM shapes with the sm_100 sweep's per-tile cost, launch time and small-K bandwidth,
    and their own best-shape (MAMF) point's eta (GB200's FP8 has a sweep of its own, Azure's); Hopper keeps its
    own."""
    for dtype in ("bf16", "fp8"):
        bw = kc.gemm_params("blackwell", dtype)
        for dev in ("B200", "GB200"):
            if (dev, dtype) == ("GB200", "fp8"):
                assert kc.gemm_curve(dev, dtype).params.source.startswith("fit to 9 points of gemm.csv (GB200 185GB")
                continue
            p = kc.gemm_curve(dev, dtype).params
            assert (p.k_half, p.t0_s, p.beta) == (bw.k_half, bw.t0_s, bw.beta)
            assert "sm_100" in p.source and "MAMF" in p.source
        assert kc.gemm_curve("H100-SXM", dtype).params.k_half == kc.gemm_params("hopper", dtype).k_half


def test_gemm_bytes_count_a_bf16_output():
    """Inputs at their own width, the output C in BF16 (FP8 GEMMs write BF16)."""
    assert kc.gemm_bytes(2, 3, 5, 7, 1.0) == 2 * (1.0 * (3 * 7 + 7 * 5) + 2.0 * 3 * 5)
    assert kc.gemm_bytes(2, 3, 5, 7, 2.0) == 2 * 2.0 * (3 * 7 + 7 * 5 + 3 * 5)


def test_stored_gemm_fits_match_the_data(tmp_path):
    """topologies/microbench/gemm_fits.json is what `python -m topologies.kernel_curves` computes."""
    fresh = kc.write_fits(tmp_path / "fits.json")
    assert fresh == json.loads(kc.FITS_JSON.read_text()), "refit: python -m topologies.kernel_curves"


def test_gemm_closed_form_on_full_waves():
    """12 x 11 = 132 tiles of 128x256 fill one wave of an H100: time = t0 + 2mnk(1 + k_half/k)/(eta·peak)."""
    c = kc.gemm_curve("H100-SXM", "bf16")
    m, n, k = 128 * 12, 256 * 11, 8192
    p = c.params
    expect = p.t0_s + 2 * m * n * k * (1 + p.k_half / k) / (p.eta * c.peak_flops_per_s)
    assert c.time_s(m, n, k) == pytest.approx(expect, rel=1e-12)
    # one more row of tiles spills into a partial wave: wave quantisation costs more than the extra row
    extra = c.time_s(m + 1, n, k) - expect
    assert extra > 0.1 * (expect - p.t0_s)      # the extra row is 0.07 % of the work


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(["H100-SXM", "A100-80GB", "B200", "H100-PCIe"]), st.sampled_from(["bf16", "fp8"]),
       st.integers(1, 40000), st.integers(1, 40000), st.integers(1, 40000), st.integers(1, 8))
def test_gemm_never_beats_its_sustained_peak(dev, dtype, m, n, k, b):
    c = kc.gemm_curve(dev, dtype)
    t = c.time_s(m, n, k, b)
    assert t > 0 and 2.0 * b * m * n * k / t <= c.params.eta * c.peak_flops_per_s * (1 + 1e-9)


def test_fp8_gemms_are_faster_where_the_device_has_fp8():
    big = (8192, 8192, 8192)
    assert kc.gemm_curve("H100-SXM", "fp8").time_s(*big) < 0.7 * kc.gemm_curve("H100-SXM", "bf16").time_s(*big)
    # A100 has no FP8 tensor path: an FP8 recipe runs its GEMMs in BF16
    assert kc.gemm_curve("A100-80GB", "fp8").time_s(*big) == kc.gemm_curve("A100-80GB", "bf16").time_s(*big)


def _attention_series() -> dict:
    groups: dict = {}
    for r in kc.read_rows(kc.ATTENTION_CSV):
        groups.setdefault((r["hardware"], r["kernel"], r["pass"], r["causal"], r["head_dim"]), []).append(
            (int(r["seq_len"]), float(r["tflops_per_s"])))
    return {k: sorted(v) for k, v in groups.items() if len(v) >= 4}


def test_attention_curve_predicts_held_out_sequence_lengths():
    """Leave one measured length out of every chart series: interior points from their neighbours within 9 %,
    the longest length (extrapolated through the two below it) within 4 %."""
    series = _attention_series()
    assert len(series) >= 20
    interior, longest = [], []
    for key, pts in series.items():
        for i in range(1, len(pts)):
            train = pts[:i] + pts[i + 1:]
            seq, rate = pts[i]
            err = abs(kc.seq_curve(*zip(*train)).at(seq) / rate - 1)
            (interior if i < len(pts) - 1 else longest).append((err, key, seq))
    assert max(interior)[0] < 0.09, max(interior)
    assert max(longest)[0] < 0.04, max(longest)
    assert sorted(e for e, *_ in interior)[len(interior) // 2] < 0.03


def test_attention_curve_passes_through_its_points_and_saturates():
    for pts in _attention_series().values():
        c = kc.seq_curve(*zip(*pts))
        for seq, rate in pts:
            assert c.at(seq) == pytest.approx(rate, rel=1e-12)
        top = c.at(pts[-1][0])
        # beyond the chart: never below the last measured point, bounded growth (1/rate = a + b/s)
        assert top <= c.at(4 * pts[-1][0]) <= 1.5 * top
        assert c.at(pts[0][0] / 4) <= c.at(pts[0][0]) * (1 + 1e-12) or pts[1][1] <= pts[0][1]
    # the closed form beyond the ends: through (8k, 80) and (16k, 83), 1/rate = a + b/s
    c = kc.seq_curve([4096, 8192, 16384], [76.0, 80.0, 83.0])
    b = (1 / 80 - 1 / 83) / (1 / 8192 - 1 / 16384)
    a = 1 / 83 - b / 16384
    assert c.at(65536) == pytest.approx(1 / (a + b / 65536), rel=1e-12)
    assert c.at(6000) == pytest.approx(76 + 4 * math.log(6000 / 4096) / math.log(2), rel=1e-12)


def test_attention_backward_is_slower_per_flop_than_forward():
    c = kc.attention_curve("H100-SXM")
    f = Kernel("f", ATTENTION, 1e12, pass_="fwd", seq_q=8192, seq_kv=8192, head_dim=128, heads=8, causal=True)
    b = Kernel("b", ATTENTION, 2.5e12, pass_="bwd", seq_q=8192, seq_kv=8192, head_dim=128, heads=8, causal=True)
    assert c.time_s(b) / 2.5 > c.time_s(f)
    # forward at 8k, hd128, causal: the chart's 333 TFLOP/s within the fit's error
    assert 1e12 / c.time_s(f) == pytest.approx(333e12, rel=0.05)
    # devices without a chart scale Hopper's curve by their BF16 peak
    assert kc.attention_curve("B200").scale == pytest.approx(2250 / 989.4, rel=1e-3)


def test_flash_attention_2_on_blackwell_runs_at_its_measured_ratio_to_hopper():
    """flash-attn 2's Ampere-style kernels do not gain Blackwell's tensor-core peak ratio: Azure's runs of the same
    benchmark script at one stated configuration measure GB200 at 373.9 and H100 at 327.9 TFLOP/s (x1.14, not the
    x2.5 of the BF16 peaks); B200 / B300 / GB300 take GB200's ratio (transferred) and say so. Fused kernels
    (Transformer Engine's cuDNN) keep the peak ratio; Hopper and Ampere devices, whose charts price them, have none."""
    rows = kc._azure_fa2()
    assert rows["GB200"][1] == 373.9 and rows["H100-SXM"][1] == 327.9 and rows["GB200"][0] == rows["H100-SXM"][0]
    # the chart devices agree with Azure's run where both say the same configuration: H200 and H100 (one die)
    assert rows["H200"][1] / rows["H100-SXM"][1] == pytest.approx(
        1 / kc.attention_curve("H200").scale, rel=0.01)
    h100 = kc.attention_curve("H100-SXM")
    kern = Kernel("a", ATTENTION, 2.0 * 8192 * 8192 * 16 * 2 * 128, pass_="fwd", seq_q=8192, seq_kv=8192,
                  head_dim=128, heads=16, causal=False, impl="flash2")
    for device, basis in (("GB200", "GB200 / H100"), ("B200", "transferred from GB200"),
                          ("GB300", "transferred"), ("B300", "transferred")):
        c = kc.attention_curve(device)
        assert c.fa2_scale == pytest.approx(373.9 / 327.9, rel=1e-3) and basis in c.fa2_basis
        assert c.time_s(kern) == pytest.approx(h100.time_s(kern) / c.fa2_scale, rel=1e-12)
        te = Kernel("a", ATTENTION, kern.flops, pass_="fwd", seq_q=8192, seq_kv=8192, head_dim=128, heads=16,
                    causal=False, impl="te")
        assert c.time_s(te) == pytest.approx(h100.time_s(te) / c.scale, rel=1e-12)     # cuDNN: peak ratio
        assert "FlashAttention-2 x1.140" in c.source
    for device in ("H100-SXM", "H200", "A100-80GB", "A100-40GB"):
        assert kc.attention_curve(device).fa2_scale == 0.0 and kc.fa2_device_ratio(device) is None


@pytest.mark.parametrize("impl", ["flash2", "triton"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_a_head_dim_between_compiled_ones_costs_the_padded_kernel(impl, pass_):
    """MPT-30B's head dim 112 runs the 128-wide kernel (FA2 rounds to 32s, llm-foundry's Triton kernel to a
    power of two): the same time as head dim 128 on the same tokens and heads, not an interpolation."""
    c = kc.attention_curve("H100-SXM")

    def kern(d):
        fwd = 2.0 * 4096 * 4096 * 8 * 2 * d * 0.5
        return Kernel("a", ATTENTION, fwd if pass_ == "fwd" else 2.5 * fwd, pass_=pass_, seq_q=4096,
                      seq_kv=4096, head_dim=d, heads=8, causal=True, impl=impl)
    assert c.time_s(kern(112)) == pytest.approx(c.time_s(kern(128)), rel=1e-12)
    assert kc.kernel_head_dim(112, impl) == 128 and kc.kernel_head_dim(128, impl) == 128
    assert kc.kernel_head_dim(80, "flash2") == 96 and kc.kernel_head_dim(80, "triton") == 128
    assert kc.kernel_head_dim(200, "flash2") == 256 and kc.kernel_head_dim(8, "triton") == 16
    # a compiled width is priced from its own curve, as before: d 64 is faster per call than padded 112
    assert c.time_s(kern(64)) < c.time_s(kern(112))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(kc.SWEEP_MAMF) + sorted(kc.MAMF_POINTS)), st.integers(64, 65536),
       st.integers(64, 65536), st.integers(64, 65536))
def test_no_shape_beats_the_published_best_shape(sweep, m, n, k):
    """MAMF is the best of a brute-force shape search on the device: the fitted curve stays below it, for the
    devices with a sweep and for those with the one best-shape point (B200, GB200)."""
    fam, dtype = sweep
    device = {"hopper": "H100-SXM", "hopper-h200": "H200", "ampere": "A100-80GB", "gb200": "GB200"}.get(fam, fam)
    c = kc.gemm_curve(device, dtype)
    best = kc.mamf_flops_per_s(*(kc.SWEEP_MAMF.get(sweep) or kc.MAMF_POINTS[sweep]))
    assert 2.0 * m * n * k / c.time_s(m, n, k) <= best * (1 + 1e-9)


@pytest.mark.parametrize("device,dtype", sorted(kc.MAMF_POINTS))
def test_best_shape_point_devices_price_their_point_near_it(device, dtype):
    """The capped curve prices the measured best shape itself never above it and at most 20% below it (the
    Hopper sweep's own fit prices H100's best shape 7% under; GB200's BF16 best shape, 4096 x 9728 x 2048, is
    priced 16% under: the sm_100 sweep's per-tile cost at K = 2048 and 8.2 waves of 128 x 256 tiles on 148 SMs)."""
    hw, pre = kc.MAMF_POINTS[(device, dtype)]
    shapes, times = kc._gemm_points(kc.read_rows(kc.GEMM_CSV), hw, (pre,))
    b, m, n, k = map(int, shapes[0])
    rate = 2.0 * b * m * n * k / kc.gemm_curve(device, dtype).time_s(m, n, k, b)
    sustained = kc.sustained_rate(device, dtype)
    factor = sustained.factor if sustained is not None else 1.0
    assert 0.80 < rate / (kc.mamf_flops_per_s(hw, pre) * factor) <= 1.0 + 1e-9


@pytest.mark.parametrize("device,dtype,msmf,mamf", [
    ("H100-SXM", "bf16", 755, 850), ("H100-SXM", "fp8", 1354, 1525), ("H200", "bf16", 755, 850),
    ("H200", "fp8", 1354, 1525), ("B200", "bf16", 1439, 1737), ("B200", "fp8", 2788, 3350)])
def test_sustained_rate_is_the_published_msmf_over_mamf(device, dtype, msmf, mamf):
    """ml-engineering's table (8-GPU node under load): the sustained factor is MSMF / MAMF of one run, and the
    device's curve is its burst curve slowed by it (or held at MSMF where that is lower)."""
    s = kc.sustained_rate(device, dtype)
    assert s.factor == pytest.approx(msmf / mamf, rel=1e-12)
    fam = {"H100-SXM": "hopper", "H200": "hopper-h200" if dtype == "fp8" else "hopper"}.get(device)
    c = kc.gemm_curve(device, dtype)
    if (fam, dtype) in kc.STEADY_STATE_SWEEPS:
        # Azure's FP8 sweeps ran each shape at the power limit: no factor, MSMF still caps
        want = min(kc.gemm_params(fam, dtype).eta, msmf * 1e12 / c.peak_flops_per_s)
        assert c.params.eta == pytest.approx(want, rel=1e-12)
        assert f"capped at MSMF {msmf} TFLOP/s" in c.params.source and "x 0." not in c.params.source
        return
    if fam is not None:
        want = min(kc.gemm_params(fam, dtype).eta * msmf / mamf, msmf * 1e12 / c.peak_flops_per_s)
        assert c.params.eta == pytest.approx(want, rel=1e-12)
    assert "sustained at the power limit" in c.params.source and f"{msmf} / {mamf}" in c.params.source


@pytest.mark.parametrize("device,dtype,hardware,prefix", [
    ("H100-SXM", "fp8", "H100 80GB HBM3", "FP8"), ("H200", "fp8", "H200 141GB", "FP8"),
    ("A100-80GB", "bf16", "A100-SXM4-80GB", "FP16"), ("GB200", "fp8", "GB200 185GB", "FP8"),
    ("GB300", "fp8", "GB300 288GB", "FP8")])
def test_a_sweep_timed_at_the_power_limit_is_priced_as_measured(device, dtype, hardware, prefix):
    """Azure's sweeps (10,000 warm-up iterations per shape) are sustained timings: the device's curve prices
    their shapes of 4096^3 and up within 5% of the measurement (a burst-to-sustained factor on top priced
    H100's FP8 ones 7-11% under it), and the burst best-shape point is not one of the fitted points."""
    shapes, times = kc._gemm_points(kc.read_rows(kc.GEMM_CSV), hardware, (prefix,))
    c = kc.gemm_curve(device, dtype)
    big = [(s, t) for s, t in zip(shapes, times) if min(s[1:]) >= 4096]
    assert len(big) >= 3
    for (b, m, n, k), t in big:
        assert c.time_s(int(m), int(n), int(k), int(b)) == pytest.approx(t, rel=0.05), (m, n, k)
    fam = kc._sweep_family(get_accelerator(device), dtype)
    assert kc.GEMM_SWEEPS[(fam, dtype)][0] == (hardware,)
    assert kc.gemm_params(fam, dtype).source.startswith(f"fit to {len(times)} points")


def test_gb200_bf16_takes_the_sustained_over_burst_ratio_of_its_fp8_sweep():
    """GB200 has a steady-state sweep in FP8 only (Azure's ND GB200 v6): its best measured rate over GB200's
    FP8 best burst (MAMF) slows the BF16 burst curve, as MSMF / MAMF does on H200 and B200 (whose two dtypes
    agree to 0.5%); the FP8 curve is the sweep itself, with no factor."""
    s = kc.sustained_rate("GB200", "bf16")
    assert s.factor == pytest.approx(2906.9 / 3615.6, rel=1e-12) and s.label == "sustained x0.804 (FP8 sweep / MAMF)"
    assert kc.sustained_rate("GB200", "fp8") is None
    c = kc.gemm_curve("GB200", "bf16")       # Blackwell's shape parameters, GB200's MAMF eta slowed by the factor
    assert c.params.k_half == kc.gemm_params("blackwell", "bf16").k_half
    assert "x 0.804 sustained at the power limit" in c.params.source
    # B200 (MSMF / MAMF at 1,000 W) sustains less than GB200 (1,200 W) in both dtypes; GB200's FP8 sits well
    # under its burst best
    for dtype in ("bf16", "fp8"):
        g, b = kc.gemm_curve("GB200", dtype), kc.gemm_curve("B200", dtype)
        assert b.time_s(8192, 8192, 8192) > g.time_s(8192, 8192, 8192)
    assert 2.0 * 16384 ** 3 / kc.gemm_curve("GB200", "fp8").time_s(16384, 16384, 16384) < 3615.6e12 * 0.85


@pytest.mark.parametrize("device", ["GB300", "H100-PCIe"])
def test_devices_without_a_sustained_measurement_keep_the_burst_rate_and_say_so(device):
    assert kc.sustained_rate(device, "bf16") is None
    c = kc.gemm_curve(device, "bf16")
    assert "burst rate (no sustained measurement" in c.params.source


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(kc.SUSTAINED_SOURCES)), st.sampled_from(["bf16", "fp8"]), st.integers(64, 65536),
       st.integers(64, 65536), st.integers(64, 65536))
def test_no_shape_beats_the_published_sustained_best(device, dtype, m, n, k):
    """MSMF is the best rate any searched shape held at the power limit: no priced shape runs faster."""
    c = kc.gemm_curve(device, dtype)
    assert 2.0 * m * n * k / c.time_s(m, n, k) <= kc.sustained_rate(device, dtype).msmf_flops_per_s * (1 + 1e-9)


def test_cudnn_backward_speedup_is_the_charted_ratio():
    """At the charted points the speed-up is the backward chart's cuDNN / FlashAttention-2 ratio; log-linear in
    the head dim between 64 and 128, clamped outside; none on a family without the chart."""
    assert kc.cudnn_backward_speedup("hopper", 2048, 64) == pytest.approx(395 / 264)
    assert kc.cudnn_backward_speedup("hopper", 512, 128) == pytest.approx(305 / 214)
    lo, hi = kc.cudnn_backward_speedup("hopper", 4096, 64), kc.cudnn_backward_speedup("hopper", 4096, 128)
    assert lo < kc.cudnn_backward_speedup("hopper", 4096, 96) < hi
    assert kc.cudnn_backward_speedup("hopper", 4096, 192) == hi
    assert kc.cudnn_backward_speedup("ampere", 4096, 128) == 1.0


def test_transformer_engine_attention_runs_cudnn_forward_on_hopper():
    """Megatron-Core's attention is Transformer Engine's: cuDNN fused attention on Hopper (TE prefers it over
    FlashAttention there), FlashAttention-2 on Ampere. Its forward takes cuDNN's charted rate (H100, hd 128,
    causal, 8k: 529 TFLOP/s); its backward FlashAttention-2's sped up by the ratio of the two backward rates
    charted without a causal mask (hd 128, 8k: 518 / 318 TFLOP/s). Blackwell scales Hopper's."""
    def kern(pass_, impl, d=128):
        fwd = 2.0 * 8192 * 8192 * 8 * 2 * d * 0.5
        return Kernel("a", ATTENTION, fwd if pass_ == "fwd" else 2.5 * fwd, pass_=pass_, seq_q=8192, seq_kv=8192,
                      head_dim=d, heads=8, causal=True, impl=impl)
    h100, a100, b200 = (kc.attention_curve(d) for d in ("H100-SXM", "A100-80GB", "B200"))
    f = kern("fwd", "te")
    assert f.flops / h100.time_s(f) == pytest.approx(529e12, rel=0.02)
    assert h100.time_s(f) < h100.time_s(kern("fwd", "flash2")) / 1.5
    assert h100.time_s(kern("bwd", "te")) == pytest.approx(h100.time_s(kern("bwd", "flash2")) * 318 / 518, rel=1e-9)
    assert b200.time_s(kern("bwd", "te")) == pytest.approx(h100.time_s(kern("bwd", "te")) / b200.scale, rel=1e-12)
    for pass_ in ("fwd", "bwd"):
        assert a100.time_s(kern(pass_, "te")) == a100.time_s(kern(pass_, "flash2"))
    assert b200.time_s(f) == pytest.approx(h100.time_s(f) / b200.scale, rel=1e-12)
    # cuDNN takes any head dim: 96 between the charted 64 and 128, not padded to a compiled width
    assert h100.time_s(kern("fwd", "te", 96)) < h100.time_s(kern("fwd", "te", 128))
    from schedules.kernels import phase_kernels
    from schedules.models import get_model
    from schedules.plan import ParallelPlan
    ks = phase_kernels(get_model("llama3-8b"), ParallelPlan(seq=8192, stack="megatron"), 0, "forward")
    assert {k.impl for k in ks if k.kind == ATTENTION} == {"te"}


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(["bf16", "fp8"]), st.integers(64, 32768), st.integers(64, 32768), st.integers(64, 32768))
def test_a_lower_power_limit_never_sustains_more(dtype, m, n, k):
    """The 500 W H100 (same board as the 700 W H100 SXM) is priced no faster than the 700 W part's sustained
    rate, which bounds it; its curve says the bound is an upper one."""
    low, high = kc.gemm_curve("H100-HBM2e", dtype), kc.gemm_curve("H100-SXM", dtype)
    assert low.time_s(m, n, k) >= high.time_s(m, n, k) * (1 - 1e-12)
    assert "upper bound" in low.params.source


def test_gemm_rate_labels_name_the_basis():
    assert kc.gemm_rate_label("H100-SXM", "bf16") == "sustained x0.888 (MSMF / MAMF)"
    assert kc.gemm_rate_label("B200", "fp8") == "sustained x0.832 (MSMF / MAMF)"
    assert kc.gemm_rate_label("H100-HBM2e", "bf16") == "sustained x0.888 (MSMF / MAMF, upper bound)"
    assert kc.gemm_rate_label("GB300", "bf16").startswith("burst")
    assert kc.gemm_rate_label("GB300", "fp8") == "sustained (sweep at the power limit)"
    assert kc.gemm_rate_label("GB200", "fp8") == "sustained (sweep at the power limit)"
    assert kc.gemm_rate_label("A100-80GB", "fp8") == kc.gemm_rate_label("A100-80GB", "bf16")
    assert kc.gemm_rate_label("A100-80GB", "bf16") == "sustained (sweep at the power limit)"
    assert kc.gemm_rate_label("H100-SXM", "fp8") == "sustained (sweep at the power limit, MSMF cap)"
    assert kc.gemm_rate_label("H100-HBM2e", "fp8") == "sustained (sweep at the power limit, MSMF cap, upper bound)"
    # the 350 W PCIe card takes the 700 W SXM's FP8 sweep as a bound, and says so in its curve's source
    assert kc.gemm_rate_label("H100-PCIe", "fp8") == "sustained (sweep at the power limit, upper bound)"
    assert "upper bound" in kc.gemm_curve("H100-PCIe", "fp8").params.source
