"""Calibration: closed-form recovery of known parameters, transfer times from hand-made traces, benchmark
manifests, the shipped H100/H200 defaults, and the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.calibration import Calibration, CollectiveFit, ComputeFit, bus_factor
from clustersim.cli import main as cli_main
from simulator.errors import TraceError
from traces.calibrate import calibrate, fit_collective, fit_compute, fit_linear_relative, plot, transfer_times
from traces.data import defaults
from traces.parse import load_trace
from tests.traces import kineto_fixtures as fx

DATA = Path(__file__).parent / "data"


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-13, 1e-6), st.floats(0, 1e-3), st.lists(st.floats(1, 1e9), min_size=2, max_size=8, unique=True))
def test_linear_fit_is_exact_on_exact_data(a, b, xs):
    xs = np.array(xs)
    if np.ptp(xs) < 1e-6 * xs.max():
        return
    t = a * xs + b
    fa, fb = fit_linear_relative(xs, t)
    # exact up to floating point: the intercept only as well as it shows next to the largest time
    assert fa == pytest.approx(a, rel=1e-6) and fb == pytest.approx(b, rel=1e-6, abs=1e-9 * t.max())


def test_compute_fit_recovers_peak_and_half_saturation():
    true = ComputeFit("X", peak_flops_per_s=5e14, half_saturation_flops=2e9)
    flops = np.repeat(np.logspace(7, 12, 11), 5)
    noise = np.tile([1.3, 1.0, 0.97, 1.0, 1.0], 11)        # per size: median 1, outliers either side
    t = flops / np.array([true.achieved_flops_per_s(f) for f in flops]) * noise
    fit = fit_compute("X", flops, t)
    assert fit.peak_flops_per_s == pytest.approx(5e14, rel=1e-9)
    assert fit.half_saturation_flops == pytest.approx(2e9, rel=1e-9)
    assert len(fit.points) == 11


@pytest.mark.parametrize("kind,n", [("all_reduce", 8), ("all_gather", 4), ("broadcast", 2), ("all_to_all", 16)])
def test_collective_fit_recovers_alpha_beta(kind, n):
    true = CollectiveFit(kind, n, "intra", alpha_s=2e-5, busbw_bytes_per_s=3e11)
    sizes = np.logspace(3, 9, 13)
    fit = fit_collective(kind, n, "intra", "nccl", sizes, [true.time_s(s) for s in sizes])
    assert fit.alpha_s == pytest.approx(2e-5, rel=1e-9)
    assert fit.busbw_bytes_per_s == pytest.approx(3e11, rel=1e-9)


def test_transfer_time_is_min_end_minus_max_start(tmp_path):
    """Rank 1 reaches each all_reduce 3 us later; both kernels end together: min(end) - max(start) = 117 us."""
    for r in range(2):
        fx.write(fx.nccl_rank(r, skew_us=3.0 * r), tmp_path / "job" / f"rank{r}.json")
    t = transfer_times(load_trace(tmp_path / "job"))
    assert len(t) == 2 and t["complete"].all()
    assert np.allclose(t["transfer_s"], (fx.NCCL_KERNEL_US - 3.0) * 1e-6)
    cal = calibrate(tmp_path / "job")
    (ar,) = [c for c in cal.collectives if c.kind == "all_reduce"]
    size = 4 * fx.ALLREDUCE_NELEMS
    assert ar.group_size == 2 and ar.scope == "intra" and ar.backend == "nccl" and ar.alpha_s == 0.0
    assert ar.busbw_bytes_per_s == pytest.approx(size * bus_factor("all_reduce", 2) / 117e-6)
    # GEMMs: one kernel each, 50 us for 524288 FLOPs (forward) and 40 us (backward), same size
    (cf,) = cal.compute
    assert cf.device == "NVIDIA H100 80GB HBM3" and len(cf.points) == 1
    assert cf.points[0][1] == pytest.approx(524288 / 45e-6)        # median of 50 and 40 us
    assert cal.source["inputs"][0]["kind"] == "trace"


def test_single_rank_trace_uses_its_own_durations(tmp_path):
    p = fx.write(fx.nccl_rank(0), tmp_path / "rank0.json")
    t = transfer_times(load_trace(p))
    assert not t["complete"].any() and np.allclose(t["transfer_s"], fx.NCCL_KERNEL_US * 1e-6)


def test_complete_collectives_fit_their_mean_partial_ones_their_median(tmp_path, monkeypatch):
    """Per size, a step pays the mean transfer time (slow calls included): complete collectives count with
    the mean. A member's own duration (peers absent) includes waiting for them: one median per size."""
    import pandas as pd
    from traces import calibrate as cal_mod
    p = fx.write(fx.nccl_rank(0), tmp_path / "rank0.json")
    times = [1e-3, 1e-3, 10e-3]
    rows = ([{"complete": True, "size_bytes": 1e6, "transfer_s": t} for t in times]
            + [{"complete": False, "size_bytes": 4e6, "transfer_s": t} for t in times])
    fake = pd.DataFrame([{"kind": "all_reduce", "impl": "all_reduce", "backend": "nccl", "group_size": 2, **r}
                         for r in rows])
    monkeypatch.setattr(cal_mod, "transfer_times", lambda trace: fake)
    (ar,) = [c for c in calibrate(p).collectives if c.kind == "all_reduce"]
    assert dict((s, t) for s, t in ar.points) == pytest.approx({1e6: 4e-3, 4e6: 1e-3})


