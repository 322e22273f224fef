"""GEMM and attention curves: held-out microbenchmark points, the stored fit, closed forms, invariants."""
import json

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


@pytest.mark.parametrize("hw", ["H100 80GB SXM5", "A100 80GB SXM4"])
def test_attention_fit_predicts_a_held_out_sequence_length(hw):
    groups = {}
    for r in kc.read_rows(kc.ATTENTION_CSV):
        if r["hardware"] == hw and r["kernel"] == kc.ATTENTION_KERNEL:
            groups.setdefault((r["pass"], r["causal"], r["head_dim"]), []).append(
                (int(r["seq_len"]), float(r["tflops_per_s"])))
    assert groups
    for key, pts in groups.items():
        train = [p for p in pts if p[0] != 4096]
        test = [p for p in pts if p[0] == 4096]
        if not test or len(train) < 3:
            continue
        fit = kc.fit_rate_curve(*zip(*train))
        assert fit.at(4096) == pytest.approx(test[0][1], rel=0.06), key


def test_attention_backward_is_slower_per_flop_than_forward():
    c = kc.attention_curve("H100-SXM")
    f = Kernel("f", ATTENTION, 1e12, pass_="fwd", seq_q=8192, seq_kv=8192, head_dim=128, heads=8, causal=True)
    b = Kernel("b", ATTENTION, 2.5e12, pass_="bwd", seq_q=8192, seq_kv=8192, head_dim=128, heads=8, causal=True)
    assert c.time_s(b) / 2.5 > c.time_s(f)
    # forward at 8k, hd128, causal: the chart's 333 TFLOP/s within the fit's error
    assert 1e12 / c.time_s(f) == pytest.approx(333e12, rel=0.05)
    # devices without a chart scale Hopper's curve by their BF16 peak
    assert kc.attention_curve("B200").scale == pytest.approx(2250 / 989.4, rel=1e-3)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(kc.SWEEP_MAMF)), st.integers(64, 65536), st.integers(64, 65536),
       st.integers(64, 65536))
def test_no_shape_beats_the_published_best_shape(sweep, m, n, k):
    """MAMF is the best of a brute-force shape search on the device: the fitted curve stays below it."""
    fam, dtype = sweep
    device = {"hopper": "H100-SXM", "hopper-h200": "H200", "ampere": "A100-80GB"}[fam]
    c = kc.gemm_curve(device, dtype)
    best = kc.mamf_flops_per_s(*kc.SWEEP_MAMF[sweep])
    assert 2.0 * m * n * k / c.time_s(m, n, k) <= best * (1 + 1e-9)
