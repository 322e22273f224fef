"""Issue 18 item 9: the collective benchmark prints as nccl-tests does; calibrate prints each fit's error
against its own points and warns above 20 %."""
import json
from pathlib import Path

import pytest

from clustersim.cli import main
from simulator.calibration import CollectiveFit, ComputeFit
from traces import bench_format
from traces.calibrate import FIT_WARN_ERROR, fit_errors

SAMPLES = Path(__file__).resolve().parents[2] / "traces" / "samples"


def test_nccl_tests_layout_on_the_sample_benchmark():
    m = json.loads((SAMPLES / "cpu-gloo-bench" / "manifest.json").read_text())
    rows, world = m["results"], m["world_size"]
    lines = bench_format.table(rows, world, m["backend"])
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    heads = [i for i, line in enumerate(lines) if line.startswith("#") and "redop" in line]
    assert len(heads) == len(kinds)
    cols = lines[heads[0]].lstrip("#").split()
    assert cols == ["size", "count", "type", "redop", "root", "time", "min", "time", "avg", "time", "max", "algbw",
                    "busbw"]
    ar = [r for r in rows if r["kind"] == "all_reduce"]
    body = [line for line in lines[heads[0] + 2:heads[0] + 2 + len(ar)]]
    for r, line in zip(ar, body):
        f = line.split()
        assert int(f[0]) == r["size_bytes"] and int(f[1]) == r["size_bytes"] // 4
        assert f[2:5] == ["float", "sum", "-1"]
        algbw = r["size_bytes"] / r["time_s"] / 1e9          # the sample keeps only time_s
        assert float(f[8]) == pytest.approx(algbw, abs=1e-3) and float(f[9]) == pytest.approx(algbw, abs=1e-3)
    avg = [line for line in lines if line.startswith("# Avg bus bandwidth    : ")]
    assert len(avg) == len(kinds)
    assert float(avg[0].split(":")[1]) == pytest.approx(sum(r["size_bytes"] / r["time_s"] / 1e9 for r in ar) / len(ar))
    bc = bench_format.row_line({"kind": "broadcast", "size_bytes": 4096, "time_s": 1e-5}, 4).split()
    assert bc[3:5] == ["none", "0"]


def test_fit_errors_against_own_points():
    exact = CollectiveFit("all_reduce", 2, "intra", 1e-5, 1e9, points=[[1e6, 1e-5 + 1e-3], [2e6, 1e-5 + 2e-3]])
    assert fit_errors(exact) == pytest.approx((0.0, 0.0))
    off = CollectiveFit("all_reduce", 2, "intra", 1e-5, 1e9, points=[[1e6, (1e-5 + 1e-3) / 1.5]])
    assert fit_errors(off)[1] == pytest.approx(0.5)
    c = ComputeFit("x", 1e12, 1e9, points=[[1e9, 0.5e12]])
    assert fit_errors(c) == pytest.approx((0.0, 0.0))


def test_calibrate_prints_errors_and_warns(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["calibrate", str(SAMPLES / "cpu-gloo-bench"), "-o", str(out)]) == 0
    cap = capsys.readouterr()
    fits = [line for line in cap.out.splitlines() if "error vs its points" in line]
    assert len(fits) == 6
    worst = {line.split()[0]: float(line.rsplit("max ", 1)[1].rstrip("%)")) / 100 for line in fits}
    warned = {line.split()[2] for line in cap.err.splitlines() if line.startswith("warning: the ")}
    assert warned == {k for k, v in worst.items() if v > FIT_WARN_ERROR}


def test_benchmark_rows_that_cannot_be_fitted_are_said_so(tmp_path, capsys):
    """Times that do not grow with the size fitted a bus bandwidth of 1e25 B/s, refused only by the output file's
    check (naming it and an internal field); a fit resting on one size wrote alpha 0 without a word."""
    manifest = json.loads((SAMPLES / "cpu-gloo-bench" / "manifest.json").read_text())
    # flat times are latency-bound: bandwidth from the largest size, with the fit's miss warned about
    flat = dict(manifest, results=[dict(r, time_s=0.001) for r in manifest["results"]])
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "manifest.json").write_text(json.dumps(flat))
    assert main(["calibrate", str(tmp_path / "flat"), "-o", str(tmp_path / "f.json")]) == 0
    capsys.readouterr()
    # times no network could give (a MB in 0.1 ns) are refused naming the collective, not the output file
    fast = dict(manifest, results=[dict(r, time_s=1e-10) for r in manifest["results"]])
    (tmp_path / "fast").mkdir()
    (tmp_path / "fast" / "manifest.json").write_text(json.dumps(fast))
    assert main(["calibrate", str(tmp_path / "fast"), "-o", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err
    assert "give a bus bandwidth of" in err and "beyond any network" in err and "g.json" not in err
    one = dict(manifest, results=[r for r in manifest["results"] if r["kind"] == "all_reduce"][:1])
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "manifest.json").write_text(json.dumps(one))
    assert main(["calibrate", str(tmp_path / "one"), "-o", str(tmp_path / "o.json")]) == 0
    assert "rests on one size: its latency (alpha) cannot be told from its bandwidth" in capsys.readouterr().err