def _bench_manifest(path: Path, kinds=("all_reduce", "all_gather", "p2p"), devices=("CPU", "CPU")) -> Path:
    rows = []
    for kind in kinds:
        n = 2
        f = CollectiveFit(kind if kind != "p2p" else "p2p", n, "intra", alpha_s=1e-4, busbw_bytes_per_s=2e9)
        for s in [2 ** k for k in range(10, 21)]:
            t = f.time_s(s)
            rows.append({"kind": kind, "size_bytes": s, "group_size": n, "time_s": t, "algbw_GBps": s / t / 1e9,
                         "busbw_GBps": s / t * bus_factor(kind, n) / 1e9})
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({
        "format": "clustersim-trace-manifest", "version": 1, "mode": "bench", "backend": "gloo",
        "world_size": 2, "scope": "intra", "devices": list(devices), "results": rows}))
    return path


def test_collectives_of_different_devices_are_not_fitted_together(tmp_path):
    """Two benchmarks of one collective on different devices would make one fit of two interconnects: a clear
    error naming both, unless allow_mixed; two runs on the same device fit together."""
    a = _bench_manifest(tmp_path / "a", kinds=("all_reduce",), devices=("NVIDIA A100-SXM4-80GB",) * 2)
    b = _bench_manifest(tmp_path / "b", kinds=("all_reduce",), devices=("Tesla V100-SXM2-32GB",) * 2)
    with pytest.raises(TraceError, match="different devices.*A100.*V100.*--allow-mixed"):
        calibrate([a, b])
    mixed = calibrate([a, b], allow_mixed=True)
    assert len(mixed.collectives) == 1 and len(mixed.collectives[0].points) == 11
    same = calibrate([a, _bench_manifest(tmp_path / "c", kinds=("all_reduce",), devices=("NVIDIA A100-SXM4-80GB",) * 2)])
    assert len(same.collectives) == 1
    # different devices on different collectives are fine (nothing is mixed)
    other = calibrate([a, _bench_manifest(tmp_path / "d", kinds=("all_gather",), devices=("Tesla V100-SXM2-32GB",) * 2)])
    assert {c.kind for c in other.collectives} == {"all_reduce", "all_gather"}


def test_benchmark_manifest(tmp_path):
    cal = calibrate([_bench_manifest(tmp_path / "bench")])
    assert {c.kind for c in cal.collectives} == {"all_reduce", "all_gather", "p2p"}
    for c in cal.collectives:
        assert c.backend == "gloo" and c.group_size == 2 and len(c.points) == 11
        assert c.alpha_s == pytest.approx(1e-4, rel=1e-9) and c.busbw_bytes_per_s == pytest.approx(2e9, rel=1e-9)
    # the manifest file itself works too, and the result round-trips through JSON
    cal2 = calibrate(tmp_path / "bench" / "manifest.json")
    cal2.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json")
    assert len(back.collectives) == 3 and back.collective_fit("p2p", 2, "intra").alpha_s == pytest.approx(1e-4)


def test_committed_gloo_samples_calibrate():
    """The torch 2.13 gloo samples: CPU GEMMs and gloo all_reduce / all_gather points."""
    cal = calibrate([DATA / "torch213_gloo_ddp", DATA / "torch213_gloo_fsdp"])
    (cf,) = cal.compute
    assert cf.device == "cpu" and 1e8 < cf.peak_flops_per_s < 1e13
    kinds = {c.kind for c in cal.collectives}
    assert {"all_reduce", "all_gather"} <= kinds           # FSDP's reduce_scatter is filed as gloo all_reduce
    assert all(c.backend == "gloo" and c.group_size == 2 for c in cal.collectives)


def test_nothing_to_calibrate(tmp_path):
    fx.write(fx.nccl_rank(0, with_args=False), tmp_path / "x" / "rank0.json")
    with pytest.raises(TraceError, match="nothing to calibrate"):
        calibrate(tmp_path / "x")
    with pytest.raises(TraceError, match="does not exist"):
        calibrate(tmp_path / "missing")


def test_defaults_are_generated_and_load():
    for gpu in ("h100", "h200"):
        committed = json.loads(defaults.path_of(gpu).read_text())
        assert committed == defaults.default_calibration(gpu).to_dict(), "regenerate: python -m traces.data.defaults"
        cal = Calibration.load(defaults.path_of(gpu))
        assert "first principles" in cal.source["kind"]
        fit = cal.compute_fit(gpu.upper())
        assert fit is not None and fit.peak_flops_per_s == pytest.approx(989.4e12, rel=1e-3)
        # 1 GiB all_reduce on 8 GPUs of a node: 2*7/8 * 2^30 / 450e9 plus 19 us
        ar = cal.collective_fit("all_reduce", 8, "intra", "nccl")
        assert ar.time_s(2 ** 30) == pytest.approx(19e-6 + 1.75 * 2 ** 30 / 450e9)
        assert cal.collective_fit("all_gather", 64, "inter").busbw_bytes_per_s == 50e9


