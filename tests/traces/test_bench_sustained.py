"""traces.bench_sustained: the sustained-GEMM device check (runs on CPU here with a tiny shape)."""
import json

import pytest

from traces import bench_sustained as bs


def test_summary_by_hand():
    w = [{"flops_per_s": r} for r in (10.0, 9.0, 8.0, 8.0, 7.0, 8.0)]
    s = bs.summarize(w)
    assert s["first_window_flops_per_s"] == 10.0
    assert s["steady_flops_per_s"] == 8.0            # median of the second half (8, 7, 8)
    assert s["steady_over_first"] == pytest.approx(0.8) and s["min_window_flops_per_s"] == 7.0
    with pytest.raises(ValueError):
        bs.summarize([])


def test_runs_on_cpu_and_writes_json(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "s.json"
    assert bs.main(["--seconds", "0.3", "--window", "0.1", "--shape", "64,64,64", "--dtype", "fp32",
                    "--device", "cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["shape"] == [64, 64, 64] and res["dtype"] == "fp32" and len(res["windows"]) >= 2
    for w in res["windows"]:
        assert w["gemms"] > 0 and w["flops_per_s"] == pytest.approx(2 * 64 ** 3 * w["gemms"] / w["elapsed_s"])
        assert "sm_clock_mhz" not in w                  # CPU: no nvidia-smi sample
    assert res["summary"]["steady_over_first"] > 0
    assert "steady" in capsys.readouterr().err


def test_bad_input_is_a_one_line_error(capsys):
    assert bs.main(["--shape", "64,64"]) == 2
    assert capsys.readouterr().err.startswith("error: --shape takes M,N,K")
    assert bs.main(["--seconds", "0.1", "--window", "1", "--device", "cpu"]) == 2
    assert "window" in capsys.readouterr().err
    assert bs.main(["--shape", "0,64,64", "--device", "cpu"]) == 2
    assert "positive" in capsys.readouterr().err


def test_no_nvidia_smi_gives_no_sample(monkeypatch):
    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")
    monkeypatch.setattr(bs.subprocess, "run", missing)
    assert bs.nvidia_smi_sample() == {}
