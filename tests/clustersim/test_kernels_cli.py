"""simulate --dtype / --stack / --breakdown and the pricing provenance in results."""
import json

from clustersim.cli import main

BASE = ["simulate", "--cluster", "dgx-h100", "--gpus", "16", "--model", "llama3-8b", "--tp", "8", "--pp", "2",
        "--seq", "4096", "--global-batch", "8", "--sp"]


def _run(capsys, *extra):
    assert main(BASE + ["--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_reports_dtype_stack_pricing_and_breakdown(capsys):
    bf = _run(capsys, "--breakdown")
    assert bf["dtype"] == "bf16" and bf["stack"] == "megatron"          # NVIDIA preset default
    assert bf["pricing"]["kernels"]["device"] == "H100-SXM" and "gemm.csv" in bf["pricing"]["kernels"]["gemm_bf16"]
    assert bf["pricing"]["calibration"] is None
    assert bf["top_kernels"] and bf["top_kernels"][0]["share"] > 0.1
    phases = {p["label"]: p for p in bf["breakdown"]["phases"]}
    fwd = phases["dense layer forward"]
    assert {k["kernel"] for k in fwd["kernels"]} >= {"qkv", "flash attention fwd", "mlp fc2", "input norm"}
    fp8 = _run(capsys, "--dtype", "fp8")
    assert fp8["dtype"] == "fp8" and fp8["step_time_s"] < bf["step_time_s"]
    eager = _run(capsys, "--stack", "torchtitan")
    assert eager["stack"] == "torchtitan" and eager["step_time_s"] > bf["step_time_s"]


def test_bad_dtype_is_a_one_line_error(capsys, tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text("model: llama3-8b\ndtype: fp4\n")
    assert main(["simulate", "-c", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "dtype" in err and "Traceback" not in err


def test_breakdown_table_prints(capsys):
    assert main(BASE + ["--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "dense layer forward" in out and "flash attention fwd" in out