def test_plot(tmp_path):
    cal = calibrate([_bench_manifest(tmp_path / "b")])
    cal.compute.append(ComputeFit("X", 1e12, 1e8, points=[[1e8, 5e11], [1e10, 9e11]]))
    p = plot(cal, tmp_path / "fits.png")
    assert p.stat().st_size > 10_000


def test_cli(tmp_path):
    b = _bench_manifest(tmp_path / "bench")
    out, png = tmp_path / "calib.json", tmp_path / "calib.png"
    r = CliRunner().invoke(__import__("clustersim.calibrate", fromlist=["calibrate"]).calibrate,
                           [str(b), "-o", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert "all_reduce" in r.output and out.exists() and png.exists()
    assert Calibration.load(out).collective_fit("all_gather", 2, "intra") is not None
    assert cli_main(["calibrate", str(tmp_path / "nope"), "-o", str(out)]) == 2
    for bad in (["-o", str(tmp_path / "c.yaml")], ["-o", str(tmp_path / "missing" / "c.json")],
                ["-o", str(out), "--plot", str(tmp_path / "fit.yaml")],
                ["-o", str(out), "--plot", str(tmp_path / "missing" / "fit.png")]):
        assert cli_main(["calibrate", str(b)] + bad) == 2, bad


def _layers_manifest(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps({
        "format": "clustersim-trace-manifest", "mode": "bench", "bench": "layers", "backend": "gloo",
        "devices": ["CPU Test", "CPU Test"], "world_size": 2, "results": rows}))
    return folder


def test_layer_benchmark_calibrates_and_plots(tmp_path, capsys):
    rows = [{"hidden": 64, "heads": 2, "ffn": 176, "seq": 32, "batch": b, "tp": t,
             "forward_s": 1e-3 * b / t + 2e-4, "backward_s": 2e-3 * b / t + 3e-4} for t in (1, 2) for b in (1, 4)]
    d = _layers_manifest(tmp_path / "layers", rows)
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    assert cli_main(["calibrate", str(d), "-o", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "layer    CPU Test forward" in printed and "layer    CPU Test backward" in printed
    cal = Calibration.load(out)
    assert {f.phase for f in cal.layers} == {"forward", "backward"} and png.stat().st_size > 10_000
    assert cal.source["inputs"][0]["kind"] == "layer benchmark"


@pytest.mark.parametrize("rows", [[], [{"hidden": 64}],
                                  [{"hidden": "x", "heads": 2, "ffn": 1, "seq": 1, "batch": 1, "forward_s": 1,
                                    "backward_s": 1}],
                                  [{"hidden": 64, "heads": 0, "ffn": 1, "seq": 1, "batch": 1, "forward_s": 1,
                                    "backward_s": 1}]])
def test_bad_layer_benchmark_is_a_clear_error(tmp_path, capsys, rows):
    d = _layers_manifest(tmp_path / "layers", rows)
    assert cli_main(["calibrate", str(d), "-o", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(d) in err and ("layer benchmark" in err or "results row" in err)
    assert "Traceback" not in err


def test_committed_layer_benchmark_sample_fits_both_phases():
    """traces/samples/cpu-gloo-layers: a real layer benchmark (2 gloo ranks); bigger layers run closer to the
    fitted peak, and the fit reproduces every measured point within 15 %."""
    from pathlib import Path
    d = Path(__file__).resolve().parents[2] / "traces" / "samples" / "cpu-gloo-layers"
    cal = calibrate(d)
    assert {f.phase for f in cal.layers} == {"forward", "backward"}
    for f in cal.layers:
        pts = np.array(f.points)
        assert len(pts) >= 4 and f.half_saturation_flops > 0
        assert np.all(np.abs(np.array([f.achieved_flops_per_s(x) for x in pts[:, 0]]) / pts[:, 1] - 1) < 0.15)


@pytest.mark.parametrize("edit, match", [
    ({"kind": "abc"}, r"results row 0: kind: unknown value 'abc'"),
    ({"size_bytes": 1e308}, r"results row 0: size_bytes"),
    ({"group_size": 0}, r"results row 0: group_size"),
    ({"group_size": None}, r"results row 0: group_size"),
])
def test_a_bad_benchmark_row_is_named(tmp_path, edit, match):
    """A benchmark row's unknown kind, 1e308-byte size or missing group size named the calibration file being
    written (its fit went NaN, after a page of numpy warnings) or was accepted; now the row is named."""
    path = _bench_manifest(tmp_path / "b")
    m = json.loads((path / "manifest.json").read_text())
    m["results"][0].update(edit)
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError, match=match):
        calibrate(path)
